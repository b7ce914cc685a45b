"""The map service's HTTP details over real loopback sockets: the 16 KiB limit on a request head, however the
head arrives, and ``Expect: 100-continue``."""

from __future__ import annotations

import socket
import time

import pytest
import trio

from corda_trio import network, pki

from .conftest import NOW, signed_node_info
from .test_server import http_call

LIMIT = 16 * 1024


def _head(size: int, *, many_headers: bool = False) -> bytes:
    """A ``GET /network-map`` head of exactly ``size`` bytes (request line to blank line): one long header
    line, or as many 14-byte headers as fit plus one that pads to the size."""
    start, end = b"GET /network-map HTTP/1.1\r\nhost: x\r\n", b"\r\n"
    room = size - len(start) - len(end)
    lines = b""
    if many_headers:
        count = (room - 20) // 14
        lines = b"".join(b"x-h%05d: v\r\n" % i for i in range(count))
        room -= len(lines)
    pad = b"x-pad: " + b"a" * (room - len(b"x-pad: \r\n")) + b"\r\n"
    head = start + lines + pad + end
    assert len(head) == size
    return head


def _exchange(port: int, writes: list[bytes], pause: float = 0.0) -> bytes:
    """Send ``writes`` (``pause`` seconds apart, Nagle off) without half-closing, then read until the server
    closes (or 5 s pass). A server that stops listening half way may reset the rest of the sending; what it
    answered before is still read."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            for i, data in enumerate(writes):
                if i and pause:
                    time.sleep(pause)
                sock.sendall(data)
        except OSError:
            pass
        chunks = []
        try:
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        except (ConnectionResetError, TimeoutError):
            pass
    return b"".join(chunks)


def _trickle(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


@pytest.mark.parametrize(
    ("writes", "pause"),
    [
        ([_head(40_000)], 0.0),
        ([_head(3000 * 14, many_headers=True)], 0.0),
        ([_head(LIMIT + 1)], 0.0),
        ([_head(LIMIT + 1, many_headers=True)], 0.0),
        (_trickle(_head(40_000), 500), 0.001),
        ([_head(LIMIT + 1)[:-1], _head(LIMIT + 1)[-1:]], 0.2),  # incomplete at exactly the limit
    ],
    ids=["40KB-line", "3000-headers", "limit+1", "limit+1-headers", "small-writes", "last-byte-over"],
)
async def test_a_head_over_16_kib_gets_431_and_a_closed_connection(
    map_server: tuple[network.NetworkMapService, int], writes: list[bytes], pause: float
) -> None:
    """It was answered 200 when the whole head came in one read (h11 bounds only incomplete heads)."""
    _, port = map_server
    with trio.fail_after(20):
        reply = await trio.to_thread.run_sync(_exchange, port, writes, pause)
    assert reply.startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n"), reply[:200]
    assert b"\r\nconnection: close\r\n" in reply
    assert reply.endswith(b"\r\n\r\nrequest head larger than 16384 bytes\n"), reply[-200:]
    assert (await http_call(port, "GET", "/network-map"))[0] == 200  # and the server serves on


@pytest.mark.parametrize("many_headers", [False, True], ids=["one-line", "headers"])
async def test_a_head_of_exactly_16_kib_is_served_and_the_connection_kept(
    map_server: tuple[network.NetworkMapService, int], many_headers: bool
) -> None:
    _, port = map_server
    head = _head(LIMIT, many_headers=many_headers)
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        with trio.fail_after(20):
            for _ in range(2):  # twice on one connection: the limit is per request
                await stream.send_all(head)
                reply = b""
                while b"\r\n\r\n" not in reply:
                    reply += await stream.receive_some()
                assert reply.startswith(b"HTTP/1.1 200 "), reply[:200]
                length = int(reply.split(b"content-length: ")[1].split(b"\r\n")[0])
                while len(reply) < reply.index(b"\r\n\r\n") + 4 + length:
                    reply += await stream.receive_some()


async def _receive_head(stream: trio.SocketStream, buffer: bytearray) -> bytes:
    """The next response head from ``stream`` (``buffer`` keeps what follows it)."""
    while (end := buffer.find(b"\r\n\r\n")) < 0:
        chunk = await stream.receive_some()
        assert chunk, f"closed after {bytes(buffer)!r}"
        buffer += chunk
    head = bytes(buffer[: end + 4])
    del buffer[: end + 4]
    return head


async def _receive_body(stream: trio.SocketStream, buffer: bytearray, head: bytes) -> bytes:
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    while len(buffer) < length:
        buffer += await stream.receive_some()
    body = bytes(buffer[:length])
    del buffer[:length]
    return body


async def test_expect_100_continue_gets_100_before_the_body(
    map_server: tuple[network.NetworkMapService, int], alice: pki.NodeCredentials
) -> None:
    """The client waited for a 100 that never came, and sent its body only at its own timeout."""
    _, port = map_server
    info = signed_node_info(alice)
    head = (
        b"POST /network-map/publish HTTP/1.1\r\nhost: x\r\ncontent-type: application/octet-stream\r\n"
        b"expect: 100-continue\r\ncontent-length: %d\r\n\r\n" % len(info)
    )
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        buffer = bytearray()
        for expected in (b"added ", b"unchanged "):  # twice on one connection
            await stream.send_all(head)
            with trio.fail_after(5):
                interim = await _receive_head(stream, buffer)
            assert interim.startswith(b"HTTP/1.1 100 "), interim
            await stream.send_all(info)
            with trio.fail_after(10):
                final = await _receive_head(stream, buffer)
                assert final.startswith(b"HTTP/1.1 200 "), final
                assert (await _receive_body(stream, buffer, final)).startswith(expected)


async def test_expect_100_continue_with_a_body_too_large_gets_413_without_100(
    map_server: tuple[network.NetworkMapService, int],
) -> None:
    _, port = map_server
    head = (
        b"POST /network-map/publish HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\n"
        b"content-length: %d\r\n\r\n" % (300 * 1024)
    )
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        await stream.send_all(head)
        buffer = bytearray()
        with trio.fail_after(5):
            final = await _receive_head(stream, buffer)
        assert final.startswith(b"HTTP/1.1 413 "), final


@pytest.mark.parametrize("announced", [True, False], ids=["content-length", "chunked"])
async def test_a_body_too_large_sent_at_once_still_reads_its_413(
    map_server: tuple[network.NetworkMapService, int], announced: bool
) -> None:
    """A client that sends a too-large body without waiting (no Expect) reads the 413: the server lets it
    read the answer before closing, instead of closing with its body unread (a reset that could destroy
    the answer before the client read it)."""
    _, port = map_server
    body = b"x" * (1024 * 1024)
    if announced:
        request = b"POST /network-map/publish HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n" % len(body)
        writes = [request + body[:65536], *_trickle(body[65536:], 65536)]
    else:
        head = b"POST /network-map/publish HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n"
        chunks = [b"%x\r\n%s\r\n" % (len(part), part) for part in _trickle(body, 65536)]
        writes = [head, *chunks, b"0\r\n\r\n"]
    answer = await trio.to_thread.run_sync(_exchange, port, writes)
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]


@pytest.mark.parametrize(
    "hosts",
    [("0.0.0.0",), ("::",), ("::ffff:0.0.0.0",), ("0",), ("0x0",), ("10.0.0.5", "0.0.0.0")],
    ids=["0.0.0.0", "::", "v4-mapped", "0", "0x0", "good-and-wildcard"],
)
async def test_a_node_info_listing_a_wildcard_address_is_refused_403_invalid_address(
    map_server: tuple[network.NetworkMapService, int],
    creds: pki.NetworkCredentials,
    alice: pki.NodeCredentials,
    hosts: tuple[str, ...],
) -> None:
    """A NodeInfo signed by a member (an older build, a hand-made one) listing 0.0.0.0 was added and served:
    a peer dialling 0.0.0.0 reaches its own host, so its bridge connected to whatever listened there."""
    service, port = map_server
    status, _, body = await http_call(
        port, "POST", "/network-map/publish", signed_node_info(alice, 10002, hosts=hosts)
    )
    assert status == 403, body
    wildcard = hosts[-1]
    assert body.startswith(b"invalid-address: address "), body
    assert f"{'[' + wildcard + ']' if ':' in wildcard else wildcard}:10002".encode() in body
    assert b"no peer can dial" in body and b"O=Alice, L=London, C=GB" in body
    assert service.store.node_info_hashes() == []
    status, _, signed_map = await http_call(port, "GET", "/network-map")
    assert status == 200
    assert network.verify_network_map(signed_map, trust_root=creds.root.cert, now=NOW).node_info_hashes == ()
    # The same node with a dialable address is taken.
    status, _, body = await http_call(port, "POST", "/network-map/publish", signed_node_info(alice, 10002))
    assert status == 200 and body.startswith(b"added "), body
