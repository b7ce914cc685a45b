"""The external-bridge setup under a low open-file limit (``ulimit -n 64``): the node's local bridge endpoint
and the ``corda-trio bridge start`` process's acceptor of peers.

The node planned its listeners' caps for the limit (``corda_trio.node._descriptors``), but in ``[bridge]
mode = "external"`` its bridge endpoint kept the transport's default cap of 512 connections, and the bridge
process planned nothing: its acceptor took 512 too, so a flood of TCP connections could take every
descriptor either process had. Now both are planned as the node's listeners are, with the same one-line
warning at start, and a client over the cap gets a closed socket at once."""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
from pathlib import Path

import attrs
import pytest
import trio

from corda_trio.node import _config
from corda_trio.node._processes import _limit_files, start_node_process

from .netutil import make_network, stop
from .test_flows_e2e import ALICE

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="sets the children's RLIMIT_NOFILE")

LIMIT = 64


def _cap(warning: str, listener: str) -> int:
    """The cap the start warning gives ``listener`` (``... take at most bridge 9, rpc 4 ... connections``)."""
    match = re.search(rf"its listeners take at most [^:]*?\b{listener} (\d+)", warning)
    assert match, warning
    return int(match.group(1))


async def _closed_at_once(host: str, port: int, count: int) -> int:
    """Open ``count`` idle TCP connections to ``host:port``: how many the server closed within a second."""
    streams = [await trio.open_tcp_stream(host, port) for _ in range(count)]
    closed = 0
    try:
        for stream in streams:
            with trio.move_on_after(1.0 / count):
                try:
                    if await stream.receive_some() == b"":
                        closed += 1
                except trio.BrokenResourceError:
                    closed += 1
    finally:
        for stream in streams:
            await stream.aclose()
    return closed


async def test_the_bridge_endpoint_and_the_bridge_process_are_capped_for_ulimit_64(tmp_path: Path) -> None:
    ((alice_path, alice_cfg),) = make_network(tmp_path / "net", [ALICE], shutdown_timeout_seconds=0.5)
    alice_cfg = attrs.evolve(
        alice_cfg,
        bridge_mode=_config.BridgeMode.EXTERNAL,
        bridge_password=_config.KeyPassphrase(env="TEST_BRIDGE_PASSWORD"),
    )
    alice_path.write_text(_config.dump_node_config(alice_cfg, alice_cfg.base_directory), encoding="utf-8")
    env = {"TEST_BRIDGE_PASSWORD": "bridge-secret"}
    console = tmp_path / "alice.stderr"
    alice = await start_node_process(
        alice_path, _config.load_node_config(alice_path), env=env, console=console, open_files_limit=LIMIT
    )
    bridge = None
    try:
        warning = console.read_text().splitlines()[0]
        assert f"the open-file limit (ulimit -n) is {LIMIT}, below the " in warning, warning
        endpoint_cap = _cap(warning, "bridge")
        host, port = alice.addresses["bridge_endpoint"].rsplit(":", 1)
        with trio.fail_after(30):
            assert await _closed_at_once(host, int(port), endpoint_cap + 4) >= 4
        certs = alice_cfg.base_directory / "certificates"
        bridge_toml = tmp_path / "bridge.toml"
        bridge_toml.write_text(
            f'[node]\nendpoint = "{alice.addresses["bridge_endpoint"]}"\nusername = "bridge"\n'
            'password_env = "TEST_BRIDGE_PASSWORD"\n'
            '[p2p]\nlisten = "127.0.0.1:0"\n'
            f'[tls]\ncert_chain = "{certs / "tls.chain.pem"}"\nkey = "{certs / "tls.key.pem"}"\n'
            f'trust_root = "{certs / "network-root.cert.pem"}"\npassphrase_file = "{certs / "passphrase"}"\n',
            encoding="utf-8",
        )
        bridge = await trio.lowlevel.open_process(
            [sys.executable, "-m", "corda_trio", "bridge", "start", "--config", str(bridge_toml)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, **env},
            preexec_fn=functools.partial(_limit_files, LIMIT),
        )  # fmt: skip
        assert bridge.stdout is not None and bridge.stderr is not None
        out = b""
        with trio.fail_after(60):
            while b"corda-trio bridge: listening on " not in out:
                chunk = await bridge.stdout.receive_some()
                assert chunk, out
                out += chunk
        listening = out.decode().split("corda-trio bridge: listening on ", 1)[1].split()[0]
        p2p_host, p2p_port = listening.rsplit(":", 1)
        with trio.fail_after(30):
            err = b""
            while b"\n" not in err:
                chunk = await bridge.stderr.receive_some()
                assert chunk, err
                err += chunk
        first = err.decode().splitlines()[0]
        assert f"WARNING corda_trio.bridge: the open-file limit (ulimit -n) is {LIMIT}, below the " in first
        assert "this bridge process needs" in first and "rpc" not in first, first
        acceptor_cap = _cap(first, "p2p")
        with trio.fail_after(30):
            assert await _closed_at_once(p2p_host, int(p2p_port), acceptor_cap + 4) >= 4
        assert bridge.returncode is None and alice.process.returncode is None
    finally:
        if bridge is not None:
            await stop(bridge, timeout_seconds=30)
        code = await alice.stop()
    assert code == 0, console.read_text()
    assert "Traceback" not in console.read_text()
