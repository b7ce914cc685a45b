"""Open AMQP connections: TLS (optional) over TCP, or over any trio Stream (tests, in-memory networks)."""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import ssl
from collections.abc import AsyncIterator, Callable
from typing import Any, Final

import trio

from corda_trio import amqp, hostport

from ._driver import AmqpConnection
from ._errors import HandshakeError
from ._socks import SocksProxy, open_socks_stream
from ._tls import TlsStream, tls_over
from ._tls_failures import describe_tls_failure

__all__ = [
    "DEFAULT_HANDSHAKE_TIMEOUT_SECONDS",
    "DEFAULT_IDLE_TIMEOUT_SECONDS",
    "HANDSHAKE_TIMEOUT_RANGE_SECONDS",
    "IDLE_TIMEOUT_RANGE_SECONDS",
    "PeerCheck",
    "idle_timeout_ms",
    "open_amqp_connection",
    "open_amqp_over_stream",
]

log = logging.getLogger("corda_trio.transport")

# TLS + SASL + open on loopback take a few ms; 10 s leaves room for a loaded machine and a slow peer.
DEFAULT_HANDSHAKE_TIMEOUT_SECONDS: Final = 10.0
#: What an operator may configure as a handshake timeout (``handshake_timeout_seconds``): below 0.5 s a
#: loaded machine fails healthy handshakes; beyond 5 minutes a silent peer holds its slot too long.
HANDSHAKE_TIMEOUT_RANGE_SECONDS: Final = (0.5, 300.0)
#: The engine's idle timeout (``amqp.ConnectionConfig.idle_timeout_ms``: 10 s, advertised to the peer as 5 s).
DEFAULT_IDLE_TIMEOUT_SECONDS: Final = 10.0
#: What an operator may configure as ``idle_timeout_seconds``: at least 1 s (it is advertised halved, and a
#: stall of our own process must stay well below it: the driver's STALL_GRACE_SECONDS is 0.5 s), at most an
#: hour (a dead peer is noticed only by it).
IDLE_TIMEOUT_RANGE_SECONDS: Final = (1.0, 3600.0)


def idle_timeout_ms(seconds: float) -> int:
    """``amqp.ConnectionConfig.idle_timeout_ms`` for a configured ``idle_timeout_seconds``."""
    return round(seconds * 1000)


PeerCheck = Callable[[Any], Any]
"""``(ssl_object) -> identity``: inspects ``getpeercert(binary_form=True)`` after the TLS handshake and
raises if the peer is not who it must be (``corda_trio.pki.check_peer_legal_name`` fits). Its return value
becomes ``AmqpConnection.peer_identity``."""


@contextlib.contextmanager
def _handshake_deadline(timeout: float | None, what: str) -> Any:
    if timeout is None:
        yield
        return
    try:
        with trio.fail_after(timeout):
            yield
    except trio.TooSlowError:
        raise HandshakeError(f"{what} did not complete within {timeout} s") from None


async def secure_stream(
    stream: trio.abc.Stream,
    ssl_context: ssl.SSLContext | None,
    peer_check: PeerCheck | None,
    *,
    server_side: bool,
    server_hostname: str | None = None,
) -> tuple[trio.abc.Stream, Any]:
    """Run the TLS handshake (if ``ssl_context``) and the peer check; returns ``(stream, peer_identity)``.

    Raises:
        HandshakeError: the handshake failed or the peer check refused the peer (the stream is closed).
    """
    if ssl_context is None:
        if peer_check is not None:
            raise ValueError("peer_check needs TLS: pass an ssl_context")
        return stream, None
    tls = tls_over(
        stream, ssl_context, server_side=server_side, server_hostname=None if server_side else server_hostname
    )
    try:
        await tls.do_handshake()
    except (trio.BrokenResourceError, ssl.SSLError) as exc:
        await _send_pending_alert(tls, stream)
        await trio.aclose_forcefully(tls)
        cause = exc.__cause__ or exc
        why = describe_tls_failure(exc, tls, now=dt.datetime.now(dt.UTC)) or _one_line(cause)
        raise HandshakeError(f"TLS handshake failed: {why}") from exc
    except BaseException:
        await trio.aclose_forcefully(tls)
        raise
    identity = None
    if peer_check is not None:
        try:
            identity = peer_check(tls)
        except Exception as exc:
            # The handshake is complete, so ssl can send no other alert: close_notify, then close.
            with trio.move_on_after(ALERT_SEND_TIMEOUT_SECONDS):
                await tls.aclose()
            await trio.aclose_forcefully(tls)
            raise HandshakeError(f"TLS peer identity check failed: {_one_line(exc)}") from exc
    return tls, identity


#: Bound on sending the TLS alert (or close_notify) to a refused peer before closing its socket.
ALERT_SEND_TIMEOUT_SECONDS: Final = 1.0


async def _send_pending_alert(
    tls: TlsStream | trio.SSLStream[trio.abc.Stream], stream: trio.abc.Stream
) -> None:
    """Send what OpenSSL queued when the handshake failed: the alert that says why (``unknown_ca``,
    ``bad_certificate``, ``handshake_failure``, ...).

    A failed handshake raises without sending the bytes OpenSSL wrote for the peer, so a refused peer would
    only see the socket close. :class:`TlsStream` hands them over; ``trio.SSLStream`` (over other streams)
    keeps them in its outgoing memory BIO, a private attribute: if a trio version renames it, nothing is
    sent and the peer sees the close, as before.
    """
    if isinstance(tls, TlsStream):
        alert = tls.pending_output()
    else:
        outgoing = getattr(tls, "_outgoing", None)
        if not isinstance(outgoing, ssl.MemoryBIO):
            return
        alert = outgoing.read()
    if not alert:
        return
    with trio.move_on_after(ALERT_SEND_TIMEOUT_SECONDS):
        try:
            await stream.send_all(alert)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass  # the peer is gone already


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


@contextlib.asynccontextmanager
async def open_amqp_over_stream(
    stream: trio.abc.Stream,
    *,
    client: bool = True,
    config: amqp.ConnectionConfig | None = None,
    peer_identity: Any = None,
    handshake_timeout: float | None = DEFAULT_HANDSHAKE_TIMEOUT_SECONDS,
    on_violation: Callable[[amqp.RemoteProtocolError], None] | None = None,
) -> AsyncIterator[AmqpConnection]:
    """Run an AMQP connection over an already connected (and secured) stream.

    As client it waits for the peer's ``open`` and begins one session; as server it waits for the peer's
    ``open`` (the peer begins its sessions; we answer automatically). On exit the connection is closed
    gracefully (``close`` frame, a short wait for the peer's) and the stream closed. ``on_violation``: told
    each protocol violation of the peer instead of a warning per violation (see :class:`AmqpConnection`).

    Raises:
        AuthenticationError: SASL failed.
        HandshakeError: no ``open`` within ``handshake_timeout`` seconds.
        AmqpConnectionError: the peer closed or broke the connection during the handshake.
    """
    engine = amqp.Connection(config, client=client)
    conn = AmqpConnection(stream, engine, peer_identity=peer_identity, on_violation=on_violation)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(conn._run)
            try:
                with _handshake_deadline(handshake_timeout, "the AMQP handshake (SASL and open)"):
                    await conn._handshake(begin_session=client)
                yield conn
            finally:
                await conn.aclose()
    except BaseExceptionGroup as group:
        # The background tasks do not raise; a group holds the body's exception: give it back unwrapped.
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise


@contextlib.asynccontextmanager
async def open_amqp_connection(
    host: str,
    port: int,
    *,
    ssl_context: ssl.SSLContext | None = None,
    peer_check: PeerCheck | None = None,
    config: amqp.ConnectionConfig | None = None,
    server_hostname: str | None = None,
    handshake_timeout: float | None = DEFAULT_HANDSHAKE_TIMEOUT_SECONDS,
    proxy: SocksProxy | None = None,
) -> AsyncIterator[AmqpConnection]:
    """Dial ``host:port``, run TLS (if ``ssl_context``) and the peer check, then AMQP; yields the connection.

    ``async with open_amqp_connection("127.0.0.1", 10002, ssl_context=ctx, peer_check=check) as conn:``,
    then ``sender = await conn.open_sender(address)``, ``await sender.send(message)``.

    Args:
        ssl_context: a client context (e.g. ``corda_trio.pki.client_ssl_context``); ``None`` = plain TCP.
        peer_check: called with the TLS stream after the handshake; raise to refuse the peer.
        config: engine configuration (default: ``amqp.ConnectionConfig()``, Corda's P2P profile).
        server_hostname: SNI / host-name check name (default ``host``; ignored when the context does not
            check host names).
        handshake_timeout: bound on TCP + TLS + SASL + open, in seconds (``None`` = unbounded).
        proxy: dial through this SOCKS5 / SOCKS4 proxy (``None``: directly).

    Raises:
        OSError: the TCP connection failed.
        HandshakeError / AuthenticationError / AmqpConnectionError: see :func:`open_amqp_over_stream`.
    """
    with _handshake_deadline(
        handshake_timeout, f"TCP/TLS connection to {hostport.host_port_text(host, port)}"
    ):
        if proxy is not None:
            tcp = await open_socks_stream(proxy, host, port)
        else:
            tcp = await trio.open_tcp_stream(host, port)
        stream, identity = await secure_stream(
            tcp, ssl_context, peer_check, server_side=False, server_hostname=server_hostname or host
        )
    async with open_amqp_over_stream(
        stream, client=True, config=config, peer_identity=identity, handshake_timeout=handshake_timeout
    ) as conn:
        yield conn
