"""``corda-trio bench``: run load benchmarks and write records (``protocol_spec/bench-records.md``).

The product never imports the benchmarks: they are a plugin found through the entry point group
``corda_trio.bench`` (the project's own ``bench`` package registers itself there, see ``pyproject.toml``).
Without a plugin the command says so in one line. The plugin offers the harness API (``SCENARIOS``,
``load_scenario``, ``LoadProfile``, ``RunConfig``, ``SizeDistribution``, ``check_parameters``,
``run_benchmark``, ``BenchError``); its records are written with :mod:`corda_trio.records`.

Examples (also shown by ``corda-trio bench --help``; a test runs their parameters through the scenarios)::

    corda-trio bench list
    corda-trio bench run loopback --out bench-out --rate 5000 --duration 10 --warmup 2 --sizes 256,4k
    corda-trio bench run wal --out bench-out --closed --concurrency 8 --duration 5 --param fsync=always
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from importlib import metadata
from typing import Any, Final

from corda_trio import files, records, store

from ._cli import CliError, error_text, path_arg, run_trio

__all__ = ["BENCH_ENTRY_POINT_GROUP", "EXAMPLES", "register"]

#: The examples of the module docstring, for ``--help``.
EXAMPLES: Final = "examples:\n" + "\n".join(
    line for line in (__doc__ or "").splitlines() if line.strip().startswith("corda-trio bench")
)

#: Entry point group through which benchmark harnesses register (name -> module with the harness API).
BENCH_ENTRY_POINT_GROUP: Final = "corda_trio.bench"


def _harness() -> Any:
    """The benchmark plugin registered under :data:`BENCH_ENTRY_POINT_GROUP` (one line if there is none)."""
    found = sorted(metadata.entry_points(group=BENCH_ENTRY_POINT_GROUP), key=lambda ep: ep.name)
    if not found:
        raise CliError(
            f"no benchmarks installed (nothing registers the entry point group {BENCH_ENTRY_POINT_GROUP}); "
            "from a checkout: pip install -e '.[bench]'",
            2,
        )
    if len(found) > 1:
        names = ", ".join(f"{ep.name} = {ep.value}" for ep in found)
        raise CliError(f"more than one benchmark plugin in {BENCH_ENTRY_POINT_GROUP}: {names}", 2)
    try:
        return found[0].load()
    except Exception as exc:  # a broken plugin must not take the CLI down with a traceback
        raise CliError(f"cannot load the benchmark plugin {found[0].value}: {exc}", 1) from None


def register(parser: argparse.ArgumentParser) -> None:
    """Add ``bench list`` and ``bench run``."""
    parser.epilog = EXAMPLES
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    sub = parser.add_subparsers(dest="bench_command", metavar="SUBCOMMAND", required=True)

    listing = sub.add_parser("list", help="list the scenarios")
    listing.set_defaults(func=_list)

    run = sub.add_parser(
        "run",
        help="run one scenario and write its records",
        description="Run one benchmark scenario; records and a meta file go into --out.",
    )
    run.add_argument("scenario", help="scenario name (see `corda-trio bench list`)")
    run.add_argument("--out", type=path_arg, required=True, help="output directory for records (created)")
    mode = run.add_mutually_exclusive_group()
    mode.add_argument(
        "--rate",
        type=float,
        help="open loop: operations per second on a fixed schedule (latency free of coordinated omission)",
    )
    mode.add_argument("--closed", action="store_true", help="closed loop: maximum throughput (default)")
    run.add_argument("--concurrency", type=int, default=1, help="closed loop: concurrent workers (default 1)")
    run.add_argument("--duration", type=float, default=10.0, help="measured seconds after warm-up (10)")
    run.add_argument("--warmup", type=float, default=1.0, help="warm-up seconds, not recorded (1)")
    run.add_argument("--ops", type=int, help="stop after this many recorded operations")
    run.add_argument("--max-in-flight", type=int, default=10_000, help="open loop: concurrency bound (10000)")
    run.add_argument(
        "--drain", type=float, default=30.0, help="seconds to wait for stragglers at the end (30)"
    )
    run.add_argument(
        "--sizes", default="1024", help="message sizes: 1024 | 256,4k,64k | 256:3,64k:1 | uniform:100-2000"
    )
    run.add_argument("--nodes", type=int, help="scenario parameter: number of nodes")
    run.add_argument("--peers", type=int, help="scenario parameter: number of peers / links")
    run.add_argument(
        "--param", action="append", default=[], metavar="KEY=VALUE", help="scenario parameter (repeatable)"
    )
    run.add_argument("--seed", type=int, default=1, help="seed for the size distribution (1)")
    run.add_argument("--run-id", help="fixed run id (default: timestamp-scenario-random)")
    run.add_argument(
        "--scratch", type=path_arg, help="directory for the scenario's files (default: a temp dir)"
    )
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    run.add_argument("--json", action="store_true", help="print the summary as JSON")
    run.set_defaults(func=_run)


def _list(args: argparse.Namespace) -> int:
    bench = _harness()
    width = max(len(n) for n in bench.SCENARIOS)
    for name, (_, description) in sorted(bench.SCENARIOS.items()):
        print(f"{name:<{width}}  {description}")
        for param, text in bench.load_scenario(name).parameters.items():
            print(f"{'':<{width}}    --param {param}=...  {text}")
    return 0


def _params(args: argparse.Namespace) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for item in args.param:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CliError(f"--param {item!r}: expected KEY=VALUE", 2)
        params[key.strip()] = value.strip()
    for flag, value, limit in (("--nodes", args.nodes, MAX_NODES), ("--peers", args.peers, _max_peers())):
        if value is not None and not 1 <= value <= limit:
            why = "" if flag == "--nodes" else f" (each peer needs descriptors; `ulimit -n` is {_fd_limit()})"
            raise CliError(f"{flag} {value}: must be in 1..{limit}{why}", 2)
    if args.nodes is not None:
        params["nodes"] = args.nodes
    if args.peers is not None:
        params["peers"] = args.peers
    return params


#: Most nodes one benchmark run may start on this machine.
MAX_NODES: Final = 64


def _fd_limit() -> int:
    return files.open_files_limit() or 1 << 20


def _max_peers() -> int:
    """Peers (links) a run can hold open: each takes up to two descriptors (both ends on this machine),
    and 64 stay free for the process itself, its stores and the output files."""
    return max(1, (_fd_limit() - 64) // 2)


def _scratch_and_out(args: argparse.Namespace) -> None:
    """``--scratch`` and ``--out`` are directories (created if missing), checked before anything runs."""
    for flag, path in (("--scratch", args.scratch), ("--out", args.out)):
        if path is None:
            continue
        if path.exists() and not path.is_dir():
            raise CliError(f"{flag} {path}: exists and is not a directory", 2)
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CliError(f"{flag} {path}: cannot create the directory: {exc.strerror}", 2) from None


def _run(args: argparse.Namespace) -> int:

    bench = _harness()
    try:
        load = bench.LoadProfile(
            mode="open" if args.rate is not None else "closed",
            rate_per_second=args.rate,
            concurrency=args.concurrency,
            duration_seconds=args.duration,
            warmup_seconds=args.warmup,
            max_ops=args.ops,
            max_in_flight=args.max_in_flight,
            drain_seconds=args.drain,
        )
        config = bench.RunConfig(
            scenario=args.scenario,
            load=load,
            sizes=bench.SizeDistribution.parse(args.sizes),
            params=_params(args),
            seed=args.seed,
            run_id=args.run_id if args.run_id is None else records.check_run_id(args.run_id),
        )
        scenario = bench.load_scenario(args.scenario)
        bench.check_parameters(scenario, config)
    except bench.BenchError as exc:
        raise CliError(str(exc), 2) from exc
    _scratch_and_out(args)

    show_progress = not args.no_progress and sys.stderr.isatty()
    try:
        if show_progress:
            summary = _run_with_progress(scenario, config, args)
        else:
            summary = run_trio(
                functools.partial(bench.run_benchmark, scratch_dir=args.scratch),
                scenario,
                config,
                args.out,
            )
    except bench.BenchError as exc:
        raise CliError(str(exc), 1) from exc
    except _MACHINE_ERRORS as exc:  # the machine, not the benchmark: ports, descriptors, disk
        raise CliError(f"scenario {args.scenario} failed: {error_text(exc)}", 1) from None
    except BaseExceptionGroup as group:
        failed = group.subgroup(_MACHINE_ERRORS)
        if failed is None or failed.split(_MACHINE_ERRORS)[1] is not None:
            raise
        leaf: BaseException = failed
        while isinstance(leaf, BaseExceptionGroup):
            leaf = leaf.exceptions[0]
        raise CliError(f"scenario {args.scenario} failed: {error_text(leaf)}", 1) from None
    if args.json:
        print(json.dumps(summary.to_json(), indent=2))
    else:
        print(summary.format())
    if summary.recorded_ops == 0:
        why = (
            f"{summary.unstarted_ops:,} due never started: lower --rate"
            if summary.unstarted_ops
            else "nothing was due after the warm-up"
        )
        raise CliError(f"run {summary.run_id} recorded no operation ({why})", 1)
    return 0


#: Failures of the machine, not of the benchmark: an OSError (ports, descriptors, disk), or a store the
#: scenario opened that failed on one (a full --scratch disk stops the wal scenario's queue with
#: StoreFailedError, from a consumer's task: it was a traceback) or is locked by another run.
_MACHINE_ERRORS: Final = (OSError, store.StoreError)


def _run_with_progress(scenario: Any, config: Any, args: argparse.Namespace) -> Any:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    bench = _harness()

    columns = (
        TextColumn(f"[bold]{config.scenario}[/bold]"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TextColumn("{task.fields[ops]:>10,} ops"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("run", total=1.0, ops=0)

        def progress(fraction: float, ops: int) -> None:
            bar.update(task, completed=fraction, ops=ops)

        run = functools.partial(bench.run_benchmark, scratch_dir=args.scratch, progress=progress)
        return run_trio(run, scenario, config, args.out)
