"""The Python RPC client::

    async with rpc.connect("ws://127.0.0.1:40002", "ops", password) as client:
        result = await client.start_flow("PingPong", recipient="O=Bob,L=Paris,C=FR", rounds=10)
        async for event in client.watch_flow(flow_id):
            ...

One websocket; many tasks may call at once over it. There is no reader task of our own: a caller waiting
for its answer reads the connection itself (one at a time: the *reader*) and routes each frame to the call
with its id; when it has its own answer it hands the reading over to another waiting caller. A lone caller
so reads its answer directly, one task switch fewer per call than behind a reader task.

Every method raises :class:`RpcError` for an error reply (``code`` says which) and
:class:`RpcConnectionError` when the connection fails or closes.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import re
import ssl
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Final

import attrs
import h11
import trio
import trio_websocket

from .. import logs
from ..hostport import host_port_text
from ._codec import pack, unpack
from ._protocol import ErrorCode, RpcProtocolError, request_frame
from ._server import RpcError

__all__ = ["RpcClient", "RpcConnectionError", "connect"]

#: Largest reply the client reads (a long flow list or network map).
MAX_REPLY_BYTES: Final[int] = 64 * 1024 * 1024
#: Messages trio-websocket buffers before its reader waits for ours (which never waits).
EVENT_BUFFER: Final[int] = 1024
#: How long closing the websocket may take (the closing handshake) before the stream is closed anyway.
_DISCONNECT_TIMEOUT_SECONDS: Final[float] = 5.0


class RpcConnectionError(RpcError):
    """The connection could not be made, or it closed before the answer arrived."""

    def __init__(self, message: str, code: ErrorCode | str = ErrorCode.UNAVAILABLE) -> None:
        super().__init__(code, message)


@attrs.define(eq=False)
class RpcClient:
    """A logged-in connection. Get one from :func:`connect`."""

    _ws: trio_websocket.WebSocketConnection
    user: str = ""
    permissions: tuple[str, ...] = ()
    _ids: itertools.count[int] = attrs.field(factory=lambda: itertools.count(1))
    _pending: dict[int, _Pending] = attrs.field(factory=dict)
    _closed: RpcConnectionError | None = None
    #: a caller is reading the connection (see the module docstring)
    _reading: bool = False

    # --- the generic call --------------------------------------------------------------------------

    async def call(self, method: str, **args: Any) -> Any:
        """Call ``method`` and return its result (events, if any, are dropped)."""
        async with self._request(method, args) as pending:
            while True:
                frame = await pending.get()
                if "event" not in frame:
                    return _result(frame)

    async def stream(self, method: str, **args: Any) -> AsyncIterator[dict[str, Any]]:
        """Call ``method``; yields ``{"event": value}`` for each event and finally ``{"ok": value}``."""
        async with self._request(method, args) as pending:
            while True:
                frame = await pending.get()
                if "event" in frame:
                    yield {"event": frame["event"]}
                else:
                    yield {"ok": _result(frame)}
                    return

    @contextlib.asynccontextmanager
    async def _request(self, method: str, args: Mapping[str, Any]) -> AsyncIterator[_Pending]:
        if self._closed is not None:
            raise self._closed
        request_id = next(self._ids)
        try:
            data = pack(request_frame(request_id, method, args))
        except (TypeError, ValueError, OverflowError) as exc:  # what msgpack cannot hold
            raise RpcError(ErrorCode.BAD_ARGUMENTS, f"{method}: an argument cannot be sent: {exc}") from None
        pending = _Pending(self)
        self._pending[request_id] = pending
        try:
            try:
                await self._ws.send_message(data)
            except trio_websocket.ConnectionClosed as exc:
                raise _closed_error(exc) from None
            yield pending
        finally:
            self._pending.pop(request_id, None)

    async def _receive_for(self, waiting: _Pending) -> dict[str, Any]:
        """The next frame of ``waiting``'s call: read the connection if no other caller does, else wait."""
        while not waiting.frames:
            if self._closed is not None:
                raise self._closed
            if self._reading:
                await waiting.wait()
                continue
            self._reading = True
            reading_on = False
            try:
                await self._read_one()
                reading_on = not waiting.frames and self._closed is None
            finally:
                self._reading = False
                if not reading_on:  # done, closed or cancelled: another waiting caller reads next
                    self._hand_over()
        return waiting.frames.popleft()

    async def _read_one(self) -> None:
        try:
            data = await self._ws.get_message()
        except trio_websocket.ConnectionClosed as exc:
            self._closed = _closed_error(exc)
            for pending in self._pending.values():
                pending.wake()
            return
        try:
            frame = unpack(data)
        except RpcProtocolError:
            return
        if isinstance(frame, dict):
            pending = self._pending.get(frame.get("id"))  # type: ignore[arg-type]
            if pending is not None:
                pending.put(frame)

    def _hand_over(self) -> None:
        """The reader is leaving: wake one caller that waits for a frame (it reads next)."""
        for pending in self._pending.values():
            if pending.waiting and not pending.frames:
                pending.wake()
                return

    # --- typed calls -------------------------------------------------------------------------------

    async def ping(self) -> Any:
        return await self.call("ping")

    async def node_info(self) -> dict[str, Any]:
        return await self.call("node_info")

    async def network_map(self) -> list[dict[str, Any]]:
        return await self.call("network_map")

    async def queue_statistics(self) -> list[dict[str, Any]]:
        return await self.call("queue_statistics")

    async def registered_flows(self) -> list[str]:
        return await self.call("registered_flows")

    async def start_flow(
        self,
        flow: str,
        args: Mapping[str, Any] | None = None,
        /,
        *,
        client_id: str | None = None,
        **flow_args: Any,
    ) -> Any:
        """Start ``flow`` and return its result once it finishes.

        The flow's arguments are keywords, or one mapping ``args`` (for an argument that shares a name with
        a keyword of this method, ``client_id`` say), not both. ``client_id`` makes the start idempotent: the
        flow's id is ``C-<client_id>``, and calling again with it (after a lost connection, say) waits for
        that flow instead of starting another.

        Raises:
            TypeError: both ``args`` and keyword arguments given.
            RpcError: ``flow-failed`` (the flow's error in the message), ``forbidden``, ``draining``, ...
        """
        return await self._start_flow(flow, args, flow_args, client_id, wait=True)

    async def launch_flow(
        self,
        flow: str,
        args: Mapping[str, Any] | None = None,
        /,
        *,
        client_id: str | None = None,
        **flow_args: Any,
    ) -> str:
        """Start ``flow`` and return its id at once (see :meth:`watch_flow`; the arguments and ``client_id``
        as for :meth:`start_flow`: the id of the flow it names, started now or before)."""
        return await self._start_flow(flow, args, flow_args, client_id, wait=False)

    async def _start_flow(
        self,
        flow: str,
        args: Mapping[str, Any] | None,
        flow_args: dict[str, Any],
        client_id: str | None,
        *,
        wait: bool,
    ) -> Any:
        if args is not None and flow_args:
            raise TypeError("give the flow's arguments as keywords or as one mapping, not both")
        ids = {} if client_id is None else {"client_id": client_id}
        return await self.call("start_flow", flow=flow, args=dict(args or flow_args), wait=wait, **ids)

    async def watch_flow(self, flow_id: str) -> AsyncIterator[dict[str, Any]]:
        """Yield the flow's progress events, then its final state (``state`` and ``result`` or ``error``)."""
        async with contextlib.aclosing(self.stream("watch_flow", flow_id=flow_id)) as frames:
            async for frame in frames:
                yield frame.get("event", frame.get("ok"))

    async def flow_result(self, flow_id: str) -> Any:
        """Wait for the flow to end; its final state (a map with ``state`` and ``result`` or ``error``)."""
        return await self.call("watch_flow", flow_id=flow_id)

    async def list_flows(self, state: str | None = None) -> list[dict[str, Any]]:
        return await self.call("list_flows", **({"state": state} if state else {}))

    async def kill_flow(self, flow_id: str) -> Any:
        return await self.call("kill_flow", flow_id=flow_id)

    async def retry_flow(self, flow_id: str) -> Any:
        return await self.call("retry_flow", flow_id=flow_id)

    async def drain(self) -> Any:
        return await self.call("drain")

    async def undrain(self) -> Any:
        return await self.call("undrain")


@attrs.define(eq=False)
class _Pending:
    """The frames of one call in flight: whoever reads puts them (never waiting), the caller takes them."""

    client: RpcClient
    frames: collections.deque[dict[str, Any]] = attrs.field(factory=collections.deque)
    #: the caller is parked in :meth:`wait`
    waiting: bool = False
    _arrived: trio.Event = attrs.field(factory=trio.Event)

    def put(self, frame: dict[str, Any]) -> None:
        self.frames.append(frame)
        self._arrived.set()

    def wake(self) -> None:
        self._arrived.set()

    async def wait(self) -> None:
        """Until a frame arrives or this caller should read (or the connection closed)."""
        self.waiting = True
        try:
            await self._arrived.wait()
        finally:
            self.waiting = False
        self._arrived = trio.Event()

    async def get(self) -> dict[str, Any]:
        return await self.client._receive_for(self)


def _result(frame: dict[str, Any]) -> Any:
    if "error" in frame:
        error = frame["error"]
        if isinstance(error, dict):
            raise RpcError(str(error.get("code", "?")), str(error.get("message", "")))
        raise RpcError("?", repr(error))
    return frame.get("ok")


def _closed_error(exc: trio_websocket.ConnectionClosed) -> RpcConnectionError:
    reason = exc.reason
    code = getattr(reason, "code", None)
    text = getattr(reason, "reason", None) or getattr(reason, "name", "") or ""
    if code == 1009:
        return RpcConnectionError(
            f"the server closed the connection: request too large ({text})", ErrorCode.TOO_LARGE
        )
    return RpcConnectionError(f"the server closed the connection (code {code}: {text})")


@contextlib.asynccontextmanager
async def connect(
    url: str,
    user: str,
    password: str,
    *,
    connect_timeout_seconds: float = 10.0,
) -> AsyncIterator[RpcClient]:
    """Connect to a node's RPC endpoint (``ws://host:port``) and log in.

    Raises:
        RpcConnectionError: the node cannot be reached or closed the connection.
        RpcError: ``unauthenticated`` (wrong user or password).
    """
    async with contextlib.AsyncExitStack() as stack:
        try:
            ws = await stack.enter_async_context(_open_websocket(url, connect_timeout_seconds))
        except trio_websocket.ConnectionRejected as exc:
            said = (exc.body or b"").decode("utf-8", "replace").strip()[:200]
            raise RpcConnectionError(
                f"{url} refused the connection: HTTP {exc.status_code}" + (f" ({said})" if said else "")
            ) from None
        except (OSError, trio_websocket.HandshakeError, trio.TooSlowError, ValueError) as exc:
            # (trio-websocket's HandshakeError says nothing itself; what went wrong is its context; trio's
            # 'all attempts to connect to HOST:PORT failed' keeps each attempt's reason in its cause)
            inner = exc if str(exc) else (exc.__cause__ or exc.__context__ or exc)
            why = logs.error_message(inner) or type(exc).__name__
            raise RpcConnectionError(f"cannot connect to {url}: {why}") from None
        async with _unwrapped():
            client = RpcClient(ws)
            answer = await client.call("login", user=user, password=password)
            client.user = str(answer.get("user", user))
            client.permissions = tuple(answer.get("permissions", ()))
            yield client


@contextlib.asynccontextmanager
async def _open_websocket(
    url: str, connect_timeout: float
) -> AsyncIterator[trio_websocket.WebSocketConnection]:
    """trio-websocket's ``open_websocket_url(url)``, but with the ``Host`` header written as an address is
    (:func:`~corda_trio.hostport.host_port_text`): trio-websocket writes the host it dials, then the port, so
    ``Host: ::1:40002``, which a strict reverse proxy in front of the RPC port refuses with 400 (RFC 7230 and
    3986: ``[::1]:40002``). Its errors are trio-websocket's: ``ValueError`` for a URL that is not ``ws://`` or
    ``wss://`` (``wss://`` with the default TLS context), :class:`trio_websocket.ConnectionTimeout` when
    ``connect_timeout`` runs out before the server has answered the upgrade, :class:`HandshakeError` from the
    ``OSError`` of a failed dial, for an answer that is not HTTP and for a connection the server closed
    without answering, :class:`ConnectionRejected` for an HTTP answer other than the upgrade."""
    host, port, resource, tls = _websocket_target(url)
    deadline = trio.current_time() + connect_timeout
    try:
        with trio.fail_at(deadline):
            if tls:
                context = ssl.create_default_context()
                stream: trio.SocketStream | trio.SSLStream[trio.SocketStream]
                stream = await trio.open_ssl_over_tcp_stream(
                    host, port, ssl_context=context, https_compatible=True
                )
                await _tls_handshake(stream, url)
            else:
                stream = await trio.open_tcp_stream(host, port)
    except trio.TooSlowError:
        raise trio_websocket.ConnectionTimeout from None
    except OSError as exc:
        raise trio_websocket.HandshakeError from exc
    # (the port is left out when it is the scheme's own, as browsers do)
    if port == (443 if tls else 80):
        header = f"[{host}]" if ":" in host else host
    else:
        header = host_port_text(host, port)
    ws: trio_websocket.WebSocketConnection | None = None
    try:
        async with trio.open_nursery() as nursery:  # (the connection's reader task)
            waiting = trio.CancelScope()
            try:
                with trio.fail_at(deadline), waiting:
                    ws = await trio_websocket.wrap_client_stream(
                        _ReaderNursery(nursery, waiting),  # type: ignore[arg-type]
                        stream,
                        header,
                        resource,
                        max_message_size=MAX_REPLY_BYTES,
                        message_queue_size=EVENT_BUFFER,
                        receive_buffer_size=65536,
                    )
            except trio.TooSlowError:
                await trio.aclose_forcefully(stream)
                raise trio_websocket.ConnectionTimeout from None
            except BaseException:  # (as when the server refused the upgrade: the reader task raised)
                await trio.aclose_forcefully(stream)
                raise
            if ws is None:  # (the reader task returned first: see _ReaderNursery)
                await trio.aclose_forcefully(stream)
                said = "the server closed the connection without answering the websocket upgrade"
                raise trio_websocket.HandshakeError(said)
            try:
                yield ws
            finally:
                # The caller is done: a server that does not answer our close (frozen, or gone without a
                # word) is not an error of the call; the stream is closed without it, which ends the reader.
                with trio.move_on_after(_DISCONNECT_TIMEOUT_SECONDS) as closing:
                    await ws.aclose()
                if closing.cancelled_caught:
                    await trio.aclose_forcefully(stream)
    except BaseExceptionGroup as group:
        leaf = _only_leaf(group)
        if leaf is None:
            raise
        if ws is None and isinstance(leaf, h11.ProtocolError):
            # (an answer that is not HTTP: wsproto takes the client for a server and has it answer 400, which
            # h11 refuses; trio-websocket's reader task raised that)
            raise trio_websocket.HandshakeError(f"the answer is not HTTP ({_http_error(leaf)})") from None
        context = leaf.__context__  # (as it was: not the group, which holds the leaf itself)
        try:
            raise leaf
        finally:
            leaf.__context__ = context
            del leaf, context


async def _tls_handshake(stream: trio.SSLStream[trio.SocketStream], url: str) -> None:
    """Run the TLS handshake of a ``wss://`` connection now, so that its failure is said as what it is
    (trio would run it inside trio-websocket's upgrade, whose failure then read as a server that closed the
    connection without answering). Raises :class:`trio_websocket.HandshakeError` with one line."""
    try:
        await stream.do_handshake()
    except trio.BrokenResourceError as exc:
        await trio.aclose_forcefully(stream)
        error = exc.__cause__
        if isinstance(error, ssl.SSLCertVerificationError):
            why = f"the server's certificate was refused: {error.verify_message or error.reason}"
            hint = " (this client trusts the system's CAs; SSL_CERT_FILE names another CA bundle)"
        elif isinstance(error, ssl.SSLError) and error.reason == "WRONG_VERSION_NUMBER":
            why, hint = "the server does not speak TLS", ""
        elif isinstance(error, ssl.SSLError | OSError | None):
            why, hint = "the server closed the connection during it", ""
        else:
            why, hint = " ".join(str(error).split()), ""
        if not hint:  # (every failure but a refused certificate)
            hint = f" (a node's own RPC port speaks ws://, not wss://: {url.replace('wss://', 'ws://', 1)}?)"
        raise trio_websocket.HandshakeError(f"TLS handshake failed: {why}{hint}") from None


@attrs.frozen
class _ReaderNursery:
    """The nursery trio-websocket's ``wrap_client_stream`` starts the connection's reader task in (its only
    use of it: ``start_soon``). A reader that returns (the server closed the connection, as a node's P2P
    port does: an operator's likely wrong ``--node``) cancels ``waiting``, the wait for the answer to the
    upgrade, which trio-websocket would otherwise wait for until the connect timeout."""

    nursery: trio.Nursery
    waiting: trio.CancelScope

    def start_soon(self, fn: Callable[..., Awaitable[object]], *args: object, name: object = None) -> None:
        async def reader() -> None:
            await fn(*args)
            self.waiting.cancel()  # (once the connection is open, its scope is gone: no effect)

        self.nursery.start_soon(reader, name=name or fn)


def _websocket_target(url: str) -> tuple[str, int, str, bool]:
    """``(host, port, resource, tls)`` of a ``ws://`` or ``wss://`` URL (``ValueError``: not one)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("ws", "wss"):
        raise ValueError('WebSocket URL scheme must be "ws:" or "wss:"')
    if not parts.hostname:
        if parts.netloc.count(":") > 1:  # (ws://::1:40002: the host cannot be told from the port)
            host, _, port_text = parts.netloc.rpartition(":")
            written = f"{parts.scheme}://[{host}]:{port_text}"
            raise ValueError(f"an IPv6 address is written in brackets in a URL, as in {written}")
        raise ValueError(f"the URL names no host: write it as {parts.scheme}://HOST:PORT")
    tls = parts.scheme == "wss"
    port = parts.port if parts.port is not None else 443 if tls else 80  # (ValueError: out of range)
    resource = (parts.path or "/") + (f"?{parts.query}" if "?" in url else "")
    return parts.hostname, port, resource, tls


def _http_error(exc: BaseException) -> str:
    """What h11 found wrong in the server's answer: the h11 ``RemoteProtocolError`` ``exc`` was raised while
    handling (``illegal status line: 'garbage'``: without the ``bytearray(b...)`` h11 wraps it in)."""
    said: BaseException | None = exc
    for _ in range(10):
        if said is None or isinstance(said, h11.RemoteProtocolError):
            break
        said = said.__context__
    return _BYTES_REPR.sub(r"\1", str(said or exc))[:200]


_BYTES_REPR: Final = re.compile(r"bytearray\(b('.*?'|\".*?\")\)")


def _only_leaf(group: BaseExceptionGroup) -> BaseException | None:
    """The one exception inside ``group`` (through groups of one), or ``None``: it holds several."""
    leaf: BaseException = group
    while isinstance(leaf, BaseExceptionGroup) and len(leaf.exceptions) == 1:
        leaf = leaf.exceptions[0]
    return None if isinstance(leaf, BaseExceptionGroup) else leaf


@contextlib.asynccontextmanager
async def _unwrapped() -> AsyncIterator[None]:
    """The client's nursery is its own business: an error from inside comes out as itself, not a group."""
    try:
        yield
    except BaseExceptionGroup as group:
        leaf = _only_leaf(group)
        if leaf is None:
            raise
        raise leaf from None
