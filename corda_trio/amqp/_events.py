"""Events the connection engine reports: frozen facts in the past tense (h2 ``events.py``).

``Connection.receive_data`` (and ``tick``) return lists of these. ``channel`` is always our local channel
number and ``handle`` our local handle of the link, whichever side created it: the engine maps the peer's
numbers to ours.
"""

from __future__ import annotations

from typing import Any, final

import attrs

__all__ = [
    "ConnectionClosed",
    "ConnectionOpened",
    "CreditUpdated",
    "DeliveryReceived",
    "DeliverySettled",
    "DeliveryStateChanged",
    "Event",
    "LinkAttachRequested",
    "LinkAttached",
    "LinkDetached",
    "SaslCompleted",
    "SessionBegun",
    "SessionEnded",
    "TransferAborted",
]


class Event:
    """Base class of every engine event (only for ``isinstance`` and typing; do not subclass)."""

    __slots__ = ()


@final
@attrs.frozen(kw_only=True)
class SaslCompleted(Event):
    """The SASL exchange ended successfully (client: outcome ``ok`` received; server: outcome sent).

    Attributes:
        mechanism: the mechanism used.
        username: the PLAIN authentication id (server side), else ``None``.
    """

    mechanism: str
    username: str | None = None


@final
@attrs.frozen(kw_only=True)
class ConnectionOpened(Event):
    """The peer's ``open`` arrived (ours is sent automatically); ``remote_open`` is the frame."""

    remote_open: Any


@final
@attrs.frozen(kw_only=True)
class ConnectionClosed(Event):
    """The connection is finished.

    Attributes:
        error: the ``amqp.ErrorCondition`` carried by the ``close`` (or the one we sent); ``None``: a clean
            close.
        by_peer: ``True`` when the peer closed (or vanished), ``False`` when we closed.
        error_from_peer: ``error`` came in the peer's ``close``: its description is the peer's words, about
            the peer (``no frame received ...`` means the peer received none from us). ``False`` when we
            wrote it (our close, or the end we noticed: EOF without a close, a failed SASL outcome).
    """

    error: Any = None
    by_peer: bool = True
    error_from_peer: bool = False


@final
@attrs.frozen(kw_only=True)
class SessionBegun(Event):
    """A session is mapped on ``channel`` (locally begun and answered, or begun by the peer and answered)."""

    channel: int
    remote_begin: Any
    initiated_by_peer: bool


@final
@attrs.frozen(kw_only=True)
class SessionEnded(Event):
    """The session on ``channel`` ended (``error`` from the peer's or our ``end``)."""

    channel: int
    error: Any = None
    by_peer: bool = True


@final
@attrs.frozen(kw_only=True)
class LinkAttachRequested(Event):
    """The peer attached a link we did not ask for: answer with ``accept_link`` or ``refuse_link``.

    Not raised for an attach whose answer (its source and target echoed) would not fit the peer's
    max-frame-size: the engine refuses that one itself (``amqp:frame-size-too-small``).

    Attributes:
        handle: the local handle reserved for the link.
        attach: the peer's ``attach`` (``attach.role`` is the peer's role: ``True`` = the peer receives).
    """

    channel: int
    handle: int
    attach: Any


@final
@attrs.frozen(kw_only=True)
class LinkAttached(Event):
    """A link we attached is now attached at both ends; ``remote_attach`` is the peer's answer.

    A peer that refuses answers with a null source or target and then detaches: look for the
    :class:`LinkDetached` that follows.
    """

    channel: int
    handle: int
    remote_attach: Any


@final
@attrs.frozen(kw_only=True)
class LinkDetached(Event):
    """The link is detached (``closed`` = the peer closed it for good).

    Attributes:
        unsettled: delivery ids we sent on the link that the peer never settled: their outcome is unknown,
            so a sender must treat them as not delivered and send them again.
    """

    channel: int
    handle: int
    error: Any = None
    closed: bool = True
    by_peer: bool = True
    unsettled: tuple[int, ...] = ()


@final
@attrs.frozen(kw_only=True)
class CreditUpdated(Event):
    """A ``flow`` for one of our links arrived.

    Attributes:
        credit: the credit we have now (sender link) or the credit the peer sees (receiver link).
        drain: the peer (receiver) asks us to use up or give back the credit (spec 2.6.7).
        available: the peer's ``available`` (receiver links).
    """

    channel: int
    handle: int
    credit: int
    drain: bool = False
    available: int | None = None


@final
@attrs.frozen(kw_only=True)
class DeliveryReceived(Event):
    """A complete message arrived on a receiving link (all frames of a multi-frame transfer reassembled).

    Attributes:
        delivery_id: the session's delivery id, used to settle it (``Connection.settle``).
        payload: the bare message bytes (encoded sections).
        settled: the sender pre-settled it: do not settle it again.
        message_format: the first transfer's message-format (spec 2.7.5; 0 = the standard AMQP message,
            also when omitted). The engine takes any format; the application decides which it accepts.
    """

    channel: int
    handle: int
    delivery_id: int
    delivery_tag: bytes
    payload: bytes
    settled: bool
    message_format: int = 0
    state: Any = None


@final
@attrs.frozen(kw_only=True)
class TransferAborted(Event):
    """The sender aborted a multi-frame delivery (``aborted`` flag): the partial payload is discarded."""

    channel: int
    handle: int
    delivery_id: int
    delivery_tag: bytes


@final
@attrs.frozen(kw_only=True)
class DeliverySettled(Event):
    """The peer settled one of our outgoing deliveries (one event per delivery, ranges expanded).

    ``state`` is the terminal delivery state (``amqp.Accepted()``, ``Rejected``, ``Released``, ``Modified``)
    or ``None`` when the peer settled without one.
    """

    channel: int
    handle: int
    delivery_id: int
    delivery_tag: bytes
    state: Any = None


@final
@attrs.frozen(kw_only=True)
class DeliveryStateChanged(Event):
    """The peer reported a state for a delivery without settling it (e.g. ``rcv-settle-mode`` second)."""

    channel: int
    handle: int
    delivery_id: int
    delivery_tag: bytes
    state: Any = None
