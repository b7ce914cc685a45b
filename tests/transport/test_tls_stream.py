"""``TlsStream``: TLS straight over a TCP socket, against ``trio.SSLStream`` (the reference) on real sockets.

Each test runs one side on our stream and the other on trio's, so both directions of every property are
checked against an independent implementation of the same TLS session (OpenSSL underneath both).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import os
import socket
import ssl
from collections.abc import AsyncIterator

import pytest
import trio
import trio.testing

from corda_trio import pki
from corda_trio.transport._tls import TlsStream, tls_over


@pytest.fixture(scope="module")
def network() -> pki.NetworkCredentials:
    return pki.NetworkCredentials.create(now=dt.datetime.now(dt.UTC) - dt.timedelta(hours=1))


@pytest.fixture(scope="module")
def contexts(network: pki.NetworkCredentials) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    now = dt.datetime.now(dt.UTC)
    node = network.issue_node(pki.CordaX500Name.parse("O=Alice, L=London, C=GB"), now=now)
    kw = dict(cert_chain=node.tls_chain, key=node.tls.key, trust_root=network.root.cert)
    return pki.client_ssl_context(**kw), pki.server_ssl_context(**kw)  # type: ignore[arg-type]


@contextlib.asynccontextmanager
async def pair(
    contexts: tuple[ssl.SSLContext, ssl.SSLContext], ours_is_client: bool
) -> AsyncIterator[tuple[trio.abc.Stream, trio.abc.Stream]]:
    """(ours, theirs): a connected, handshaken pair over loopback TCP."""
    client_ctx, server_ctx = contexts
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    async with trio.open_nursery() as nursery:
        accepted: list[trio.SocketStream] = []

        async def accept() -> None:
            accepted.append(await listeners[0].accept())  # type: ignore[arg-type]

        nursery.start_soon(accept)
        tcp_client = await trio.open_tcp_stream("127.0.0.1", port)
    await listeners[0].aclose()
    tcp_server = accepted[0]
    if ours_is_client:
        ours: trio.abc.Stream = TlsStream(tcp_client, client_ctx)
        theirs: trio.abc.Stream = trio.SSLStream(tcp_server, server_ctx, server_side=True)
    else:
        ours = TlsStream(tcp_server, server_ctx, server_side=True)
        theirs = trio.SSLStream(tcp_client, client_ctx)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(ours.do_handshake)  # type: ignore[attr-defined]
        nursery.start_soon(theirs.do_handshake)  # type: ignore[attr-defined]
    try:
        yield ours, theirs
    finally:
        await trio.aclose_forcefully(ours)
        await trio.aclose_forcefully(theirs)


async def _receive_exactly(stream: trio.abc.Stream, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = await stream.receive_some(65536)
        assert chunk, "end of stream before all bytes arrived"
        out += chunk
    return bytes(out)


def test_tls_over_picks_our_stream_only_for_tcp(contexts: tuple[ssl.SSLContext, ssl.SSLContext]) -> None:
    a, b = socket.socketpair()
    try:
        tcp = trio.SocketStream(trio.socket.from_stdlib_socket(a))
        assert isinstance(tls_over(tcp, contexts[0], server_side=False, server_hostname=None), TlsStream)
        memory, _ = trio.testing.memory_stream_pair()
        other = tls_over(memory, contexts[0], server_side=False, server_hostname=None)
        assert isinstance(other, trio.SSLStream)
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("ours_is_client", [True, False])
async def test_bulk_both_directions_at_once(
    contexts: tuple[ssl.SSLContext, ssl.SSLContext], ours_is_client: bool
) -> None:
    """4 MiB each way at the same time, in uneven pieces: every byte arrives, in order (digests match);
    both sides send while the other's socket buffer is full, so the writable waits are exercised."""
    rng = os.urandom(1 << 16)
    pieces = [rng[: (i * 7919) % 60000 + 1] for i in range(140)]
    blob = b"".join(pieces)
    async with pair(contexts, ours_is_client) as (ours, theirs):
        got: dict[str, bytes] = {}

        async def send(stream: trio.abc.Stream) -> None:
            for piece in pieces:
                await stream.send_all(piece)

        async def receive(stream: trio.abc.Stream, key: str) -> None:
            got[key] = await _receive_exactly(stream, len(blob))

        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(send, ours)
                nursery.start_soon(send, theirs)
                nursery.start_soon(receive, ours, "ours")
                nursery.start_soon(receive, theirs, "theirs")
    want = hashlib.sha256(blob).hexdigest()
    assert hashlib.sha256(got["ours"]).hexdigest() == want
    assert hashlib.sha256(got["theirs"]).hexdigest() == want


async def test_receive_returns_every_record_at_hand(contexts: tuple[ssl.SSLContext, ssl.SSLContext]) -> None:
    """Several TLS records already received come back from one call (trio's stream returns one record)."""
    async with pair(contexts, True) as (ours, theirs):
        for _ in range(8):
            await theirs.send_all(b"r" * 10_000)  # one record each
        await trio.sleep(0.2)
        with trio.fail_after(10):
            first = await ours.receive_some(1 << 20)
        assert len(first) > 16_384, len(first)
        rest = await _receive_exactly(ours, 80_000 - len(first))
        assert first + rest == b"r" * 80_000
        # and max_bytes is honoured
        await theirs.send_all(b"s" * 30_000)
        await trio.sleep(0.1)
        assert len(await ours.receive_some(100)) == 100


@pytest.mark.parametrize("ours_is_client", [True, False])
async def test_close_notify_both_ways(
    contexts: tuple[ssl.SSLContext, ssl.SSLContext], ours_is_client: bool
) -> None:
    """Our aclose sends close_notify (trio reads b"", not a broken stream); theirs reads as b"" here."""
    async with pair(contexts, ours_is_client) as (ours, theirs):
        await ours.send_all(b"last words")
        await ours.aclose()
        with trio.fail_after(10):
            assert await _receive_exactly(theirs, 10) == b"last words"
            assert await theirs.receive_some(100) == b""
        with pytest.raises(trio.ClosedResourceError):
            await ours.send_all(b"more")
    async with pair(contexts, ours_is_client) as (ours, theirs):
        await theirs.send_all(b"bye")
        await theirs.aclose()
        with trio.fail_after(10):
            assert await _receive_exactly(ours, 3) == b"bye"
            assert await ours.receive_some(100) == b""


async def test_eof_without_close_notify_is_broken(contexts: tuple[ssl.SSLContext, ssl.SSLContext]) -> None:
    """A TCP end of file without close_notify (a truncation) raises BrokenResourceError, not b""."""
    async with pair(contexts, True) as (ours, theirs):
        await theirs.send_all(b"partial")
        await theirs.transport_stream.aclose()  # type: ignore[attr-defined]
        with trio.fail_after(10):
            assert await _receive_exactly(ours, 7) == b"partial"
            with pytest.raises(trio.BrokenResourceError) as info:
                await ours.receive_some(100)
        assert isinstance(info.value.__cause__, ssl.SSLError)
        with pytest.raises(trio.BrokenResourceError):
            await ours.receive_some(100)


async def test_concurrent_use_is_refused(contexts: tuple[ssl.SSLContext, ssl.SSLContext]) -> None:
    async with pair(contexts, True) as (ours, _theirs):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ours.receive_some, 10)
            await trio.sleep(0.05)
            with pytest.raises(trio.BusyResourceError):
                await ours.receive_some(10)
            nursery.cancel_scope.cancel()


async def test_cancelled_send_breaks_the_stream(contexts: tuple[ssl.SSLContext, ssl.SSLContext]) -> None:
    """A send cancelled while the socket is full may have put part of a record out: the stream is broken
    afterwards (nothing can follow a partial record), and closing it still works."""
    async with pair(contexts, True) as (ours, _theirs):
        with trio.move_on_after(0.5) as scope:
            while True:  # the peer never reads: the socket buffers fill up and the send waits
                await ours.send_all(b"x" * 65536)
        assert scope.cancelled_caught
        with pytest.raises(trio.BrokenResourceError):
            await ours.send_all(b"y")
        with trio.fail_after(5):
            await ours.aclose()


async def test_cancelled_receive_loses_nothing(contexts: tuple[ssl.SSLContext, ssl.SSLContext]) -> None:
    """A receive cancelled while waiting for the socket is harmless: the next one gets the bytes."""
    async with pair(contexts, True) as (ours, theirs):
        with trio.move_on_after(0.1):
            await ours.receive_some(100)
        await theirs.send_all(b"after")
        with trio.fail_after(10):
            assert await _receive_exactly(ours, 5) == b"after"


async def test_peer_certificate_and_chain(contexts: tuple[ssl.SSLContext, ssl.SSLContext]) -> None:
    """The peer checks read the certificate and the verified chain through our stream."""
    async with pair(contexts, True) as (ours, _theirs):
        name = pki.check_peer_is_network_node(ours)  # type: ignore[arg-type]
        assert str(name) == "O=Alice, L=London, C=GB"
        assert ours.version() in ("TLSv1.2", "TLSv1.3")  # type: ignore[attr-defined]


async def test_handshake_failure_leaves_the_alert_to_send(
    contexts: tuple[ssl.SSLContext, ssl.SSLContext], network: pki.NetworkCredentials
) -> None:
    """A client from another network: our server's handshake fails with BrokenResourceError and the alert
    OpenSSL wrote is handed over, so the client learns why instead of seeing a bare close."""
    now = dt.datetime.now(dt.UTC)
    other = pki.NetworkCredentials.create(now=now - dt.timedelta(hours=1))
    stranger = other.issue_node(pki.CordaX500Name.parse("O=Mallory, L=Paris, C=FR"), now=now)
    # it trusts our root (so it accepts our server), but its own certificate comes from another network
    kw = dict(cert_chain=stranger.tls_chain, key=stranger.tls.key, trust_root=network.root.cert)
    stranger_ctx = pki.client_ssl_context(**kw)  # type: ignore[arg-type]
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    client_error: list[BaseException] = []

    async def client() -> None:
        tls = trio.SSLStream(await trio.open_tcp_stream("127.0.0.1", port), stranger_ctx)
        try:
            await tls.do_handshake()
            await tls.receive_some(10)  # TLS 1.3: the server's verdict arrives after the client's Finished
        except trio.BrokenResourceError as exc:
            client_error.append(exc)
        await trio.aclose_forcefully(tls)

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client)
            tcp = await listeners[0].accept()
            ours = TlsStream(tcp, contexts[1], server_side=True)  # type: ignore[arg-type]
            with pytest.raises(trio.BrokenResourceError):
                await ours.do_handshake()
            alert = ours.pending_output()
            assert alert, "no alert was queued for the peer"
            await tcp.send_all(alert)
            await trio.aclose_forcefully(ours)
    await listeners[0].aclose()
    assert client_error
    cause = client_error[0].__cause__
    assert isinstance(cause, ssl.SSLError) and "ALERT" in str(cause).upper(), cause


@pytest.mark.parametrize("ours_is_client", [True, False])
async def test_send_all_nowait_sends_at_once_or_leaves_the_rest_to_send_all(
    contexts: tuple[ssl.SSLContext, ssl.SSLContext], ours_is_client: bool
) -> None:
    """``send_all_nowait`` puts a piece on the socket without a scheduling point; once the peer stops
    reading it answers ``False`` with the piece taken, and ``send_all(b"")`` finishes it: the peer gets every
    byte once, in order, mixed with ordinary sends."""
    pieces = [os.urandom((i * 4099) % 50_000 + 1) for i in range(120)]
    blob = b"".join(pieces)
    async with pair(contexts, ours_is_client) as (ours, theirs):
        assert isinstance(ours, TlsStream)
        with trio.testing.assert_no_checkpoints():
            assert ours.send_all_nowait(b"hello")  # an empty socket buffer takes it at once
        assert await _receive_exactly(theirs, 5) == b"hello"
        results: list[bool] = []

        async def send() -> None:
            for i, piece in enumerate(pieces):
                if i % 3 == 2:
                    await ours.send_all(piece)
                    continue
                with trio.testing.assert_no_checkpoints():
                    done = ours.send_all_nowait(piece)
                results.append(done)
                if not done:
                    await ours.send_all(b"")
                await trio.lowlevel.checkpoint()

        got: list[bytes] = []

        async def receive_late() -> None:
            await trio.sleep(0.3)  # the socket buffers fill up meanwhile
            got.append(await _receive_exactly(theirs, len(blob)))

        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(send)
                nursery.start_soon(receive_late)
    assert hashlib.sha256(got[0]).hexdigest() == hashlib.sha256(blob).hexdigest()
    assert True in results and False in results  # both ways were taken


async def test_send_all_nowait_refusals(contexts: tuple[ssl.SSLContext, ssl.SSLContext]) -> None:
    """Before the handshake it takes nothing (``WouldBlock``: ``send_all`` does the handshake); on a
    closed stream it raises like ``send_all``."""
    client_ctx = contexts[0]
    a, b = socket.socketpair()
    try:
        tcp = trio.SocketStream(trio.socket.from_stdlib_socket(a))
        fresh = TlsStream(tcp, client_ctx)
        with pytest.raises(trio.WouldBlock):
            fresh.send_all_nowait(b"too early")
        assert not fresh.pending_output()
    finally:
        a.close()
        b.close()
    async with pair(contexts, True) as (ours, _theirs):
        assert isinstance(ours, TlsStream)
        await ours.aclose()
        with pytest.raises(trio.ClosedResourceError):
            ours.send_all_nowait(b"after close")
