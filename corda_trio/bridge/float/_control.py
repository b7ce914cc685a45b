"""PURE: the float control protocol: addresses, messages, the forwarded-delivery envelope, the float's states.

Theory of operation
-------------------
The bridge manager (inside) dials the float's control port (mutual TLS with tunnel certificates, AMQP 1.0)
and attaches three links, all named by fixed addresses (``protocol_spec/float-control.md``):

* a sender to :data:`CONTROL_ADDRESS`: inside -> float commands (:class:`ActivateFloat`,
  :class:`DeactivateFloat`), each settled ``accepted`` once the float has taken it in;
* a receiver from :data:`EVENTS_ADDRESS`: float -> inside reports (:class:`FloatActivated`,
  :class:`FloatActivationFailed`, :class:`FloatDeactivated`);
* a receiver from :data:`INBOUND_ADDRESS` with the end-to-end credit: each peer delivery the float took,
  wrapped in a :class:`ForwardedDelivery`. The inside settles it with the outcome the peer must get.

A command or report is an AMQP message: ``properties.subject`` names its type, application property
``float-protocol`` is :data:`PROTOCOL_VERSION`, and the body is one amqp-value holding a map of its fields
(string keys, in the order the class declares them, so the encoding is canonical). A forwarded delivery
keeps the peer's message untouched as its one Data section and carries the float's facts in
application properties (``float-source``: the peer's validated legal name; ``float-target``: the inbox it
attached to; ``float-peer``: the peer's socket address).

Decoding is strict: an unknown type, a wrong version, a missing or mistyped field raises
:class:`ControlProtocolError` with the AMQP condition the receiver answers with.

No I/O, no clock, no randomness here.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any, ClassVar, Final, final

import attrs

from corda_trio import amqp
from corda_trio.messaging import InvalidMessageError

__all__ = [
    "CONTROL_ADDRESS",
    "EVENTS_ADDRESS",
    "INBOUND_ADDRESS",
    "PROTOCOL_VERSION",
    "ActivateFloat",
    "ControlMessage",
    "ControlProtocolError",
    "DeactivateFloat",
    "EnvelopeReader",
    "FloatActivated",
    "FloatActivationFailed",
    "FloatDeactivated",
    "FloatInput",
    "FloatState",
    "ForwardedDelivery",
    "decode_control",
    "encode_control",
    "float_transition",
]

CONTROL_ADDRESS: Final = "internal.float.control"
EVENTS_ADDRESS: Final = "internal.float.events"
INBOUND_ADDRESS: Final = "internal.float.inbound"
PROTOCOL_VERSION: Final = 1
_VERSION_KEY: Final = "float-protocol"
SOURCE_HEADER: Final = "float-source"
TARGET_HEADER: Final = "float-target"
PEER_HEADER: Final = "float-peer"
FORWARDED_SUBJECT: Final = "ForwardedDelivery"


class ControlProtocolError(InvalidMessageError):
    """A control message or envelope breaks the protocol; ``condition`` is the AMQP error to answer with
    (an :class:`~corda_trio.messaging.InvalidMessageError`: a forwarded delivery is refused as any bad message
    is)."""


def _str_list(value: Any) -> tuple[str, ...]:
    return tuple(value)


@final
@attrs.frozen(kw_only=True)
class ActivateFloat:
    """inside -> float: open the public listener for these inboxes.

    Attributes:
        activation_id: chosen by the inside; echoed in the float's answer.
        tls_ref: names the node TLS material in the float's configuration (the float holds the node's TLS
            key only because its operator configured it; it never travels over the tunnel).
        inboxes: the only addresses peers may attach senders to (``p2p.inbound.<key-hash>``).
        credit: the end-to-end window: the float holds at most this many peer deliveries unsettled.
    """

    TYPE: ClassVar[str] = "ActivateFloat"
    activation_id: str
    tls_ref: str
    inboxes: tuple[str, ...] = attrs.field(converter=_str_list)
    credit: int


@final
@attrs.frozen(kw_only=True)
class DeactivateFloat:
    """inside -> float: close the public listener (and every peer connection); stay connected."""

    TYPE: ClassVar[str] = "DeactivateFloat"
    reason: str


@final
@attrs.frozen(kw_only=True)
class FloatActivated:
    """float -> inside: the public listener is open at ``public_host:public_port``."""

    TYPE: ClassVar[str] = "FloatActivated"
    activation_id: str
    public_host: str
    public_port: int


@final
@attrs.frozen(kw_only=True)
class FloatActivationFailed:
    """float -> inside: the activation could not be done (unknown ``tls_ref``, port in use, ...)."""

    TYPE: ClassVar[str] = "FloatActivationFailed"
    activation_id: str
    condition: str
    description: str


@final
@attrs.frozen(kw_only=True)
class FloatDeactivated:
    """float -> inside: the public listener is closed."""

    TYPE: ClassVar[str] = "FloatDeactivated"
    reason: str


ControlMessage = ActivateFloat | DeactivateFloat | FloatActivated | FloatActivationFailed | FloatDeactivated
_TYPES: Final[Mapping[str, type]] = {
    cls.TYPE: cls
    for cls in (ActivateFloat, DeactivateFloat, FloatActivated, FloatActivationFailed, FloatDeactivated)
}
#: Field types on the wire; tuples travel as AMQP lists of strings.
_FIELD_KINDS: Final[Mapping[str, type]] = {
    "activation_id": str, "tls_ref": str, "inboxes": tuple, "credit": int, "reason": str,
    "public_host": str, "public_port": int, "condition": str, "description": str,
}  # fmt: skip


def encode_control(message: ControlMessage) -> amqp.Message:
    """The AMQP message carrying ``message`` (canonical: fields in declaration order)."""
    fields: dict[str, Any] = {}
    for a in attrs.fields(type(message)):
        value = getattr(message, a.name)
        fields[a.name.replace("_", "-")] = list(value) if isinstance(value, tuple) else value
    return amqp.Message(
        properties=amqp.Properties(subject=message.TYPE),
        application_properties={_VERSION_KEY: PROTOCOL_VERSION},
        body=amqp.AmqpValue(fields),
    )


def _check_version(message: amqp.Message) -> None:
    version = (message.application_properties or {}).get(_VERSION_KEY)
    if version != PROTOCOL_VERSION or isinstance(version, bool):
        raise ControlProtocolError(
            "amqp:not-implemented", f"float protocol version {version!r} is not {PROTOCOL_VERSION}"
        )


def decode_control(message: amqp.Message) -> ControlMessage:
    """Read a command or report.

    Raises:
        ControlProtocolError: ``amqp:not-implemented`` for an unknown type or version,
            ``amqp:invalid-field`` for a missing, extra or mistyped field.
    """
    _check_version(message)
    subject = message.properties.subject if message.properties is not None else None
    cls = _TYPES.get(subject) if isinstance(subject, str) else None
    if cls is None:
        raise ControlProtocolError("amqp:not-implemented", f"unknown float control message {subject!r}")
    body = message.body
    if not isinstance(body, amqp.AmqpValue) or not isinstance(body.value, dict):
        raise ControlProtocolError("amqp:invalid-field", f"{subject}: the body must be one amqp-value map")
    given = dict(body.value)
    values: dict[str, Any] = {}
    for a in attrs.fields(cls):
        key = a.name.replace("_", "-")
        if key not in given:
            raise ControlProtocolError("amqp:invalid-field", f"{subject}: field {key!r} is missing")
        value = given.pop(key)
        kind = _FIELD_KINDS[a.name]
        if kind is tuple:
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ControlProtocolError(
                    "amqp:invalid-field", f"{subject}: {key!r} must be a list of strings"
                )
        elif not isinstance(value, kind) or isinstance(value, bool):
            raise ControlProtocolError(
                "amqp:invalid-field",
                f"{subject}: {key!r} must be of type {kind.__name__}, got {type(value).__name__}",
            )
        values[a.name] = int(value) if kind is int else value
    if given:
        raise ControlProtocolError("amqp:invalid-field", f"{subject}: unknown field(s) {sorted(given)}")
    if cls is ActivateFloat and values["credit"] < 1:
        raise ControlProtocolError("amqp:invalid-field", f"{subject}: 'credit' must be at least 1")
    if cls is FloatActivated and not 0 < values["public_port"] < 65536:
        raise ControlProtocolError("amqp:invalid-field", f"{subject}: 'public-port' out of range")
    return cls(**values)  # type: ignore[no-any-return]


@final
@attrs.frozen(kw_only=True)
class ForwardedDelivery:
    """float -> inside: one peer delivery, with what the float established about its sender.

    Attributes:
        source: the peer's legal name, from its TLS certificate (the float's claim: the inside checks it).
        target: the address the peer's link attached to.
        peer: the peer's socket address ``host:port`` (for the audit trail).
        payload: the peer's message, encoded (``_AMQ_VALIDATED_USER`` stamped by the float).
    """

    source: str
    target: str
    peer: str
    payload: bytes

    def encode(self) -> bytes:
        return self.wrap(self.prefix(self.source, self.target, self.peer), self.payload)

    @staticmethod
    def prefix(source: str, target: str, peer: str) -> bytes:
        """The envelope's sections before the body: the same for every delivery of one peer link."""
        return amqp.Message(
            properties=amqp.Properties(subject=FORWARDED_SUBJECT),
            application_properties={
                _VERSION_KEY: PROTOCOL_VERSION,
                SOURCE_HEADER: source,
                TARGET_HEADER: target,
                PEER_HEADER: peer,
            },
        ).encode()

    @staticmethod
    def wrap(prefix: bytes, payload: bytes) -> bytes:
        """``prefix`` (see :meth:`prefix`) and ``payload`` as one Data section (spec 3.2.6: binary)."""
        n = len(payload)
        head = b"\x00\x53\x75\xa0" + bytes((n,)) if n < 256 else b"\x00\x53\x75\xb0" + n.to_bytes(4, "big")
        return b"".join((prefix, head, payload))

    @classmethod
    def decode(cls, data: bytes) -> ForwardedDelivery:
        """Raises: ControlProtocolError (``amqp:decode-error`` / ``amqp:invalid-field`` / version)."""
        try:
            message = amqp.Message.decode(data)
        except amqp.DecodeError as exc:
            raise ControlProtocolError("amqp:decode-error", f"malformed forwarded delivery: {exc}") from exc
        _check_version(message)
        subject = message.properties.subject if message.properties is not None else None
        if subject != FORWARDED_SUBJECT:
            raise ControlProtocolError(
                "amqp:invalid-field", f"expected a {FORWARDED_SUBJECT}, got {subject!r}"
            )
        props = message.application_properties or {}
        values = {}
        for name, key in (("source", SOURCE_HEADER), ("target", TARGET_HEADER), ("peer", PEER_HEADER)):
            value = props.get(key)
            if not isinstance(value, str):
                raise ControlProtocolError(
                    "amqp:invalid-field", f"{FORWARDED_SUBJECT}: {key!r} missing or not a string"
                )
            values[name] = value
        if type(message.body) is not bytes:
            raise ControlProtocolError(
                "amqp:invalid-field", f"{FORWARDED_SUBJECT}: the body must be one Data section"
            )
        return cls(payload=message.body, **values)


#: The prefixes an :class:`EnvelopeReader` remembers (one per peer link the float forwards from).
MAX_REMEMBERED_PREFIXES: Final = 256


@final
@attrs.define(eq=False)
class EnvelopeReader:
    """:meth:`ForwardedDelivery.decode` that remembers the prefixes it has read: the inside's hot path.

    Every envelope of one peer link starts with the same bytes (:meth:`ForwardedDelivery.prefix`). The
    first one is decoded in full; if its prefix is exactly the canonical prefix of the fields it carried,
    those bytes are remembered with the fields. An envelope that is then such a prefix followed by one
    canonical Data section up to its end *is* ``ForwardedDelivery(fields, payload).encode()``, so its
    fields and payload are taken without decoding (and without evicting the payload's shapes from the
    decoder's memo). Anything else, including any non-canonical layout, goes to the full decoder, so the
    result or error is always the one :meth:`ForwardedDelivery.decode` gives.
    """

    _known: dict[bytes, tuple[str, str, str]] = attrs.field(factory=dict)

    def decode(self, data: bytes) -> ForwardedDelivery:
        """Raises: ControlProtocolError, as :meth:`ForwardedDelivery.decode`."""
        start = _body_start(data)
        if start is not None:
            fields = self._known.get(data[:start])
            if fields is not None:
                payload = _canonical_data_section(data, start)
                if payload is not None:
                    return ForwardedDelivery(
                        source=fields[0], target=fields[1], peer=fields[2], payload=payload
                    )
        envelope = ForwardedDelivery.decode(data)
        prefix = ForwardedDelivery.prefix(envelope.source, envelope.target, envelope.peer)
        if start == len(prefix) and data.startswith(prefix):
            if len(self._known) >= MAX_REMEMBERED_PREFIXES:
                self._known.clear()
            self._known[prefix] = (envelope.source, envelope.target, envelope.peer)
        return envelope


def _body_start(data: bytes) -> int | None:
    """Where the first Data section (``00 53 75``) starts after sections 0x70-0x74 in short form (each a
    list or map, skipped by its declared size); ``None`` for any other layout. Only a proposal of where a
    remembered prefix would end: the caller checks the bytes before it against what it remembered."""
    pos = 0
    try:
        while data[pos] == 0 and data[pos + 1] == 0x53:
            code, c = data[pos + 2], data[pos + 3]
            if code == 0x75:
                return pos
            if not 0x70 <= code <= 0x74:
                return None
            if c in (0xC0, 0xC1):
                pos += 5 + data[pos + 4]
            elif c in (0xD0, 0xD1):
                pos += 8 + int.from_bytes(data[pos + 4 : pos + 8], "big")
            else:
                return None
    except IndexError:
        return None
    return None


def _canonical_data_section(data: bytes, pos: int) -> bytes | None:
    """The payload of the one Data section from ``pos`` to the end, if written as
    :meth:`ForwardedDelivery.wrap` writes it (vbin8 below 256 bytes, else vbin32); else ``None``."""
    if data[pos : pos + 3] != b"\x00\x53\x75":
        return None
    c, end = data[pos + 3 : pos + 4], len(data)
    if c == b"\xa0" and pos + 5 <= end and end - pos - 5 == data[pos + 4]:
        return data[pos + 5 :]
    if (
        c == b"\xb0"
        and pos + 8 <= end
        and end - pos - 8 == int.from_bytes(data[pos + 4 : pos + 8], "big") >= 256
    ):
        return data[pos + 8 :]
    return None


# --- the float's activation state machine --------------------------------------------------------------
#
#            control link up                ActivateFloat (listener opened)
#   IDLE  ------------------->  CONNECTED  -------------------------------->  ACTIVE
#    ^  ^                        |   ^  |                                     |   |
#    |  |    control link down   |   |  '-- ActivateFloat failed (stays) --'  |   |
#    |  '------------------------'   '---------- DeactivateFloat -------------'   |
#    '--------------------------- control link down (listener closed) ------------'
#
# A second control link while one is up is refused (one bridge manager activates a float); a command that
# has no entry below (ActivateFloat while ACTIVE) is a protocol error: the float rejects it with
# ``amqp:precondition-failed`` and closes the control link, which also closes the public listener.


class FloatState(enum.Enum):
    IDLE = "idle"  # no control link; public port closed
    CONNECTED = "connected"  # control link up, not activated; public port closed
    ACTIVE = "active"  # public port open, deliveries forwarded


class FloatInput(enum.Enum):
    CONTROL_UP = "control-up"
    CONTROL_DOWN = "control-down"
    ACTIVATE = "activate"
    ACTIVATE_FAILED = "activate-failed"
    DEACTIVATE = "deactivate"


_S, _I = FloatState, FloatInput
#: (state, input) -> (side effect, next state). Side effects: "open" / "close" the public listener, or "".
FLOAT_TRANSITIONS: Final[Mapping[tuple[FloatState, FloatInput], tuple[str, FloatState]]] = {
    (_S.IDLE, _I.CONTROL_UP): ("", _S.CONNECTED),
    (_S.CONNECTED, _I.ACTIVATE): ("open", _S.ACTIVE),
    (_S.ACTIVE, _I.ACTIVATE_FAILED): ("close", _S.CONNECTED),
    (_S.ACTIVE, _I.DEACTIVATE): ("close", _S.CONNECTED),
    (_S.CONNECTED, _I.DEACTIVATE): ("", _S.CONNECTED),
    (_S.CONNECTED, _I.CONTROL_DOWN): ("", _S.IDLE),
    (_S.ACTIVE, _I.CONTROL_DOWN): ("close", _S.IDLE),
}


def float_transition(state: FloatState, event: FloatInput) -> tuple[str, FloatState]:
    """The side effect and next state; a pair missing from the table raises :class:`ControlProtocolError`."""
    try:
        return FLOAT_TRANSITIONS[(state, event)]
    except KeyError:
        raise ControlProtocolError(
            "amqp:precondition-failed", f"{event.value} is not allowed while the float is {state.value}"
        ) from None
