"""Create small bootstrapped networks whose nodes have RPC users, and run their network map service, for the
node process tests."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import attrs
import trio

from corda_trio import pki, rpc
from corda_trio.node import _config
from corda_trio.node._cli_network import create_network

from .cli_helpers import CLI

PASSWORD = "demo-password"
_HASH = rpc.hash_password(PASSWORD)
USERS = (
    rpc.RpcUser(username="ops", password_hash=_HASH, permissions=frozenset({"admin"})),
    rpc.RpcUser(username="reader", password_hash=_HASH, permissions=frozenset({"read"})),
)


def make_network(
    directory: Path, names: Sequence[str], *, with_map: bool = False, **overrides: object
) -> list[tuple[Path, _config.NodeConfig]]:
    """Bootstrap ``names`` in ``directory`` (directory mode unless ``with_map``); returns (path, config)."""
    net = create_network(
        directory, [pki.CordaX500Name.parse(n) for n in names], map_port=0 if with_map else None
    )
    out = []
    for node in net.nodes:
        path = node.directory / "node.toml"
        settings: dict[str, object] = {"rpc_users": USERS, "shutdown_timeout_seconds": 5.0, **overrides}
        cfg = attrs.evolve(_config.load_node_config(path), **settings)
        path.write_text(_config.dump_node_config(cfg, node.directory), encoding="utf-8")
        out.append((path, _config.load_node_config(path)))
    return out


@contextlib.asynccontextmanager
async def open_map_process(net: Path, *, max_age_seconds: int) -> AsyncIterator[trio.Process]:
    """``corda-trio networkmap serve --dir net`` (a network made ``with_map``) with the map's ``max-age`` (the
    nodes' poll interval) set, serving until the block ends (SIGTERM, then SIGKILL after 10 s)."""
    toml = net / "network-map" / "networkmap.toml"
    text = toml.read_text(encoding="utf-8")
    assert "max_age_seconds = 30" in text, text
    toml.write_text(text.replace("max_age_seconds = 30", f"max_age_seconds = {max_age_seconds}"), "utf-8")
    proc = await trio.lowlevel.open_process(
        [*CLI, "networkmap", "serve", "--dir", str(net)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    try:
        assert proc.stdout is not None
        line = b""
        with trio.fail_after(60):
            while b"\n" not in line:
                chunk = await proc.stdout.receive_some(4096)
                assert chunk, "networkmap serve exited before serving"
                line += chunk
        assert b"serving http://" in line, line
        yield proc
    finally:
        proc.terminate()
        with trio.CancelScope(shield=True), trio.move_on_after(10):
            await proc.wait()
        if proc.returncode is None:
            proc.kill()
