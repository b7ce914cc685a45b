"""A real node behind a real float: ``corda-trio node start`` with ``[float]`` in its node.toml, a
``corda-trio float start`` process whose tunnel PKI came from ``corda-trio float tunnel-pki``, and a second
node running flows against it over RPC, dialling out through a SOCKS5 proxy (``[bridge] proxy``; pproxy, a
maintained server). The node behind the float listens for no peer itself: the float holds its advertised
p2p port."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import attrs
import pytest
import trio

from corda_trio import network, rpc, transport
from corda_trio.node import _config
from corda_trio.node._processes import open_node_processes
from tests.ports import free_port

from .netutil import PASSWORD, make_network, stop
from .test_flows_e2e import scrape

pytestmark = pytest.mark.slow

ALICE, BOB = "O=Alice,L=London,C=GB", "O=Bob,L=Paris,C=FR"
CLI = [sys.executable, "-m", "corda_trio"]


def listening_ports(pid: int) -> set[int]:
    """Local ports of the TCP sockets in LISTEN state that process ``pid`` holds (read from /proc)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    ports = set()
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}") as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                if cols[9] in inodes and cols[3] == "0A":
                    ports.add(int(cols[1].split(":")[1], 16))
    return ports


def write_float_toml(
    directory: Path,
    bob: _config.NodeConfig,
    tunnel: Path,
    *,
    name: str = "float-a",
    public: network.NetworkHostAndPort | None = None,
) -> Path:
    """The float ``name`` for Bob: public port = Bob's advertised p2p address (or ``public``), Bob's
    encrypted TLS key as the bootstrap wrote it, with the passphrase from the same place Bob's node.toml
    names."""
    public = public or bob.p2p_address
    directory.mkdir()
    source = bob.key_passphrase
    passphrase = f'passphrase_env = "{source.env}"' if source.env else f'passphrase_file = "{source.file}"'
    path = directory / "float.toml"
    path.write_text(
        f"""
[control]
host = "127.0.0.1"
port = 0
cert = "{tunnel / f"{name}.pem"}"
key = "{tunnel / f"{name}.key"}"
ca = "{tunnel / "tunnel-ca.pem"}"

[public]
host = "{public.host}"
port = {public.port}

[tls.node]
cert_chain = "{bob.tls_cert_chain}"
key = "{bob.tls_key}"
trust_root = "{bob.trust_root}"
{passphrase}

[audit]
path = "audit.jsonl"
"""
    )
    return path


async def test_a_node_behind_a_float_receives_flows_and_listens_for_no_peer(tmp_path: Path) -> None:
    (alice_path, alice_cfg), (bob_path, bob_cfg) = make_network(tmp_path / "net", [ALICE, BOB])
    tunnel = tmp_path / "tunnel"
    made = await trio.run_process(
        [*CLI, "float", "tunnel-pki", "--out", str(tunnel), "--float", "float-a", "--bridge", "bridge"],
        capture_stdout=True,
    )
    assert b"tunnel PKI written" in made.stdout
    float_toml = write_float_toml(tmp_path / "float", bob_cfg, tunnel)
    proxy_port, proxy_log = free_port(), tmp_path / "pproxy.log"
    with open(proxy_log, "wb") as out:  # noqa: ASYNC230 (a local file, opened once)
        socks = await trio.lowlevel.open_process(
            [sys.executable, "-m", "pproxy", "-l", f"socks5://127.0.0.1:{proxy_port}", "-v"],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        flt = await trio.lowlevel.open_process(
            [*CLI, "float", "start", "--config", str(float_toml)], stdout=subprocess.PIPE
        )
    except BaseException:
        await stop(socks)
        raise
    lines: list[str] = []

    async def wait_line(text: str) -> str:
        assert flt.stdout is not None
        with trio.fail_after(60):  # generous: three node-like processes share a loaded machine
            while not any(text in x for x in lines):
                chunk = await flt.stdout.receive_some(4096)
                assert chunk, f"the float exited: {lines}"
                lines.extend(chunk.decode().splitlines())
        return next(x for x in lines if text in x)

    try:
        control_port = int((await wait_line("control port listening")).rsplit(":", 1)[1])
        behind = attrs.evolve(
            bob_cfg,
            floats=_config.FloatSettings(
                control=(network.NetworkHostAndPort(host="127.0.0.1", port=control_port),),
                tunnel_cert=tunnel / "bridge.pem",
                tunnel_key=tunnel / "bridge.key",
                tunnel_ca=tunnel / "tunnel-ca.pem",
            ),
        )
        bob_path.write_text(_config.dump_node_config(behind, bob_path.parent), encoding="utf-8")
        bob_cfg = _config.load_node_config(bob_path)
        assert bob_cfg.floats is not None
        via = transport.SocksProxy(host="127.0.0.1", port=proxy_port, version="socks5")
        alice_path.write_text(
            _config.dump_node_config(attrs.evolve(alice_cfg, bridge_proxy=via), alice_path.parent)
        )
        alice_cfg = _config.load_node_config(alice_path)
        assert alice_cfg.bridge_proxy == via
        async with open_node_processes([(alice_path, alice_cfg), (bob_path, bob_cfg)]) as (alice, bob):
            await wait_line(f"public listener open on {bob_cfg.p2p_address}")
            assert bob.addresses["p2p"] == str(bob_cfg.p2p_address)
            # Bob listens for RPC and /metrics only; the p2p port is the float's.
            assert bob.metrics_url is not None
            own = {int(bob.rpc_url.rsplit(":", 1)[1]), int(bob.metrics_url.rsplit(":", 1)[1].split("/")[0])}
            assert listening_ports(bob.process.pid) == own
            assert bob_cfg.p2p_address.port in listening_ports(flt.pid)
            async with rpc.connect(alice.rpc_url, "ops", PASSWORD) as a:
                with trio.fail_after(60):
                    while len(await a.network_map()) < 2:  # noqa: ASYNC110 (another process's state)
                        await trio.sleep(0.2)
                    result = await a.start_flow("PingPong", recipient=BOB, rounds=3)
            assert result == 3, result
            assert listening_ports(bob.process.pid) == own
            # Bob's /metrics counts what came in through the float (the tunnel, not an acceptor)
            metrics = await scrape(bob)
            assert metrics["corda_trio_p2p_messages_received_total{peer=O=Alice, L=London, C=GB}"] >= 1
            assert metrics["corda_trio_p2p_messages_released_total{}"] == 0
    finally:
        await stop(flt)
        await stop(socks)
    # Alice's bridge dialled Bob's advertised address (the float) through the proxy.
    assert f"127.0.0.1:{bob_cfg.p2p_address.port}" in proxy_log.read_text()
    audit = (tmp_path / "float" / "audit.jsonl").read_text()
    assert "O=Alice" in audit  # the peer's validated name, logged by the float


async def test_a_bridge_process_behind_a_float_carries_flows(tmp_path: Path) -> None:
    """``corda-trio bridge start`` with ``[float]`` in its bridge.toml: Bob's bridge runs in its own process,
    activates the float and stores what it forwards through Bob's local endpoint. Neither Bob's node nor his
    bridge process listens for peers; Alice's flows reach Bob through the float."""
    (alice_path, alice_cfg), (bob_path, bob_cfg) = make_network(tmp_path / "net", [ALICE, BOB])
    env = {"TEST_BRIDGE_PASSWORD": "bridge-secret"}
    bob_cfg = attrs.evolve(
        bob_cfg,
        bridge_mode=_config.BridgeMode.EXTERNAL,
        bridge_password=_config.KeyPassphrase(env="TEST_BRIDGE_PASSWORD"),
    )
    bob_path.write_text(_config.dump_node_config(bob_cfg, bob_cfg.base_directory), encoding="utf-8")
    bob_cfg = _config.load_node_config(bob_path)
    tunnel = tmp_path / "tunnel"
    await trio.run_process(
        [*CLI, "float", "tunnel-pki", "--out", str(tunnel), "--float", "float-a", "--bridge", "bridge"],
        capture_stdout=True,
    )
    float_toml = write_float_toml(tmp_path / "float", bob_cfg, tunnel)
    flt = await trio.lowlevel.open_process(
        [*CLI, "float", "start", "--config", str(float_toml)], stdout=subprocess.PIPE
    )
    bridge_proc: trio.Process | None = None
    try:
        assert flt.stdout is not None
        seen = b""
        with trio.fail_after(30):
            while b"control port listening" not in seen:
                chunk = await flt.stdout.receive_some(4096)
                assert chunk, f"the float exited: {seen!r}"
                seen += chunk
        control_port = int(seen.split(b"control port listening on ")[1].split(b"\n")[0].rsplit(b":", 1)[1])
        async with open_node_processes([(alice_path, alice_cfg), (bob_path, bob_cfg)], env=env) as (
            alice,
            bob,
        ):
            certs = bob_cfg.base_directory / "certificates"
            bridge_toml = tmp_path / "bridge.toml"
            bridge_toml.write_text(
                f'[node]\nendpoint = "{bob.addresses["bridge_endpoint"]}"\nusername = "bridge"\n'
                'password_env = "TEST_BRIDGE_PASSWORD"\n'
                f'[tls]\ncert_chain = "{certs / "tls.chain.pem"}"\nkey = "{certs / "tls.key.pem"}"\n'
                f'trust_root = "{certs / "network-root.cert.pem"}"\n'
                f'passphrase_file = "{certs / "passphrase"}"\n'
                f'[float]\ncontrol = ["127.0.0.1:{control_port}"]\ntunnel_cert = "{tunnel / "bridge.pem"}"\n'
                f'tunnel_key = "{tunnel / "bridge.key"}"\ntunnel_ca = "{tunnel / "tunnel-ca.pem"}"\n',
                encoding="utf-8",
            )
            bridge_proc = await trio.lowlevel.open_process(
                [*CLI, "bridge", "start", "--config", str(bridge_toml)],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env={**os.environ, **env},
            )  # fmt: skip
            assert bridge_proc.stdout is not None
            said = b""
            with trio.fail_after(60):
                while b"\n" not in said:
                    chunk = await bridge_proc.stdout.receive_some(4096)
                    assert chunk, "the bridge process exited"
                    said += chunk
            expected = f"float 127.0.0.1:{control_port} active, public port {bob_cfg.p2p_address.port}, for "
            assert expected in said.decode(), said
            assert listening_ports(bridge_proc.pid) == set()  # the bridge process listens for no peer
            assert bob_cfg.p2p_address.port not in listening_ports(bob.process.pid)
            assert bob_cfg.p2p_address.port in listening_ports(flt.pid)
            async with rpc.connect(alice.rpc_url, "ops", PASSWORD) as a:
                with trio.fail_after(60):
                    while len(await a.network_map()) < 2:  # noqa: ASYNC110 (another process's state)
                        await trio.sleep(0.2)
                    assert await a.start_flow("PingPong", recipient=BOB, rounds=3) == 3
    finally:
        for proc in (bridge_proc, flt):
            if proc is not None:
                await stop(proc)
    audit = (tmp_path / "float" / "audit.jsonl").read_text()
    assert "O=Alice" in audit
