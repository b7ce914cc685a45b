"""``corda-trio flow``: start, list, watch, retry and kill flows on a running node over RPC.

Examples::

    export CORDA_TRIO_RPC_PASSWORD=...          # else the password is prompted for
    corda-trio flow start --node ws://127.0.0.1:40002 --user ops \
        PingPong recipient="O=Bob,L=Paris,C=FR" rounds=10
    corda-trio flow start --base-dir net/nodes/alice --user ops --no-wait Broadcast message=hello
    corda-trio flow start --base-dir net/nodes/alice --user ops --client-id order-17 PingPong recipient=...
    corda-trio flow list  --base-dir net/nodes/alice --user ops --state parked
    corda-trio flow watch --base-dir net/nodes/alice --user ops FLOW_ID
    corda-trio flow kill  --base-dir net/nodes/alice --user ops FLOW_ID

Flow arguments are ``name=value``; a value that reads as JSON (a number, ``true``, ``[1, 2]``) is passed as
that, anything else as a string.

``flow start`` waits for the result (stdout). While it waits, a flow in trouble is reported on stderr (its
id, ``retrying`` or ``parked``, and why: e.g. a recipient not in the network map); after Ctrl-C the flow
goes on on the node, and the command says which flow that is. With ``--client-id ID`` the flow's id is
``C-ID`` and the start is idempotent: run the same command again (after a lost connection, a Ctrl-C) and it
follows that flow, running or finished, instead of starting a second one. A client id belongs to the RPC user
who first used it: another user's start with it is refused (``forbidden``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from typing import Any, Final

import trio

from corda_trio import rpc

from ._cli import CliError, _is_interrupt, shown
from ._cli_node import _run, add_rpc_options, open_rpc_client

__all__ = ["parse_flow_args", "register"]


#: ``flow start --no-wait``: the node answers with the id once the start is durable.
NO_WAIT_HELP: Final = "print the flow id and return once the start is durable (it survives a crash then)"


def register(parser: argparse.ArgumentParser) -> None:
    """Add ``flow start``, ``list``, ``watch``, ``retry`` and ``kill``."""
    sub = parser.add_subparsers(dest="flow_command", metavar="SUBCOMMAND", required=True)
    start = sub.add_parser("start", help="start a flow and wait for its result (or --no-wait)")
    add_rpc_options(start)
    start.add_argument("flow", help="flow name, e.g. PingPong")
    start.add_argument("args", nargs="*", default=[], metavar="NAME=VALUE", help="flow arguments")
    start.add_argument("--no-wait", action="store_true", help=NO_WAIT_HELP)
    start.add_argument(
        "--client-id",
        metavar="ID",
        help="start at most once: the flow's id is C-ID; run again (as the same RPC user), the command "
        "follows that flow",
    )
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
    watch.add_argument("--json", action="store_true", help="print each state as one JSON line")
    watch.set_defaults(func=_watch)

    for name, text in (("retry", "retry a parked flow from its last checkpoint"), ("kill", "kill a flow")):
        p = sub.add_parser(name, help=f"{text} (admin)")
        add_rpc_options(p)
        p.add_argument("flow_id")
        p.add_argument("--json", action="store_true", help="print the flow's state after it as JSON")
        p.set_defaults(func=_retry if name == "retry" else _kill)


def parse_flow_args(items: list[str]) -> dict[str, Any]:
    """``["rounds=10", "recipient=O=Bob,L=Paris,C=FR"]`` -> ``{"rounds": 10, "recipient": "O=Bob,..."}``.

    Raises:
        CliError: an item without ``=``, a name given twice, or a value nested too deeply to read (exit
            code 2).
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
        except RecursionError:
            raise CliError(f"flow argument {name!r}: its value is nested too deeply", 2) from None
    return args


def _print_result(value: Any, as_json: bool) -> None:
    if as_json or not isinstance(value, str):
        print(json.dumps(value, default=repr, sort_keys=True))
    else:
        print(shown(value))


def _start(args: argparse.Namespace) -> int:
    flow_args = parse_flow_args(args.args)
    started: list[str] = []

    async def main() -> Any:
        async with open_rpc_client(args) as client:
            ids = {} if args.client_id is None else {"client_id": args.client_id}
            if args.no_wait:
                return await client.launch_flow(args.flow, **ids, **flow_args)
            frames = client.stream("start_flow", flow=args.flow, args=flow_args, wait=True, **ids)
            async with trio.open_nursery() as nursery, contextlib.aclosing(frames):
                async for frame in frames:
                    if "ok" in frame:
                        nursery.cancel_scope.cancel()
                        return frame["ok"]
                    flow_id = frame["event"].get("flow_id") if isinstance(frame["event"], dict) else None
                    if isinstance(flow_id, str) and not started:
                        started.append(flow_id)
                        nursery.start_soon(_report_trouble, client, flow_id)
            raise AssertionError("unreachable: the stream ends with its result")

    try:
        result = _run(main)
    except BaseException as exc:
        if started and _is_interrupt(exc):
            _say(
                f"flow {started[0]} goes on running on the node (`corda-trio flow watch` follows it, "
                "`corda-trio flow kill` stops it)"
            )
        raise
    _print_result(result, args.json)
    return 0


def _say(line: str) -> None:
    """One whole line on stderr, in one write (a Ctrl-C between ``print``'s text and newline would leave
    the line open)."""
    sys.stderr.write(shown(line) + "\n")
    sys.stderr.flush()


async def _report_trouble(client: rpc.RpcClient, flow_id: str) -> None:
    """While ``flow start`` waits: say on stderr when the flow retries or is parked, and why (once per
    reason)."""
    said: tuple[Any, Any] | None = None
    try:
        async with contextlib.aclosing(client.watch_flow(flow_id)) as events:
            async for event in events:
                if not isinstance(event, dict) or event.get("status") not in ("retrying", "parked"):
                    continue
                if (event["status"], event.get("error")) != said:
                    said = (event["status"], event.get("error"))
                    _say(f"flow {flow_id} {said[0]}: {said[1]}")
    except rpc.RpcError:
        pass  # (a lost connection also ends the start call, which says so)


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
        print(_flow_line(f))
    return 0


def _flow_line(f: dict[str, Any]) -> str:
    """One flow (an RPC flow map) on one line: id, state, name, start time, then its error or result."""
    extra = f.get("error") or ("" if f.get("result") is None else json.dumps(f["result"], default=repr))
    # (shown: a flow id carries its starter's client id, an error a peer's text; either may hold escapes)
    return shown(f"{f['flow_id']}  {f['state']:<9} {f['flow']:<16} {f.get('started_at', '')}  {extra}")[:200]


def _print_flow(f: Any, as_json: bool) -> None:
    if as_json or not isinstance(f, dict):
        print(json.dumps(f, default=repr, sort_keys=True), flush=True)
    else:
        print(_flow_line(f), flush=True)


def _watch(args: argparse.Namespace) -> int:
    async def main() -> Any:
        last: Any = None
        async with (
            open_rpc_client(args) as client,
            contextlib.aclosing(client.watch_flow(args.flow_id)) as events,
        ):
            async for event in events:
                _print_flow(event, args.json)
                last = event
        return last

    final = _run(main)
    return 0 if isinstance(final, dict) and final.get("state") == "finished" else 1


def _retry(args: argparse.Namespace) -> int:
    async def main() -> Any:
        async with open_rpc_client(args) as client:
            return await client.retry_flow(args.flow_id)

    _print_flow(_run(main), args.json)
    return 0


def _kill(args: argparse.Namespace) -> int:
    async def main() -> Any:
        async with open_rpc_client(args) as client:
            return await client.kill_flow(args.flow_id)

    _print_flow(_run(main), args.json)
    return 0
