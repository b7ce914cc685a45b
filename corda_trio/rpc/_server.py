"""The RPC server: websocket connections (trio-websocket), login, permission checks, dispatch to handlers.

Theory of operation
-------------------
``await nursery.start(server.run)`` listens and reports the bound port. Each connection gets one task that
reads frames in order; the first request must be ``login``. Every later request runs in its own task in the
connection's nursery (at most :attr:`RpcServer.max_calls_per_connection` at once: beyond that the reader
stops reading, so a client that floods the server slows itself down). A handler is an ``async def`` that
receives a :class:`Call` (arguments, the user, ``send_event`` for progress) and returns the value of the
``ok`` frame, or raises :class:`RpcError` for an error frame. Any other exception becomes an ``internal``
error frame (and is logged); the connection and the server go on.

Calls that answer from memory (ping, node info, list flows, ...) are :attr:`RpcServer.immediate` handlers:
plain functions the reader calls itself, in order, with no task and no scheduler round of their own. That is
what makes a small call cheap: per call, the server decodes one frame, checks the permission, calls the
function and sends one frame (measured in ``bench/rpc.py``).

When a client disconnects, its connection's calls are cancelled: what a handler started elsewhere (a flow
runs in the flow manager's nursery, not here) keeps running. :meth:`RpcServer.run` ends only by
cancellation, which closes every connection (close code 1001, going away) with
:attr:`RpcServer.going_away_reason` as the close reason: the node sets it to say why it stops.

Limits, so that clients cannot take the node's descriptors or memory: at most
:attr:`RpcServer.max_connections` connections at once (counting those in their websocket handshake); one more
is answered ``503 Service Unavailable`` and closed (counted in ``connections_refused_total``, logged at most
once per ``transport.ACCEPT_ERROR_LOG_INTERVAL_SECONDS``). The websocket handshake must be done within
:data:`HANDSHAKE_TIMEOUT_SECONDS`, and the login within :attr:`RpcServer.login_timeout_seconds` of it, or the
connection is closed (close code 1008, policy violation, with the reason). A logged-in client may stay idle
as long as it likes (``flow watch`` does).

The port speaks only websockets. What arrives on it is read up to the end of the request head (at most
:data:`MAX_HANDSHAKE_HEAD_BYTES`) and checked as trio-websocket's wsproto will check it; a request that is
not a websocket handshake (``curl http://host:port/``, a browser, garbage) is answered here, with a
standard status and a one-line text body saying what the port is for and what was wrong: ``400 Bad
Request`` (not HTTP, or HTTP without the handshake's headers), ``426 Upgrade Required`` (another websocket
version), ``431 Request Header Fields Too Large`` (a head over the limit). trio-websocket would answer these
itself, but with an empty reason phrase and body (``HTTP/1.1 400 ``, also for a 70 KB head). A handshake goes
on to trio-websocket with the bytes read so far given back to it first (:class:`_Replayed`).

What a client that has not logged in can make the server log is bounded per source address (the host, not
the port): failed logins and connections closed before a login go through ``logs.PeerWarnings``, the first of
a minute as a warning in full, then one summary a minute with the count and the user names tried (at most
:data:`FAILED_LOGIN_USERS_QUOTED`), written even when the source goes quiet. ``failed_logins_total`` counts
every one. A connection that ends because the client's ping crossed our close frame (any client can make
that happen on every connection: a request over the limit, then a ping) is an info line per source address
a minute the same way, the rest at debug and counted into a summary.
"""

from __future__ import annotations

import collections
import functools
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final, final

import attrs
import h11
import trio
import trio_websocket
import wsproto
import wsproto.handshake
import wsproto.utilities

from corda_trio import logs

from ._auth import RpcUser, UserDatabase
from ._codec import pack, unpack
from ._protocol import (
    MAX_REQUEST_BYTES,
    METHODS,
    ErrorCode,
    Request,
    RpcProtocolError,
    allowed,
    check_arguments,
    error_frame,
    event_frame,
    ok_frame,
    parse_request,
)

__all__ = ["Call", "Handler", "ImmediateHandler", "RpcError", "RpcServer", "RpcServerStatistics"]

log = logging.getLogger("corda_trio.rpc.server")

#: Requests of one connection handled at once.
DEFAULT_MAX_CALLS_PER_CONNECTION: Final[int] = 256
#: Failed logins after which the server closes the connection (the client may reconnect and pay again).
MAX_FAILED_LOGINS: Final[int] = 3
#: Connections served at once, by default (more are answered 503).
DEFAULT_MAX_CONNECTIONS: Final[int] = 256
#: Seconds a new connection has for its websocket handshake.
HANDSHAKE_TIMEOUT_SECONDS: Final[float] = 10.0
#: The largest request head of a websocket handshake taken (request line and headers): h11's default limit
#: (16 KiB), which wsproto applies to a head that arrives in pieces. A larger one is answered 431.
MAX_HANDSHAKE_HEAD_BYTES: Final[int] = 16 * 1024
#: The body of the answer to a request that is not a websocket handshake (what was wrong follows it).
NOT_A_WEBSOCKET_TEXT: Final[str] = (
    "this is a corda-trio RPC websocket endpoint: connect with a websocket client"
)
#: Seconds a connection has, from its handshake, to log in (by default).
DEFAULT_LOGIN_TIMEOUT_SECONDS: Final[float] = 30.0
#: A close frame's reason is at most this many bytes of UTF-8 (RFC 6455 §5.5: a control frame's payload is
#: at most 125 bytes, 2 of them the code).
MAX_CLOSE_REASON_BYTES: Final[int] = 123
#: Seconds the server waits for a client to answer its close.
DISCONNECT_TIMEOUT_SECONDS: Final[float] = 5.0
#: User names a failed-login summary quotes at most (see the module docstring).
FAILED_LOGIN_USERS_QUOTED: Final[int] = 8
#: The same when the server is going down (cancelled): a client on a working network answers within a round
#: trip; a silent one is not waited for longer (a node stopped "at once" stops at once).
GOING_AWAY_TIMEOUT_SECONDS: Final[float] = 0.5


class RpcError(Exception):
    """An error reply: raised by handlers on the server, and by the client when one arrives."""

    def __init__(self, code: ErrorCode | str, message: str) -> None:
        super().__init__(message)
        self.code = code.value if isinstance(code, ErrorCode) else code
        self.message = message

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


@final
@attrs.define(eq=False)
class Call:
    """One request as a handler sees it."""

    method: str
    args: dict[str, Any]
    user: RpcUser
    _send: Callable[[Any], Awaitable[None]]

    async def send_event(self, value: Any) -> None:
        """Send an ``event`` frame (progress) before the final answer."""
        await self._send(value)


#: ``async def handler(call) -> value``.
Handler = Callable[[Call], Awaitable[Any]]
#: ``def handler(call) -> value``: answers at once, from memory (never waits, never sends events).
ImmediateHandler = Callable[[Call], Any]


@final
@attrs.frozen(kw_only=True)
class RpcServerStatistics:
    connections_open: int
    connections_total: int
    #: connections answered 503 because :attr:`RpcServer.max_connections` were open
    connections_refused_total: int
    failed_logins_total: int
    #: (method, outcome) -> count; outcome is ``ok`` or an error code. Unknown methods count as ``"?"``.
    calls_total: dict[tuple[str, str], int]


@attrs.define(eq=False)
class RpcServer:
    """See the module docstring."""

    handlers: Mapping[str, Handler]
    users: UserDatabase
    host: str = "127.0.0.1"
    port: int = 0
    max_calls_per_connection: int = DEFAULT_MAX_CALLS_PER_CONNECTION
    #: Handlers that answer at once (see the module docstring); a method is in ``handlers`` or here.
    immediate: Mapping[str, ImmediateHandler] = attrs.field(factory=dict)
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    #: Over-cap clients answered 503 at once (each for at most a second; more get a closed socket): ``None``
    #: is ``transport.MAX_REFUSING`` (32). A node under a low open-file limit answers fewer.
    max_refusing: int | None = None
    login_timeout_seconds: float = DEFAULT_LOGIN_TIMEOUT_SECONDS
    #: The close reason of the connections the server closes when it goes down (cancelled): why it goes
    #: down (``"node stopping: the store failed: ..."``), cut to :data:`MAX_CLOSE_REASON_BYTES`. Set it
    #: before cancelling the server.
    going_away_reason: str = "server going away"
    _connections_open: int = 0
    _connections_total: int = 0
    _connections_refused: int = 0
    _failed_logins: int = 0
    #: failed logins and connections closed before a login, per source address (see the module docstring)
    _failed_log: logs.PeerWarnings = attrs.field(
        factory=lambda: logs.PeerWarnings(
            log, "failed RPC logins from %s", distinct_details=FAILED_LOGIN_USERS_QUOTED
        ),
        init=False,
    )
    _unauthenticated_log: logs.PeerWarnings = attrs.field(
        factory=lambda: logs.PeerWarnings(log, "RPC connections from %s closed before a login"), init=False
    )
    #: connections ended by a ping that crossed our close frame, per source address (see ``_serve_stream``)
    _ended_in_close_log: logs.PeerWarnings = attrs.field(
        factory=lambda: logs.PeerWarnings(
            log, "RPC connections from %s ended during their close", level=logging.INFO
        ),
        init=False,
    )
    _calls: collections.Counter[tuple[str, str]] = attrs.field(factory=collections.Counter)

    def statistics(self) -> RpcServerStatistics:
        return RpcServerStatistics(
            connections_open=self._connections_open,
            connections_total=self._connections_total,
            connections_refused_total=self._connections_refused,
            failed_logins_total=self._failed_logins,
            calls_total=dict(self._calls),
        )

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; reports the bound port."""
        # (imported here: an RPC *client* needs none of the AMQP transport this pulls in)
        from corda_trio.transport import listener_port, serve_listeners

        if self.max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, got {self.max_connections}")
        listeners = await trio.open_tcp_listeners(self.port, host=self.host)
        self.port = listener_port(listeners)
        async with trio.open_nursery() as nursery:
            serve = functools.partial(
                serve_listeners,
                self._serve_stream,
                listeners,
                max_connections=self.max_connections,
                refuse=self._refuse,
                max_refusing=self.max_refusing,
            )
            await nursery.start(serve)
            nursery.start_soon(self._failed_log.report_due)
            nursery.start_soon(self._unauthenticated_log.report_due)
            nursery.start_soon(self._ended_in_close_log.report_due)
            task_status.started(self.port)

    async def _refuse(self, stream: trio.abc.Stream) -> None:
        from corda_trio.transport import refuse_with_http_503

        self._connections_refused += 1
        await refuse_with_http_503(stream)

    def _note_failed_login(self, client: str, user: Any) -> None:
        self._failed_logins += 1
        self._failed_log.warning(
            logs.remote_host(client),
            f"user {user!r}"[:100],
            "RPC login from %s failed for user %r",
            client,
            user,
        )

    async def _serve_stream(self, stream: trio.abc.Stream) -> None:
        """One connection: the websocket handshake (bounded), then :meth:`_serve_connection`."""
        client = logs.remote_name(stream)
        try:
            await self._serve_websocket(stream, client)
        except* wsproto.utilities.LocalProtocolError as group:
            # trio-websocket answers a ping that crossed our close frame with a pong that wsproto refuses
            # once the close is sent, in the connection's reader task (python-trio/trio-websocket#184):
            # RFC 6455 allows the ping, and the connection was ending anyway. It ends that one only. A
            # client can make it happen on every connection (a request over the limit, then a ping), so
            # the line is bounded per source host.
            self._ended_in_close_log.warning(
                logs.remote_host(client),
                str(group.exceptions[0]),
                "RPC connection from %s ended during its close: %s",
                client,
                group.exceptions[0],
            )

    async def _serve_websocket(self, stream: trio.abc.Stream, client: str) -> None:
        async with trio.open_nursery() as nursery:  # the connection's reader task
            ws = None
            with trio.move_on_after(HANDSHAKE_TIMEOUT_SECONDS):
                try:
                    head = await _receive_handshake(stream)
                except _NotAWebsocketError as exc:
                    await _answer_not_a_websocket(stream, exc)
                    head = None
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    head = None
                if head is None:  # answered, or gone before a whole head
                    nursery.cancel_scope.cancel()
                    return
                try:
                    request = await trio_websocket.wrap_server_stream(
                        nursery,
                        _Replayed(stream, head),
                        message_queue_size=4,
                        max_message_size=MAX_REQUEST_BYTES,
                        receive_buffer_size=65536,
                    )
                    ws = await request.accept()
                except trio_websocket.ConnectionClosed:
                    pass
            if ws is None:  # no websocket came of it (timed out, garbage, gone)
                nursery.cancel_scope.cancel()
                return
            self._connections_open += 1
            self._connections_total += 1
            going_away = True  # unless the connection ends by itself: the server is going down
            try:
                await self._serve_connection(ws, client)
                going_away = False
            except* trio_websocket.ConnectionClosed:
                going_away = False  # the client left while we answered
            finally:
                self._connections_open -= 1
                bound = GOING_AWAY_TIMEOUT_SECONDS if going_away else DISCONNECT_TIMEOUT_SECONDS
                with trio.move_on_after(bound) as scope:
                    scope.shield = True
                    # (also ends the reader task)
                    if going_away:
                        await ws.aclose(1001, _close_reason(self.going_away_reason))
                    else:
                        await ws.aclose()
                nursery.cancel_scope.cancel()

    async def _serve_connection(self, ws: trio_websocket.WebSocketConnection, client: str) -> None:
        send = _Sender(ws)
        user: RpcUser | None = None
        failed = 0
        slots = trio.Semaphore(self.max_calls_per_connection)
        login_deadline = trio.current_time() + self.login_timeout_seconds
        async with trio.open_nursery() as calls:
            while True:
                try:
                    if user is None:
                        with trio.move_on_at(login_deadline) as waiting:
                            data = await ws.get_message()
                        if waiting.cancelled_caught:
                            reason = f"not logged in within {self.login_timeout_seconds:g} s"
                            self._unauthenticated_log.warning(
                                logs.remote_host(client),
                                reason,
                                "RPC connection from %s closed: %s",
                                client,
                                reason,
                            )
                            await _close(ws, 1008, reason)
                            break
                    else:
                        data = await ws.get_message()
                except trio_websocket.ConnectionClosed:
                    break
                try:
                    req = parse_request(unpack(data))
                except RpcProtocolError as exc:
                    self._calls["?", exc.code.value] += 1
                    await send(error_frame(exc.request_id, exc.code, str(exc)))
                    continue
                if user is None:
                    user, attempted = await self._login(req, send, client)
                    if user is None and attempted:
                        failed += 1
                        if failed >= MAX_FAILED_LOGINS:
                            await _close(ws, 1008, "too many failed logins")
                            break
                    continue
                if req.method == "login":
                    self._calls["login", ErrorCode.ALREADY_AUTHENTICATED.value] += 1
                    message = (
                        f"this connection is logged in already (as {user.username}); a connection logs in "
                        "once: open another connection to act as another user"
                    )
                    await send(error_frame(req.id, ErrorCode.ALREADY_AUTHENTICATED, message))
                    continue
                if req.method not in self.handlers:
                    await send.raw(self._answer_now(req, user))
                    continue
                await slots.acquire()
                calls.start_soon(self._call, req, user, send, slots)
            # The client went away (or closed): abandon its calls. Anything they started elsewhere goes on.
            calls.cancel_scope.cancel()

    async def _login(self, req: Request, send: _Sender, client: str) -> tuple[RpcUser | None, bool]:
        """Answer a request on a connection not logged in yet: the user if it logged in, and whether it was
        a failed login attempt (a call before the login, or a login with an argument it does not take, is
        none: it checks no password)."""
        if req.method != "login":
            self._calls[_method_label(req.method), ErrorCode.UNAUTHENTICATED.value] += 1
            await send(error_frame(req.id, ErrorCode.UNAUTHENTICATED, "log in first (method 'login')"))
            return None, False
        try:
            check_arguments("login", req.args)
        except RpcProtocolError as exc:
            self._calls["login", exc.code.value] += 1
            await send(error_frame(req.id, exc.code, str(exc)))
            return None, False
        user = await self.users.authenticate(req.args.get("user"), req.args.get("password"))
        if user is None:
            self._calls["login", ErrorCode.UNAUTHENTICATED.value] += 1
            self._note_failed_login(client, req.args.get("user"))
            await send(error_frame(req.id, ErrorCode.UNAUTHENTICATED, "wrong user name or password"))
            return None, True
        self._calls["login", "ok"] += 1
        log.info("RPC user %s logged in", user.username)
        await send(ok_frame(req.id, {"user": user.username, "permissions": sorted(user.permissions)}))
        return user, False

    async def _call(self, req: Request, user: RpcUser, send: _Sender, slots: trio.Semaphore) -> None:
        """Run an ``async`` handler (in a task of its own) and send its answer."""
        try:
            try:
                args = self._check(req, user)

                async def send_event(value: Any) -> None:
                    await send(event_frame(req.id, value))

                value = await self.handlers[req.method](
                    Call(method=req.method, args=args, user=user, send=send_event)
                )
            except Exception as exc:
                data = self._reply(req, None, exc)
            else:
                data = self._reply(req, value, None)
            await send.raw(data)
        except trio_websocket.ConnectionClosed:
            pass
        finally:
            slots.release()

    def _answer_now(self, req: Request, user: RpcUser) -> bytes:
        """The answer to an immediate method, or to an unknown or unavailable one."""
        try:
            args = self._check(req, user)
            handler = self.immediate.get(req.method)
            if handler is None:
                raise RpcError(ErrorCode.UNAVAILABLE, f"{req.method} is not available on this node")
            value = handler(Call(method=req.method, args=args, user=user, send=_no_events))
        except Exception as exc:
            return self._reply(req, None, exc)
        return self._reply(req, value, None)

    def _check(self, req: Request, user: RpcUser) -> dict[str, Any]:
        """The arguments the handler gets (``check_arguments``: an optional one given as nil is left out);
        raises the :class:`RpcError` for an unknown method, a missing permission or arguments the method
        does not take."""
        need = METHODS.get(req.method, _UNKNOWN)
        if need is _UNKNOWN:
            raise RpcError(ErrorCode.UNKNOWN_METHOD, f"unknown method {req.method!r}")
        flow = req.args.get("flow") if req.method == "start_flow" else None
        if req.method == "start_flow" and not isinstance(flow, str):  # (its permission depends on it)
            raise RpcError(ErrorCode.BAD_ARGUMENTS, "start_flow needs 'flow': the flow's name")
        if need is not None and not allowed(user.permissions, req.method, flow):  # (None: ping, whoami)
            what = f"start flow {flow}" if flow else f"call {req.method}"
            raise RpcError(ErrorCode.FORBIDDEN, f"user {user.username} may not {what}")
        try:
            return check_arguments(req.method, req.args)
        except RpcProtocolError as exc:
            raise RpcError(exc.code, str(exc)) from None

    def _reply(self, req: Request, value: Any, error: Exception | None) -> bytes:
        """The encoded final frame for ``value`` (or ``error``), counted in the statistics."""
        outcome = "ok"
        if error is None:
            frame = {"id": req.id, "ok": value}
        elif isinstance(error, RpcError):
            outcome = error.code
            frame = {"id": req.id, "error": {"code": error.code, "message": error.message[:2000]}}
        else:
            outcome = ErrorCode.INTERNAL.value
            log.error("RPC %s failed", req.method, exc_info=error)
            frame = error_frame(req.id, ErrorCode.INTERNAL, f"{type(error).__name__}: {error}")
        try:
            data = pack(frame)
        except (TypeError, ValueError) as exc:  # a handler returned something msgpack cannot encode
            outcome = ErrorCode.INTERNAL.value
            data = pack(error_frame(req.id, ErrorCode.INTERNAL, f"result cannot be encoded: {exc}"))
        self._calls[_method_label(req.method), outcome] += 1
        return data


_UNKNOWN: Final = object()


def _close_reason(text: str) -> str:
    """``text`` cut to the :data:`MAX_CLOSE_REASON_BYTES` a close frame carries (whole characters only)."""
    return text.encode(errors="replace")[:MAX_CLOSE_REASON_BYTES].decode(errors="ignore")


async def _close(ws: trio_websocket.WebSocketConnection, code: int, reason: str) -> None:
    """Close with ``code``: a client that does not answer the close within :data:`DISCONNECT_TIMEOUT_SECONDS`
    is dropped (``aclose`` alone waits for its answer for ever, keeping the connection and its slot)."""
    with trio.move_on_after(DISCONNECT_TIMEOUT_SECONDS):
        await ws.aclose(code=code, reason=reason)  # (cancelled, it closes the stream)


class _NotAWebsocketError(Exception):
    """What arrived on the RPC port is not a websocket handshake: answer ``status`` (``str()`` says why)."""

    def __init__(self, status: int, detail: str, headers: list[tuple[bytes, bytes]] | None = None) -> None:
        super().__init__(detail)
        self.status = status
        self.headers = headers or []


#: The end of a request head (h11 takes a bare LF as a line end too).
_HEAD_END: Final = re.compile(rb"\n\r?\n")


async def _receive_handshake(stream: trio.abc.Stream) -> bytes | None:
    """Read a websocket handshake's request head from ``stream`` and check it as wsproto does (its own
    ``H11Handshake``, the one trio-websocket uses): the bytes read (the head and whatever followed it), or
    ``None`` if the client closed first.

    Raises:
        _NotAWebsocketError: it is not a websocket handshake, or its head is over
            :data:`MAX_HANDSHAKE_HEAD_BYTES`.
    """
    handshake = wsproto.handshake.H11Handshake(wsproto.ConnectionType.SERVER)
    seen = bytearray()
    while True:
        data = await stream.receive_some(65536)
        if not data:
            return None
        seen += data
        try:
            handshake.receive_data(data)
        except wsproto.utilities.RemoteProtocolError as exc:
            hint = exc.event_hint
            status = getattr(hint, "status_code", 400)
            headers = list(getattr(hint, "headers", []))
            detail = str(exc)
            # wsproto says "Bad HTTP message" for whatever h11 refused (raised while handling it): say what
            if isinstance(exc.__context__, h11.RemoteProtocolError):
                status, detail = exc.__context__.error_status_hint, _h11_text(exc.__context__)
            raise _NotAWebsocketError(status, detail, headers) from None
        except UnicodeError:  # wsproto decodes Host as IDNA (in trio-websocket's reader: the server ended)
            raise _NotAWebsocketError(400, "the Host header is not a valid host name") from None
        done = next(handshake.events(), None) is not None  # (the Request: nothing else comes before it)
        size = len(seen)
        if done and (end := _HEAD_END.search(seen)):  # (what follows the head is not part of it)
            size = end.end()
        if size > MAX_HANDSHAKE_HEAD_BYTES:
            raise _NotAWebsocketError(431, f"request head larger than {MAX_HANDSHAKE_HEAD_BYTES} bytes")
        if done:
            return bytes(seen)


def _h11_text(exc: h11.RemoteProtocolError) -> str:
    from corda_trio.transport import protocol_error_text

    if exc.error_status_hint == 431:
        return f"request head larger than {MAX_HANDSHAKE_HEAD_BYTES} bytes"
    return protocol_error_text(exc)


async def _answer_not_a_websocket(stream: trio.abc.Stream, refusal: _NotAWebsocketError) -> None:
    """Answer ``refusal`` (see :class:`_NotAWebsocketError`), then let the client read it before closing."""
    from corda_trio.transport import drain_before_close, http_response

    body = f"{NOT_A_WEBSOCKET_TEXT} ({refusal})\n".encode()
    headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"connection", b"close"), *refusal.headers]
    try:
        await stream.send_all(http_response(h11.Connection(h11.SERVER), refusal.status, headers, body))
        if isinstance(stream, trio.abc.HalfCloseableStream):
            await drain_before_close(stream)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass  # the client left already


@final
class _Replayed(trio.abc.HalfCloseableStream):
    """``stream``, whose reader gets ``head`` (read from ``stream`` already) first: how the handshake we
    checked reaches trio-websocket."""

    def __init__(self, stream: trio.abc.Stream, head: bytes) -> None:
        self._stream = stream
        self._head = head
        # every call after the head goes straight to the stream: no frame of ours per websocket read/write
        self.send_all = stream.send_all  # type: ignore[method-assign]

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if not self._head:
            self.receive_some = self._stream.receive_some  # type: ignore[method-assign]
            return await self._stream.receive_some(max_bytes)
        await trio.lowlevel.checkpoint()
        n = len(self._head) if max_bytes is None else max_bytes
        data, self._head = self._head[:n], self._head[n:]
        return data

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self._stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self._stream.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        if isinstance(self._stream, trio.abc.HalfCloseableStream):
            await self._stream.send_eof()

    async def aclose(self) -> None:
        await self._stream.aclose()


async def _no_events(value: Any) -> None:
    raise RuntimeError("an immediate RPC handler cannot send events")


def _method_label(method: str) -> str:
    return method if method in METHODS or method == "login" else "?"


@attrs.define(eq=False)
class _Sender:
    ws: trio_websocket.WebSocketConnection

    async def __call__(self, frame: dict[str, Any]) -> None:
        await self.raw(pack(frame))

    async def raw(self, data: bytes) -> None:
        await self.ws.send_message(data)
