"""Messages (spec 3.2): body shapes, section order, the P2P message, encode_parts, errors."""

from __future__ import annotations

import uuid

import pytest

from corda_trio import amqp
from corda_trio.amqp import Int, Symbol, ULong

P2P = amqp.Message(
    header=amqp.Header(durable=True),
    properties=amqp.Properties(message_id="N-1-2-3", to="p2p.inbound.DLx", user_id=b"O=Bank A, C=GB"),
    application_properties={
        "platform-topic": "platform.session", "platform-version": Int(13), "corda-vendor": "Corda OS",
        "release-version": "4.12", "sender-uuid": str(uuid.UUID(int=1)), "send-seq-no": 42,
        "corda_p2p_message_type": "session", "_AMQ_DUPL_ID": "N-1-2-3", "_AMQ_VALIDATED_USER": "O=Bank A",
    },
    body=b"\x81\xa1k\xa1v",
)  # fmt: skip


@pytest.mark.parametrize(
    "body",
    [
        None,
        b"",
        b"x" * 255,
        b"y" * 256,
        bytes(70000),
        (b"a", b"b"),
        (b"", b"", b"c"),
        amqp.AmqpValue(None),
        amqp.AmqpValue({"k": [1, Symbol("s")]}),
        amqp.AmqpSequence([1, "two"]),
        (amqp.AmqpSequence([]), amqp.AmqpSequence([b"x"])),
    ],
)
def test_body_shapes_round_trip(body: object) -> None:
    msg = amqp.Message(body=body)
    encoded = msg.encode()
    assert amqp.Message.decode(encoded) == msg
    assert amqp.Message.decode(memoryview(encoded)) == msg
    assert amqp.Message.decode(bytearray(encoded)) == msg


def test_body_inputs_are_normalised_on_the_wire() -> None:
    """bytearray / memoryview / list bodies encode like bytes / tuple bodies."""
    assert amqp.Message(body=bytearray(b"ab")).encode() == amqp.Message(body=b"ab").encode()
    assert amqp.Message(body=[b"a", memoryview(b"b")]).encode() == amqp.Message(body=(b"a", b"b")).encode()


def test_p2p_message_layout() -> None:
    encoded = P2P.encode()
    assert encoded.startswith(bytes.fromhex("005370c0020141"))  # header: list8 [durable=true]
    parts = P2P.encode_parts()
    assert b"".join(parts) == encoded
    assert parts[-1] is P2P.body  # the body is not copied before the final join
    decoded = amqp.Message.decode(encoded)
    assert decoded == P2P
    assert type(decoded.application_properties["platform-version"]) is Int
    assert type(decoded.application_properties["send-seq-no"]) is int
    assert decoded.body == P2P.body


def test_every_section_in_order() -> None:
    msg = amqp.Message(
        header=amqp.Header(priority=1),
        delivery_annotations={"x-opt-d": 1},
        message_annotations={"x-opt-m": "v", 7: True},
        properties=amqp.Properties(
            message_id=5, correlation_id=uuid.UUID(int=9), content_type=Symbol("text/plain")
        ),
        application_properties={"a": None},
        body=b"b",
        footer={"x-opt-f": b"sig"},
    )
    encoded = msg.encode()
    codes = []
    pos = 0
    while pos < len(encoded):
        assert encoded[pos : pos + 2] == b"\x00\x53"
        codes.append(encoded[pos + 2])
        pos = amqp.decode_value(encoded, pos + 3)[1]
    assert codes == [0x70, 0x71, 0x72, 0x73, 0x74, 0x75, 0x78]
    decoded = amqp.Message.decode(encoded)
    assert decoded.message_annotations == {Symbol("x-opt-m"): "v", ULong(7): True}
    assert type(next(iter(decoded.delivery_annotations))) is Symbol
    assert decoded.properties.message_id == ULong(5) and type(decoded.properties.message_id) is ULong
    assert decoded == msg


def test_symbolic_section_descriptors() -> None:
    encoded = (
        b"\x00\xa3\x10amqp:header:list\x45"
        + b"\x00\x80\x00\x00\x00\x00\x00\x00\x00\x75\xa0\x01z"  # data with a full-width ulong descriptor
        + b"\x00\xa3\x0famqp:footer:map\xc1\x01\x00"
    )
    assert amqp.Message.decode(encoded) == amqp.Message(header=amqp.Header(), body=b"z", footer={})


@pytest.mark.parametrize(
    "body",
    [1, "text", (b"a", amqp.AmqpSequence([])), (), object()],
)
def test_bad_bodies_are_encode_errors(body: object) -> None:
    with pytest.raises(amqp.EncodeError):
        amqp.Message(body=body).encode()


def test_bad_application_property_key() -> None:
    with pytest.raises(amqp.EncodeError):
        amqp.Message(application_properties={1: "x"}).encode()  # type: ignore[dict-item]


def test_decode_errors_carry_offsets() -> None:
    good = amqp.Message(header=amqp.Header(), body=b"abc").encode()
    with pytest.raises(amqp.DecodeError) as info:
        amqp.Message.decode(good + b"\x00\x53\x70\x45")  # a header after the body
    assert info.value.offset == len(good)
    with pytest.raises(amqp.DecodeError) as info:
        amqp.Message.decode(good[:-1])
    assert info.value.condition == amqp.Condition.DECODE_ERROR


def test_transfer_frame_carries_the_message() -> None:
    transfer = amqp.Transfer(
        handle=0, delivery_id=1, delivery_tag=b"\x00\x01", message_format=0, settled=False
    )
    frame = amqp.encode_frame(transfer, 2, P2P.encode())
    decoded = amqp.decode_frame(frame)
    assert decoded.performative == transfer
    assert amqp.Message.decode(decoded.payload) == P2P
