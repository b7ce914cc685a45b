"""The AMQP 1.0 composites except message sections, every field in spec order (spec 2, 3.4, 3.5, 5.3).

* transport performatives (2.7): :class:`Open`, :class:`Begin`, :class:`Attach`, :class:`Flow`,
  :class:`Transfer`, :class:`Disposition`, :class:`Detach`, :class:`End`, :class:`Close`;
* :class:`ErrorCondition` (2.8.14, the spec's ``error`` type);
* delivery states (3.4): :class:`Received`, :class:`Accepted`, :class:`Rejected`, :class:`Released`,
  :class:`Modified`;
* terminus (3.5): :class:`Source`, :class:`Target`;
* SASL frames (5.3.3): :class:`SaslMechanisms`, :class:`SaslInit`, :class:`SaslChallenge`,
  :class:`SaslResponse`, :class:`SaslOutcome`.

Field names are the spec's names in snake_case; defaults are the spec defaults; fields without a default are
mandatory. Decoded values are plain Python values (``int``, ``bool``, ``bytes``, ``str``), :class:`Symbol`
for symbol fields, tuples of :class:`Symbol` for ``multiple="true"`` symbol fields and ``dict`` for maps
(``fields`` maps have :class:`Symbol` keys; plain ``str`` keys are accepted when encoding). Fields typed
``*`` in the spec (addresses, message ids, default-outcome, ...) hold any AMQP value.
"""

# ruff: noqa: RUF009  (`field` is attrs.field with AMQP metadata: ruff cannot see that)
from __future__ import annotations

import enum
from typing import Any, Final

import attrs

from ._composite import composite, field
from ._types import Described, Symbol

__all__ = [
    "DELIVERY_STATES",
    "PERFORMATIVES",
    "SASL_FRAMES",
    "Accepted",
    "Attach",
    "Begin",
    "Close",
    "Detach",
    "Disposition",
    "End",
    "ErrorCondition",
    "Flow",
    "Modified",
    "Open",
    "Received",
    "ReceiverSettleMode",
    "Rejected",
    "Released",
    "Role",
    "SaslChallenge",
    "SaslCode",
    "SaslInit",
    "SaslMechanisms",
    "SaslOutcome",
    "SaslResponse",
    "SenderSettleMode",
    "Source",
    "Target",
    "TerminusDurability",
    "TerminusExpiryPolicy",
    "Transfer",
]


class Role:
    """Link role (spec 2.8.1): a boolean on the wire."""

    SENDER: Final = False
    RECEIVER: Final = True


class SenderSettleMode(enum.IntEnum):
    """sender-settle-mode (spec 2.8.2), a ubyte."""

    UNSETTLED = 0
    SETTLED = 1
    MIXED = 2


class ReceiverSettleMode(enum.IntEnum):
    """receiver-settle-mode (spec 2.8.3), a ubyte."""

    FIRST = 0
    SECOND = 1


class TerminusDurability(enum.IntEnum):
    """terminus-durability (spec 3.5.5), a uint."""

    NONE = 0
    CONFIGURATION = 1
    UNSETTLED_STATE = 2


class TerminusExpiryPolicy:
    """terminus-expiry-policy (spec 3.5.6), a symbol."""

    LINK_DETACH: Final = Symbol("link-detach")
    SESSION_END: Final = Symbol("session-end")
    CONNECTION_CLOSE: Final = Symbol("connection-close")
    NEVER: Final = Symbol("never")


class SaslCode(enum.IntEnum):
    """sasl-code (spec 5.3.3.6), a ubyte."""

    OK = 0
    AUTH = 1
    SYS = 2
    SYS_PERM = 3
    SYS_TEMP = 4


# --- 2.8.14 error --------------------------------------------------------------------------------------


@composite(0x1D, "amqp:error:list")
@attrs.frozen(kw_only=True, slots=False)
class ErrorCondition:
    """The spec's ``error`` type (2.8.14), carried by ``close``, ``end``, ``detach`` and ``rejected``.

    ``condition`` is one of :class:`~corda_trio.amqp.Condition` (or another symbol); not an exception (the
    package's exceptions derive from :class:`~corda_trio.amqp.AmqpError`).
    """

    condition: Symbol = field("symbol")
    description: str | None = field("string", None)
    info: dict[Symbol, Any] | None = field("fields", None)


# --- 3.4 delivery states -------------------------------------------------------------------------------


@composite(0x23, "amqp:received:list")
@attrs.frozen(kw_only=True, slots=False)
class Received:
    """The receiver's partial progress on a delivery (spec 3.4.1); not terminal."""

    section_number: int = field("uint")
    section_offset: int = field("ulong")


@composite(0x24, "amqp:accepted:list")
@attrs.frozen(kw_only=True, slots=False)
class Accepted:
    """Terminal outcome: the message was processed (spec 3.4.2)."""


@composite(0x25, "amqp:rejected:list")
@attrs.frozen(kw_only=True, slots=False)
class Rejected:
    """Terminal outcome: the message is invalid and will not be processed (spec 3.4.3)."""

    error: ErrorCondition | None = field("described", None, allowed=(ErrorCondition,))


@composite(0x26, "amqp:released:list")
@attrs.frozen(kw_only=True, slots=False)
class Released:
    """Terminal outcome: the message was not and will not be processed here; redeliver (spec 3.4.4)."""


@composite(0x27, "amqp:modified:list")
@attrs.frozen(kw_only=True, slots=False)
class Modified:
    """Terminal outcome: released with modifications (spec 3.4.5)."""

    delivery_failed: bool | None = field("boolean", None)
    undeliverable_here: bool | None = field("boolean", None)
    message_annotations: dict[Any, Any] | None = field("annotations", None)


DELIVERY_STATES: Final = (Received, Accepted, Rejected, Released, Modified)
_STATE_OR_OTHER: Final = (*DELIVERY_STATES, Described)  # Described: e.g. transactional-state (4.5.5)
_OUTCOME_OR_OTHER: Final = (Accepted, Rejected, Released, Modified, Described)


# --- 3.5 terminus --------------------------------------------------------------------------------------


@composite(0x28, "amqp:source:list")
@attrs.frozen(kw_only=True, slots=False)
class Source:
    """The source terminus of a link (spec 3.5.3)."""

    address: Any = field("any", None)
    durable: int = field("uint", 0)
    expiry_policy: Symbol = field("symbol", TerminusExpiryPolicy.SESSION_END)
    timeout: int = field("uint", 0)
    dynamic: bool = field("boolean", False)
    dynamic_node_properties: dict[Symbol, Any] | None = field("fields", None)
    distribution_mode: Symbol | None = field("symbol", None)
    filter: dict[Symbol, Any] | None = field("map", None)
    default_outcome: Any = field("described", None, allowed=_OUTCOME_OR_OTHER)
    outcomes: tuple[Symbol, ...] | None = field("symbols", None)
    capabilities: tuple[Symbol, ...] | None = field("symbols", None)


@composite(0x29, "amqp:target:list")
@attrs.frozen(kw_only=True, slots=False)
class Target:
    """The target terminus of a link (spec 3.5.4)."""

    address: Any = field("any", None)
    durable: int = field("uint", 0)
    expiry_policy: Symbol = field("symbol", TerminusExpiryPolicy.SESSION_END)
    timeout: int = field("uint", 0)
    dynamic: bool = field("boolean", False)
    dynamic_node_properties: dict[Symbol, Any] | None = field("fields", None)
    capabilities: tuple[Symbol, ...] | None = field("symbols", None)


# --- 2.7 performatives ---------------------------------------------------------------------------------


@composite(0x10, "amqp:open:list")
@attrs.frozen(kw_only=True, slots=False)
class Open:
    """Negotiate connection parameters (spec 2.7.1)."""

    container_id: str = field("string")
    hostname: str | None = field("string", None)
    max_frame_size: int = field("uint", 4294967295)
    channel_max: int = field("ushort", 65535)
    idle_time_out: int | None = field("uint", None)
    outgoing_locales: tuple[Symbol, ...] | None = field("symbols", None)
    incoming_locales: tuple[Symbol, ...] | None = field("symbols", None)
    offered_capabilities: tuple[Symbol, ...] | None = field("symbols", None)
    desired_capabilities: tuple[Symbol, ...] | None = field("symbols", None)
    properties: dict[Symbol, Any] | None = field("fields", None)


@composite(0x11, "amqp:begin:list")
@attrs.frozen(kw_only=True, slots=False)
class Begin:
    """Begin a session on a channel (spec 2.7.2)."""

    remote_channel: int | None = field("ushort", None)
    next_outgoing_id: int = field("uint")
    incoming_window: int = field("uint")
    outgoing_window: int = field("uint")
    handle_max: int = field("uint", 4294967295)
    offered_capabilities: tuple[Symbol, ...] | None = field("symbols", None)
    desired_capabilities: tuple[Symbol, ...] | None = field("symbols", None)
    properties: dict[Symbol, Any] | None = field("fields", None)


@composite(0x12, "amqp:attach:list")
@attrs.frozen(kw_only=True, slots=False)
class Attach:
    """Attach a link to a session (spec 2.7.3). ``role``: ``False`` = sender, ``True`` = receiver."""

    name: str = field("string")
    handle: int = field("uint")
    role: bool = field("boolean")
    snd_settle_mode: int = field("ubyte", 2)
    rcv_settle_mode: int = field("ubyte", 0)
    source: Source | None = field("described", None, allowed=(Source, Described))
    target: Target | None = field("described", None, allowed=(Target, Described))
    unsettled: dict[Any, Any] | None = field("map", None)
    incomplete_unsettled: bool = field("boolean", False)
    initial_delivery_count: int | None = field("uint", None)
    max_message_size: int | None = field("ulong", None)
    offered_capabilities: tuple[Symbol, ...] | None = field("symbols", None)
    desired_capabilities: tuple[Symbol, ...] | None = field("symbols", None)
    properties: dict[Symbol, Any] | None = field("fields", None)


@composite(0x13, "amqp:flow:list")
@attrs.frozen(kw_only=True, slots=False)
class Flow:
    """Update link and session flow state (spec 2.7.4)."""

    next_incoming_id: int | None = field("uint", None)
    incoming_window: int = field("uint")
    next_outgoing_id: int = field("uint")
    outgoing_window: int = field("uint")
    handle: int | None = field("uint", None)
    delivery_count: int | None = field("uint", None)
    link_credit: int | None = field("uint", None)
    available: int | None = field("uint", None)
    drain: bool = field("boolean", False)
    echo: bool = field("boolean", False)
    properties: dict[Symbol, Any] | None = field("fields", None)


@composite(0x14, "amqp:transfer:list")
@attrs.frozen(kw_only=True, slots=False)
class Transfer:
    """Transfer (part of) a message (spec 2.7.5); the message bytes follow it in the frame as its payload."""

    handle: int = field("uint")
    delivery_id: int | None = field("uint", None)
    delivery_tag: bytes | None = field("binary", None)
    message_format: int | None = field("uint", None)
    settled: bool | None = field("boolean", None)
    more: bool = field("boolean", False)
    rcv_settle_mode: int | None = field("ubyte", None)
    state: Any = field("described", None, allowed=_STATE_OR_OTHER)
    resume: bool = field("boolean", False)
    aborted: bool = field("boolean", False)
    batchable: bool = field("boolean", False)


@composite(0x15, "amqp:disposition:list")
@attrs.frozen(kw_only=True, slots=False)
class Disposition:
    """Inform the peer of delivery state changes for the range ``first``..``last`` (spec 2.7.6)."""

    role: bool = field("boolean")
    first: int = field("uint")
    last: int | None = field("uint", None)
    settled: bool = field("boolean", False)
    state: Any = field("described", None, allowed=_STATE_OR_OTHER)
    batchable: bool = field("boolean", False)


@composite(0x16, "amqp:detach:list")
@attrs.frozen(kw_only=True, slots=False)
class Detach:
    """Detach (``closed=True``: close) a link (spec 2.7.7)."""

    handle: int = field("uint")
    closed: bool = field("boolean", False)
    error: ErrorCondition | None = field("described", None, allowed=(ErrorCondition,))


@composite(0x17, "amqp:end:list")
@attrs.frozen(kw_only=True, slots=False)
class End:
    """End a session (spec 2.7.8)."""

    error: ErrorCondition | None = field("described", None, allowed=(ErrorCondition,))


@composite(0x18, "amqp:close:list")
@attrs.frozen(kw_only=True, slots=False)
class Close:
    """Close the connection (spec 2.7.9)."""

    error: ErrorCondition | None = field("described", None, allowed=(ErrorCondition,))


PERFORMATIVES: Final = (Open, Begin, Attach, Flow, Transfer, Disposition, Detach, End, Close)


# --- 5.3.3 SASL frames ---------------------------------------------------------------------------------


@composite(0x40, "amqp:sasl-mechanisms:list")
@attrs.frozen(kw_only=True, slots=False)
class SaslMechanisms:
    """The server's SASL mechanisms, most preferred first (spec 5.3.3.1)."""

    sasl_server_mechanisms: tuple[Symbol, ...] = field("symbols")


@composite(0x41, "amqp:sasl-init:list")
@attrs.frozen(kw_only=True, slots=False)
class SaslInit:
    """The client's chosen mechanism and initial response (spec 5.3.3.2)."""

    mechanism: Symbol = field("symbol")
    initial_response: bytes | None = field("binary", None)
    hostname: str | None = field("string", None)


@composite(0x42, "amqp:sasl-challenge:list")
@attrs.frozen(kw_only=True, slots=False)
class SaslChallenge:
    """A security challenge from the server (spec 5.3.3.3)."""

    challenge: bytes = field("binary")


@composite(0x43, "amqp:sasl-response:list")
@attrs.frozen(kw_only=True, slots=False)
class SaslResponse:
    """The client's response to a challenge (spec 5.3.3.4)."""

    response: bytes = field("binary")


@composite(0x44, "amqp:sasl-outcome:list")
@attrs.frozen(kw_only=True, slots=False)
class SaslOutcome:
    """The outcome of the SASL exchange (spec 5.3.3.5): ``code`` is a :class:`SaslCode`."""

    code: int = field("ubyte")
    additional_data: bytes | None = field("binary", None)


SASL_FRAMES: Final = (SaslMechanisms, SaslInit, SaslChallenge, SaslResponse, SaslOutcome)
