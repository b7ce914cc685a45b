"""How long closing takes, and that our close reaches the peer: graceful, and when the owner is cancelled.

When the task that owns a connection is cancelled, the connection's reader is cancelled with it, so the
peer's reply to our ``close`` cannot be read by it: ``aclose`` then sends our close, reads the reply itself
for at most ``CANCELLED_CLOSE_TIMEOUT_SECONDS`` and closes. A graceful close waits for the peer's close at
most ``CLOSE_TIMEOUT_SECONDS`` in all. Virtual time (autojump clock, memory streams) checks the bounds
exactly; real sockets check them on a real network stack, with the peer reading our close before EOF.
"""

from __future__ import annotations

import datetime as dt
import functools
import time

import pytest
import trio
import trio.testing

from corda_trio import amqp, pki, transport

from .test_hostile import parse

PLAIN = amqp.ConnectionConfig(sasl=False, idle_timeout_ms=None)


class Silent:
    """The peer side of a handshake (our own engine, server role) that goes silent once it sees a close:
    it keeps reading, but never answers the close and never sends EOF."""

    def __init__(self) -> None:
        self.engine = amqp.Connection(PLAIN, client=False)
        self.seen = bytearray()

    def feed(self, data: bytes) -> bytes:
        """Take received bytes; return what to send back (nothing once a close arrived)."""
        self.seen += data
        try:
            self.engine.receive_data(data)
        except amqp.RemoteProtocolError:
            pass
        out = self.engine.data_to_send()
        return b"" if closes(self.seen) else out


async def silent_peer(stream: trio.abc.Stream, seen: bytearray) -> None:
    peer = Silent()
    peer.seen = seen
    while data := await stream.receive_some(65536):
        if out := peer.feed(data):
            await stream.send_all(out)


def closes(data: bytes | bytearray) -> list[amqp.Close]:
    return [p for p in parse(bytes(data)) if isinstance(p, amqp.Close)]


# --- virtual time ------------------------------------------------------------------------------------


async def owner_cancelled_after_open(stream: trio.abc.Stream) -> float:
    """Open a client connection over ``stream``, cancel its owner; return how long the exit took."""
    with trio.CancelScope() as scope:
        async with transport.open_amqp_over_stream(stream, config=PLAIN):
            scope.cancel()
            start = trio.current_time()
            await trio.sleep_forever()
    return trio.current_time() - start


async def test_cancelled_owner_with_a_silent_peer_closes_within_the_short_bound(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    ours, theirs = trio.testing.memory_stream_pair()
    seen = bytearray()
    nursery.start_soon(silent_peer, theirs, seen)
    with trio.fail_after(30):
        elapsed = await owner_cancelled_after_open(ours)
    assert elapsed <= transport.CANCELLED_CLOSE_TIMEOUT_SECONDS + 0.01  # was 4 s: nobody read the reply
    assert len(closes(seen)) == 1  # our close went out first


async def test_cancelled_owner_with_a_live_peer_closes_at_once_and_cleanly(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    ours, theirs = trio.testing.memory_stream_pair()
    server_done = trio.Event()
    result: dict[str, object] = {}

    async def server() -> None:
        async with transport.open_amqp_over_stream(theirs, client=False, config=PLAIN) as conn:
            await conn.wait_closed()
            result["error"] = conn.close_error
        server_done.set()

    nursery.start_soon(server)
    with trio.fail_after(30):
        elapsed = await owner_cancelled_after_open(ours)
        await server_done.wait()
    assert elapsed < 0.01  # the reply is read by aclose itself: no timeout involved
    error = result["error"]
    assert isinstance(error, transport.AmqpConnectionError) and error.condition is None  # a clean close


async def test_graceful_close_with_a_silent_peer_is_bounded_by_one_timeout(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    ours, theirs = trio.testing.memory_stream_pair()
    seen = bytearray()
    nursery.start_soon(silent_peer, theirs, seen)
    with trio.fail_after(30):
        async with transport.open_amqp_over_stream(ours, config=PLAIN):
            start = trio.current_time()
        elapsed = trio.current_time() - start
    assert transport.CLOSE_TIMEOUT_SECONDS - 0.01 <= elapsed <= transport.CLOSE_TIMEOUT_SECONDS + 0.01
    assert len(closes(seen)) == 1


async def test_graceful_close_with_a_live_peer_waits_for_its_close(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    ours, theirs = trio.testing.memory_stream_pair()
    replies: list[int] = []

    async def server() -> None:
        async with transport.open_amqp_over_stream(theirs, client=False, config=PLAIN) as conn:
            await conn.wait_closed()
            replies.append(1)

    nursery.start_soon(server)
    with trio.fail_after(30):
        async with transport.open_amqp_over_stream(ours, config=PLAIN) as conn:
            start = trio.current_time()
        assert trio.current_time() - start < 0.01
    assert conn._engine.state is amqp.ConnectionState.END  # both close frames exchanged
    assert replies == [1]


# --- real sockets ------------------------------------------------------------------------------------


async def test_cancelled_client_over_tcp_closes_fast_and_the_server_sees_the_close(
    nursery: trio.Nursery,
) -> None:
    ended_send, ended = trio.open_memory_channel[BaseException | None](20)

    async def handler(conn: transport.AmqpConnection) -> None:
        await conn.wait_closed()
        await ended_send.send(conn.close_error)

    listeners = await nursery.start(transport.serve_amqp, handler, 0)
    port = transport.listener_port(listeners)
    for _ in range(20):
        with trio.fail_after(20), trio.CancelScope() as scope:
            async with transport.open_amqp_connection("127.0.0.1", port):
                scope.cancel()
                start = time.monotonic()
                await trio.sleep_forever()
        # one round trip on loopback; the old wait was 4 s (the cancelled reader never read the reply)
        assert time.monotonic() - start < transport.CANCELLED_CLOSE_TIMEOUT_SECONDS
    with trio.fail_after(10):
        errors = [await ended.receive() for _ in range(20)]
    assert all(isinstance(e, transport.AmqpConnectionError) and e.condition is None for e in errors)


async def silent_tcp_server(nursery: trio.Nursery, received: trio.MemorySendChannel[bytearray]) -> int:
    """A TCP server that answers the AMQP handshake, then reads everything until EOF and reports it."""

    async def serve(stream: trio.SocketStream) -> None:
        seen = bytearray()
        await silent_peer(stream, seen)
        await received.send(seen)

    listeners = await nursery.start(trio.serve_tcp, serve, 0)
    return listeners[0].socket.getsockname()[1]  # type: ignore[no-any-return]


@pytest.mark.parametrize("cancelled", [True, False])
async def test_silent_tcp_peer_gets_our_close_then_eof_within_the_bound(
    nursery: trio.Nursery, cancelled: bool
) -> None:
    send, received = trio.open_memory_channel[bytearray](10)
    port = await silent_tcp_server(nursery, send)
    bound = transport.CANCELLED_CLOSE_TIMEOUT_SECONDS if cancelled else transport.CLOSE_TIMEOUT_SECONDS
    for run in range(5 if cancelled else 2):
        with trio.fail_after(20), trio.CancelScope() as scope:
            async with transport.open_amqp_connection("127.0.0.1", port, config=PLAIN):
                start = time.monotonic()
                if cancelled:
                    scope.cancel()
                    await trio.sleep_forever()
        elapsed = time.monotonic() - start
        assert bound - 0.05 <= elapsed < bound + 1.0  # the peer never answers: the whole bound, no more
        with trio.fail_after(10):
            seen = await received.receive()  # all the peer read before our EOF
        assert len(closes(seen)) == 1, run


async def test_cancelled_tls_client_sends_close_and_close_notify(nursery: trio.Nursery) -> None:
    now = dt.datetime.now(dt.UTC)
    network = pki.NetworkCredentials.create(now=now - dt.timedelta(hours=1))
    node = network.issue_node(pki.CordaX500Name.parse("O=Alice, L=London, C=GB"), now=now)
    kw = dict(cert_chain=node.tls_chain, key=node.tls.key, trust_root=network.root.cert)
    client_ctx, server_ctx = pki.client_ssl_context(**kw), pki.server_ssl_context(**kw)  # type: ignore[arg-type]
    results_send, results = trio.open_memory_channel[tuple[bytearray, bool]](1)

    async def serve(tcp: trio.SocketStream) -> None:
        tls = trio.SSLStream(tcp, server_ctx, server_side=True)
        peer = Silent()
        try:
            while chunk := await tls.receive_some(65536):  # b"" only after a close_notify
                if out := peer.feed(chunk):
                    await tls.send_all(out)
            clean = True
        except trio.BrokenResourceError:
            clean = False
        await trio.aclose_forcefully(tls)
        await results_send.send((peer.seen, clean))

    listeners = await nursery.start(trio.serve_tcp, serve, 0)
    port = listeners[0].socket.getsockname()[1]
    with trio.fail_after(20), trio.CancelScope() as scope:
        async with transport.open_amqp_connection("127.0.0.1", port, ssl_context=client_ctx, config=PLAIN):
            scope.cancel()
            start = time.monotonic()
            await trio.sleep_forever()
    elapsed = time.monotonic() - start
    assert elapsed < transport.CANCELLED_CLOSE_TIMEOUT_SECONDS + transport.CLOSE_NOTIFY_TIMEOUT_SECONDS + 0.5
    with trio.fail_after(10):
        seen, clean_eof = await results.receive()
    assert clean_eof and len(closes(seen)) == 1


# --- a peer that never opened ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "first_bytes",
    [
        b"AMQP\x09\x09\x09\x09",
        b"GET / HTTP/1.1\r\n\r\n",
        b"AMQP\x00\x01\x00\x00\x00\x00\x00\x04\x02\x00\x00\x00",
    ],
    ids=["bad-version", "not-amqp", "junk-frame-after-header"],
)
async def test_a_peer_that_never_opened_gets_our_header_and_is_not_waited_for_longer_than_the_short_bound(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock, first_bytes: bytes
) -> None:
    """It has no close to send: the goodbye waited the graceful 2 s for one, so each bad header held a
    connection slot that long. Now ``PRE_OPEN_CLOSE_TIMEOUT_SECONDS``; it still reads our header first."""
    ours, theirs = trio.testing.memory_stream_pair()
    got = bytearray()
    ended = trio.Event()

    async def hostile() -> None:  # sends its bytes, then reads (never closes) until we end the stream
        await theirs.send_all(first_bytes)
        while data := await theirs.receive_some(65536):
            got.extend(data)
        ended.set()

    nursery.start_soon(hostile)
    start = trio.current_time()
    with trio.fail_after(30), pytest.raises(transport.AmqpConnectionError):
        async with transport.open_amqp_over_stream(ours, client=False, config=PLAIN):
            pass
    await ended.wait()
    assert trio.current_time() - start <= transport.PRE_OPEN_CLOSE_TIMEOUT_SECONDS + 0.01
    assert transport.PRE_OPEN_CLOSE_TIMEOUT_SECONDS < transport.CLOSE_TIMEOUT_SECONDS
    assert bytes(got).startswith(b"AMQP\x00\x01\x00\x00")  # our header: what we speak


async def test_a_bad_header_over_mutual_tls_ends_within_the_short_bound_with_our_header(
    nursery: trio.Nursery,
) -> None:
    now = dt.datetime.now(dt.UTC)
    network = pki.NetworkCredentials.create(now=now - dt.timedelta(hours=1))
    bob = network.issue_node(pki.CordaX500Name.parse("O=Bob, L=New York, C=US"), now=now)
    alice = network.issue_node(pki.CordaX500Name.parse("O=Alice, L=London, C=GB"), now=now)

    async def handler(conn: transport.AmqpConnection) -> None:
        await trio.sleep_forever()

    server_ctx = pki.server_ssl_context(
        cert_chain=bob.tls_chain, key=bob.tls.key, trust_root=network.root.cert
    )
    listeners = await nursery.start(
        functools.partial(transport.serve_amqp, handler, 0, ssl_context=server_ctx)
    )
    port = transport.listener_port(listeners)
    ctx = pki.client_ssl_context(cert_chain=alice.tls_chain, key=alice.tls.key, trust_root=network.root.cert)
    for _ in range(3):
        tcp = await trio.open_tcp_stream("127.0.0.1", port)
        async with trio.SSLStream(tcp, ctx, server_hostname=None) as tls:
            await tls.do_handshake()
            await tls.send_all(b"AMQP\x09\x09\x09\x09")
            start, got = time.monotonic(), bytearray()
            with trio.fail_after(10):
                while data := await tls.receive_some(4096):  # b"": the server's close_notify
                    got.extend(data)
            elapsed = time.monotonic() - start
        assert bytes(got) == b"AMQP\x03\x01\x00\x00"  # we speak SASL first over a network connection
        assert (
            elapsed < transport.PRE_OPEN_CLOSE_TIMEOUT_SECONDS + transport.CLOSE_NOTIFY_TIMEOUT_SECONDS
        )  # was 2 s
