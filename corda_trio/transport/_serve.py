"""Accept AMQP connections: ``serve_amqp(handler, port, ...)``, for ``nursery.start`` like ``serve_tcp``."""

from __future__ import annotations

import functools
import logging
import ssl
from collections.abc import Awaitable, Callable
from typing import Any, Final

import trio

from corda_trio import amqp

from ._connect import DEFAULT_HANDSHAKE_TIMEOUT_SECONDS, PeerCheck, open_amqp_over_stream, secure_stream
from ._driver import AmqpConnection
from ._errors import AmqpConnectionError, HandshakeError

__all__ = ["SERVER_SASL_MECHANISMS", "listener_port", "serve_amqp"]

SERVER_SASL_MECHANISMS: Final = ("PLAIN", "ANONYMOUS", "EXTERNAL")

log = logging.getLogger("corda_trio.transport")

Handler = Callable[[AmqpConnection], Awaitable[Any]]


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
    task_status: trio.TaskStatus[list[trio.SocketListener]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Listen on ``host:port`` and run ``await handler(conn)`` for each AMQP connection, until cancelled.

    Use ``listeners = await nursery.start(serve_amqp, handler, 0)`` and :func:`listener_port`. Each connection
    is TLS-secured (if ``ssl_context``; build it with ``corda_trio.pki.server_ssl_context``: it requires
    client certificates), checked with ``peer_check`` and opened; then ``handler`` runs. The handler decides
    which links the peer may attach: ``async for request in conn.link_requests()`` and ``accept_receiver`` /
    ``accept_sender`` / ``refuse("amqp:unauthorized-access")``. When the handler returns the connection is
    closed. A failing handshake, a misbehaving peer or a crashing handler ends that connection only (logged);
    the server keeps serving.
    """
    if config is None:
        # DESIGN.md §3: the server accepts PLAIN (Corda's SystemUsers/Peer), ANONYMOUS and EXTERNAL.
        config = amqp.ConnectionConfig(sasl_mechanisms=SERVER_SASL_MECHANISMS)
    listeners = await trio.open_tcp_listeners(port, host=host)
    serve_one = functools.partial(
        _serve_one,
        handler=handler,
        ssl_context=ssl_context,
        peer_check=peer_check,
        config=config,
        handshake_timeout=handshake_timeout,
    )
    await trio.serve_listeners(serve_one, listeners, task_status=task_status)


async def _serve_one(
    stream: trio.abc.Stream,
    *,
    handler: Handler,
    ssl_context: ssl.SSLContext | None,
    peer_check: PeerCheck | None,
    config: amqp.ConnectionConfig | None,
    handshake_timeout: float | None,
) -> None:
    peer = _peer_name(stream)
    try:
        if handshake_timeout is not None:
            with trio.fail_after(handshake_timeout):
                secured, identity = await secure_stream(stream, ssl_context, peer_check, server_side=True)
        else:
            secured, identity = await secure_stream(stream, ssl_context, peer_check, server_side=True)
    except (HandshakeError, trio.TooSlowError) as exc:
        log.warning("inbound %s refused: %s", peer, exc or "TLS handshake timed out")
        await trio.aclose_forcefully(stream)
        return
    try:
        async with open_amqp_over_stream(
            secured, client=False, config=config, peer_identity=identity, handshake_timeout=handshake_timeout
        ) as conn:
            log.debug("inbound %s: %s open (peer %s)", peer, conn.id, identity)
            await handler(conn)
    except AmqpConnectionError as exc:
        log.info("inbound %s ended: %s", peer, exc)
    except Exception:  # supervision boundary: one broken handler must not stop the server
        log.exception("inbound %s: handler failed", peer)


def _peer_name(stream: trio.abc.Stream) -> str:
    try:
        host, port = stream.socket.getpeername()[:2]  # type: ignore[attr-defined]
        return f"{host}:{port}"
    except Exception:
        return "<unknown peer>"
