"""A node behind two floats on two public addresses, with no DNS name or virtual IP in front of them: its
``node.toml`` lists both in ``[p2p] advertise``, its NodeInfo carries both, and a peer that knows it only
from the network map reaches the standby float through the second address once the active one is gone.

Real processes throughout: ``corda-trio networkmap serve``, two ``corda-trio node start`` (Alice sends, Bob
is behind the floats), two ``corda-trio float start`` (tunnel PKI from ``corda-trio float tunnel-pki``). No
peer file: Alice learns Bob's addresses from the map. Bob first advertises his ``p2p.address`` alone (the
default); restarted with ``advertise``, he publishes a NodeInfo with both addresses and Alice's view follows.
Then Alice streams 2,000 messages to Bob (``stream_flows.Stream``; Bob's responder is the ledger: it takes
each number once, in order, or fails) and the active float is killed -9 mid-stream.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from corda_trio import network, rpc
from corda_trio.node import _config
from corda_trio.node._processes import NodeProcess, start_node_process
from tests.float.test_processes import Proc
from tests.ports import free_port

from .netutil import PASSWORD, make_network, open_map_process
from .parking_flows import node_env
from .stream_flows import MODULE
from .test_float_e2e import CLI, write_float_toml
from .test_flows_e2e import scrape

pytestmark = pytest.mark.slow

ALICE, BOB = "O=Alice,L=London,C=GB", "O=Bob,L=Paris,C=FR"
MESSAGES = 2000
#: Bob has stored this many of Alice's messages when the active float is killed
KILL_AFTER = 600


async def bob_addresses(client: rpc.RpcClient) -> list[str] | None:
    """Bob's addresses in the network map of ``client``'s node (``None``: Bob is not in it)."""
    for entry in await client.network_map():
        if entry["legal_name"].startswith("O=Bob"):
            return list(entry["addresses"])
    return None


async def wait_bob_at(client: rpc.RpcClient, addresses: list[str], seconds: float = 60) -> None:
    with trio.fail_after(seconds):
        while await bob_addresses(client) != addresses:  # noqa: ASYNC110 (another process's state)
            await trio.sleep(0.2)


def audit(directory: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (directory / "audit.jsonl").read_text().splitlines()]


async def test_a_node_behind_two_floats_advertises_both_and_a_peer_fails_over_through_the_second(
    tmp_path: Path,
) -> None:
    net = tmp_path / "net"
    (alice_path, alice_cfg), (bob_path, bob_cfg) = make_network(
        net, [ALICE, BOB], with_map=True, flows_modules=(MODULE,)
    )
    tunnel = tmp_path / "tunnel"
    await trio.run_process(
        [*CLI, "float", "tunnel-pki", "--out", str(tunnel), "--float", "float-a", "--float", "float-b",
         "--bridge", "bridge"],
        capture_stdout=True,
    )  # fmt: skip
    public_a = bob_cfg.p2p_address  # (the bootstrap's p2p address of Bob: float-a's public port)
    public_b = network.NetworkHostAndPort(host="127.0.0.1", port=free_port())
    floats = []
    for name, public in (("float-a", public_a), ("float-b", public_b)):
        toml = write_float_toml(tmp_path / name, bob_cfg, tunnel, name=name, public=public)
        floats.append(Proc([*CLI, "float", "start", "--config", str(toml)]))
    env = node_env()
    nodes: list[NodeProcess] = []
    async with open_map_process(net, max_age_seconds=1), trio.open_nursery() as nursery:
        try:
            controls = []
            for proc in floats:
                await proc.start(nursery)
                line = await proc.wait_line(lambda x: "control port listening" in x)
                controls.append(network.NetworkHostAndPort.parse(line.rsplit(" ", 1)[1]))
            behind = attrs.evolve(
                bob_cfg,
                floats=_config.FloatSettings(
                    control=tuple(controls),
                    tunnel_cert=tunnel / "bridge.pem",
                    tunnel_key=tunnel / "bridge.key",
                    tunnel_ca=tunnel / "tunnel-ca.pem",
                ),
            )
            bob_path.write_text(_config.dump_node_config(behind, bob_path.parent), encoding="utf-8")
            nodes.append(await start_node_process(alice_path, alice_cfg, env=env))
            nodes.append(await start_node_process(bob_path, _config.load_node_config(bob_path), env=env))
            async with rpc.connect(nodes[0].rpc_url, "ops", PASSWORD) as a:
                # Without advertise: Bob's NodeInfo lists his p2p.address alone.
                await wait_bob_at(a, [str(public_a)])
                await floats[0].wait_line(lambda x: f"public listener open on {public_a}" in x)

                # Restarted with both floats' public addresses: a new NodeInfo (serial bump) with both, in
                # that order, published to the map; Alice's view follows at her next poll.
                assert await nodes[1].stop() == 0
                advertised = attrs.evolve(behind, p2p_advertise=(public_a, public_b))
                bob_path.write_text(_config.dump_node_config(advertised, bob_path.parent), encoding="utf-8")
                bob_cfg = _config.load_node_config(bob_path)
                assert bob_cfg.advertised_addresses == (public_a, public_b)
                seen = len(floats[0].lines)
                nodes[1] = await start_node_process(bob_path, bob_cfg, env=env)
                await wait_bob_at(a, [str(public_a), str(public_b)])
                bob = nodes[1]
                await floats[0].wait_line(lambda x: f"public listener open on {public_a}" in x, after=seen)

                outcome: dict[str, Any] = {}
                finished = trio.Event()

                async def stream() -> None:
                    # (batch 1: each number its own P2P message, since a flow bundles what it sends at once)
                    taken = await a.start_flow("Stream", recipient=BOB, count=MESSAGES, batch=1)
                    outcome["taken"] = taken
                    finished.set()

                async with trio.open_nursery() as flows:
                    flows.start_soon(stream)
                    received = "corda_trio_p2p_messages_received_total{peer=O=Alice, L=London, C=GB}"
                    with trio.fail_after(120):
                        while (await scrape(bob)).get(received, 0) < KILL_AFTER:  # noqa: ASYNC110 (another process)
                            await trio.sleep(0.05)
                    assert not finished.is_set()  # (mid-stream)
                    await floats[0].kill()  # kill -9 of the active float, mid-stream
                    with trio.fail_after(60):
                        await floats[1].wait_line(lambda x: f"public listener open on {public_b}" in x)
                    with trio.fail_after(300):
                        await finished.wait()
                # The ledger: Bob's responder took 0..1999, each once, in order (else the flow fails).
                assert outcome["taken"] == MESSAGES
                pending = "corda_trio_p2p_messages_pending{peer=O=Bob, L=Paris, C=FR}"
                with trio.fail_after(30):  # (the session's last message may still be on its way)
                    while (alice_metrics := await scrape(nodes[0]))[pending] != 0:  # noqa: ASYNC110
                        await trio.sleep(0.1)
                assert alice_metrics["corda_trio_bridge_connects_total{peer=O=Bob, L=Paris, C=FR}"] >= 2
        finally:
            for node in nodes:
                await node.stop()
            for proc in floats:
                await proc.kill()
            nursery.cancel_scope.cancel()
    # Alice reached float-b through the second advertised address, which only Bob's NodeInfo names.
    b_events = audit(tmp_path / "float-b")
    assert any(e["event"] == "public-open" and e["port"] == public_b.port for e in b_events)
    attached = [e for e in b_events if e["event"] == "link-attached"]
    assert attached and all(e["legal_name"] == "O=Alice, L=London, C=GB" for e in attached), attached
    bob_log = bob_cfg.log_path.read_text(encoding="utf-8")
    assert f"public port {public_b.port}" in bob_log
