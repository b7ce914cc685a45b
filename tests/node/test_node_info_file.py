"""What a node advertises reaches its peers, with and without a network map service.

Real processes throughout (``corda-trio node start``, ``corda-trio networkmap serve``), as an operator meets
them:

* Directory mode (``network bootstrap --no-map``): peers know a node only from the NodeInfo files they hold.
  Bob moves to another port and restarts; he writes his new signed NodeInfo to ``nodeInfo-<HASH>`` in his
  base directory, the operator copies it into the running Alice's ``additional-node-infos/`` (replacing the
  copy of the same name the bootstrap put there), Alice picks it up at her next poll of the directory and a
  PingPong reaches Bob at his new address. Before, no node wrote its NodeInfo anywhere at start: the only file
  was the bootstrap's, with the bootstrap address.
* With a map service: the serial of Bob's last NodeInfo lies in the future (his clock was ahead when he
  signed it, and has been stepped back since). His next start signs a NodeInfo with a higher serial still,
  which the map takes: his new address reaches Alice. Before, the serial was the start time alone, the map
  refused it (``409 stale-serial``) and kept the old address for ever.
"""

from __future__ import annotations

import datetime as dt
import shutil
import time
import urllib.request
from pathlib import Path

import attrs
import pytest
import trio
from cryptography.hazmat.primitives import serialization

from corda_trio import network, pki, rpc
from corda_trio.node import _config
from corda_trio.node._processes import NodeProcess, start_node_process
from tests.ports import free_port

from .netutil import PASSWORD, make_network, open_map_process

pytestmark = pytest.mark.slow

ALICE, BOB = "O=Alice,L=London,C=GB", "O=Bob,L=Paris,C=FR"


def _move(path: Path, cfg: _config.NodeConfig) -> _config.NodeConfig:
    """Give the node of ``path`` a new p2p port (listen and advertise) in its node.toml."""
    moved = network.NetworkHostAndPort(host="127.0.0.1", port=free_port())
    new = attrs.evolve(cfg, p2p_address=moved, p2p_listen=moved)
    path.write_text(_config.dump_node_config(new, path.parent), encoding="utf-8")
    return _config.load_node_config(path)


def _own_file(cfg: _config.NodeConfig) -> Path:
    return cfg.base_directory / network.node_info_file_name(cfg.legal_name)


def _verified(cfg: _config.NodeConfig, signed: network.SignedNodeInfo | bytes) -> network.VerifiedNodeInfo:
    """``signed`` verified as every peer verifies it."""
    root = pki.read_certificate(cfg.trust_root)
    return network.verify_node_info(signed, trust_root=root, now=dt.datetime.now(dt.UTC))


def _read(cfg: _config.NodeConfig, data: bytes) -> network.NodeInfo:
    return _verified(cfg, data).node_info


async def _bob_in_view(client: rpc.RpcClient) -> dict[str, object] | None:
    return next((e for e in await client.network_map() if e["legal_name"].startswith("O=Bob")), None)


async def _wait_bob_at(client: rpc.RpcClient, address: network.NetworkHostAndPort, seconds: float) -> None:
    with trio.fail_after(seconds):
        while (entry := await _bob_in_view(client)) is None or entry["addresses"] != [str(address)]:  # noqa: ASYNC110
            await trio.sleep(0.2)  # (another process's state)


async def test_directory_mode_a_moved_node_writes_its_nodeinfo_and_a_copy_reaches_a_running_peer(
    tmp_path: Path,
) -> None:
    (alice_path, alice_cfg), (bob_path, bob_cfg) = make_network(tmp_path / "net", [ALICE, BOB])
    # The bootstrap wrote each node's NodeInfo into its base directory under the name every node uses, and
    # the same file into every node's additional-node-infos/.
    bootstrap_copy = alice_cfg.additional_node_infos / _own_file(bob_cfg).name
    assert bootstrap_copy.read_bytes() == _own_file(bob_cfg).read_bytes()
    nodes: list[NodeProcess] = []
    try:
        nodes.append(await start_node_process(alice_path, alice_cfg))
        nodes.append(await start_node_process(bob_path, bob_cfg))
        async with rpc.connect(nodes[0].rpc_url, "ops", PASSWORD) as alice:
            await _wait_bob_at(alice, bob_cfg.p2p_address, 60)
            with trio.fail_after(60):
                assert await alice.start_flow("PingPong", recipient=BOB, rounds=1) == 1
            first = _read(bob_cfg, _own_file(bob_cfg).read_bytes())

            # Bob moves to another port and restarts: his base directory holds his new NodeInfo.
            assert await nodes[1].stop() == 0
            bob_cfg = _move(bob_path, bob_cfg)
            nodes[1] = await start_node_process(bob_path, bob_cfg)
            written = _own_file(bob_cfg).read_bytes()
            node_info = _read(bob_cfg, written)
            assert node_info.addresses == (bob_cfg.p2p_address,)
            assert node_info.serial > first.serial
            assert [p.name for p in bob_cfg.base_directory.glob("*nodeInfo*")] == [_own_file(bob_cfg).name]

            # Alice still knows only the old address; the operator copies Bob's file over hers (same name),
            # and the running Alice follows without a restart.
            assert (await _bob_in_view(alice) or {})["addresses"] == [str(first.addresses[0])]
            shutil.copy(_own_file(bob_cfg), alice_cfg.additional_node_infos)
            assert bootstrap_copy.read_bytes() == written
            assert len(list(alice_cfg.additional_node_infos.iterdir())) == 2
            await _wait_bob_at(alice, bob_cfg.p2p_address, 30)
            with trio.fail_after(60):
                assert await alice.start_flow("PingPong", recipient=BOB, rounds=2) == 2
        # Alice's log says where she knows Bob, at each move, as peers dial it (it was a tuple's repr:
        # "at (NetworkHostAndPort(host='127.0.0.1', port=...),)")
        log = alice_cfg.log_file.read_text(encoding="utf-8")
        for address in (first.addresses[0], bob_cfg.p2p_address):
            assert f"INFO corda_trio.node: network map: O=Bob, L=Paris, C=FR at {address}\n" in log, log
    finally:
        with trio.CancelScope(shield=True):
            for node in nodes:
                await node.stop()


def _sign_for(cfg: _config.NodeConfig, address: network.NetworkHostAndPort, serial: int) -> bytes:
    """A NodeInfo of ``cfg``'s node, signed with its identity key (as the node signs its own)."""
    chain = pki.read_certificates(cfg.identity_cert_chain)
    key = pki.read_private_key(cfg.identity_key, cfg.key_passphrase.read())
    info = network.NodeInfo(
        addresses=(address,),
        legal_identities=(tuple(c.public_bytes(serialization.Encoding.DER) for c in chain),),
        platform_version=network.PLATFORM_VERSION,
        serial=serial,
    )
    return _verified(cfg, network.sign_node_info(info, [key])).serialize()


async def test_a_clock_stepped_back_does_not_make_the_map_refuse_the_next_nodeinfo(tmp_path: Path) -> None:
    net = tmp_path / "net"
    (alice_path, alice_cfg), (bob_path, bob_cfg) = make_network(net, [ALICE, BOB], with_map=True)
    assert alice_cfg.network_map_url is not None
    nodes: list[NodeProcess] = []
    async with open_map_process(net, max_age_seconds=1):
        try:
            nodes.append(await start_node_process(alice_path, alice_cfg))
            async with rpc.connect(nodes[0].rpc_url, "ops", PASSWORD) as alice:
                # Bob's last NodeInfo, signed an hour "ahead": published to the map and left in his base
                # directory, as a start with his clock an hour fast would have done.
                future = int(time.time() * 1000) + 3_600_000
                ahead = _sign_for(bob_cfg, bob_cfg.p2p_address, future)
                request = urllib.request.Request(
                    f"{alice_cfg.network_map_url}/network-map/publish", data=ahead, method="POST"
                )
                with urllib.request.urlopen(request, timeout=10) as response:  # noqa: ASYNC210 (one request)
                    assert response.read().startswith(b"added ")
                _own_file(bob_cfg).write_bytes(ahead)
                await _wait_bob_at(alice, bob_cfg.p2p_address, 30)

                # Now (the clock back to the right time) Bob starts on another port: the map takes his new
                # NodeInfo, whose serial is above the one from the future, and Alice's view follows.
                bob_cfg = _move(bob_path, bob_cfg)
                nodes.append(await start_node_process(bob_path, bob_cfg))
                await _wait_bob_at(alice, bob_cfg.p2p_address, 30)
                entry = await _bob_in_view(alice)
                assert entry is not None and entry["serial"] == future + 1, entry
                with trio.fail_after(60):
                    assert await alice.start_flow("PingPong", recipient=BOB, rounds=1) == 1
        finally:
            with trio.CancelScope(shield=True):
                for node in nodes:
                    await node.stop()
    refused = [line for line in nodes[1].console_log.read_text().splitlines() if "refused" in line]
    assert refused == [], refused
