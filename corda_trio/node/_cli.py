"""The ``corda-trio`` command line.

Each command group lives in its own module that exposes ``register(subparsers)``; this module only
collects them, so that the packages stay independent of each other and a broken optional part (Spark,
say) cannot stop the rest of the CLI from starting: groups are imported lazily, when chosen.

Exit codes: 0 success, 1 the operation failed (the message says why), 2 usage or configuration error,
130 interrupted.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import Final

__all__ = ["CliError", "main"]


class CliError(Exception):
    """An error to show to the operator as one line, with an exit code (2 = usage / configuration)."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


#: name -> (module that defines the group, one-line help).  The module exposes
#: ``register(parser: argparse.ArgumentParser) -> None`` which adds sub-commands and sets ``func``.
COMMAND_GROUPS: Final[dict[str, tuple[str, str]]] = {
    "demo": ("corda_trio.node._cli_demo", "run a small end-to-end demo on this machine"),
    "bench": ("corda_trio.node._cli_bench", "run load benchmarks and write records"),
    "report": (
        "corda_trio.node._cli_report",
        "turn benchmark records into a Spark latency/throughput report",
    ),
    "network": ("corda_trio.node._cli_network", "create and inspect networks (bootstrap)"),
    "networkmap": ("corda_trio.node._cli_networkmap", "run the network map service"),
    "store": ("corda_trio.node._cli_store", "inspect and repair durable queues"),
}


def _build_parser(chosen: str | None) -> argparse.ArgumentParser:
    from corda_trio import __version__

    parser = argparse.ArgumentParser(prog="corda-trio", description="corda-trio node and tools")
    parser.add_argument("--version", action="version", version=f"corda-trio {__version__}")
    sub = parser.add_subparsers(dest="group", metavar="COMMAND")
    for name, (module_name, help_text) in COMMAND_GROUPS.items():
        group_parser = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:  # import only the group that runs: keeps start-up fast and failures local
            importlib.import_module(module_name).register(group_parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the process exit code (also used by the console script)."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    chosen = next((a for a in args_list if not a.startswith("-")), None)
    parser = _build_parser(chosen if chosen in COMMAND_GROUPS else None)
    args = parser.parse_args(args_list)
    func: Callable[[argparse.Namespace], int | None] | None = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(func(args) or 0)
    except CliError as exc:
        print(f"corda-trio: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except BaseExceptionGroup as group:  # a CliError raised inside a Trio nursery arrives grouped
        errors = group.subgroup(CliError)
        if errors is None:
            raise
        leaf: BaseException = errors
        while isinstance(leaf, BaseExceptionGroup):
            leaf = leaf.exceptions[0]
        assert isinstance(leaf, CliError)
        print(f"corda-trio: error: {leaf}", file=sys.stderr)
        return leaf.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `corda-trio ... | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
