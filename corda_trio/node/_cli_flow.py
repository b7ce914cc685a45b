"""``corda-trio flow``: start, list, watch, retry and kill flows on a running node over RPC.

Examples::

    export CORDA_TRIO_RPC_PASSWORD=...          # else the password is prompted for
    corda-trio flow start --node ws://127.0.0.1:40002 --user ops \
        PingPong recipient="O=Bob,L=Paris,C=FR" rounds=10
    corda-trio flow start --base-dir net/nodes/alice --user ops --no-wait Broadcast message=hello
    corda-trio flow list  --base-dir net/nodes/alice --user ops --state parked
    corda-trio flow watch --base-dir net/nodes/alice --user ops FLOW_ID
    corda-trio flow kill  --base-dir net/nodes/alice --user ops FLOW_ID

Flow arguments are ``name=value``; a value that reads as JSON (a number, ``true``, ``[1, 2]``) is passed as
that, anything else as a string.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from ._cli import CliError
from ._cli_node import _run, add_rpc_options, open_rpc_client

__all__ = ["parse_flow_args", "register"]


def register(parser: argparse.ArgumentParser) -> None:
    """Add ``flow start``, ``list``, ``watch``, ``retry`` and ``kill``."""
    sub = parser.add_subparsers(dest="flow_command", metavar="SUBCOMMAND", required=True)
    start = sub.add_parser("start", help="start a flow and wait for its result (or --no-wait)")
    add_rpc_options(start)
    start.add_argument("flow", help="flow name, e.g. PingPong")
    start.add_argument("args", nargs="*", metavar="NAME=VALUE", help="flow arguments")
    start.add_argument("--no-wait", action="store_true", help="print the flow id and return at once")
    start.add_argument("--json", action="store_true", help="print the result as JSON")
    start.set_defaults(func=_start)

    listing = sub.add_parser("list", help="list flows (running, parked with an error, recently finished)")
    add_rpc_options(listing)
    listing.add_argument("--state", choices=("running", "parked", "finished", "failed"))
    listing.add_argument("--json", action="store_true", help="print JSON")
    listing.set_defaults(func=_list)

    watch = sub.add_parser("watch", help="follow a flow's progress until it ends")
    add_rpc_options(watch)
    watch.add_argument("flow_id")
    watch.set_defaults(func=_watch)

    for name, text in (("retry", "retry a parked flow from its last checkpoint"), ("kill", "kill a flow")):
        p = sub.add_parser(name, help=f"{text} (admin)")
        add_rpc_options(p)
        p.add_argument("flow_id")
        p.set_defaults(func=_retry if name == "retry" else _kill)


def parse_flow_args(items: list[str]) -> dict[str, Any]:
    """``["rounds=10", "recipient=O=Bob,L=Paris,C=FR"]`` -> ``{"rounds": 10, "recipient": "O=Bob,..."}``.

    Raises:
        CliError: an item without ``=`` or a name given twice (exit code 2).
    """
    args: dict[str, Any] = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or not name.isidentifier():
            raise CliError(f"flow argument {item!r}: expected NAME=VALUE", 2)
        if name in args:
            raise CliError(f"flow argument {name!r} is given twice", 2)
        try:
            args[name] = json.loads(text)
        except ValueError:
            args[name] = text
    return args


def _print_result(value: Any, as_json: bool) -> None:
    if as_json or not isinstance(value, str):
        print(json.dumps(value, default=repr, sort_keys=True))
    else:
        print(value)


def _start(args: argparse.Namespace) -> int:
    flow_args = parse_flow_args(args.args)

    async def main() -> Any:
        async with open_rpc_client(args) as client:
            if args.no_wait:
                return await client.launch_flow(args.flow, **flow_args)
            return await client.start_flow(args.flow, **flow_args)

    _print_result(_run(main), args.json)
    return 0


def _list(args: argparse.Namespace) -> int:
    async def main() -> list[dict[str, Any]]:
        async with open_rpc_client(args) as client:
            return await client.list_flows(args.state)

    flows = _run(main)
    if args.json:
        print(json.dumps(flows, default=repr, indent=2, sort_keys=True))
        return 0
    if not flows:
        print("no flows")
    for f in flows:
        extra = f.get("error") or ("" if f.get("result") is None else json.dumps(f["result"], default=repr))
        print(f"{f['flow_id']}  {f['state']:<9} {f['flow']:<16} {f.get('started_at', '')}  {extra}"[:200])
    return 0


def _watch(args: argparse.Namespace) -> int:
    async def main() -> Any:
        last: Any = None
        async with open_rpc_client(args) as client:
            async for event in client.watch_flow(args.flow_id):
                print(json.dumps(event, default=repr, sort_keys=True), flush=True)
                last = event
        return last

    final = _run(main)
    return 0 if isinstance(final, dict) and final.get("state") == "finished" else 1


def _retry(args: argparse.Namespace) -> int:
    async def main() -> Any:
        async with open_rpc_client(args) as client:
            return await client.retry_flow(args.flow_id)

    _print_result(_run(main), True)
    return 0


def _kill(args: argparse.Namespace) -> int:
    async def main() -> Any:
        async with open_rpc_client(args) as client:
            return await client.kill_flow(args.flow_id)

    _print_result(_run(main), True)
    return 0
