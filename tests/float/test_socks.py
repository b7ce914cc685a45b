"""SOCKS outbound: a bridge reaches its peer through a SOCKS5 / SOCKS4 proxy (pproxy, a maintained server)."""

from __future__ import annotations

import functools
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from corda_trio import bridge, messaging, pki, transport
from tests.p2p_harness import running_node, wait_until
from tests.ports import free_port

from .test_processes import ENV, listening

TOPIC = "test.p2p"


@pytest.fixture
def proxy(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """A pproxy SOCKS5 + SOCKS4 server on a free port; yields (port, its verbose log)."""
    port = free_port()
    log = tmp_path / "pproxy.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "pproxy", "-l", f"socks5+socks4://127.0.0.1:{port}", "-v"],
            stdout=out, stderr=subprocess.STDOUT, env=ENV,
        )  # fmt: skip
        try:
            for _ in range(200):
                if listening(port):
                    break
                trio.run(trio.sleep, 0.05)
            yield port, log
        finally:
            process.kill()
            process.wait()


@pytest.mark.parametrize("version", ["socks5", "socks4"])
async def test_a_bridge_delivers_through_a_socks_proxy(
    version: str,
    proxy: tuple[int, Path],
    alice: pki.NodeCredentials,
    bob: pki.NodeCredentials,
    network: pki.NetworkCredentials,
    tmp_path: Path,
) -> None:
    port, log = proxy
    n = 50
    peers = messaging.PeerDirectory()
    via = transport.SocksProxy(host="127.0.0.1", port=port, version=version)  # type: ignore[arg-type]
    config = bridge.BridgeConfig(proxy=via, initial_backoff_seconds=0.05, max_backoff_seconds=0.2)
    root = network.root.cert
    got: dict[str, list[bytes]] = defaultdict(list)
    async with (
        running_node(alice, root, tmp_path / "a", peers=peers, bridge_config=config) as a,
        running_node(bob, root, tmp_path / "b", peers=peers) as b,
    ):

        async def handler(message: messaging.ReceivedMessage) -> None:
            got[message.validated_user or ""].append(message.data)

        b.service.add_message_handler(TOPIC, handler)
        peers.put(a.as_peer())
        peers.put(b.as_peer())
        with trio.fail_after(60):
            for i in range(n):
                await a.service.send(a.service.create_message(TOPIC, b"%d" % i), bob.legal_name)
            await wait_until(lambda: len(got[str(alice.legal_name)]) >= n)
    assert got == {str(alice.legal_name): [b"%d" % i for i in range(n)]}
    # the proxy carried the bridge's connection to Bob's P2P port
    assert f"127.0.0.1:{b.port}" in log.read_text()


async def test_a_dead_proxy_means_no_delivery_and_a_clear_error(
    alice: pki.NodeCredentials, bob: pki.NodeCredentials, network: pki.NetworkCredentials, tmp_path: Path
) -> None:
    peers = messaging.PeerDirectory()
    via = transport.SocksProxy(host="127.0.0.1", port=free_port())
    config = bridge.BridgeConfig(proxy=via, initial_backoff_seconds=0.05, max_backoff_seconds=0.2)
    root = network.root.cert
    async with (
        running_node(alice, root, tmp_path / "a", peers=peers, bridge_config=config) as a,
        running_node(bob, root, tmp_path / "b", peers=peers) as b,
    ):
        peers.put(b.as_peer())
        await a.service.send(a.service.create_message(TOPIC, b"x"), bob.legal_name)
        with trio.fail_after(30):
            await wait_until(lambda: any(x.failures >= 2 for x in a.manager.bridges().values()))
        (one,) = a.manager.bridges().values()
        assert one.delivered == 0 and b.service.inbox.statistics().depth == 0
        assert "Connection refused" in (one.last_error or "") or "OSError" in (one.last_error or "")


async def test_socks5_refusal_is_a_socks_error() -> None:
    """A SOCKS5 server that answers 'connection refused' (05 01 00 01 ...): SocksError naming the code."""

    async def fake(stream: trio.SocketStream) -> None:
        assert await stream.receive_some(3) == b"\x05\x01\x00"
        await stream.send_all(b"\x05\x00")
        await stream.receive_some(100)
        await stream.send_all(b"\x05\x05\x00\x01\x00\x00\x00\x00\x00\x00")

    async with trio.open_nursery() as nursery:
        (listener,) = await nursery.start(functools.partial(trio.serve_tcp, fake, 0, host="127.0.0.1"))
        port = listener.socket.getsockname()[1]
        with pytest.raises(transport.SocksError, match="CONNECTION_REFUSED"):
            await transport.open_socks_stream(
                transport.SocksProxy(host="127.0.0.1", port=port), "peer.example", 1
            )
        nursery.cancel_scope.cancel()
