"""The codec's exceptions and the AMQP error conditions (spec part 2.8.15-2.8.18, part 5.3.x).

Every exception the codec raises derives from :class:`AmqpError` and carries the AMQP ``condition`` (a
:class:`~corda_trio.amqp.Symbol`) that a connection would put into its ``close`` / ``end`` / ``detach``
error, plus a human ``description``. Malformed input raises exactly one type, :class:`DecodeError`, with the
byte ``offset`` where decoding failed; the framing layer raises :class:`FramingError`. Anything else escaping
the codec on bad input is a bug.
"""

from __future__ import annotations

from typing import Final

from ._types import Symbol

__all__ = ["AmqpError", "Condition", "DecodeError", "EncodeError", "FramingError"]


class Condition:
    """Every error condition the AMQP 1.0 spec defines, as :class:`Symbol` constants.

    Spec part 2.8.15 (amqp-error), 2.8.16 (connection-error), 2.8.17 (session-error), 2.8.18 (link-error),
    5.3.6 (sasl-code is an enum, not a condition: see :class:`~corda_trio.amqp.SaslCode`).
    """

    # 2.8.15 amqp-error
    INTERNAL_ERROR: Final = Symbol("amqp:internal-error")
    NOT_FOUND: Final = Symbol("amqp:not-found")
    UNAUTHORIZED_ACCESS: Final = Symbol("amqp:unauthorized-access")
    DECODE_ERROR: Final = Symbol("amqp:decode-error")
    RESOURCE_LIMIT_EXCEEDED: Final = Symbol("amqp:resource-limit-exceeded")
    NOT_ALLOWED: Final = Symbol("amqp:not-allowed")
    INVALID_FIELD: Final = Symbol("amqp:invalid-field")
    NOT_IMPLEMENTED: Final = Symbol("amqp:not-implemented")
    RESOURCE_LOCKED: Final = Symbol("amqp:resource-locked")
    PRECONDITION_FAILED: Final = Symbol("amqp:precondition-failed")
    RESOURCE_DELETED: Final = Symbol("amqp:resource-deleted")
    ILLEGAL_STATE: Final = Symbol("amqp:illegal-state")
    FRAME_SIZE_TOO_SMALL: Final = Symbol("amqp:frame-size-too-small")
    # 2.8.16 connection-error
    CONNECTION_FORCED: Final = Symbol("amqp:connection:forced")
    FRAMING_ERROR: Final = Symbol("amqp:connection:framing-error")
    CONNECTION_REDIRECT: Final = Symbol("amqp:connection:redirect")
    # 2.8.17 session-error
    WINDOW_VIOLATION: Final = Symbol("amqp:session:window-violation")
    ERRANT_LINK: Final = Symbol("amqp:session:errant-link")
    HANDLE_IN_USE: Final = Symbol("amqp:session:handle-in-use")
    UNATTACHED_HANDLE: Final = Symbol("amqp:session:unattached-handle")
    # 2.8.18 link-error
    DETACH_FORCED: Final = Symbol("amqp:link:detach-forced")
    TRANSFER_LIMIT_EXCEEDED: Final = Symbol("amqp:link:transfer-limit-exceeded")
    MESSAGE_SIZE_EXCEEDED: Final = Symbol("amqp:link:message-size-exceeded")
    REDIRECT: Final = Symbol("amqp:link:redirect")
    STOLEN: Final = Symbol("amqp:link:stolen")

    @classmethod
    def all(cls) -> tuple[Symbol, ...]:
        """Every condition above, in spec order."""
        return tuple(v for k, v in vars(cls).items() if k.isupper() and isinstance(v, Symbol))


class AmqpError(Exception):
    """Root of every exception of :mod:`corda_trio.amqp`.

    Attributes:
        condition: the AMQP error condition (a symbol) that describes the failure on the wire.
        description: a human-readable explanation (also the exception message).
    """

    condition: Symbol = Condition.INTERNAL_ERROR

    def __init__(self, description: str, *, condition: Symbol | None = None) -> None:
        super().__init__(description)
        self.description = description
        if condition is not None:
            self.condition = condition


class DecodeError(AmqpError):
    """Bytes from the peer (or from storage) are not valid AMQP: a misbehaving peer, never a local bug.

    Attributes:
        offset: index into the buffer handed to the decoder where the bad construct starts (or where more
            bytes were needed).
    """

    condition: Symbol = Condition.DECODE_ERROR

    def __init__(self, description: str, offset: int = 0, *, condition: Symbol | None = None) -> None:
        super().__init__(f"{description} (at offset {offset})", condition=condition)
        self.description = description
        self.offset = offset


class FramingError(DecodeError):
    """The frame layer is broken: bad protocol header, SIZE below 8 or above max-frame-size, DOFF below 2.

    It is a :class:`DecodeError` (so "any malformed input raises DecodeError" holds), with the condition
    ``amqp:connection:framing-error`` (spec 2.8.16), which a connection answers with ``close``.
    """

    condition: Symbol = Condition.FRAMING_ERROR


class EncodeError(AmqpError, ValueError):
    """A local value cannot be encoded (out of range, wrong type): a bug in the caller, not a peer's fault."""

    condition: Symbol = Condition.INTERNAL_ERROR
