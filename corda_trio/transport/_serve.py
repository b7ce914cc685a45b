"""Accept AMQP connections: ``serve_amqp(handler, port, ...)``, for ``nursery.start`` like ``serve_tcp``.

Theory of operation
-------------------
One accept loop per listening socket, all sharing one :class:`_Slots` count per ``serve_amqp`` call.
A connection takes a slot from ``accept`` until its handler and goodbye are done; a client that arrives
when all ``max_connections`` slots are taken gets a closed socket at once (its descriptor is needed only
for that instant), so a flood of clients cannot take the descriptors the running connections need. A server
that answers such a client (HTTP's 503, ``refuse``) does so in a task of its own, at most
:data:`MAX_REFUSING` at once (or the ``max_refusing`` it is given) for at most
:data:`REFUSE_TIMEOUT_SECONDS` each (beyond that: a closed socket),
so the accept loop never waits for a refused client.

A connection still in its handshake (TCP accepted; TLS, SASL and the AMQP ``open`` exchange not done yet)
also counts against its source address (:class:`HandshakeLimit`). Idle or half-open sockets hold a slot until
the handshake timeout, so without a limit one address could take every slot. While fewer than half the slots
are in their handshake, any address gets in (a burst of 200 connections from one client is served); past
that, an address that already has ``max_handshakes_per_address`` in their handshake gets no more: its next
one is closed at once (counted, and logged at most once per :data:`ACCEPT_ERROR_LOG_INTERVAL_SECONDS`), so
one address can hold at most half the slots plus its limit, and other addresses still get in. A connection
that finished its handshake no longer counts.

When ``accept`` itself fails for lack of resources (``EMFILE``, ``ENFILE``, ``ENOBUFS``, ``ENOMEM``), the
loop waits until one of our connections ends (which frees a descriptor) or a short poll interval passes,
whichever is first, and tries again: accepting resumes as soon as descriptors come back. The failure is
logged once per :data:`ACCEPT_ERROR_LOG_INTERVAL_SECONDS` with the count of failures since, never per try,
and ``EMFILE`` with the process's limit (``EMFILE (Too many open files (the limit, ulimit -n, is 64))``).

What a remote makes the server log is bounded (:class:`InboundRefusals`): anyone who can open a TCP
connection can fail a TLS handshake, present a certificate of another network or send a bad AMQP header,
thousands of times a second. Each such connection is counted by reason, and logged per source address (the
host: a client has 60,000 ports) with ``logs.PeerWarnings``: the first in full, with its reason, then one
summary a minute counting the rest. A connection served that ends normally (the peer's close without an
error) is logged at debug; one that ends with an error (a reset, EOF without a close, a close with an error)
at info, per source host at most once a minute too (a client reconnecting in a loop could write them at
will), the rest counted into the summary line.
"""

from __future__ import annotations

import collections
import errno
import functools
import logging
import math
import ssl
from collections.abc import Awaitable, Callable
from typing import Any, Final

import attrs
import trio

from corda_trio import amqp, files, hostport, logs

from ._connect import DEFAULT_HANDSHAKE_TIMEOUT_SECONDS, PeerCheck, open_amqp_over_stream, secure_stream
from ._driver import AmqpConnection
from ._errors import AmqpConnectionError, HandshakeError
from ._http import drain_before_close

__all__ = [
    "ACCEPT_ERROR_LOG_INTERVAL_SECONDS",
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_MAX_HANDSHAKES_PER_ADDRESS",
    "MAX_REFUSING",
    "REFUSE_REQUEST_WAIT_SECONDS",
    "REFUSE_TIMEOUT_SECONDS",
    "SERVER_SASL_MECHANISMS",
    "HandshakeLimit",
    "InboundRefusals",
    "listener_port",
    "refuse_with_http_503",
    "serve_amqp",
    "serve_listeners",
]

SERVER_SASL_MECHANISMS: Final = ("PLAIN", "ANONYMOUS", "EXTERNAL")
#: Concurrent connections per ``serve_amqp`` by default: far more peers than a node talks to, far fewer than
#: the usual 1024-descriptor soft limit, so the node keeps descriptors for its stores and outbound bridges.
DEFAULT_MAX_CONNECTIONS: Final = 512
#: Connections one source address may have in their handshake at once by default, once half the slots are in
#: their handshake: a peer node opens one or a few connections, so 16 leaves room for reconnects, while an
#: address that opens idle sockets by the hundred holds at most half the slots plus this many.
DEFAULT_MAX_HANDSHAKES_PER_ADDRESS: Final = 16
#: Bound on telling an over-cap client why it is refused (each in a task of its own).
REFUSE_TIMEOUT_SECONDS: Final = 1.0
#: Of which, at most this long waiting for its request before answering (``refuse_with_http_503``).
REFUSE_REQUEST_WAIT_SECONDS: Final = 0.1
#: Over-cap clients being told why at once; one more gets a closed socket at once (bounds the descriptors
#: a flood of over-cap clients can hold); ``serve_listeners(max_refusing=...)`` sets another bound.
MAX_REFUSING: Final = 32
# The request head a refusal waits for, at most (h11's default bound on an incomplete head).
_REFUSE_HEAD_BYTES: Final = 16 * 1024
#: At most one log line per this interval about ``accept`` failing for lack of descriptors / memory.
ACCEPT_ERROR_LOG_INTERVAL_SECONDS: Final = 10.0
# Retry interval of a failing accept when none of our own connections ends in the meantime.
_ACCEPT_RETRY_SECONDS: Final = 0.05
_CAPACITY_ERRNOS: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})

log = logging.getLogger("corda_trio.transport")

Handler = Callable[[AmqpConnection], Awaitable[Any]]


@attrs.define(eq=False)
class InboundRefusals:
    """Inbound connections a server refused, or ended for the peer's protocol violation, counted by reason
    and logged per source address at most once a minute (see the module docstring).

    Reasons (the keys of :attr:`counts`): ``tls`` (TLS handshake or peer identity check failed),
    ``handshake_timeout`` (TLS or AMQP handshake not done in time), ``amqp`` (a protocol violation, SASL
    failure or end during the AMQP handshake), ``address_limit`` (its address had too many connections in
    their handshake), ``capacity`` (every slot was taken). The last two are logged by the accept loop and
    :class:`HandshakeLimit`, rate-limited for all addresses together.
    """

    counts: collections.Counter[str] = attrs.field(factory=collections.Counter)
    _warnings: logs.PeerWarnings = attrs.field(
        factory=lambda: logs.PeerWarnings(log, "inbound connections from %s refused"), init=False
    )
    #: connections served that ended with an error (the peer's close with one, a reset, EOF without a close):
    #: info, per source host at most once a minute (a client reconnecting in a loop writes them at will)
    _ended: logs.PeerWarnings = attrs.field(
        factory=lambda: logs.PeerWarnings(log, "inbound connections from %s ended", level=logging.INFO),
        init=False,
    )

    def ended(self, peer: str, conn: AmqpConnection | None, exc: AmqpConnectionError) -> None:
        """A connection from ``peer`` that was served ended with ``exc``: a normal end (the peer's close
        without an error) at debug, one with an error at info, bounded per source host. Not a refusal: not
        counted."""
        if conn is not None and conn.ended_cleanly:
            log.debug("inbound %s ended: %s", peer, exc)
        else:
            self._ended.warning(logs.remote_host(peer), str(exc), "inbound %s ended: %s", peer, exc)

    def refused(self, peer: str, reason: str, text: str) -> None:
        """Count one connection from ``peer`` (``host:port``) refused for ``reason``; ``text`` says why."""
        self.counts[reason] += 1
        self._warnings.warning(logs.remote_host(peer), text, "inbound %s refused: %s", peer, text)

    async def report_due(self) -> None:
        """Write the summaries of bursts that went quiet, until cancelled (``logs.PeerWarnings``)."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._warnings.report_due)
            nursery.start_soon(self._ended.report_due)


def listener_port(listeners: list[trio.SocketListener]) -> int:
    """The TCP port of the first listener ``serve_amqp`` reported (useful with ``port=0``)."""
    return int(listeners[0].socket.getsockname()[1])


async def serve_amqp(
    handler: Handler,
    port: int,
    *,
    host: str = "127.0.0.1",
    ssl_context: ssl.SSLContext | None = None,
    peer_check: PeerCheck | None = None,
    config: amqp.ConnectionConfig | None = None,
    handshake_timeout: float | None = DEFAULT_HANDSHAKE_TIMEOUT_SECONDS,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
    max_handshakes_per_address: int | None = DEFAULT_MAX_HANDSHAKES_PER_ADDRESS,
    refusals: InboundRefusals | None = None,
    task_status: trio.TaskStatus[list[trio.SocketListener]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Listen on ``host:port`` and run ``await handler(conn)`` for each AMQP connection, until cancelled.

    Use ``listeners = await nursery.start(serve_amqp, handler, 0)`` and :func:`listener_port`. Each connection
    is TLS-secured (if ``ssl_context``; build it with ``corda_trio.pki.server_ssl_context``: it requires
    client certificates), checked with ``peer_check`` and opened; then ``handler`` runs. The handler decides
    which links the peer may attach: ``async for request in conn.link_requests()`` and ``accept_receiver`` /
    ``accept_sender`` / ``refuse("amqp:unauthorized-access")``. When the handler returns the connection is
    closed. A failing handshake, a misbehaving peer or a crashing handler ends that connection only (logged);
    the server keeps serving. Refused connections and protocol violations are counted in ``refusals`` (pass
    your own to read its counts) and logged per source address at most once a minute.

    At most ``max_connections`` connections run at once (counting handshakes); a client beyond that gets a
    closed socket. Once half the slots are in their handshake (TLS, SASL, AMQP ``open``), an address with
    ``max_handshakes_per_address`` of them gets no more: its next one is closed at once (``None``: no limit).
    Running out of file descriptors while accepting is logged at most once per
    :data:`ACCEPT_ERROR_LOG_INTERVAL_SECONDS`, and accepting resumes as soon as descriptors are free.
    """
    if max_connections < 1:
        raise ValueError(f"max_connections must be at least 1, got {max_connections}")
    if config is None:
        # The server accepts PLAIN (Corda's SystemUsers/Peer), ANONYMOUS and EXTERNAL.
        config = amqp.ConnectionConfig(sasl_mechanisms=SERVER_SASL_MECHANISMS)
    if refusals is None:
        refusals = InboundRefusals()
    listeners = await trio.open_tcp_listeners(port, host=host)
    serve_one = functools.partial(
        _serve_one,
        handler=handler,
        ssl_context=ssl_context,
        peer_check=peer_check,
        config=config,
        handshake_timeout=handshake_timeout,
        handshakes=HandshakeLimit(max_handshakes_per_address, free_below=max_connections // 2),
        refusals=refusals,
    )

    async def refuse(stream: trio.abc.Stream) -> None:
        refusals.counts["capacity"] += 1
        await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(refusals.report_due)
        await nursery.start(
            functools.partial(
                serve_listeners, serve_one, listeners, max_connections=max_connections, refuse=refuse
            )
        )
        task_status.started(listeners)


async def serve_listeners(
    serve_one: Callable[[trio.abc.Stream], Awaitable[None]],
    listeners: list[trio.SocketListener],
    *,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
    refuse: Callable[[trio.abc.Stream], Awaitable[None]] | None = None,
    max_refusing: int | None = None,
    task_status: trio.TaskStatus[list[trio.SocketListener]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Accept on ``listeners`` and run ``await serve_one(stream)`` per connection, until cancelled.

    The listeners share one cap of ``max_connections`` running connections. A client over the cap gets
    ``await refuse(stream)`` (bounded to :data:`REFUSE_TIMEOUT_SECONDS`; an HTTP server answers 503 there),
    at most ``max_refusing`` (default :data:`MAX_REFUSING`) at once, and then a closed socket: a server
    holds at most ``max_connections + max_refusing`` descriptors for its clients. Refusals and ``accept``
    failures for lack of descriptors are logged at most once per :data:`ACCEPT_ERROR_LOG_INTERVAL_SECONDS`,
    and accepting resumes as soon as a descriptor is free.
    The stream is closed after ``serve_one`` returns or raises.
    """
    if max_connections < 1:
        raise ValueError(f"max_connections must be at least 1, got {max_connections}")
    slots = _Slots(max_connections, MAX_REFUSING if max_refusing is None else max_refusing)
    async with trio.open_nursery() as nursery:
        for listener in listeners:
            nursery.start_soon(_accept_loop, listener, serve_one, slots, nursery, refuse)
        task_status.started(listeners)


_OVER_CAPACITY: Final = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"retry-after: 1\r\nconnection: close\r\ncontent-length: 39\r\n\r\n"
    b"too many connections; try again later\r\n"
)


async def refuse_with_http_503(stream: trio.abc.Stream) -> None:
    """``refuse`` for :func:`serve_listeners` in front of an HTTP (or websocket) server: a ``503 Service
    Unavailable`` answer with ``retry-after: 1``, whatever the client sent.

    The answer waits for the request head (at most :data:`REFUSE_REQUEST_WAIT_SECONDS`: a client that sends
    nothing gets it then), and the rest of what the client sends is read and dropped until it closes. A
    websocket client (the ``websockets`` package) whose answer arrived before it had sent its request, or
    whose socket was reset because ours closed with its request unread, saw an error instead of the 503 in
    14 attempts in 100 here. The caller bounds all of it (:data:`REFUSE_TIMEOUT_SECONDS`).
    """
    with trio.move_on_after(REFUSE_REQUEST_WAIT_SECONDS):
        seen = b""
        while b"\r\n\r\n" not in seen and len(seen) < _REFUSE_HEAD_BYTES:
            chunk = await stream.receive_some(_REFUSE_HEAD_BYTES)
            if not chunk:
                break
            seen += chunk
    await stream.send_all(_OVER_CAPACITY)
    if isinstance(stream, trio.abc.HalfCloseableStream):
        await drain_before_close(stream)


class _Slots:
    """The connection count of one ``serve_amqp`` and the wake-up for accept loops waiting on descriptors."""

    def __init__(self, limit: int, max_refusing: int = MAX_REFUSING) -> None:
        self.limit = limit
        self.active = 0
        self.refusing = 0  # over-cap clients being told so (``_refuse_one``)
        self.max_refusing = max_refusing
        self.freed = trio.Event()
        self.refusals = _Throttled()
        self.accept_failures = _Throttled()

    def release(self) -> None:
        self.active -= 1
        self.freed.set()
        self.freed = trio.Event()

    def note_refusal(self, where: str) -> None:
        if (count := self.refusals.note()) is not None:
            log.warning(
                "listener %s: %d connection(s) refused since the last report: all %d slots are taken",
                where,
                count,
                self.limit,
            )

    def note_accept_failure(self, where: str, exc: OSError) -> None:
        if (count := self.accept_failures.note()) is not None:
            log.error(
                "listener %s: accept failed %d time(s) since the last report: %s (%s); %d connection(s) "
                "running; retrying as soon as descriptors are free",
                where,
                count,
                errno.errorcode.get(exc.errno or 0, exc.errno),
                files.os_error_text(exc),
                self.active,
            )


class _Throttled:
    """Counts events for a log line said at most once per :data:`ACCEPT_ERROR_LOG_INTERVAL_SECONDS`."""

    def __init__(self) -> None:
        self.since = 0  # events since the last line
        self.last_line = -math.inf

    def note(self) -> int | None:
        """Count one event; the count to report (and start again from) when a line is due, else ``None``."""
        self.since += 1
        now = trio.current_time()
        if now - self.last_line < ACCEPT_ERROR_LOG_INTERVAL_SECONDS:
            return None
        count, self.since, self.last_line = self.since, 0, now
        return count


class HandshakeLimit:
    """Connections in their handshake per source address, for one server (``serve_amqp`` makes its own; the
    float's public listener has one too): see the module docstring.

    ``limit`` ``None`` counts nothing. The limit applies only while at least ``free_below`` handshakes (of
    all addresses) are running: below that, nobody is short of slots. ``refused_total`` counts every
    connection refused.
    """

    def __init__(self, limit: int | None, *, free_below: int = 0) -> None:
        if limit is not None and limit < 1:
            raise ValueError(f"max_handshakes_per_address must be at least 1, got {limit}")
        self.limit = limit
        self.free_below = free_below
        self.total = 0
        self.active: dict[str, int] = {}
        self.refused_total = 0
        self.refusals = _Throttled()

    def admit(self, stream: trio.abc.Stream) -> Callable[[], None] | None:
        """Count ``stream``'s handshake against its source address: the function to call once the
        handshake is over (done, failed or given up; later calls do nothing), or ``None`` when that address
        has too many in their handshake already (close the stream at once)."""
        address = _peer_address(stream)
        if not self.begin(address):
            return None
        return _Once(functools.partial(self.end, address))

    def begin(self, address: str) -> bool:
        """Count a handshake from ``address``; ``False`` (and counted as refused) when it has too many while
        slots are short."""
        if self.limit is None:
            return True
        n = self.active.get(address, 0)
        if n >= self.limit and self.total >= self.free_below:
            self._note_refusal(address)
            return False
        self.active[address] = n + 1
        self.total += 1
        return True

    def end(self, address: str) -> None:
        """A handshake :meth:`begin` let in is over (done, failed or given up)."""
        if self.limit is None:
            return
        self.total -= 1
        n = self.active[address] - 1
        if n:
            self.active[address] = n
        else:
            del self.active[address]

    def _note_refusal(self, address: str) -> None:
        self.refused_total += 1
        if (count := self.refusals.note()) is not None:
            log.warning(
                "%d connection(s) closed at once since the last report: their address (last %s) already had "
                "%d connections in their handshake",
                count,
                address,
                self.limit,
            )


async def _accept_loop(
    listener: trio.SocketListener,
    serve_one: Callable[[trio.abc.Stream], Awaitable[None]],
    slots: _Slots,
    nursery: trio.Nursery,
    refuse: Callable[[trio.abc.Stream], Awaitable[None]] | None = None,
) -> None:
    where = _listener_name(listener)
    async with listener:
        while True:
            try:
                stream = await listener.accept()
            except OSError as exc:
                if exc.errno not in _CAPACITY_ERRNOS:
                    raise
                slots.note_accept_failure(where, exc)
                with trio.move_on_after(_ACCEPT_RETRY_SECONDS):
                    await slots.freed.wait()
                continue
            if slots.active >= slots.limit:
                slots.note_refusal(where)
                if refuse is not None and slots.refusing < slots.max_refusing:
                    slots.refusing += 1
                    nursery.start_soon(_refuse_one, stream, refuse, slots)
                else:
                    await trio.aclose_forcefully(stream)
                continue
            slots.active += 1
            nursery.start_soon(_serve_slot, stream, serve_one, slots)


async def _refuse_one(
    stream: trio.abc.Stream, refuse: Callable[[trio.abc.Stream], Awaitable[None]], slots: _Slots
) -> None:
    try:
        with trio.move_on_after(REFUSE_TIMEOUT_SECONDS):
            try:
                await refuse(stream)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass  # the client left already
    finally:
        await trio.aclose_forcefully(stream)
        slots.refusing -= 1


async def _serve_slot(
    stream: trio.abc.Stream, serve_one: Callable[[trio.abc.Stream], Awaitable[None]], slots: _Slots
) -> None:
    try:
        await serve_one(stream)
    finally:
        await trio.aclose_forcefully(stream)
        slots.release()


def _listener_name(listener: trio.SocketListener) -> str:
    try:
        host, port = listener.socket.getsockname()[:2]
        return hostport.host_port_text(host, port)
    except OSError:
        return "<listener>"


async def _serve_one(
    stream: trio.abc.Stream, *, handshakes: HandshakeLimit, refusals: InboundRefusals, **kw: Any
) -> None:
    """Serve one accepted connection, unless its address has too many handshakes running already."""
    done = handshakes.admit(stream)
    if done is None:
        refusals.counts["address_limit"] += 1
        await trio.aclose_forcefully(stream)
        return
    try:
        await _serve_admitted(stream, handshake_done=done, refusals=refusals, **kw)
    finally:
        done()


class _Once:
    """Call ``fn`` on the first call only (a handshake ends once, whether it was done or given up)."""

    def __init__(self, fn: Callable[[], None]) -> None:
        self._fn: Callable[[], None] | None = fn

    def __call__(self) -> None:
        fn, self._fn = self._fn, None
        if fn is not None:
            fn()


async def _serve_admitted(
    stream: trio.abc.Stream,
    *,
    handler: Handler,
    ssl_context: ssl.SSLContext | None,
    peer_check: PeerCheck | None,
    config: amqp.ConnectionConfig | None,
    handshake_timeout: float | None,
    handshake_done: Callable[[], None],
    refusals: InboundRefusals,
) -> None:
    peer = logs.remote_name(stream)
    try:
        if handshake_timeout is not None:
            with trio.fail_after(handshake_timeout):
                secured, identity = await secure_stream(stream, ssl_context, peer_check, server_side=True)
        else:
            secured, identity = await secure_stream(stream, ssl_context, peer_check, server_side=True)
    except trio.TooSlowError:
        # (TooSlowError has no text: name what happened)
        refusals.refused(peer, "handshake_timeout", f"no TLS handshake within {handshake_timeout} s")
        await trio.aclose_forcefully(stream)
        return
    except HandshakeError as exc:
        refusals.refused(peer, "tls", str(exc))
        await trio.aclose_forcefully(stream)
        return
    violated = False

    def on_violation(exc: amqp.RemoteProtocolError) -> None:
        nonlocal violated
        violated = True
        refusals.refused(peer, "amqp", f"protocol violation: {exc}")

    opened: AmqpConnection | None = None
    try:
        async with open_amqp_over_stream(
            secured, client=False, config=config, peer_identity=identity, handshake_timeout=handshake_timeout,
            on_violation=on_violation,
        ) as conn:  # fmt: skip
            handshake_done()
            opened = conn
            log.debug("inbound %s: %s open (peer %s)", peer, conn.id, identity)
            await handler(conn)
    except AmqpConnectionError as exc:
        if violated:  # counted and logged (bounded) already
            log.debug("inbound %s ended: %s", peer, exc)
        elif opened is None:
            reason = "handshake_timeout" if isinstance(exc, HandshakeError) else "amqp"
            refusals.refused(peer, reason, str(exc))
        else:
            refusals.ended(peer, opened, exc)
    except Exception as exc:  # supervision boundary: one broken handler must not stop the server
        ended = _connection_ended(exc)
        if ended is not None:  # the peer went away under the handler's tasks: not a failure of ours
            if violated:
                log.debug("inbound %s ended: %s", peer, ended)
            else:
                refusals.ended(peer, opened, ended)
        else:
            log.exception("inbound %s: handler failed", peer)


def _connection_ended(exc: Exception) -> AmqpConnectionError | None:
    """The connection error ``exc`` holds when it is a group (a handler's nursery groups what its tasks
    raised) of nothing but connection errors; else ``None``."""
    if not isinstance(exc, ExceptionGroup) or exc.split(AmqpConnectionError)[1] is not None:
        return None
    leaf: BaseException = exc
    while isinstance(leaf, BaseExceptionGroup):
        leaf = leaf.exceptions[0]
    assert isinstance(leaf, AmqpConnectionError)
    return leaf


def _peer_address(stream: trio.abc.Stream) -> str:
    """The source address (host only) of ``stream``: what :class:`HandshakeLimit` counts by."""
    try:
        return str(stream.socket.getpeername()[0])  # type: ignore[attr-defined]
    except Exception:
        return "<unknown peer>"
