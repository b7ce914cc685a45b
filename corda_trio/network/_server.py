"""The network map HTTP service: h11 under Trio (``protocol_spec/network-map.md``).

Theory of operation
-------------------
One task per TCP connection drives an ``h11.Connection`` through ``transport.receive_http_event``: read a
request (a head of at most ``MAX_HEAD_BYTES``, however it arrives; then a body of at most ``MAX_BODY_BYTES``,
after ``100 Continue`` if the client waits for it: a body refused on its ``Content-Length`` is answered 413
without), answer it, and start the next cycle while the client keeps the connection alive.  Each request is
handled by :meth:`NetworkMapService.handle`, a plain blocking function (SQLite and signature checks) run in a
worker thread behind a one-thread ``CapacityLimiter``, so requests are serialised and the Trio loop never
blocks.
A refused publication (a NodeInfo of another network, a bad signature, a node the operator removed) is
logged per client address (the host) at most once a minute: the first in full, then a summary counting the
rest (``logs.PeerWarnings``), since anyone who can reach the port can post thousands;
:attr:`NetworkMapService.refused_publications` counts every one.
Anything wrong with a request becomes a 4xx with a one-line text reason; a protocol error gets a 400 (431 for
a head over the limit) when a response can still be sent, then the connection is closed once the client has
read it (``transport.drain_before_close``).  No request can stop the server: exceptions other than
``Cancelled`` inside a connection are logged and end that connection only.

The map itself is not cached: every ``GET /network-map`` reads the current hashes from the store and signs
them, so that an operator's change to the store (``corda-trio networkmap remove``) is served at once.  The
response carries ``Cache-Control: max-age=N``, which clients use as their polling interval.
"""

from __future__ import annotations

import collections
import datetime as dt
import logging
import re
from collections.abc import Callable, Sequence
from typing import Final, final

import attrs
import h11
import trio
from cryptography import x509

from corda_trio import logs, pki, transport

from . import _codec
from ._errors import MalformedPayloadError, PayloadRejectedError
from ._model import NetworkMap
from ._signing import sign_network_map, stored_damage, verify_network_parameters, verify_node_info
from ._store import NetworkMapStore

__all__ = [
    "DEFAULT_MAX_CONNECTIONS",
    "ENDPOINTS",
    "HttpResponse",
    "NetworkMapService",
    "endpoint_of",
    "serve_network_map",
]

log = logging.getLogger("corda_trio.network.server")

#: Largest request body (a signed NodeInfo is a few KiB).
MAX_BODY_BYTES: Final[int] = 256 * 1024
#: Largest request head, request line to blank line (h11's default bound on incomplete heads is 16 KiB too);
#: a larger one is answered 431.
MAX_HEAD_BYTES: Final[int] = 16 * 1024
#: A connection that sends nothing for this long is closed.
IDLE_TIMEOUT_SECONDS: Final[float] = 30.0
#: Concurrent clients by default: far more than the nodes of a development network poll with, far fewer
#: than the usual 1024-descriptor soft limit.
DEFAULT_MAX_CONNECTIONS: Final[int] = 256
#: Default ``Cache-Control: max-age`` of the map, i.e. how often nodes poll.
DEFAULT_MAX_AGE_SECONDS: Final[int] = 30
SERVER_NAME: Final[bytes] = b"corda-trio-networkmap/1"
_HASH_RE: Final = re.compile(r"^[0-9A-Fa-f]{64}$")


@final
@attrs.frozen(kw_only=True)
class HttpResponse:
    """A response: status, body, content type and extra headers."""

    status: int
    body: bytes
    content_type: bytes = b"text/plain; charset=utf-8"
    headers: tuple[tuple[bytes, bytes], ...] = ()
    #: why a publication was refused, for the server's log (bounded per client there)
    refusal: str | None = None

    @classmethod
    def text(cls, status: int, message: str) -> HttpResponse:
        return cls(status=status, body=(message + "\n").encode())


#: The endpoints responses are counted under (:func:`endpoint_of`).
ENDPOINTS: Final = (
    "/network-map",
    "/network-map/publish",
    "/network-map/node-info",
    "/network-map/network-parameters",
)


def endpoint_of(target: str | None) -> str:
    """The endpoint of a request target, one of :data:`ENDPOINTS`; ``other`` for any other path (a client
    chooses the path: it is never a label as it is) and ``none`` when no request could be read."""
    if target is None:
        return "none"
    path = target.partition("?")[0]
    if path in ENDPOINTS[:2]:
        return path
    for endpoint in ENDPOINTS[2:]:
        if path.startswith(endpoint + "/"):
            return endpoint
    return "other"


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


@attrs.define(eq=False)
class NetworkMapService:
    """Request handling of the map service, independent of sockets (testable with plain calls).

    Attributes:
        store: the persistent map.
        trust_root: the network root every NodeInfo must chain to.
        map_key: the network map signing key.
        map_cert_path: its certificate path (map certificate first, root excluded).
        max_age_seconds: advertised in ``Cache-Control``.
        clock: returns the current UTC time (certificate validity checks).
    """

    store: NetworkMapStore
    trust_root: x509.Certificate
    map_key: pki.CaKey
    map_cert_path: Sequence[x509.Certificate]
    max_age_seconds: int = DEFAULT_MAX_AGE_SECONDS
    clock: Callable[[], dt.datetime] = _utcnow
    #: publications refused with 403 (each is logged, per client at most once a minute)
    refused_publications: int = 0
    #: publications stored, by what the store did (``added``, ``replaced``, ``unchanged``)
    accepted_publications: collections.Counter[str] = attrs.field(factory=collections.Counter)
    #: publications not stored, by reason: the 403s' (a ``PayloadRejectedError`` reason,
    #: ``removed-by-operator``, ``confusable-name``; ``refused_publications`` in all), ``malformed`` (400)
    #: and ``stale-serial`` (409)
    publication_refusals: collections.Counter[str] = attrs.field(factory=collections.Counter)
    #: stored entries (their hashes) found damaged as they were to be served: each refused, logged once
    damaged_entries: set[str] = attrs.field(factory=set)
    #: responses sent, by endpoint (:func:`endpoint_of`) and status (see :meth:`count_response`)
    responses: collections.Counter[tuple[str, int]] = attrs.field(factory=collections.Counter)

    def count_response(self, target: str | None, status: int) -> None:
        """Count a response to a request for ``target`` (``None``: no request could be read)."""
        self.responses[(endpoint_of(target), status)] += 1

    def minimum_platform_version(self) -> int:
        current = self.store.current_parameters_hash()
        if current is None:
            return 1
        signed = self.store.get_parameters(current)
        assert signed is not None
        params, _ = verify_network_parameters(signed, trust_root=self.trust_root, now=self.clock())
        return params.minimum_platform_version

    def handle(self, method: str, target: str, body: bytes) -> HttpResponse:
        """Answer one request (blocking; run it in a worker thread)."""
        path, _, _query = target.partition("?")
        if path == "/network-map/publish":
            if method != "POST":
                return self._not_allowed("POST")
            return self._publish(body)
        if path == "/network-map":
            if method not in ("GET", "HEAD"):
                return self._not_allowed("GET, HEAD")
            return self._get_map()
        for prefix, getter, kind in (
            ("/network-map/node-info/", self.store.get_node_info, "node-info"),
            ("/network-map/network-parameters/", self.store.get_parameters, "network-parameters"),
        ):
            if path.startswith(prefix):
                if method not in ("GET", "HEAD"):
                    return self._not_allowed("GET, HEAD")
                wanted = path[len(prefix) :]
                if not _HASH_RE.match(wanted):
                    return HttpResponse.text(400, f"{wanted[:80]!r} is not a SHA-256 hash (64 hex digits)")
                data = getter(wanted.upper())
                if data is None:
                    return HttpResponse.text(404, f"no entry with hash {wanted.upper()}")
                # (checked as it is served: the database's bytes may have been damaged since they were
                # accepted, and a node must never get bytes the map did not accept)
                damage = stored_damage(kind, data, wanted, trust_root=self.trust_root, now=self.clock())
                if damage is not None:
                    return self._damaged(kind, wanted.upper(), damage)
                return HttpResponse(
                    status=200, body=data, content_type=b"application/octet-stream",
                    headers=((b"cache-control", b"max-age=31536000, immutable"),),
                )  # fmt: skip
        return HttpResponse.text(404, f"no such resource: {path[:200]}")

    def _damaged(self, kind: str, hash_hex: str, damage: str) -> HttpResponse:
        what = "NodeInfo" if kind == "node-info" else "network parameters"
        if hash_hex not in self.damaged_entries:  # (one error line per entry: nodes ask again at each poll)
            self.damaged_entries.add(hash_hex)
            log.error(
                "the map database's copy of %s %s is damaged (%s): not served; restore the database from a "
                "backup",
                what, hash_hex, damage,
            )  # fmt: skip
        return HttpResponse.text(
            500, f"the map's stored copy of {what} {hash_hex} is damaged; the map's operator must restore it"
        )

    @staticmethod
    def _not_allowed(allowed: str) -> HttpResponse:
        return attrs.evolve(
            HttpResponse.text(405, f"method not allowed; use {allowed}"),
            headers=((b"allow", allowed.encode()),),
        )

    def _publish(self, body: bytes) -> HttpResponse:
        if not body:
            self.publication_refusals["malformed"] += 1
            return HttpResponse.text(400, "empty body: expected a signed NodeInfo")
        try:
            node = verify_node_info(
                body,
                trust_root=self.trust_root,
                now=self.clock(),
                minimum_platform_version=self.minimum_platform_version(),
            )
        except MalformedPayloadError as exc:
            self.publication_refusals["malformed"] += 1
            return HttpResponse.text(400, f"malformed NodeInfo: {exc}")
        except PayloadRejectedError as exc:
            self.refused_publications += 1
            self.publication_refusals[exc.reason] += 1
            return attrs.evolve(HttpResponse.text(403, f"{exc.reason}: {exc}"), refusal=str(exc))
        result = self.store.put_node_info(node)
        if result == "denied":
            self.refused_publications += 1
            self.publication_refusals["removed-by-operator"] += 1
            return attrs.evolve(
                HttpResponse.text(
                    403,
                    f"removed-by-operator: {node.legal_name} (identity key {node.identity_key_hash}) was "
                    "removed from the map; the operator must readmit it",
                ),
                refusal=f"{node.legal_name}: removed by the operator",
            )
        if result == "confusable":
            self.refused_publications += 1
            self.publication_refusals["confusable-name"] += 1
            held = self.store.confusable_with(node.legal_name)
            message = (
                pki.confusable_names_message(node.legal_name, held)
                if held is not None
                else f"legal name {str(node.legal_name)!r} is confusable with a name in the map"
            )
            return attrs.evolve(HttpResponse.text(403, f"confusable-name: {message}"), refusal=message)
        if result == "stale":
            self.publication_refusals["stale-serial"] += 1
            current = self.store.current_serial(str(node.legal_name))
            return HttpResponse.text(
                409,
                f"stale-serial: the map holds serial {current} for {node.legal_name}; "
                f"publish a higher serial than {node.node_info.serial}",
            )
        self.accepted_publications[result] += 1
        log.info("NodeInfo of %s %s (%s)", node.legal_name, result, node.hash)
        return HttpResponse.text(200, f"{result} {node.hash}")

    def signed_map(self) -> bytes:
        params_hash = self.store.current_parameters_hash()
        if params_hash is None:
            raise RuntimeError("the store has no current network parameters")
        network_map = NetworkMap(
            node_info_hashes=tuple(self.store.node_info_hashes()), network_parameters_hash=params_hash
        )
        return _codec.encode(sign_network_map(network_map, self.map_key, self.map_cert_path).to_wire())

    def _get_map(self) -> HttpResponse:
        return HttpResponse(
            status=200,
            body=self.signed_map(),
            content_type=b"application/octet-stream",
            headers=(
                (b"cache-control", f"max-age={self.max_age_seconds}".encode()),
                (b"x-corda-map-serial", str(self.store.map_serial()).encode()),
            ),
        )


async def serve_network_map(
    service: NetworkMapService,
    port: int,
    *,
    host: str = "127.0.0.1",
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
    task_status: trio.TaskStatus[list[trio.SocketListener]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``service`` on ``host:port`` until cancelled (``port=0``: any free port, see the listeners).

    At most ``max_connections`` clients are served at once; one more gets ``503 Service Unavailable`` and
    a closed socket. Refusals and ``accept`` failing for lack of descriptors are logged at most once per
    ``transport.ACCEPT_ERROR_LOG_INTERVAL_SECONDS``; accepting resumes as soon as a descriptor is free (the
    accept loop is ``transport.serve_listeners``, shared with the AMQP listeners).
    """
    limiter = trio.CapacityLimiter(1)
    refusals = logs.PeerWarnings(log, "NodeInfo publications from %s refused")

    async def handler(stream: trio.SocketStream) -> None:
        try:
            await _serve_connection(service, stream, limiter, refusals)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            log.debug("client went away before its response was sent")
        except Exception:  # one bad connection must never stop the server
            log.exception("network map connection failed")
        finally:
            await trio.aclose_forcefully(stream)

    listeners = await trio.open_tcp_listeners(port, host=host)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(refusals.report_due)
        await transport.serve_listeners(
            handler,  # type: ignore[arg-type]  # TCP listeners hand out SocketStreams
            listeners,
            max_connections=max_connections,
            refuse=transport.refuse_with_http_503,
            task_status=task_status,
        )


async def _send(
    stream: trio.SocketStream, conn: h11.Connection, response: HttpResponse, *, head: bool
) -> None:
    headers = [(b"content-type", response.content_type), (b"server", SERVER_NAME), *response.headers]
    if response.status >= 400:
        headers.append((b"connection", b"close"))
    await stream.send_all(
        transport.http_response(conn, response.status, headers, response.body, with_body=not head)
    )


async def _next_event(stream: trio.SocketStream, conn: h11.Connection) -> h11.Event | type[h11.PAUSED]:
    return await transport.receive_http_event(stream, conn, max_head_bytes=MAX_HEAD_BYTES)


async def _serve_connection(
    service: NetworkMapService,
    stream: trio.SocketStream,
    limiter: trio.CapacityLimiter,
    refusals: logs.PeerWarnings,
) -> None:
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
    while True:
        request: h11.Request | None = None  # (of this cycle; ``None`` until its head is read)
        target = ""
        try:
            with trio.move_on_after(IDLE_TIMEOUT_SECONDS) as idle:
                event = await _next_event(stream, conn)
            if idle.cancelled_caught:
                return
            if isinstance(event, h11.ConnectionClosed) or event is h11.PAUSED:
                return
            if not isinstance(event, h11.Request):
                raise h11.RemoteProtocolError(f"unexpected {type(event).__name__}", 400)
            request = event
            length = dict(request.headers).get(b"content-length")
            target = request.target.decode("ascii", "replace")
            if length is not None and int(length) > MAX_BODY_BYTES:
                service.count_response(target, 413)
                await _send(stream, conn, HttpResponse.text(413, f"body larger than {MAX_BODY_BYTES} bytes"),
                            head=False)  # fmt: skip
                return
            body = bytearray()
            with trio.move_on_after(IDLE_TIMEOUT_SECONDS) as body_timeout:
                while True:
                    event = await _next_event(stream, conn)
                    if isinstance(event, h11.Data):
                        body += event.data
                        if len(body) > MAX_BODY_BYTES:
                            service.count_response(target, 413)
                            await _send(stream, conn, HttpResponse.text(413, "body too large"), head=False)
                            return
                    elif isinstance(event, h11.EndOfMessage):
                        break
                    else:
                        raise h11.RemoteProtocolError(
                            "connection closed in the middle of a request body", 400
                        )
            if body_timeout.cancelled_caught:
                return
        except h11.RemoteProtocolError as exc:
            if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                status = exc.error_status_hint if 400 <= exc.error_status_hint < 500 else 400
                reason = (
                    transport.protocol_error_text(exc)
                    if status == 431
                    else f"bad request: {transport.protocol_error_text(exc)}"
                )
                service.count_response(None if request is None else target, status)
                await _send(stream, conn, HttpResponse.text(status, reason), head=False)
                await transport.drain_before_close(stream)
            return
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return
        assert request is not None
        method = request.method.decode("ascii", "replace")
        try:
            response = await trio.to_thread.run_sync(
                service.handle, method, target, bytes(body), limiter=limiter
            )
        except Exception as exc:  # a bug or a broken store: answer 500 and keep serving
            log.exception("network map request %s %s failed", method, target)
            response = HttpResponse.text(500, f"internal error: {type(exc).__name__}")
        if response.refusal is not None:
            client = logs.remote_name(stream)
            refusals.warning(
                logs.remote_host(client),
                response.refusal,
                "refused NodeInfo from %s: %s",
                client,
                response.refusal,
            )
        service.count_response(target, response.status)
        await _send(stream, conn, response, head=method == "HEAD")
        if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
            return
        try:
            conn.start_next_cycle()
        except h11.LocalProtocolError:
            return
