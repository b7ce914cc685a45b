"""PURE: the peer-to-peer message model, addresses and Corda's P2P header names.

Theory of operation
-------------------
A message between nodes is an AMQP 1.0 message (``protocol_spec/README.md``, "Node to node", item 6):
a durable header, properties with a message-id, application-properties under Corda's P2P header names and one
Data body section holding the application's bytes. :class:`OutgoingMessage` is what a node sends (built by
``MessagingService.create_message``); :func:`to_amqp` turns it into the wire message, stamped with the
sender's identity headers; :func:`from_amqp` reads a received wire message back into a
:class:`ReceivedMessage`, and :func:`check_p2p_message` is the receiving node's validation, raising the AMQP
condition to reject with.

Addresses: a node's inbox is ``p2p.inbound.<key-hash>``, the durable outbound queue towards a peer is
``internal.peers.<key-hash>`` (key-hash: ``corda_trio.pki.key_hash`` of the peer's legal identity key).

No I/O, no clock, no randomness here: ids and sequence numbers are arguments.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, Final

import attrs

from corda_trio import amqp

__all__ = [
    "CORDA_VENDOR",
    "HEADER_DEDUP_ID",
    "HEADER_MESSAGE_TYPE",
    "HEADER_PLATFORM_VERSION",
    "HEADER_RELEASE_VERSION",
    "HEADER_SENDER_UUID",
    "HEADER_SEND_SEQ_NO",
    "HEADER_TOPIC",
    "HEADER_VALIDATED_USER",
    "HEADER_VENDOR",
    "INBOX_PREFIX",
    "OUTBOUND_PREFIX",
    "REQUIRED_HEADERS",
    "InvalidMessageError",
    "OutgoingMessage",
    "ReceivedMessage",
    "check_inbox_sender",
    "check_message_format",
    "check_p2p_message",
    "from_amqp",
    "inbox_address",
    "key_hash_of_address",
    "outbound_queue",
    "stamp_validated_user",
    "stamped_payload",
    "to_amqp",
]

INBOX_PREFIX: Final = "p2p.inbound."
OUTBOUND_PREFIX: Final = "internal.peers."

HEADER_TOPIC: Final = "platform-topic"
HEADER_PLATFORM_VERSION: Final = "platform-version"
HEADER_VENDOR: Final = "corda-vendor"
HEADER_RELEASE_VERSION: Final = "release-version"
HEADER_SENDER_UUID: Final = "sender-uuid"
HEADER_SEND_SEQ_NO: Final = "send-seq-no"
HEADER_MESSAGE_TYPE: Final = "corda_p2p_message_type"
HEADER_DEDUP_ID: Final = "_AMQ_DUPL_ID"
HEADER_VALIDATED_USER: Final = "_AMQ_VALIDATED_USER"

CORDA_VENDOR: Final = "corda-trio"
#: Headers a received message must carry (with these types) or it is rejected with ``amqp:invalid-field``.
REQUIRED_HEADERS: Final[Mapping[str, type]] = {
    HEADER_TOPIC: str,
    HEADER_PLATFORM_VERSION: int,
    HEADER_DEDUP_ID: str,
}
#: Names a caller may not set through ``headers=``: the messaging layer owns them.
_RESERVED: Final = frozenset(
    {
        HEADER_TOPIC,
        HEADER_PLATFORM_VERSION,
        HEADER_VENDOR,
        HEADER_RELEASE_VERSION,
        HEADER_SENDER_UUID,
        HEADER_SEND_SEQ_NO,
        HEADER_DEDUP_ID,
        HEADER_VALIDATED_USER,
    }
)


class InvalidMessageError(ValueError):
    """A received message breaks the P2P contract; ``condition`` is the AMQP error to reject it with."""

    def __init__(self, condition: str, description: str) -> None:
        super().__init__(description)
        self.condition = condition
        self.description = description


def inbox_address(key_hash: str) -> str:
    """The inbox of the node whose legal identity key hashes to ``key_hash``."""
    return INBOX_PREFIX + key_hash


def outbound_queue(key_hash: str) -> str:
    """The durable outbound queue towards the node whose identity key hashes to ``key_hash``."""
    return OUTBOUND_PREFIX + key_hash


def key_hash_of_address(address: str) -> str:
    """The key-hash part of an inbox or outbound queue name.

    Raises:
        ValueError: ``address`` is neither.
    """
    for prefix in (INBOX_PREFIX, OUTBOUND_PREFIX):
        if address.startswith(prefix) and len(address) > len(prefix):
            return address[len(prefix) :]
    raise ValueError(f"{address!r} is neither {INBOX_PREFIX}<key-hash> nor {OUTBOUND_PREFIX}<key-hash>")


def _valid_headers(_instance: object, _attribute: object, value: Mapping[str, str]) -> None:
    for name, val in value.items():
        if not isinstance(name, str) or not isinstance(val, str):
            raise TypeError(f"headers must map str to str, got {name!r}: {val!r}")
        if name in _RESERVED:
            raise ValueError(f"header {name!r} is set by the messaging layer and cannot be given")


@attrs.frozen(kw_only=True)
class OutgoingMessage:
    """A message to send: topic, the application's bytes, its deduplication id and extra string headers."""

    topic: str = attrs.field(validator=attrs.validators.instance_of(str))
    data: bytes = attrs.field(converter=bytes)
    dedup_id: str = attrs.field(validator=attrs.validators.instance_of(str))
    headers: Mapping[str, str] = attrs.field(factory=dict, validator=_valid_headers)


@attrs.frozen(kw_only=True)
class ReceivedMessage:
    """A message taken from this node's inbox.

    Attributes:
        validated_user: the sender's legal name as the receiving node's TLS check established it (``None``
            for a message a node sent to itself).
        headers: every application property that is not one of the P2P names above.
    """

    topic: str
    data: bytes
    dedup_id: str
    platform_version: int
    sender_uuid: str | None
    send_seq_no: int | None
    validated_user: str | None
    message_id: str | None
    headers: Mapping[str, Any]


_DURABLE: Final = amqp.Header(durable=True)  # immutable: one for every message
_int: Final = functools.lru_cache(maxsize=16)(amqp.Int)  # the platform version, as an AMQP int


def to_amqp(
    message: OutgoingMessage,
    *,
    platform_version: int,
    release_version: str,
    sender_uuid: str,
    send_seq_no: int,
) -> amqp.Message:
    """The wire form of ``message`` (durable header, message-id = dedup id, Corda's P2P headers, one Data)."""
    props: dict[str, Any] = dict(message.headers)
    props.update(
        {
            HEADER_TOPIC: message.topic,
            HEADER_PLATFORM_VERSION: _int(platform_version),
            HEADER_VENDOR: CORDA_VENDOR,
            HEADER_RELEASE_VERSION: release_version,
            HEADER_SENDER_UUID: sender_uuid,
            HEADER_SEND_SEQ_NO: amqp.Long(send_seq_no),
            HEADER_DEDUP_ID: message.dedup_id,
        }
    )
    return amqp.Message(
        header=_DURABLE,
        properties=amqp.Properties(message_id=message.dedup_id),
        application_properties=props,
        body=message.data,
    )


def check_message_format(message_format: int) -> None:
    """A delivery's transfer message-format (spec 2.7.5) must be 0, the standard AMQP message: raises
    :class:`InvalidMessageError` with ``amqp:not-implemented`` for any other.

    Another format (the upper three bytes a vendor's id, the low byte its version) says the payload is
    *not* standard sections; reading it as an ``amqp.Message`` would be guessing, and a P2P message is
    never one. ``not-implemented`` (the receiver does not implement what the sender used) rather than
    ``decode-error`` or ``invalid-field``: the payload may be well formed in its own format.
    """
    if message_format != 0:
        raise InvalidMessageError(
            "amqp:not-implemented",
            f"message-format {message_format:#x} is not taken here: only 0, the standard AMQP message",
        )


def check_inbox_sender(snd_settle_mode: int | None) -> None:
    """A link that sends to a node's inbox must send unsettled (spec 2.7.3 ``snd-settle-mode``): raises
    :class:`InvalidMessageError` with ``amqp:not-implemented`` for ``settled`` (1), the mode of pre-settled,
    at-most-once transfers.

    An inbox settles a message ``accepted`` only once it is durable (or ``rejected`` with the reason): a
    pre-settled one would get neither, so a message the node could not store, or refused, would be gone
    without the sender ever hearing of it. ``unsettled`` (0, Corda's) and ``mixed`` (2, Qpid Proton's
    default) are taken.
    """
    if snd_settle_mode == amqp.SenderSettleMode.SETTLED:
        raise InvalidMessageError(
            "amqp:not-implemented",
            "an inbox takes no pre-settled (at-most-once) messages: it settles each one accepted once it is "
            "stored, or rejected with the reason; attach with snd-settle-mode unsettled",
        )


def check_p2p_message(message: amqp.Message, *, max_size: int, encoded_size: int) -> None:
    """The receiving node's checks; raises :class:`InvalidMessageError` with the condition to reject with.

    Checks: the size (``amqp:link:message-size-exceeded``), the required headers and their types, exactly
    one Data body section (``amqp:invalid-field``).
    """
    if encoded_size > max_size:
        raise InvalidMessageError(
            "amqp:link:message-size-exceeded",
            f"message of {encoded_size} bytes exceeds the network's max_message_size of {max_size} bytes",
        )
    props = message.application_properties or {}
    for name, kind in REQUIRED_HEADERS.items():
        value = props.get(name)
        if value is None:
            raise InvalidMessageError("amqp:invalid-field", f"required header {name!r} is missing")
        if not isinstance(value, kind) or isinstance(value, bool):
            raise InvalidMessageError(
                "amqp:invalid-field",
                f"header {name!r} must be of type {kind.__name__}, got {type(value).__name__}",
            )
    if type(message.body) is not bytes:
        raise InvalidMessageError("amqp:invalid-field", "the body must be exactly one Data section")


def stamp_validated_user(message: amqp.Message, user: str) -> amqp.Message:
    """``message`` with ``_AMQ_VALIDATED_USER`` set to ``user`` (overwriting whatever the sender put there).

    Raises:
        InvalidMessageError: the sender claimed a different user (``amqp:unauthorized-access``).
    """
    props = dict(message.application_properties or {})
    claimed = props.get(HEADER_VALIDATED_USER)
    if claimed is not None and claimed != user:
        raise InvalidMessageError(
            "amqp:unauthorized-access",
            f"{HEADER_VALIDATED_USER} claims {claimed!r} but the connection is authenticated as {user!r}",
        )
    props[HEADER_VALIDATED_USER] = user
    return attrs.evolve(message, application_properties=props)


def _skip_list(buf: bytes, pos: int) -> int:
    """The position after the list (or null) at ``pos`` (a header or properties section's value)."""
    c = buf[pos]
    if c in (0x40, 0x45):  # null, list0
        return pos + 1
    if c in (0xC0, 0xC1):  # list8, map8
        return pos + 2 + buf[pos + 1]
    if c in (0xD0, 0xD1):  # list32, map32
        return pos + 5 + int.from_bytes(buf[pos + 1 : pos + 5], "big")
    raise ValueError(f"unexpected constructor 0x{c:02x}")


@functools.lru_cache(maxsize=256)  # one entry per peer (TLS subject) seen lately
def _stamp_entry(user: str) -> bytes:
    """The encoded ``_AMQ_VALIDATED_USER`` map entry (key and value) for ``user``."""
    return amqp.encode_value(HEADER_VALIDATED_USER) + amqp.encode_value(user)


def stamped_payload(payload: bytes, message: amqp.Message, user: str) -> bytes:
    """The bytes of ``stamp_validated_user(message, user).encode()`` for ``message = decode(payload)``,
    without encoding the whole message again: the ``_AMQ_VALIDATED_USER`` pair is appended to the
    application-properties map in place (the acceptor's hot path). A message that already names ``user``
    is returned as it is; an unusual layout (long-form section descriptors) takes the slow path.

    Raises:
        InvalidMessageError: the sender claimed a different user (``amqp:unauthorized-access``).
    """
    props = message.application_properties or {}
    claimed = props.get(HEADER_VALIDATED_USER)
    if claimed is not None:
        if claimed != user:
            stamp_validated_user(message, user)  # raises with the right condition
        return payload
    try:
        pos = 0
        while payload[pos] == 0 and payload[pos + 1] == 0x53 and 0x70 <= payload[pos + 2] <= 0x73:
            pos = _skip_list(payload, pos + 3)  # header, annotations, properties
        if payload[pos : pos + 3] != b"\x00\x53\x74":
            raise ValueError("no application-properties section")
        c = payload[pos + 3]
        if c == 0xC1:
            count, start, end = payload[pos + 5], pos + 6, pos + 5 + payload[pos + 4]
        elif c == 0xD1:
            size = int.from_bytes(payload[pos + 4 : pos + 8], "big")
            count, start, end = int.from_bytes(payload[pos + 8 : pos + 12], "big"), pos + 12, pos + 8 + size
        else:
            raise ValueError(f"application-properties is not a map (0x{c:02x})")
    except (IndexError, ValueError):
        return stamp_validated_user(message, user).encode()
    pairs = payload[start:end] + _stamp_entry(user)
    count += 2
    if count <= 255 and len(pairs) < 255:
        head = bytes((0xC1, len(pairs) + 1, count))
    else:
        head = b"\xd1" + (len(pairs) + 4).to_bytes(4, "big") + count.to_bytes(4, "big")
    return b"".join((payload[: pos + 3], head, pairs, payload[end:]))


def from_amqp(
    message: amqp.Message, *, checked: bool = False, validated_user: str | None = None
) -> ReceivedMessage:
    """Read a stored inbox message.

    Args:
        checked: ``message`` passed :func:`check_p2p_message` already (the in-node acceptor's hand-off):
            it is not checked again.
        validated_user: ``message`` is the acceptor's decoded form from before it stamped this user into
            the stored bytes: the result carries it, whatever ``_AMQ_VALIDATED_USER`` ``message`` holds.

    Raises:
        InvalidMessageError: a required header is missing or mistyped, or the body is not one Data section.
    """
    if not checked:
        check_p2p_message(message, max_size=2**63, encoded_size=0)
    props = dict(message.application_properties or {})
    seq = props.pop(HEADER_SEND_SEQ_NO, None)
    sender = props.pop(HEADER_SENDER_UUID, None)
    user = props.pop(HEADER_VALIDATED_USER, None)
    if validated_user is not None:
        user = validated_user
    message_id = message.properties.message_id if message.properties is not None else None
    received = ReceivedMessage(
        topic=props.pop(HEADER_TOPIC),
        data=message.body,
        dedup_id=props.pop(HEADER_DEDUP_ID),
        platform_version=int(props.pop(HEADER_PLATFORM_VERSION)),
        sender_uuid=sender if isinstance(sender, str) else None,
        send_seq_no=int(seq) if isinstance(seq, int) and not isinstance(seq, bool) else None,
        validated_user=user if isinstance(user, str) else None,
        message_id=str(message_id) if message_id is not None else None,
        headers={k: v for k, v in props.items() if k not in (HEADER_VENDOR, HEADER_RELEASE_VERSION)},
    )
    return received
