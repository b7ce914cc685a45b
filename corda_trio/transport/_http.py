"""Serving HTTP/1.1 with h11 over a Trio stream: the reading both of our HTTP servers (the network map service
and the node's ``/metrics``) share, and the writing of every answer we send over HTTP (those two, and the
node's RPC port when what arrives is not a websocket handshake): :func:`http_response` gives each the
standard reason phrase (h11 sends an empty one unless given one: ``HTTP/1.1 404 ``) and its
``content-length``, and :func:`protocol_error_text` says what h11 found wrong in a client's bytes.

Theory of operation
-------------------
h11 bounds a request head only while it is incomplete: ``max_incomplete_event_size`` is checked when
``next_event`` needs more data, so a head that arrives whole in one read (a 40 KB header line, 3,000 headers
in one write) is parsed whatever its size, and so is one whose last read takes it past the limit.
:func:`receive_http_event` measures each head itself: while it is incomplete, the bytes buffered; once h11
returns the ``Request``, the bytes h11 consumed for it (its receive buffer before, from ``trailing_data``,
plus what was read since, minus what is left). Over ``max_head_bytes`` either way is the error h11 raises for
an incomplete head, ``RemoteProtocolError`` with status hint 431, so a server has one path for both, however
the head was split into writes.

A client that sends ``Expect: 100-continue`` holds its body back until it sees ``100 Continue`` or a final
response (RFC 9110 §10.1.1). Reading from the stream while h11 says the client waits for ``100 Continue``
means the server has decided to take the body, so :func:`receive_http_event` sends ``100 Continue`` right
before that read; a server that refuses the body answers without reading it.
"""

from __future__ import annotations

import http
import re
from collections.abc import Sequence
from typing import Final

import h11
import trio

__all__ = [
    "DRAIN_LIMIT_BYTES",
    "DRAIN_TIMEOUT_SECONDS",
    "drain_before_close",
    "http_response",
    "protocol_error_text",
    "receive_http_event",
]

#: What :func:`drain_before_close` reads and drops at most: enough for the rest of any request we refuse.
DRAIN_LIMIT_BYTES: Final[int] = 1 << 20
#: ... and for how long.
DRAIN_TIMEOUT_SECONDS: Final[float] = 1.0
_CONTINUE: Final = h11.InformationalResponse(status_code=100, headers=[], reason=b"Continue")


async def receive_http_event(
    stream: trio.abc.Stream, conn: h11.Connection, *, max_head_bytes: int, receive_bytes: int = 65536
) -> h11.Event | type[h11.PAUSED]:
    """The next event of ``conn`` (a server connection), reading from ``stream`` as needed.

    Args:
        stream: the client's stream.
        conn: its h11 server connection (made with ``max_incomplete_event_size=max_head_bytes``, so h11's own
            check agrees with ours).
        max_head_bytes: the largest request head (request line, headers and the blank line) taken.
        receive_bytes: at most this many bytes are read at a time.

    Returns:
        The event, as ``conn.next_event()`` (never ``NEED_DATA``).

    Raises:
        h11.RemoteProtocolError: the client broke HTTP (``error_status_hint`` 400), or its request head is
            longer than ``max_head_bytes`` (hint 431); a response can still be sent.
        trio.BrokenResourceError: the stream broke.
    """
    head_pending = conn.their_state is h11.IDLE
    # Bytes buffered that belong to the head (and maybe what follows it): what h11 holds, plus what we read.
    buffered = len(conn.trailing_data[0]) if head_pending else 0
    while True:
        try:
            event = conn.next_event()
        except h11.RemoteProtocolError as exc:
            if head_pending and exc.error_status_hint == 431:  # h11's own check: say it as we do
                raise _head_too_large(max_head_bytes) from exc
            raise
        if event is not h11.NEED_DATA:
            if head_pending and isinstance(event, h11.Request):
                if buffered - len(conn.trailing_data[0]) > max_head_bytes:
                    raise _head_too_large(max_head_bytes)
            return event
        if head_pending and buffered > max_head_bytes:
            raise _head_too_large(max_head_bytes)
        if conn.client_is_waiting_for_100_continue:
            await stream.send_all(conn.send(_CONTINUE))
        data = await stream.receive_some(receive_bytes)
        buffered += len(data)
        conn.receive_data(data)


def _head_too_large(max_head_bytes: int) -> h11.RemoteProtocolError:
    return h11.RemoteProtocolError(f"request head larger than {max_head_bytes} bytes", error_status_hint=431)


async def drain_before_close(stream: trio.abc.HalfCloseableStream) -> None:
    """After answering a request that was not read to its end: say end of file, then read and drop what the
    client still sends (at most :data:`DRAIN_LIMIT_BYTES`, for at most :data:`DRAIN_TIMEOUT_SECONDS`), so
    that closing does not reset the connection before the client has read the answer."""
    with trio.move_on_after(DRAIN_TIMEOUT_SECONDS):
        await stream.send_eof()
        left = DRAIN_LIMIT_BYTES
        while left > 0 and (chunk := await stream.receive_some(65536)):
            left -= len(chunk)


def http_response(
    conn: h11.Connection,
    status: int,
    headers: Sequence[tuple[bytes, bytes]],
    body: bytes,
    *,
    with_body: bool = True,
) -> bytes:
    """The bytes of one whole response of ``conn`` (a server connection): the head, with the standard reason
    phrase of ``status`` (none for a code that has none) and a ``content-length`` of ``body`` after
    ``headers``, then ``body`` unless ``with_body`` is false (the answer to ``HEAD``).

    A fresh connection (``h11.Connection(h11.SERVER)``) can send it too, before any request was read."""
    try:
        reason = http.HTTPStatus(status).phrase.encode()
    except ValueError:
        reason = b""
    head = [*headers, (b"content-length", str(len(body)).encode())]
    out = conn.send(h11.Response(status_code=status, headers=head, reason=reason)) or b""
    if with_body and body:
        out += conn.send(h11.Data(data=body)) or b""
    out += conn.send(h11.EndOfMessage()) or b""
    return out


def protocol_error_text(exc: h11.RemoteProtocolError) -> str:
    """h11's reason, without the Python repr it wraps the offending bytes in ("illegal request line:
    bytearray(b'GARBAGE')" -> "illegal request line: 'GARBAGE'"), at most 200 characters."""
    return _BYTES_REPR.sub(r"\1", str(exc))[:200]


_BYTES_REPR: Final = re.compile(r"bytearray\(b('.*?'|\".*?\")\)")
