"""``corda-trio demo``: a three-node network on this machine, each node its own process, running flows.

What it does, with nothing simulated:

1. ``network bootstrap`` into ``--dir`` (default ``./devnet``; an existing demo network is reused): a root
   CA, doorman and map keys, three nodes with their certificates, ``node.toml`` files with an RPC user
   ``demo`` (its password is generated once, stored 0600 in ``<dir>/rpc-password``, and only its argon2
   hash is in the configurations), signed network parameters.
2. Runs the network map service (in this process) and starts every node as a separate
   ``corda-trio node start`` process; waits until each sees the other two in the map.
3. Over RPC: ``--flows`` PingPong flows (``--rounds`` round trips each) around the ring Alice -> Bob ->
   Carol -> Alice, ``--concurrency`` at a time per node, and a Broadcast from each node to the other two;
   a progress bar counts finished flows.
4. Prints the results, flow latency percentiles and throughput, and each node's P2P counters read from its
   ``/metrics`` once they have settled (:func:`_settled_counters`; a line says so if they did not within
   :data:`SETTLE_TIMEOUT_SECONDS`); stops every node (SIGTERM, then waits) and the map, whatever happened,
   Ctrl-C included.

``--records DIR`` writes one benchmark record per flow (``protocol_spec/bench-records.md``) for
``corda-trio report``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import json
import math
import os
import secrets
import signal
import time
import urllib.parse
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import attrs
import trio
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from corda_trio import network, pki, records, rpc

from ._cli import CliError, path_arg, run_trio
from ._cli_network import create_network
from ._cli_networkmap import _service as network_map_service
from ._config import ConfigError, NodeConfig, dump_node_config, load_network_map_config, load_node_config
from ._processes import NodeProcess, NodeProcessError, open_node_processes

__all__ = ["DemoResult", "FlowRun", "register", "run_demo"]

DEFAULT_NODES: Final[tuple[str, ...]] = (
    "O=Alice,L=London,C=GB",
    "O=Bob,L=Paris,C=FR",
    "O=Carol,L=New York,C=US",
)
DEMO_USER: Final[str] = "demo"
PASSWORD_FILE: Final[str] = "rpc-password"
#: How often the nodes poll the demo's map (the map's max-age): short, so that they find each other fast.
MAP_MAX_AGE_SECONDS: Final[int] = 1
DISCOVERY_TIMEOUT_SECONDS: Final[float] = 30.0
FLOWS_TIMEOUT_SECONDS: Final[float] = 120.0
#: How long the summary waits, after the last flow, for the nodes' P2P counters to settle (see
#: :func:`_settled_counters`) before it prints them as they are, saying so.
SETTLE_TIMEOUT_SECONDS: Final[float] = 10.0
_SENT: Final = "corda_trio_p2p_messages_sent_total"
_RECEIVED: Final = "corda_trio_p2p_messages_received_total"
_PENDING: Final = "corda_trio_p2p_messages_pending"


#: The demo's bounds: beyond them it would not end in a sitting (``corda-trio bench run flows`` is the load
#: test); --rounds 10**20 was taken and every flow then failed on an argument msgpack cannot carry.
DEMO_LIMITS: Final = {"flows": 100_000, "rounds": 10_000, "concurrency": 1_000}


def register(parser: argparse.ArgumentParser) -> None:
    """``corda-trio demo [--dir D] [--flows N] [--rounds R] [--records DIR]``."""
    parser.add_argument(
        "--dir", type=path_arg, default=Path("devnet"), help="network directory (default ./devnet)"
    )
    for name, default, what in (
        ("flows", 60, "PingPong flows per node"),
        ("rounds", 3, "round trips per PingPong flow"),
        ("concurrency", 8, "flows each node runs at once"),
    ):
        limit = f"default {default}, at most {DEMO_LIMITS[name]:,}"
        parser.add_argument(f"--{name}", type=int, default=default, help=f"{what} ({limit})")
    parser.add_argument("--records", type=path_arg, help="also write benchmark records into this directory")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(func=_main)


@attrs.frozen(kw_only=True)
class FlowRun:
    """One flow the demo started: who, what, when (epoch ns), and how it ended."""

    initiator: str
    flow: str
    target: str
    created_ns: int
    finished_ns: int
    result: Any = None
    error: str | None = None

    @property
    def latency_ms(self) -> float:
        return (self.finished_ns - self.created_ns) / 1e6


@attrs.frozen(kw_only=True)
class DemoResult:
    runs: tuple[FlowRun, ...]
    elapsed_seconds: float
    started_at: dt.datetime
    finished_at: dt.datetime
    #: node -> metric name -> value (from each node's /metrics after the flows)
    counters: dict[str, dict[str, float]]
    #: the counters had settled when read (no message in flight); else read at SETTLE_TIMEOUT_SECONDS
    counters_settled: bool = True


def _main(args: argparse.Namespace) -> int:
    for name, most in DEMO_LIMITS.items():
        if not 1 <= getattr(args, name) <= most:
            raise CliError(f"--{name} {getattr(args, name)}: must be in 1..{most:,}", 2)
    if args.records is not None and args.records.exists() and not args.records.is_dir():
        raise CliError(f"--records {args.records}: exists and is not a directory", 2)
    console = Console(highlight=False)
    net_dir: Path = args.dir.absolute()
    started = time.perf_counter()
    configs, password = prepare_network(net_dir, console)
    result = run_trio(
        functools.partial(
            _interruptible,
            run_demo,
            net_dir,
            configs,
            password,
            flows=args.flows,
            rounds=args.rounds,
            concurrency=args.concurrency,
            console=console,
            progress=not args.no_progress,
        )
    )
    _print(console, result, args.rounds)
    if args.records is not None:
        path = _write_records(args.records, result, args)
        console.print(f"records: {path}  (corda-trio report --in {args.records} --out report.html)")
    failed = sum(r.error is not None for r in result.runs)
    console.print(
        f"demo finished in {time.perf_counter() - started:.1f} s: 3 node processes, mutual TLS, AMQP 1.0, "
        f"durable queues with fsync, checkpointed flows; network in {net_dir}"
    )
    return 1 if failed else 0


async def _interruptible(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Run ``fn``; on Ctrl-C cancel it (so every node is stopped and waited for), then raise
    KeyboardInterrupt (the CLI prints ``interrupted`` and exits 130)."""
    interrupted = False
    result: Any = None
    with trio.open_signal_receiver(signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:

            async def watch() -> None:
                nonlocal interrupted
                async for _ in signals:
                    interrupted = True
                    nursery.cancel_scope.cancel()
                    return

            async def main() -> None:
                nonlocal result
                result = await fn(*args, **kwargs)
                nursery.cancel_scope.cancel()

            nursery.start_soon(watch)
            nursery.start_soon(main)
    if interrupted:
        raise KeyboardInterrupt
    return result


def prepare_network(
    net_dir: Path, console: Console | None = None
) -> tuple[list[tuple[Path, NodeConfig]], str]:
    """Bootstrap the demo network in ``net_dir`` unless it is there; returns the node configs and the
    demo user's password."""
    password_file = net_dir / PASSWORD_FILE
    if not (net_dir / "nodes").is_dir():
        names = [pki.CordaX500Name.parse(n) for n in DEFAULT_NODES]
        net = create_network(net_dir, names)
        password = secrets.token_urlsafe(18)
        fd = os.open(password_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(password + "\n")
        user = rpc.RpcUser(
            username=DEMO_USER, password_hash=rpc.hash_password(password), permissions=frozenset({"admin"})
        )
        for node in net.nodes:
            path = node.directory / "node.toml"
            cfg = attrs.evolve(load_node_config(path), rpc_users=(user,), shutdown_timeout_seconds=5.0)
            path.write_text(dump_node_config(cfg, node.directory), encoding="utf-8")
        if console is not None:
            console.print(f"created a network of {len(net.nodes)} nodes and a network map in {net_dir}")
    try:
        password = password_file.read_text().strip()
    except OSError:
        raise CliError(
            f"{net_dir} holds a network that was not made by `corda-trio demo` (no {PASSWORD_FILE})", 2
        ) from None
    try:
        configs = [(p, load_node_config(p)) for p in sorted((net_dir / "nodes").glob("*/node.toml"))]
    except ConfigError as exc:
        raise CliError(str(exc), 2) from None
    if len(configs) < 2:
        raise CliError(f"{net_dir} has fewer than two nodes", 2)
    return configs, password


async def run_demo(
    net_dir: Path,
    configs: Sequence[tuple[Path, NodeConfig]],
    password: str,
    *,
    flows: int,
    rounds: int,
    concurrency: int = 32,
    console: Console | None = None,
    progress: bool = True,
) -> DemoResult:
    """Run the map and the nodes, the flows over RPC, and stop everything (see the module docstring)."""
    try:
        map_config = attrs.evolve(
            load_network_map_config(net_dir / "network-map" / "networkmap.toml"),
            max_age_seconds=MAP_MAX_AGE_SECONDS,
        )
    except ConfigError as exc:
        raise CliError(str(exc), 2) from None
    service, _ = network_map_service(map_config)  # (its certificates were checked: fresh, the demo made them)
    t0 = time.perf_counter()

    def say(text: str) -> None:
        if console is not None:
            console.print(f"[dim]{time.perf_counter() - t0:5.1f} s[/dim]  {text}")

    try:
        async with trio.open_nursery() as nursery:
            try:
                await nursery.start(
                    functools.partial(network.serve_network_map, host=map_config.address.host),
                    service,
                    map_config.address.port,
                )
            except OSError as exc:
                raise CliError(
                    f"network map: cannot listen on {map_config.address}: {exc.strerror}"
                ) from None
            say(f"network map serving http://{map_config.address}; starting {len(configs)} node processes")
            try:
                async with open_node_processes(configs) as nodes:
                    say("every node is ready")
                    for n in nodes:
                        a = n.addresses
                        say(f"  {a['legal_name']}: pid {n.process.pid}, p2p {a['p2p']}, rpc {n.rpc_url}")
                    result = await _drive(
                        nodes, password, flows, rounds, concurrency, console if progress else None, say
                    )
                    say("stopping the nodes (SIGTERM)")
            except NodeProcessError as exc:
                raise CliError(str(exc), 1) from None
            say("every node process stopped")
            nursery.cancel_scope.cancel()
    finally:
        service.store.close()
    return result


async def _drive(
    nodes: list[NodeProcess],
    password: str,
    flows: int,
    rounds: int,
    concurrency: int,
    console: Console | None,
    say: Any,
) -> DemoResult:
    names = [str(n.addresses["legal_name"]) for n in nodes]
    clock = records.Clock()
    runs: list[FlowRun] = []
    async with trio.open_nursery() as nursery:
        clients: list[rpc.RpcClient] = []
        for n in nodes:
            clients.append(await _enter(nursery, n.rpc_url, password))
        with trio.fail_after(DISCOVERY_TIMEOUT_SECONDS):
            for client in clients:
                while len(await client.network_map()) < len(nodes):  # noqa: ASYNC110 (another process's state)
                    await trio.sleep(0.1)
        say(f"every node sees all {len(nodes)} nodes in the network map")

        plan: list[tuple[int, str, str, dict[str, Any]]] = []
        for i, name in enumerate(names):
            target = names[(i + 1) % len(names)]
            plan += [(i, "PingPong", target, {"recipient": target, "rounds": rounds})] * flows
            others = [o for o in names if o != name]
            plan.append(
                (i, "Broadcast", ";".join(others), {"recipients": others, "message": f"hello from {name}"})
            )
        started_at = dt.datetime.now(dt.UTC)
        started = time.perf_counter()
        with _progress(console, len(plan)) as advance, trio.fail_after(FLOWS_TIMEOUT_SECONDS):
            limits = [trio.Semaphore(concurrency) for _ in nodes]
            async with trio.open_nursery() as flows_nursery:
                for i, flow, target, args in plan:
                    flows_nursery.start_soon(
                        _one_flow, clients[i], limits[i], names[i], flow, target, args, clock, runs, advance
                    )
        elapsed = time.perf_counter() - started
        counters, settled = await _settled_counters(
            {name: n.metrics_url for name, n in zip(names, nodes, strict=True)}
        )
        nursery.cancel_scope.cancel()
    return DemoResult(
        runs=tuple(runs),
        elapsed_seconds=elapsed,
        started_at=started_at,
        finished_at=dt.datetime.now(dt.UTC),
        counters=counters,
        counters_settled=settled,
    )


async def _settled_counters(
    urls: dict[str, str | None],
) -> tuple[dict[str, dict[str, float]], bool]:
    """Every node's counters (node -> its /metrics URL) once the traffic has settled, and whether it did
    within :data:`SETTLE_TIMEOUT_SECONDS` (if not: the last read).

    A flow's result reaches RPC before the last messages of its sessions are acknowledged (a session's
    end, the peers' acks), so counters read at once catch the nodes mid-conversation, a message counted
    received by one node and not yet sent (acked) by the other. Settled: no message waits in any outbound
    queue, all the nodes sent what all received (the demo's network is closed), and two reads in a row
    agree. One node's own two counts may still differ: its peers' flows need not send it what it sends.
    """
    previous: dict[str, dict[str, float]] | None = None
    with trio.move_on_after(SETTLE_TIMEOUT_SECONDS):
        while True:
            counters = {name: await _scrape(url) for name, url in urls.items()}
            quiet = all(c.get(_PENDING, 0) == 0 for c in counters.values()) and sum(
                c.get(_SENT, 0) for c in counters.values()
            ) == sum(c.get(_RECEIVED, 0) for c in counters.values())
            if quiet and counters == previous:
                return counters, True
            previous = counters
            await trio.sleep(0.1)
    return previous or {}, False


async def _enter(nursery: trio.Nursery, url: str, password: str) -> rpc.RpcClient:
    """Connect and keep the connection open in ``nursery`` until it is cancelled."""

    async def hold(task_status: trio.TaskStatus[rpc.RpcClient] = trio.TASK_STATUS_IGNORED) -> None:
        async with rpc.connect(url, DEMO_USER, password) as client:
            task_status.started(client)
            await trio.sleep_forever()

    return await nursery.start(hold)


async def _one_flow(
    client: rpc.RpcClient,
    limit: trio.Semaphore,
    initiator: str,
    flow: str,
    target: str,
    args: dict[str, Any],
    clock: records.Clock,
    runs: list[FlowRun],
    advance: Any,
) -> None:
    result: Any = None
    error: str | None = None
    async with limit:
        created = clock.now_ns()
        try:
            result = await client.start_flow(flow, args)
        except rpc.RpcError as exc:
            error = str(exc)
    runs.append(
        FlowRun(
            initiator=initiator,
            flow=flow,
            target=target,
            created_ns=created,
            finished_ns=clock.now_ns(),
            result=result,
            error=error,
        )
    )
    advance()


class _progress:
    """A rich progress bar of finished flows (or nothing, without a console)."""

    def __init__(self, console: Console | None, total: int) -> None:
        self.bar = (
            Progress(
                TextColumn("flows"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=console,
                transient=False,
            )
            if console is not None
            else None
        )
        self.total = total

    def __enter__(self) -> Any:
        if self.bar is None:
            return lambda: None
        self.bar.start()
        task = self.bar.add_task("flows", total=self.total)
        return lambda: self.bar.advance(task) if self.bar is not None else None

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()


async def _scrape(url: str | None) -> dict[str, float]:
    """Selected P2P and flow counters from a node's /metrics (summed over labels)."""
    if url is None:
        return {}
    from prometheus_client.parser import text_string_to_metric_families

    parts = urllib.parse.urlsplit(url)  # (http://[::1]:PORT/metrics: the host without its brackets)
    assert parts.hostname is not None and parts.port is not None, url  # (the node wrote it: ready_line)
    with trio.move_on_after(5):
        stream = await trio.open_tcp_stream(parts.hostname, parts.port)
        async with stream:
            await stream.send_all(b"GET /metrics HTTP/1.1\r\nhost: demo\r\nconnection: close\r\n\r\n")
            data = b""
            while chunk := await stream.receive_some(65536):
                data += chunk
        wanted = {
            _SENT,
            _RECEIVED,
            _PENDING,
            "corda_trio_p2p_messages_redelivered_total",
            "corda_trio_flows_started_total",
        }
        totals: dict[str, float] = {}
        for family in text_string_to_metric_families(data.partition(b"\r\n\r\n")[2].decode()):
            for sample in family.samples:
                if sample.name in wanted:
                    totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
        return totals
    return {}


def _short(name: str) -> str:
    """``O=Alice, L=London, C=GB`` -> ``Alice`` (for tables)."""
    try:
        return pki.CordaX500Name.parse(name).organisation
    except pki.InvalidNameError:
        return name


def _percentile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def _print(console: Console, result: DemoResult, rounds: int) -> None:
    ok = [r for r in result.runs if r.error is None]
    failed = [r for r in result.runs if r.error is not None]
    table = Table(title="flows over RPC")
    for column in ("initiator", "flow", "to", "ok", "failed", "p50 ms", "p99 ms", "max ms"):
        table.add_column(column, justify="right" if column.endswith(("ms", "ok", "failed")) else "left")
    groups: dict[tuple[str, str, str], list[FlowRun]] = {}
    for r in result.runs:
        groups.setdefault((r.initiator, r.flow, r.target), []).append(r)
    for (initiator, flow, target), runs in sorted(groups.items()):
        lat = sorted(r.latency_ms for r in runs if r.error is None) or [math.nan]
        table.add_row(
            _short(initiator), flow, " + ".join(_short(t) for t in target.split(";")),
            str(sum(r.error is None for r in runs)),
            str(sum(r.error is not None for r in runs)),
            f"{_percentile(lat, 0.5):.1f}", f"{_percentile(lat, 0.99):.1f}", f"{lat[-1]:.1f}",
        )  # fmt: skip
    console.print(table)
    for r in [r for r in ok if r.flow == "Broadcast"]:
        console.print(f"  {_short(r.initiator)} Broadcast answers: {json.dumps(r.result)}")
    for r in failed[:5]:
        console.print(f"  [red]failed[/red] {r.initiator} {r.flow} -> {r.target}: {r.error}")
    lat = sorted(r.latency_ms for r in ok)
    if lat:
        rate = len(ok) / result.elapsed_seconds
        console.print(
            f"{len(ok)} flows finished, {len(failed)} failed, in {result.elapsed_seconds:.2f} s = "
            f"{rate:,.1f} flows/s; flow latency (start_flow over RPC to its result) "
            f"p50 {_percentile(lat, 0.5):.1f} ms, p90 {_percentile(lat, 0.9):.1f} ms, "
            f"p99 {_percentile(lat, 0.99):.1f} ms, max {lat[-1]:.1f} ms"
        )
    if result.counters_settled and result.counters:
        sent = sum(c.get(_SENT, 0) for c in result.counters.values())
        received = sum(c.get(_RECEIVED, 0) for c in result.counters.values())
        console.print(
            f"  P2P counters read once settled: {sent:,.0f} messages sent and {received:,.0f} received "
            f"across the {len(result.counters)} nodes"
        )
    if not result.counters_settled:
        console.print(
            f"  [yellow]P2P counters still moving {SETTLE_TIMEOUT_SECONDS:g} s after the last "
            "flow[/yellow] (messages in flight, or a peer not acknowledging): read as they were, sent and "
            "received may differ"
        )
    for name, c in result.counters.items():
        console.print(
            f"  {_short(name)} /metrics: P2P messages sent "
            f"{c.get(_SENT, 0):,.0f}, received "
            f"{c.get(_RECEIVED, 0):,.0f}, redelivered "
            f"{c.get('corda_trio_p2p_messages_redelivered_total', 0):,.0f}; flows started "
            f"{c.get('corda_trio_flows_started_total', 0):,.0f}"
        )


def _write_records(out_dir: Path, result: DemoResult, args: argparse.Namespace) -> Path:
    run_id = records.new_run_id("flows-demo")
    try:
        writer = records.RecordWriter(out_dir, run_id)
    except records.RecordError as exc:
        raise CliError(str(exc), 2) from None
    ordered = sorted(result.runs, key=lambda r: r.created_ns)
    for seq, r in enumerate(ordered):
        writer.add_sync(
            records.make_record(
                run_id=run_id,
                scenario="flows-demo",
                link=f"{r.initiator} -> {r.target.replace(';', ' + ')} {r.flow}",
                size_bytes=0,
                seq=seq,
                intended_ns=r.created_ns,
                stages={"created": r.created_ns, "flow_finished": r.finished_ns},
                error=r.error,
            )
        )
    ends = sorted(r.finished_ns - r.created_ns for r in ordered if r.error is None) or [0]
    writer.finish(
        {
            "schema_version": records.SCHEMA_VERSION,
            "run_id": run_id,
            "scenario": "flows-demo",
            "description": "flows started over RPC on three node processes, each awaited to its result",
            "started_at": result.started_at.isoformat(),
            "finished_at": result.finished_at.isoformat(),
            "clock": "epoch ns (perf_counter_ns anchored to time_ns) in the demo process",
            "links": sorted({f"{r.initiator} -> {r.target.replace(';', ' + ')} {r.flow}" for r in ordered}),
            "config": {
                "scenario": "flows-demo",
                "sizes": "0:1",
                "params": {"flows_per_node": args.flows, "rounds": args.rounds, "network": str(args.dir)},
                "load": {
                    "mode": "closed",
                    "concurrency_per_node": args.concurrency,
                    "note": "latency = start_flow over RPC to its result",
                },
            },
            "environment": records.environment_metadata(),
            "summary": {
                "recorded_ops": writer.count,
                "error_ops": sum(r.error is not None for r in ordered),
                "elapsed_seconds": result.elapsed_seconds,
                "latency_ns": {f"p{q * 100:g}": int(_percentile(ends, q)) for q in (0.5, 0.9, 0.99, 0.999)}
                | {"max": ends[-1]},
            },
        }
    )
    return writer.records_path
