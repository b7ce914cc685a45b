"""``corda-trio node``: run a node, and ask a running one about itself.

Examples::

    corda-trio node start --config net/nodes/alice/node.toml     # or --base-dir net/nodes/alice
    corda-trio node info  --node ws://127.0.0.1:40002 --user ops  # password: $CORDA_TRIO_RPC_PASSWORD
    corda-trio node drain --base-dir net/nodes/alice --user ops   # no new flows; `--undo` to undrain
    corda-trio node hash-password                                  # for [[rpc.users]] password_hash

``node start`` prints one line when the node is ready and logs to ``<base dir>/logs/node.log``. SIGTERM stops
it gracefully (exit 0); Ctrl-C too (exit 130); a second Ctrl-C stops it at once (nothing durable is lost).
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import trio

from corda_trio import rpc
from corda_trio.files import read_small_file

from ._cli import CliError, error_text, path_arg, run_trio
from ._heap import freeze_startup_heap

if TYPE_CHECKING:
    from ._config import NodeConfig

# The RPC commands (`node info`, `flow ...`) import only what they use: the configuration (and through it the
# AMQP engine, the store and the network map) is imported where a command reads node.toml or starts a node,
# which more than halves how long an RPC command takes to start.

__all__ = ["PASSWORD_ENV", "add_rpc_options", "open_rpc_client", "register"]

#: Environment variable the RPC commands read the password from (else they prompt).
PASSWORD_ENV: Final[str] = "CORDA_TRIO_RPC_PASSWORD"


def register(parser: argparse.ArgumentParser) -> None:
    """Add ``node start``, ``info``, ``drain`` and ``hash-password``."""
    sub = parser.add_subparsers(dest="node_command", metavar="SUBCOMMAND", required=True)
    start = sub.add_parser(
        "start",
        help="run a node until SIGTERM / Ctrl-C",
        description="Run the node described by node.toml. Prints one line when ready; logs to its base dir.",
    )
    _add_config_options(start)
    start.set_defaults(func=_start)

    info = sub.add_parser("info", help="show a running node's identity, addresses and state (RPC)")
    add_rpc_options(info)
    info.add_argument("--json", action="store_true", help="print JSON")
    info.set_defaults(func=_info)

    drain = sub.add_parser(
        "drain", help="stop taking new flows (RPC and peers); running flows finish (RPC, admin)"
    )
    add_rpc_options(drain)
    drain.add_argument("--undo", action="store_true", help="take new flows again")
    drain.set_defaults(func=_drain)

    hashing = sub.add_parser("hash-password", help="print an argon2 hash for [[rpc.users]] password_hash")
    hashing.add_argument(
        "--password-env", metavar="VAR", help="read the password from this environment variable (else prompt)"
    )
    hashing.set_defaults(func=_hash_password)


def _add_config_options(parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--config", type=path_arg, help="path of node.toml")
    where.add_argument("--base-dir", type=path_arg, help="node directory holding node.toml")


def _load_config(args: argparse.Namespace) -> NodeConfig:
    from ._config import ConfigError, load_node_config

    path = args.config if args.config is not None else args.base_dir / "node.toml"
    try:
        return load_node_config(path)
    except ConfigError as exc:
        raise CliError(str(exc), 2) from None


# --- node start ------------------------------------------------------------------------------------


def _start(args: argparse.Namespace) -> int:
    from corda_trio import store

    from ._node import Node, NodeStartError, configure_logging

    config = _load_config(args)
    node = Node(config)
    try:  # (first: a start refused for a key, a certificate or the store record creates nothing on disk)
        node.check_start()
    except (NodeStartError, store.NewerFormatError, store.MissingPartError, store.PartListError) as exc:
        raise _start_error(exc, config, started=False) from None
    try:
        log_path = configure_logging(config)
    except OSError as exc:
        raise CliError(f"cannot open the log file {config.log_path}: {exc.strerror}", 2) from None
    try:
        signum = run_trio(_serve, node, str(log_path))
    except BaseExceptionGroup as group:
        # A failed store fails several tasks at once (each write it refuses): report the store. A start that
        # failed may take another task's error with it as the rest is cancelled: report why it failed.
        reason = group.split(store.StoreError)[0] or group.split(NodeStartError)[0]
        leaf: BaseException = reason or group
        while isinstance(leaf, BaseExceptionGroup) and (reason or len(leaf.exceptions) == 1):
            leaf = leaf.exceptions[0]
        raise _start_error(leaf, config, started=node.addresses is not None) from None
    except (NodeStartError, store.StoreError, OSError) as exc:
        raise _start_error(exc, config, started=node.addresses is not None) from None
    return 130 if signum == signal.SIGINT else 0


def _start_error(exc: BaseException, config: NodeConfig, *, started: bool) -> BaseException:
    """The one line ``node start`` ends with for ``exc``; ``started``: the node had got up (was ready)."""
    from corda_trio import store

    from ._node import NodeStartError

    if isinstance(exc, NodeStartError):
        return CliError(f"{config.legal_name}: {exc}", 1)
    if isinstance(exc, store.BrokerLockedError):
        return CliError(f"{config.legal_name}: the store is in use by another process: {exc}", 1)
    if isinstance(exc, store.NewerFormatError):
        return CliError(f"{config.legal_name}: cannot start, {exc}", 1)
    if isinstance(exc, store.MissingPartError):
        return CliError(
            f"{config.legal_name}: cannot start, {exc}. Restore what is missing (from a backup), or run "
            f"`corda-trio store check {exc.directory} --repair` to take it off the store's part list and "
            "start without it (what it held is then lost: unsent messages, flow checkpoints, dedup ids)",
            1,
        )
    if isinstance(exc, store.PartListError):
        return CliError(
            f"{config.legal_name}: cannot start, {exc}. `corda-trio store check "
            f"{os.path.dirname(exc.path)} --repair` writes it anew, listing the parts that are there",
            1,
        )
    if isinstance(exc, store.CorruptSegmentError) and not started:
        where = config.store_directory
        return CliError(
            f"{config.legal_name}: cannot start, the store is damaged: {exc}. Restore the store from a "
            f"backup, or run `corda-trio store check {where}` to see what is damaged and `corda-trio store "
            f"check {where} --repair` to salvage what is intact (its report lists what is lost)",
            1,
        )
    if isinstance(exc, store.StoreError) and not started:
        return CliError(
            f"{config.legal_name}: cannot start, store error (what was durable is kept; "
            f"`corda-trio store check {config.store_directory}` inspects the store): {exc}",
            1,
        )
    if isinstance(exc, store.StoreError):
        return CliError(
            f"{config.legal_name}: fatal store error, the node stopped (what was durable is kept; "
            f"`corda-trio store check` inspects the store): {exc}",
            1,
        )
    if isinstance(exc, OSError):
        return CliError(f"{config.legal_name}: {error_text(exc)}", 1)
    return exc


async def _serve(node: Any, log_path: str) -> int | None:
    """Run ``node``: the first SIGTERM / SIGINT stops it gracefully, a second SIGINT at once."""
    first: int | None = None
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:

            async def watch_signals() -> None:
                nonlocal first
                async for signum in signals:
                    name = signal.Signals(signum).name
                    if first is None:
                        first = signum
                        hint = " (Ctrl-C again to stop at once)" if signum == signal.SIGINT else ""
                        print(f"corda-trio node: {name}: stopping{hint}", file=sys.stderr, flush=True)
                        node.request_stop()
                    elif signum == signal.SIGINT:
                        print("corda-trio node: stopping at once", file=sys.stderr, flush=True)
                        nursery.cancel_scope.cancel()

            async def run_node(task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
                await node.run(task_status=task_status)
                nursery.cancel_scope.cancel()

            nursery.start_soon(watch_signals)
            addresses = await nursery.start(run_node)
            freeze_startup_heap()
            print(f"{addresses.ready_line()}  log {log_path}", flush=True)
    return first


# --- RPC commands ----------------------------------------------------------------------------------


def add_rpc_options(parser: argparse.ArgumentParser) -> None:
    """``--node URL | --config F | --base-dir D``, ``--user``, ``--password-env``."""
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--node", metavar="URL", help="the node's RPC address, e.g. ws://127.0.0.1:40002")
    where.add_argument(
        "--config",
        type=path_arg,
        help="node.toml (the running node's node.json in its base directory, else rpc.address)",
    )
    where.add_argument(
        "--base-dir", type=path_arg, help="node directory (node.toml, or the running node's node.json)"
    )
    parser.add_argument("--user", required=True, help="RPC user name")
    parser.add_argument(
        "--password-env",
        default=PASSWORD_ENV,
        metavar="VAR",
        help=f"environment variable holding the password (default {PASSWORD_ENV}); prompted for if unset",
    )


def _rpc_url(args: argparse.Namespace) -> str:
    if args.node is not None:
        url = str(args.node)
        return url if "://" in url else f"ws://{url}"
    # The running node's node.json names its RPC address (also a port it chose itself): read straight from
    # the base directory, without loading (and importing what checks) the whole configuration.
    base_dir = args.base_dir if args.base_dir is not None else _declared_base_dir(args.config)
    if base_dir is not None:
        runtime = base_dir / "node.json"
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError, RecursionError):
            return str(json.loads(read_small_file(runtime))["rpc"])
    config = _load_config(args)
    return f"ws://{config.rpc_address}"


def _declared_base_dir(config: Path) -> Path | None:
    """The ``base_directory`` that ``config`` declares, if it can be read (else the full load says why)."""
    import tomllib

    try:
        base = tomllib.loads(read_small_file(config).decode("utf-8-sig")).get("base_directory", ".")
    except (OSError, ValueError, RecursionError):
        return None
    return config.parent / base if isinstance(base, str) and base else None


def _password(args: argparse.Namespace) -> str:
    value = os.environ.get(args.password_env, "")
    if value:
        return value
    if not sys.stdin.isatty():
        raise CliError(f"no password: set ${args.password_env} or run from a terminal to be prompted", 2)
    try:
        return getpass.getpass(f"password for {args.user}: ")
    except EOFError:
        raise CliError("no password given", 2) from None


@contextlib.asynccontextmanager
async def open_rpc_client(args: argparse.Namespace) -> AsyncIterator[rpc.RpcClient]:
    """Connect with the options of :func:`add_rpc_options`; RPC errors become one-line CLI errors."""
    url = _rpc_url(args)
    password = _password(args)
    try:
        async with rpc.connect(url, args.user, password) as client:
            yield client
    except rpc.RpcError as exc:
        code = 2 if exc.code in ("unauthenticated", "forbidden", "bad-arguments") else 1
        raise CliError(f"{url}: {exc}", code) from None


def _run(coro_fn: Any, *args: Any) -> Any:
    try:
        return run_trio(coro_fn, *args)
    except BaseExceptionGroup as group:
        leaf: BaseException = group
        while isinstance(leaf, BaseExceptionGroup) and len(leaf.exceptions) == 1:
            leaf = leaf.exceptions[0]
        if isinstance(leaf, CliError):
            raise leaf from None
        raise


def _info(args: argparse.Namespace) -> int:
    async def main() -> dict[str, Any]:
        async with open_rpc_client(args) as client:
            info = await client.node_info()
            info["network"] = await client.network_map()
            return info

    info = _run(main)
    if args.json:
        print(json.dumps(info, indent=2, sort_keys=True))
        return 0
    print(info["legal_name"])
    print(f"  key hash     {info['key_hash']}")
    print(f"  p2p          {info['p2p_address']}")
    print(f"  rpc          {info['rpc_address']}")
    print(f"  metrics      {info['metrics_address'] or 'off'}")
    print(f"  version      {info['version']} (platform {info['platform_version']}), pid {info['pid']}")
    print(f"  uptime       {info['uptime_seconds']:.0f} s{'   DRAINING' if info['draining'] else ''}")
    print(f"  flows        {', '.join(info['flows']) or 'none'}")
    count = info["network_nodes"]
    print(f"  network map  {info['network_map']} ({count} node{'' if count == 1 else 's'})")
    for n in info["network"]:
        print(f"    {n['legal_name']}  {', '.join(n['addresses'])}{'  (this node)' if n['self'] else ''}")
    return 0


def _drain(args: argparse.Namespace) -> int:
    async def main() -> dict[str, Any]:
        async with open_rpc_client(args) as client:
            return await (client.undrain() if args.undo else client.drain())

    result = _run(main)
    if result["draining"]:
        print(f"draining: no new flows; {result.get('running_flows', 0)} still running")
    else:
        print("taking new flows again")
    return 0


def _hash_password(args: argparse.Namespace) -> int:
    if args.password_env:
        password = os.environ.get(args.password_env)
        if not password:
            raise CliError(f"${args.password_env} is {'empty' if password == '' else 'not set'}", 2)
    else:
        if not sys.stdin.isatty():
            raise CliError("give --password-env VAR or run from a terminal to be prompted", 2)
        password = getpass.getpass("password: ")
        if password != getpass.getpass("again: "):
            raise CliError("the passwords differ", 2)
    if not password:
        raise CliError("an empty password cannot be used", 2)
    print(rpc.hash_password(password))
    return 0
