"""Errors of the AMQP transport: what a caller of ``send`` / ``receive`` / ``open_amqp_connection`` sees.

They derive from :class:`corda_trio.amqp.AmqpError`, the one root of the AMQP stack's exceptions, so
``except amqp.AmqpError`` catches a codec, engine or transport failure alike.
"""

from __future__ import annotations

from typing import Any

from corda_trio import amqp

__all__ = [
    "AmqpConnectionError",
    "AmqpTransportError",
    "AuthenticationError",
    "DeliveryUnknownError",
    "HandshakeError",
    "LinkDetachedError",
]


class AmqpTransportError(amqp.AmqpError):
    """Root of the transport's errors (an :class:`amqp.AmqpError`).

    Attributes:
        condition: the AMQP condition (a str, e.g. ``"amqp:unauthorized-access"``) when one is known, else
            ``None``.
        description: a human explanation.
    """

    condition: Any = None
    #: the error came in the peer's ``close``: ``description`` is the peer's words, about the peer
    by_peer: bool = False

    def __init__(self, description: str, *, condition: str | None = None, by_peer: bool = False) -> None:
        text = f"{condition}: {description}" if condition else description
        # The one place a peer's close reads as the peer's: quoted as ours, a resumed process said 'no frame
        # received for 10.003 s' of the node that had received none from it.
        Exception.__init__(self, f"the peer closed the connection: {text}" if by_peer else text)
        self.description = description
        self.condition = condition
        self.by_peer = by_peer

    @classmethod
    def from_error(cls, error: Any, default: str, *, by_peer: bool = False) -> AmqpTransportError:
        """Build from an ``amqp.ErrorCondition`` (or ``None``: then ``default`` is the description).
        ``by_peer``: the error came in the peer's ``close`` (the message then says so)."""
        if error is None:
            return cls(default)
        return cls(error.description or default, condition=str(error.condition), by_peer=by_peer)


class AmqpConnectionError(AmqpTransportError):
    """The connection is gone (closed by the peer or by us after a violation, EOF, idle timeout, I/O error).

    Any delivery whose outcome was not received is *not* delivered: send it again on a new connection.
    """


class AuthenticationError(AmqpConnectionError):
    """SASL authentication failed (for example a wrong PLAIN password)."""


class HandshakeError(AmqpConnectionError):
    """TLS handshake, peer identity check or AMQP open did not complete."""


class LinkDetachedError(AmqpTransportError):
    """The link was refused or detached; deliveries without an outcome must be sent again."""


class DeliveryUnknownError(AmqpTransportError):
    """The peer settled a delivery without a terminal outcome (treat as not delivered)."""
