"""An IPv6-only network of real processes: ``corda-trio network bootstrap --host [::1]``, the map service on
``[::1]``, a node whose RPC and /metrics listeners are on ``::1`` and whose P2P one is on ``[::]``, and a
second node behind a float whose control and public ports are on ``::1`` too; flows in both directions over
RPC. No process of the network listens on an IPv4 address (a ``[::]`` socket is an IPv6 one)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import attrs
import pytest
import trio

from corda_trio import network, rpc
from corda_trio.node import _config
from corda_trio.node._processes import open_node_processes
from tests.ipv6 import needs_ipv6

from .cli_helpers import CLI
from .netutil import PASSWORD, USERS, open_map_process, stop
from .test_float_e2e import write_float_toml
from .test_flows_e2e import scrape

pytestmark = [pytest.mark.slow, needs_ipv6]

ALICE, BOB = "O=Alice,L=London,C=GB", "O=Bob,L=Paris,C=FR"


def listening(pid: int) -> dict[str, set[int]]:
    """The TCP ports process ``pid`` listens on, per /proc table: ``{"tcp": IPv4, "tcp6": IPv6}``."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            link = fd.readlink().name
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    found: dict[str, set[int]] = {"tcp": set(), "tcp6": set()}
    for table in found:
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            cols = line.split()
            if cols[9] in inodes and cols[3] == "0A":
                found[table].add(int(cols[1].rsplit(":", 1)[1], 16))
    return found


async def test_two_nodes_and_a_float_on_ipv6_only_run_flows(tmp_path: Path) -> None:
    net = tmp_path / "net"
    made = await trio.run_process(
        [*CLI, "network", "bootstrap", "--dir", str(net), "--node", ALICE, "--node", BOB, "--host", "[::1]"],
        capture_stdout=True,
    )
    assert b"network map: http://[::1]:" in made.stdout, made.stdout
    configs = []
    for name in ("alice", "bob"):
        path = net / "nodes" / name / "node.toml"
        cfg = _config.load_node_config(path)
        assert cfg.p2p_address.host == "::1" and cfg.network_map_url is not None
        assert cfg.network_map_url.startswith("http://[::1]:")
        assert cfg.metrics_address == ("::1", 0)  # (the loopback of the network's family, as RPC and P2P)
        assert cfg.bridge_endpoint == ("::1", 0)  # (external bridge mode only: its local endpoint)
        cfg = attrs.evolve(cfg, rpc_users=USERS, shutdown_timeout_seconds=5.0)
        if name == "alice":  # binds every IPv6 interface, advertises [::1]
            cfg = attrs.evolve(
                cfg, p2p_listen=network.NetworkHostAndPort(host="::", port=cfg.p2p_address.port)
            )
        path.write_text(_config.dump_node_config(cfg, path.parent), encoding="utf-8")
        configs.append((path, _config.load_node_config(path)))
    (alice_path, alice_cfg), (bob_path, bob_cfg) = configs
    tunnel = tmp_path / "tunnel"
    await trio.run_process(
        [*CLI, "float", "tunnel-pki", "--out", str(tunnel), "--float", "float-a", "--bridge", "bridge"],
        capture_stdout=True,
    )
    float_toml = write_float_toml(tmp_path / "float", bob_cfg, tunnel)
    text = float_toml.read_text()
    float_toml.write_text(text.replace('host = "127.0.0.1"', 'host = "[::1]"'))  # (the control port)
    async with open_map_process(net, max_age_seconds=1) as map_process:
        flt = await trio.lowlevel.open_process(
            [*CLI, "float", "start", "--config", str(float_toml)], stdout=subprocess.PIPE
        )
        lines: list[str] = []

        async def wait_line(text: str) -> str:
            assert flt.stdout is not None
            with trio.fail_after(60):
                while not any(text in x for x in lines):
                    chunk = await flt.stdout.receive_some(4096)
                    assert chunk, f"the float exited: {lines}"
                    lines.extend(chunk.decode().splitlines())
            return next(x for x in lines if text in x)

        try:
            control = network.NetworkHostAndPort.parse(
                (await wait_line("control port listening")).split()[-1]
            )
            assert control.host == "::1", control
            behind = attrs.evolve(
                bob_cfg,
                floats=_config.FloatSettings(
                    control=(control,),
                    tunnel_cert=tunnel / "bridge.pem",
                    tunnel_key=tunnel / "bridge.key",
                    tunnel_ca=tunnel / "tunnel-ca.pem",
                ),
            )
            bob_path.write_text(_config.dump_node_config(behind, bob_path.parent), encoding="utf-8")
            bob_cfg = _config.load_node_config(bob_path)
            async with open_node_processes([(alice_path, alice_cfg), (bob_path, bob_cfg)]) as (alice, bob):
                await wait_line(f"public listener open on {bob_cfg.p2p_address}")
                assert alice.rpc_url.startswith("ws://[::1]:") and bob.rpc_url.startswith("ws://[::1]:")
                async with (
                    rpc.connect(alice.rpc_url, "ops", PASSWORD) as a,
                    rpc.connect(bob.rpc_url, "ops", PASSWORD) as b,
                ):
                    with trio.fail_after(60):
                        for client in (a, b):
                            while len(await client.network_map()) < 2:  # noqa: ASYNC110 (another process)
                                await trio.sleep(0.2)
                        assert await a.start_flow("PingPong", recipient=BOB, rounds=3) == 3
                        assert await b.start_flow("PingPong", recipient=ALICE, rounds=2) == 2
                for node, peer in ((alice, BOB), (bob, ALICE)):
                    assert node.metrics_url is not None and node.metrics_url.startswith("http://[::1]:")
                    metrics = await scrape(node)
                    assert metrics[
                        f"corda_trio_p2p_messages_received_total{{peer={peer.replace(',', ', ')}}}"
                    ]
                for pid in (alice.process.pid, bob.process.pid, flt.pid, map_process.pid):
                    ports = listening(pid)
                    assert ports["tcp6"] and not ports["tcp"], (pid, ports)
        finally:
            await stop(flt)
