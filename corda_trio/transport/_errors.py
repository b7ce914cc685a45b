"""Errors of the AMQP transport: what a caller of ``send`` / ``receive`` / ``open_amqp_connection`` sees."""

from __future__ import annotations

from typing import Any

__all__ = [
    "AmqpConnectionError",
    "AmqpTransportError",
    "AuthenticationError",
    "DeliveryUnknownError",
    "HandshakeError",
    "LinkDetachedError",
]


class AmqpTransportError(Exception):
    """Root of the transport's errors.

    Attributes:
        condition: the AMQP condition (a str, e.g. ``"amqp:unauthorized-access"``) when one is known.
        description: a human explanation.
    """

    def __init__(self, description: str, *, condition: str | None = None) -> None:
        super().__init__(f"{condition}: {description}" if condition else description)
        self.description = description
        self.condition = condition

    @classmethod
    def from_error(cls, error: Any, default: str) -> AmqpTransportError:
        """Build from an ``amqp.Error`` (or ``None``: then ``default`` is the description)."""
        if error is None:
            return cls(default)
        return cls(error.description or default, condition=str(error.condition))


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
