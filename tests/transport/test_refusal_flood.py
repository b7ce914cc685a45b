"""What anyone who can open a TCP connection can make ``serve_amqp`` log is bounded per source address: real
sockets, real TLS. Each of 2,000 plain-TCP clients sending garbage was a warning line (and each client with a
valid identity sending a bad AMQP header two lines: the violation, then "inbound ... ended") in the log
and on its stderr; a node run for a day could be made to write millions. Now the first refusal of an address
is logged in full with its reason, the rest of the minute counted (``InboundRefusals.counts``)."""

from __future__ import annotations

import datetime as dt
import functools
import logging

import pytest
import trio
import trio.testing

from corda_trio import pki, transport

NOW = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=30)
BOB = pki.CordaX500Name.parse("O=Bob, L=New York, C=US")
ALICE = pki.CordaX500Name.parse("O=Alice, L=London, C=GB")


@pytest.fixture(scope="module")
def network() -> pki.NetworkCredentials:
    return pki.NetworkCredentials.create(now=NOW)


async def _serve(
    nursery: trio.Nursery, network: pki.NetworkCredentials, refusals: transport.InboundRefusals
) -> int:
    bob = network.issue_node(BOB, now=NOW)

    async def handler(conn: transport.AmqpConnection) -> None:
        await trio.sleep_forever()

    ctx = pki.server_ssl_context(cert_chain=bob.tls_chain, key=bob.tls.key, trust_root=network.root.cert)
    listeners = await nursery.start(
        functools.partial(
            transport.serve_amqp, handler, 0, ssl_context=ctx, peer_check=pki.check_peer_is_network_node,
            refusals=refusals,
        )
    )  # fmt: skip
    return transport.listener_port(listeners)


async def _flood(count: int, connect_and_misbehave: object) -> None:
    limit = trio.CapacityLimiter(20)

    async def one() -> None:
        async with limit:
            await connect_and_misbehave()  # type: ignore[operator]

    async with trio.open_nursery() as nursery:
        for _ in range(count):
            nursery.start_soon(one)


def _lines(caplog: pytest.LogCaptureFixture, *, summaries: bool = True) -> list[str]:
    """The lines logged at info or above; without the per-minute summaries unless ``summaries`` (a flood on a
    loaded machine may outlast a minute, and then gets one, honestly)."""
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    return lines if summaries else [line for line in lines if " more inbound connections from " not in line]


async def _read_to_end(stream: trio.abc.Stream) -> None:
    try:
        while await stream.receive_some(4096):
            pass
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass


async def test_2000_bad_handshakes_from_one_address_are_counted_and_logged_in_a_line(
    nursery: trio.Nursery, network: pki.NetworkCredentials, caplog: pytest.LogCaptureFixture
) -> None:
    refusals = transport.InboundRefusals()
    port = await _serve(nursery, network, refusals)

    async def garbage() -> None:
        async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
            await stream.send_all(b"GET / HTTP/1.1\r\n\r\n" + b"x" * 100)
            await _read_to_end(stream)

    with caplog.at_level(logging.INFO, logger="corda_trio.transport"), trio.fail_after(120):
        await _flood(2000, garbage)
        while refusals.counts["tls"] < 2000:  # noqa: ASYNC110 (the server counts after the client saw its end)
            await trio.sleep(0.01)
    assert refusals.counts == {"tls": 2000}
    lines = _lines(caplog, summaries=False)
    assert len(lines) == 1, lines[:5]
    assert lines[0].startswith("inbound 127.0.0.1:") and "refused: TLS handshake failed: " in lines[0]
    assert "HTTP_REQUEST" in lines[0], lines  # the reason, in full


async def test_bad_amqp_from_a_valid_identity_is_counted_and_logged_in_a_line_per_address(
    nursery: trio.Nursery, network: pki.NetworkCredentials, caplog: pytest.LogCaptureFixture
) -> None:
    """A member's TLS identity, then a bad AMQP header: the violation and the end of the connection were two
    lines per connection. Another address still gets its own first line, in full, within the same minute."""
    refusals = transport.InboundRefusals()
    port = await _serve(nursery, network, refusals)
    alice = network.issue_node(ALICE, now=NOW)
    ctx = pki.client_ssl_context(cert_chain=alice.tls_chain, key=alice.tls.key, trust_root=network.root.cert)

    def bad_header(source: str) -> object:
        async def connect() -> None:
            tcp = await trio.open_tcp_stream("127.0.0.1", port, local_address=source)
            async with trio.SSLStream(tcp, ctx, server_hostname=None) as tls:
                await tls.do_handshake()
                await tls.send_all(b"AMQP\x09\x09\x09\x09")
                await _read_to_end(tls)

        return connect

    with caplog.at_level(logging.INFO, logger="corda_trio.transport"), trio.fail_after(120):
        await _flood(100, bad_header("127.0.0.1"))  # (each a full mutual-TLS handshake, both ends here)
        await _flood(1, bad_header("127.0.0.2"))
        while refusals.counts["amqp"] < 101:  # noqa: ASYNC110 (counted by the server tasks)
            await trio.sleep(0.01)
    assert refusals.counts == {"amqp": 101}
    lines = _lines(caplog, summaries=False)
    assert len(lines) == 2, lines[:5]
    for line, source in zip(lines, ["127.0.0.1", "127.0.0.2"], strict=True):
        assert line.startswith(f"inbound {source}:"), lines
        assert "refused: protocol violation: unsupported protocol header b'AMQP\\t\\t\\t\\t'" in line, lines


async def test_a_burst_that_goes_quiet_gets_its_count_within_two_minutes(
    nursery: trio.Nursery,
    network: pki.NetworkCredentials,
    caplog: pytest.LogCaptureFixture,
    autojump_clock: trio.testing.MockClock,
) -> None:
    refusals = transport.InboundRefusals()
    port = await _serve(nursery, network, refusals)

    async def garbage() -> None:
        async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
            await stream.send_all(b"\x16\x03\x01\x00\x01\x00")  # a TLS record too short to be a hello
            await stream.send_eof()
            await _read_to_end(stream)

    with caplog.at_level(logging.WARNING, logger="corda_trio.transport"):
        await _flood(50, garbage)
        while refusals.counts["tls"] < 50:  # noqa: ASYNC110 (counted by the server tasks)
            await trio.sleep(0.01)
        await trio.sleep(121)
    lines = _lines(caplog)
    assert len(lines) == 2, lines
    assert lines[1].startswith("49 more inbound connections from 127.0.0.1 refused in the last "), lines


async def test_connections_that_end_are_logged_at_debug_when_normal_and_once_per_host_with_an_error(
    nursery: trio.Nursery, network: pki.NetworkCredentials, caplog: pytest.LogCaptureFixture
) -> None:
    """A handler that raises its connection's error when the connection ends (as the bridges' watchers do):
    each of a member's 100 connections closed normally and each of 100 dropped without a close was an info
    line "inbound HOST:PORT ended: ..."; now the normal ends are at debug and those with an error are one
    line per source host a minute, the rest counted into its summary."""
    bob = network.issue_node(BOB, now=NOW)
    alice = network.issue_node(ALICE, now=NOW)
    refusals = transport.InboundRefusals()

    async def handler(conn: transport.AmqpConnection) -> None:
        await conn.wait_closed()
        raise conn.close_error or transport.AmqpConnectionError("the connection ended")

    ctx = pki.server_ssl_context(cert_chain=bob.tls_chain, key=bob.tls.key, trust_root=network.root.cert)
    listeners = await nursery.start(
        functools.partial(transport.serve_amqp, handler, 0, ssl_context=ctx, refusals=refusals)
    )
    port = transport.listener_port(listeners)
    client = pki.client_ssl_context(
        cert_chain=alice.tls_chain, key=alice.tls.key, trust_root=network.root.cert
    )

    async def connect(*, drop: bool) -> None:
        async with transport.open_amqp_connection("127.0.0.1", port, ssl_context=client) as conn:
            if drop:  # (a process killed: no close frame)
                await trio.aclose_forcefully(conn._stream)

    with caplog.at_level(logging.DEBUG, logger="corda_trio.transport"), trio.fail_after(120):
        for _ in range(100):
            await connect(drop=False)
        while sum("ended: the peer closed the connection" in r.getMessage() for r in caplog.records) < 100:  # noqa: ASYNC110
            await trio.sleep(0.01)
        for _ in range(100):
            await connect(drop=True)
        while sum("ended: amqp:connection:forced" in r.getMessage() for r in caplog.records) < 100:  # noqa: ASYNC110
            await trio.sleep(0.01)
    lines = _lines(caplog, summaries=False)
    assert len(lines) == 1, lines[:5]
    assert lines[0].startswith("inbound 127.0.0.1:") and " ended: amqp:connection:forced: " in lines[0]
    assert all(r.levelno < logging.WARNING for r in caplog.records)
    assert refusals.counts == {}
