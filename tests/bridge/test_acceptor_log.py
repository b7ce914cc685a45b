"""What the acceptor logs about a peer that connects and never completes the TLS handshake."""

from __future__ import annotations

import logging

import pytest
import trio

from corda_trio import amqp, bridge, pki, store, transport
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


async def test_a_member_attaching_links_to_other_addresses_gets_one_warning_and_every_one_is_counted(
    alice: pki.NodeCredentials,
    bob: pki.NodeCredentials,
    network: pki.NetworkCredentials,
    tmp_path: object,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Over a real socket and mutual TLS, Alice (a member) attaches 300 links Bob's acceptor refuses: a
    warning each before (``O=Alice...: refused a sender to 'x.17'``); now the first, the rest counted."""
    server_ctx, _ = contexts(bob, network.root.cert)
    _, client_ctx = contexts(alice, network.root.cert)
    caplog.set_level(logging.DEBUG, logger="corda_trio.bridge")
    async with store.open_broker(str(tmp_path)) as broker, trio.open_nursery() as nursery:
        inbox = await broker.declare_queue("p2p.inbound.DLbob")
        acceptor = bridge.InboundAcceptor(inbox=inbox, ssl_context=server_ctx)  # type: ignore[arg-type]
        port = await nursery.start(acceptor.run)
        with trio.fail_after(60):
            async with transport.open_amqp_connection(
                "127.0.0.1",
                port,
                ssl_context=client_ctx,  # type: ignore[arg-type]
            ) as conn:
                for i in range(100):
                    for attach in (
                        lambda i=i: conn.open_sender(f"x.{i}"),
                        lambda: conn.open_receiver(inbox.name),
                        lambda: conn.open_sender(inbox.name, settle_mode=amqp.SenderSettleMode.SETTLED),
                    ):
                        with pytest.raises(transport.LinkDetachedError):
                            await attach()
        nursery.cancel_scope.cancel()
    assert acceptor.refused_links == 300
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == [f"{alice.legal_name}: refused a sender to 'x.0'"]
    debug = [
        r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG and "refused" in r.getMessage()
    ]
    assert (
        len(debug) == 299
        and debug[-1] == f"{alice.legal_name}: refused a pre-settled sender to 'p2p.inbound.DLbob'"
    )


async def test_a_member_dropping_its_connections_gets_one_info_line_for_its_links(
    alice: pki.NodeCredentials,
    bob: pki.NodeCredentials,
    network: pki.NetworkCredentials,
    tmp_path: object,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Alice attaches a sender to the inbox and drops the connection without a close (a process killed),
    50 times: an info line each ("link ... ended: amqp:connection:forced: ..."); now one, the rest debug."""
    server_ctx, _ = contexts(bob, network.root.cert)
    _, client_ctx = contexts(alice, network.root.cert)
    caplog.set_level(logging.DEBUG, logger="corda_trio.bridge")
    async with store.open_broker(str(tmp_path)) as broker, trio.open_nursery() as nursery:
        inbox = await broker.declare_queue("p2p.inbound.DLbob")
        acceptor = bridge.InboundAcceptor(inbox=inbox, ssl_context=server_ctx)  # type: ignore[arg-type]
        port = await nursery.start(acceptor.run)
        with trio.fail_after(60):
            for _ in range(50):
                async with transport.open_amqp_connection(
                    "127.0.0.1",
                    port,
                    ssl_context=client_ctx,  # type: ignore[arg-type]
                ) as conn:
                    await conn.open_sender(inbox.name)
                    await trio.aclose_forcefully(conn._stream)
            await wait_until(
                lambda: sum(" ended: amqp:connection:forced" in r.getMessage() for r in caplog.records) == 50
            )
        nursery.cancel_scope.cancel()
    lines = [
        r.getMessage() for r in caplog.records if r.levelno >= logging.INFO and " ended" in r.getMessage()
    ]
    assert len(lines) == 1, lines[:3]
    assert lines[0].startswith(f"{alice.legal_name}: link ") and "amqp:connection:forced" in lines[0]
