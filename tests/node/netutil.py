"""Create small bootstrapped networks whose nodes have RPC users, for the node process tests."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import attrs

from corda_trio import pki, rpc
from corda_trio.node import _config
from corda_trio.node._cli_network import create_network

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
