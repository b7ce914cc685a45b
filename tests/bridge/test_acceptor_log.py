"""What the acceptor logs about a peer that connects and never completes the TLS handshake."""

from __future__ import annotations

import logging

import pytest
import trio

from corda_trio import bridge, pki, store
from tests.p2p_harness import contexts, wait_until


async def test_a_silent_connection_is_logged_with_the_reason(
    bob: pki.NodeCredentials,
    network: pki.NetworkCredentials,
    tmp_path: object,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """It logged "inbound HOST:PORT refused: " with nothing after the colon (a TooSlowError has no text)."""
    server_ctx, _ = contexts(bob, network.root.cert)
    caplog.set_level(logging.WARNING, logger="corda_trio.transport")
    async with store.open_broker(str(tmp_path)) as broker, trio.open_nursery() as nursery:
        inbox = await broker.declare_queue("p2p.inbound.DLbob")
        acceptor = bridge.InboundAcceptor(
            inbox=inbox,
            ssl_context=server_ctx,  # type: ignore[arg-type]
            config=bridge.AcceptorConfig(handshake_timeout_seconds=0.5),
        )
        port = await nursery.start(acceptor.run)
        with trio.fail_after(30):
            silent = await trio.open_tcp_stream("127.0.0.1", port)
            assert await silent.receive_some() == b""  # the acceptor gives up and closes
            await silent.aclose()
            await wait_until(lambda: any("refused" in r.getMessage() for r in caplog.records))
        nursery.cancel_scope.cancel()
    (line,) = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert line.endswith("refused: no TLS handshake within 0.5 s"), line
