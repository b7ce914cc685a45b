"""corda_trio.amqp: pure sans-IO AMQP 1.0 (wire contract: protocol_spec/amqp-codec.md, amqp-engine.md).

The codec: the type system (:func:`encode_value` / :func:`decode_value`), performatives, SASL frames,
delivery states, terminus, message sections and :class:`Message`, and the errors with their AMQP
conditions. The engine: :class:`Connection` (bytes in, events out) configured by
:class:`ConnectionConfig`.

The names below (``__all__``): the engine (:class:`Connection`, its config, states and the events it
returns); the errors, all derived from :class:`AmqpError`, and the AMQP :class:`Condition` symbols; messages;
performatives, :class:`ErrorCondition` (the spec's ``error`` type, carried by ``close``, ``end``, ``detach``
and ``rejected``), delivery states, terminus and SASL frames; the AMQP type system. The wire-level codec
(frames, :class:`~corda_trio.amqp.codec.FrameBuffer`, performative tables, the codec memos) is
:mod:`corda_trio.amqp.codec`.

Limits a node sets (all on :class:`ConnectionConfig`, enforced per receiving link):

* ``max_message_size`` (default 10 MiB, Corda's network parameter default): advertised in our ``attach``;
  a delivery whose running size passes it detaches only that link with ``amqp:link:message-size-exceeded``.
  Per link: ``Connection.attach(..., Role.RECEIVER, max_message_size=)`` and
  ``Connection.accept_link(..., max_message_size=)`` (:data:`FROM_CONFIG` = the config's value).
* ``max_credit_overrun`` (default 1000): deliveries beyond granted credit that are absorbed (counted in
  ``Connection.link(ch, h).overrun_total``), and ``max_credit_overrun_bytes`` (default 16 MiB): the bytes
  they may carry (``overrun_bytes``, counted frame by frame before a payload is kept); beyond either only
  that link is detached with ``amqp:link:transfer-limit-exceeded``.
* ``max_frame_size`` (128 KiB, at most 16 MiB): checked on each frame header before the body is buffered.
"""

# The wire-level codec (frames, raw values, performative tables) has its own namespace, ``amqp.codec``; its
# names stay importable from here (imported below) but are not part of this package's curated surface.
from . import codec as codec
from ._config import ConnectionConfig as ConnectionConfig
from ._config import default_container_id as default_container_id
from ._connection import FROM_CONFIG as FROM_CONFIG
from ._connection import Connection as Connection
from ._decode import MAX_ZERO_WIDTH_ARRAY_COUNT as MAX_ZERO_WIDTH_ARRAY_COUNT
from ._decode import decode_value as decode_value
from ._encode import encode_value as encode_value
from ._engine_errors import ConnectionClosedError as ConnectionClosedError
from ._engine_errors import IdleTimeoutError as IdleTimeoutError
from ._engine_errors import LocalProtocolError as LocalProtocolError
from ._engine_errors import RemoteProtocolError as RemoteProtocolError
from ._errors import AmqpError as AmqpError
from ._errors import Condition as Condition
from ._errors import DecodeError as DecodeError
from ._errors import EncodeError as EncodeError
from ._errors import FramingError as FramingError
from ._events import ConnectionClosed as ConnectionClosed
from ._events import ConnectionOpened as ConnectionOpened
from ._events import CreditUpdated as CreditUpdated
from ._events import DeliveryReceived as DeliveryReceived
from ._events import DeliverySettled as DeliverySettled
from ._events import DeliveryStateChanged as DeliveryStateChanged
from ._events import Event as Event
from ._events import LinkAttached as LinkAttached
from ._events import LinkAttachRequested as LinkAttachRequested
from ._events import LinkDetached as LinkDetached
from ._events import SaslCompleted as SaslCompleted
from ._events import SessionBegun as SessionBegun
from ._events import SessionEnded as SessionEnded
from ._events import TransferAborted as TransferAborted
from ._frames import AMQP_HEADER as AMQP_HEADER
from ._frames import EMPTY_FRAME as EMPTY_FRAME
from ._frames import MIN_MAX_FRAME_SIZE as MIN_MAX_FRAME_SIZE
from ._frames import SASL_HEADER as SASL_HEADER
from ._frames import TLS_HEADER as TLS_HEADER
from ._frames import Frame as Frame
from ._frames import FrameBuffer as FrameBuffer
from ._frames import FrameType as FrameType
from ._frames import decode_frame as decode_frame
from ._frames import encode_empty_frame as encode_empty_frame
from ._frames import encode_frame as encode_frame
from ._messages import AmqpSequence as AmqpSequence
from ._messages import AmqpValue as AmqpValue
from ._messages import Header as Header
from ._messages import Message as Message
from ._messages import Properties as Properties
from ._performatives import DELIVERY_STATES as DELIVERY_STATES
from ._performatives import PERFORMATIVES as PERFORMATIVES
from ._performatives import SASL_FRAMES as SASL_FRAMES
from ._performatives import Accepted as Accepted
from ._performatives import Attach as Attach
from ._performatives import Begin as Begin
from ._performatives import Close as Close
from ._performatives import Detach as Detach
from ._performatives import Disposition as Disposition
from ._performatives import End as End
from ._performatives import ErrorCondition as ErrorCondition
from ._performatives import Flow as Flow
from ._performatives import Modified as Modified
from ._performatives import Open as Open
from ._performatives import Received as Received
from ._performatives import ReceiverSettleMode as ReceiverSettleMode
from ._performatives import Rejected as Rejected
from ._performatives import Released as Released
from ._performatives import Role as Role
from ._performatives import SaslChallenge as SaslChallenge
from ._performatives import SaslCode as SaslCode
from ._performatives import SaslInit as SaslInit
from ._performatives import SaslMechanisms as SaslMechanisms
from ._performatives import SaslOutcome as SaslOutcome
from ._performatives import SaslResponse as SaslResponse
from ._performatives import SenderSettleMode as SenderSettleMode
from ._performatives import Source as Source
from ._performatives import Target as Target
from ._performatives import TerminusDurability as TerminusDurability
from ._performatives import TerminusExpiryPolicy as TerminusExpiryPolicy
from ._performatives import Transfer as Transfer
from ._state import ConnectionState as ConnectionState
from ._state import LinkState as LinkState
from ._state import SessionState as SessionState
from ._types import Array as Array
from ._types import Byte as Byte
from ._types import Char as Char
from ._types import Decimal32 as Decimal32
from ._types import Decimal64 as Decimal64
from ._types import Decimal128 as Decimal128
from ._types import Described as Described
from ._types import Float as Float
from ._types import Int as Int
from ._types import Long as Long
from ._types import Short as Short
from ._types import Symbol as Symbol
from ._types import Timestamp as Timestamp
from ._types import UByte as UByte
from ._types import UInt as UInt
from ._types import ULong as ULong
from ._types import UShort as UShort

__all__ = [
    "FROM_CONFIG",
    "Accepted",
    "AmqpError",
    "AmqpSequence",
    "AmqpValue",
    "Array",
    "Attach",
    "Begin",
    "Byte",
    "Char",
    "Close",
    "Condition",
    "Connection",
    "ConnectionClosed",
    "ConnectionClosedError",
    "ConnectionConfig",
    "ConnectionOpened",
    "ConnectionState",
    "CreditUpdated",
    "Decimal32",
    "Decimal64",
    "Decimal128",
    "DecodeError",
    "DeliveryReceived",
    "DeliverySettled",
    "DeliveryStateChanged",
    "Described",
    "Detach",
    "Disposition",
    "EncodeError",
    "End",
    "ErrorCondition",
    "Event",
    "Float",
    "Flow",
    "FramingError",
    "Header",
    "IdleTimeoutError",
    "Int",
    "LinkAttachRequested",
    "LinkAttached",
    "LinkDetached",
    "LinkState",
    "LocalProtocolError",
    "Long",
    "Message",
    "Modified",
    "Open",
    "Properties",
    "Received",
    "ReceiverSettleMode",
    "Rejected",
    "Released",
    "RemoteProtocolError",
    "Role",
    "SaslChallenge",
    "SaslCode",
    "SaslCompleted",
    "SaslInit",
    "SaslMechanisms",
    "SaslOutcome",
    "SaslResponse",
    "SenderSettleMode",
    "SessionBegun",
    "SessionEnded",
    "SessionState",
    "Short",
    "Source",
    "Symbol",
    "Target",
    "TerminusDurability",
    "TerminusExpiryPolicy",
    "Timestamp",
    "Transfer",
    "TransferAborted",
    "UByte",
    "UInt",
    "ULong",
    "UShort",
    "codec",
    "decode_value",
    "default_container_id",
    "encode_value",
]  # fmt: skip


def __getattr__(name: str) -> object:
    """``amqp.Error``: the former name of :class:`ErrorCondition`, kept (with a warning) for code written
    before the rename; not part of ``__all__``."""
    if name == "Error":
        import warnings

        warnings.warn("amqp.Error is now amqp.ErrorCondition", DeprecationWarning, stacklevel=2)
        return ErrorCondition
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
