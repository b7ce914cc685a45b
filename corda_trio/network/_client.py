"""HTTP client of the network map service (h11 over a Trio TCP stream).

One request per connection (``Connection: close``): nodes talk to the map every ``max-age`` seconds, so
keeping connections alive would buy nothing and cost reconnection logic.  Every call is bounded by
``REQUEST_TIMEOUT_SECONDS`` (a high-level helper, so it applies a safe default) and raises
:class:`NetworkMapHttpError` for a connection failure (``status`` 0) or a non-2xx answer, with the server's
one-line reason.
"""

from __future__ import annotations

import re
import urllib.parse
from typing import Final, final

import attrs
import h11
import trio

from corda_trio import logs

from ._errors import NetworkMapHttpError
from ._model import check_host

__all__ = ["MapResponse", "NetworkMapClient"]

REQUEST_TIMEOUT_SECONDS: Final[float] = 30.0
MAX_RESPONSE_BYTES: Final[int] = 64 * 1024 * 1024
_MAX_AGE_RE: Final = re.compile(rb"max-age=(\d+)")


@final
@attrs.frozen(kw_only=True)
class MapResponse:
    """The signed map's bytes and the polling interval the server asked for."""

    signed_map: bytes
    max_age_seconds: int | None


@attrs.define(eq=False)
class NetworkMapClient:
    """Talks to the map service at ``base_url`` (``http://host:port``)."""

    base_url: str
    timeout_seconds: float = REQUEST_TIMEOUT_SECONDS
    _host: str = attrs.field(init=False)
    _port: int = attrs.field(init=False)
    _prefix: str = attrs.field(init=False)
    #: The ``Host`` header: the URL's authority as written, so an IPv6 host keeps its brackets
    #: (``[::1]:10000``, RFC 9110 section 7.2 and RFC 3986 section 3.2.2).
    _authority: str = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        """Raises ``ValueError`` naming what is wrong with the URL (a bad host, port or scheme)."""
        parts = urllib.parse.urlsplit(self.base_url)
        if parts.netloc.count(":") > 1 and not parts.netloc.startswith("["):
            raise ValueError(f"IPv6 address in {self.base_url!r} must be in brackets: http://[addr]:port")
        if parts.scheme != "http" or not parts.hostname or "@" in parts.netloc:
            raise ValueError(f"network map URL must be http://HOST[:PORT], got {self.base_url!r}")
        host = parts.hostname
        if ":" in host:  # (a zone in a URL is written %25, RFC 6874: [fe80::1%25eth0])
            host = host.replace("%25", "%", 1)
        check_host(host)
        self._host = host
        self._port = parts.port or 80
        self._prefix = parts.path.rstrip("/")
        self._authority = parts.netloc

    async def publish(self, signed_node_info: bytes) -> str:
        """POST a signed NodeInfo; returns the server's message (``added <hash>`` etc.).

        Raises:
            NetworkMapHttpError: 400 (malformed), 403 (refused, with the reason), 409 (stale serial), ...
        """
        _, _, body = await self._request("POST", "/network-map/publish", signed_node_info)
        return body.decode("utf-8", "replace").strip()

    async def fetch_map(self) -> MapResponse:
        """GET the signed map (not verified here: see :func:`verify_network_map`)."""
        _, headers, body = await self._request("GET", "/network-map", b"")
        match = _MAX_AGE_RE.search(headers.get(b"cache-control", b""))
        return MapResponse(signed_map=body, max_age_seconds=int(match.group(1)) if match else None)

    async def fetch_node_info(self, hash_hex: str) -> bytes:
        """GET one signed NodeInfo by hash."""
        return (await self._request("GET", f"/network-map/node-info/{hash_hex}", b""))[2]

    async def fetch_network_parameters(self, hash_hex: str) -> bytes:
        """GET signed network parameters by hash."""
        return (await self._request("GET", f"/network-map/network-parameters/{hash_hex}", b""))[2]

    async def _request(self, method: str, path: str, body: bytes) -> tuple[int, dict[bytes, bytes], bytes]:
        url = f"{self.base_url}{path}"
        try:
            with trio.fail_after(self.timeout_seconds):
                stream = await trio.open_tcp_stream(self._host, self._port)
                async with stream:
                    return await self._exchange(stream, method, self._prefix + path, body, url)
        except trio.TooSlowError:
            raise NetworkMapHttpError(
                f"{method} {url}: no answer within {self.timeout_seconds} s", status=0
            ) from None
        except (OSError, trio.BrokenResourceError) as exc:
            raise NetworkMapHttpError(f"{method} {url}: {logs.error_message(exc)}", status=0) from None

    async def _exchange(
        self, stream: trio.SocketStream, method: str, target: str, body: bytes, url: str
    ) -> tuple[int, dict[bytes, bytes], bytes]:
        conn = h11.Connection(h11.CLIENT)
        headers = [
            (b"host", self._authority.encode()),
            (b"connection", b"close"),
            (b"content-length", str(len(body)).encode()),
            (b"user-agent", b"corda-trio"),
        ]
        if body:
            headers.append((b"content-type", b"application/octet-stream"))
        data = conn.send(h11.Request(method=method, target=target, headers=headers))
        data += conn.send(h11.Data(data=body)) if body else b""
        data += conn.send(h11.EndOfMessage())
        await stream.send_all(data)
        response: h11.Response | None = None
        chunks = bytearray()
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as exc:
                raise NetworkMapHttpError(f"{method} {url}: bad HTTP response: {exc}", status=0) from None
            if event is h11.NEED_DATA:
                conn.receive_data(await stream.receive_some(65536))
                continue
            if isinstance(event, h11.Response):
                response = event
            elif isinstance(event, h11.Data):
                chunks += event.data
                if len(chunks) > MAX_RESPONSE_BYTES:
                    raise NetworkMapHttpError(
                        f"{method} {url}: response larger than {MAX_RESPONSE_BYTES}", status=0
                    )
            elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                break
        if response is None:
            raise NetworkMapHttpError(f"{method} {url}: connection closed without a response", status=0)
        status = response.status_code
        if not 200 <= status < 300:
            reason = bytes(chunks).decode("utf-8", "replace").strip()
            raise NetworkMapHttpError(f"{method} {url}: HTTP {status}: {reason}", status=status)
        return status, {k.lower(): v for k, v in response.headers}, bytes(chunks)
