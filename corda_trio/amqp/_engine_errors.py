"""Errors of the connection engine: local misuse versus a misbehaving peer (h11 ``_util.py`` style).

The engine validates every input with the same rules whichever side produced it. Validation raises
:class:`LocalProtocolError`; when the offending input came from the peer (``receive_data``), the engine
queues the ``close`` frame that carries the condition and re-raises as :class:`RemoteProtocolError`, so the
driver can flush the ``close`` before it drops the transport (h2 ``_terminate_connection``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._errors import AmqpError, Condition

if TYPE_CHECKING:
    from ._events import Event
    from ._types import Symbol

__all__ = ["ConnectionClosedError", "IdleTimeoutError", "LocalProtocolError", "RemoteProtocolError"]


class LocalProtocolError(AmqpError):
    """The local application asked the engine for something the protocol forbids (a bug in the caller).

    Examples: sending on a link without credit, settling an unknown delivery, attaching on an unmapped
    session. The connection stays usable.
    """

    condition: Symbol = Condition.ILLEGAL_STATE


class RemoteProtocolError(AmqpError):
    """The peer broke the protocol; the engine has already queued a ``close`` with :attr:`condition`.

    Attributes:
        events: the events the same ``receive_data`` call produced before the violation was found; the
            driver should still process them (a delivery settled just before the garbage is still settled).
    """

    condition: Symbol = Condition.INTERNAL_ERROR

    def __init__(
        self, description: str, *, condition: Symbol | None = None, events: list[Event] | None = None
    ) -> None:
        super().__init__(description, condition=condition)
        self.events: list[Event] = list(events or ())


class IdleTimeoutError(RemoteProtocolError):
    """The peer completed no frame, not even an empty one, for our idle timeout (spec 2.4.5); the engine has
    queued a ``close`` with ``amqp:resource-limit-exceeded``.

    Silence is not misbehaviour: the peer is gone, frozen (SIGSTOP, a paused VM, a process stuck in swap)
    or cut off (a dead NAT entry), and its socket may well stay open, so only this timeout notices. Drivers
    report it as the end of the connection, not as a protocol violation of the peer.
    """

    condition: Symbol = Condition.RESOURCE_LIMIT_EXCEEDED


class ConnectionClosedError(AmqpError):
    """An operation was attempted on a connection that is closed or closing."""

    condition: Symbol = Condition.ILLEGAL_STATE
