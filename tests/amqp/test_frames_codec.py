"""Performatives, SASL frames, frames and the incremental FrameBuffer (spec 2.3, 2.7, 5.3)."""

from __future__ import annotations

import sys
import threading

import pytest

from corda_trio import amqp
from corda_trio.amqp import Symbol

ERR = amqp.ErrorCondition(condition=amqp.Condition.NOT_ALLOWED, description="no", info={Symbol("k"): 1})

# Every performative and SASL frame with every field set to a non-default value, plus minimal ones.
SAMPLES = [
    amqp.Open(container_id="c"),
    amqp.Open(
        container_id="corda-trio:1",
        hostname="h",
        max_frame_size=131072,
        channel_max=1,
        idle_time_out=5000,
        outgoing_locales=(Symbol("en"),),
        incoming_locales=(Symbol("en"), Symbol("fr")),
        offered_capabilities=(Symbol("A"),),
        desired_capabilities=(Symbol("B"),),
        properties={Symbol("p"): "v"},
    ),
    amqp.Begin(next_outgoing_id=0, incoming_window=2048, outgoing_window=2048),
    amqp.Begin(
        remote_channel=3,
        next_outgoing_id=1,
        incoming_window=2,
        outgoing_window=3,
        handle_max=7,
        offered_capabilities=(Symbol("x"),),
        desired_capabilities=(Symbol("y"),),
        properties={Symbol("a"): None},
    ),
    amqp.Attach(name="l", handle=0, role=amqp.Role.SENDER),
    amqp.Attach(
        name="link",
        handle=1,
        role=amqp.Role.RECEIVER,
        snd_settle_mode=0,
        rcv_settle_mode=1,
        source=amqp.Source(
            address="internal.peers.DLx",
            durable=2,
            expiry_policy=Symbol("never"),
            timeout=9,
            dynamic=True,
            dynamic_node_properties={Symbol("n"): 1},
            distribution_mode=Symbol("move"),
            filter={Symbol("f"): amqp.Described(Symbol("apache.org:selector-filter:string"), "a = 1")},
            default_outcome=amqp.Released(),
            outcomes=(Symbol("amqp:accepted:list"),),
            capabilities=(Symbol("queue"),),
        ),
        target=amqp.Target(
            address="p2p.inbound.DLx",
            durable=1,
            expiry_policy=Symbol("link-detach"),
            timeout=1,
            dynamic=True,
            dynamic_node_properties={Symbol("m"): 2},
            capabilities=(Symbol("topic"),),
        ),
        unsettled={b"tag": amqp.Accepted()},
        incomplete_unsettled=True,
        initial_delivery_count=5,
        max_message_size=10485760,
        offered_capabilities=(Symbol("o"),),
        desired_capabilities=(Symbol("d"),),
        properties={Symbol("q"): True},
    ),
    amqp.Flow(incoming_window=1, next_outgoing_id=2, outgoing_window=3),
    amqp.Flow(
        next_incoming_id=1,
        incoming_window=2,
        next_outgoing_id=3,
        outgoing_window=4,
        handle=5,
        delivery_count=6,
        link_credit=1000,
        available=8,
        drain=True,
        echo=True,
        properties={Symbol("z"): 0},
    ),
    amqp.Transfer(handle=0),
    amqp.Transfer(
        handle=1,
        delivery_id=2**32 - 1,
        delivery_tag=b"\x00" * 32,
        message_format=0,
        settled=True,
        more=True,
        rcv_settle_mode=1,
        state=amqp.Received(section_number=1, section_offset=2**40),
        resume=True,
        aborted=True,
        batchable=True,
    ),
    amqp.Disposition(role=amqp.Role.RECEIVER, first=0),
    amqp.Disposition(role=True, first=0, last=1, settled=True, state=amqp.Accepted(), batchable=True),
    amqp.Disposition(role=True, first=3, state=amqp.Rejected(error=ERR)),
    amqp.Disposition(role=True, first=3, state=amqp.Rejected()),
    amqp.Disposition(
        role=True,
        first=4,
        state=amqp.Modified(
            delivery_failed=True, undeliverable_here=False, message_annotations={Symbol("x"): 1}
        ),
    ),
    amqp.Detach(handle=0),
    amqp.Detach(handle=2, closed=True, error=ERR),
    amqp.End(),
    amqp.End(error=amqp.ErrorCondition(condition=amqp.Condition.WINDOW_VIOLATION)),
    amqp.Close(),
    amqp.Close(error=ERR),
    amqp.SaslMechanisms(sasl_server_mechanisms=(Symbol("PLAIN"), Symbol("ANONYMOUS"), Symbol("EXTERNAL"))),
    amqp.SaslInit(mechanism=Symbol("PLAIN"), initial_response=b"\x00SystemUsers/Peer\x00SystemUsers/Peer"),
    amqp.SaslInit(mechanism=Symbol("ANONYMOUS"), hostname="localhost"),
    amqp.SaslChallenge(challenge=b"c"),
    amqp.SaslResponse(response=b"r"),
    amqp.SaslOutcome(code=amqp.SaslCode.OK),
    amqp.SaslOutcome(code=amqp.SaslCode.AUTH, additional_data=b"why"),
]


@pytest.mark.parametrize("performative", SAMPLES, ids=lambda p: type(p).__name__)
def test_round_trip_value_and_frame(performative: object) -> None:
    encoded = amqp.encode_value(performative)
    assert amqp.decode_value(encoded) == (performative, len(encoded))
    assert amqp.encode_value(amqp.decode_value(encoded)[0]) == encoded  # canonical
    frame = amqp.encode_frame(performative, channel=0 if type(performative) in amqp.SASL_FRAMES else 7)
    decoded = amqp.decode_frame(frame)
    assert decoded.performative == performative
    assert decoded.type == (
        amqp.FrameType.SASL if type(performative) in amqp.SASL_FRAMES else amqp.FrameType.AMQP
    )
    assert decoded.payload == b""


# Golden frames: our encoding of these performatives is byte-identical to what Proton sends (captures).
GOLDEN_FRAMES = [
    (amqp.Open(container_id="proton-test-server", max_frame_size=32768, channel_max=32767),
     "0000002b02000000005310c01e04a11270726f746f6e2d746573742d736572766572407000008000607fff"),
    (amqp.SaslMechanisms(sasl_server_mechanisms=(Symbol("ANONYMOUS"),)),
     "0000001c02010000005340c00f01e00c01a309414e4f4e594d4f5553"),
    (amqp.Close(), "0000000c0200000000531845"),
]  # fmt: skip


@pytest.mark.parametrize(("performative", "hexed"), GOLDEN_FRAMES)
def test_golden_frames(performative: object, hexed: str) -> None:
    assert amqp.encode_frame(performative).hex() == hexed
    assert amqp.decode_frame(bytes.fromhex(hexed)).performative == performative


# Bytes the peers really sent, in encodings we never write (list32, array32, explicit defaults...).
PEER_FRAMES = [
    ("0000002e02010000005340d00000001e00000001f00000001500000002a309414e4f4e594d4f555305504c41494e",
     amqp.SaslMechanisms(sasl_server_mechanisms=(Symbol("ANONYMOUS"), Symbol("PLAIN")))),
    ("0000001602010000005344d000000006000000015000", amqp.SaslOutcome(code=0)),
    ("0000001002010000005344c003015000", amqp.SaslOutcome(code=0)),
    ("0000002602000000005310d00000001600000001a110726865612d746573742d736572766572",
     amqp.Open(container_id="rhea-test-server")),
]  # fmt: skip


@pytest.mark.parametrize(("hexed", "performative"), PEER_FRAMES)
def test_peer_frames(hexed: str, performative: object) -> None:
    data = bytes.fromhex(hexed)
    assert amqp.decode_frame(data).performative == performative
    buf = amqp.FrameBuffer()
    frames = []
    for i in range(len(data)):  # byte by byte
        buf.feed(data[i : i + 1])
        frame = buf.next_frame()
        if frame is not None:
            frames.append(frame)
    assert [f.performative for f in frames] == [performative]
    assert buf.buffered_bytes == 0


def test_transfer_payload_and_heartbeat() -> None:
    msg = amqp.Message(body=b"hello")
    frame = amqp.encode_frame(amqp.Transfer(handle=0, delivery_id=0, delivery_tag=b"t"), 3, msg.encode())
    heartbeat = amqp.encode_empty_frame()
    assert heartbeat.hex() == "0000000802000000"
    buf = amqp.FrameBuffer(max_frame_size=512)
    buf.feed(amqp.AMQP_HEADER + frame + heartbeat + frame[:5])
    assert buf.next_protocol_header() == amqp.AMQP_HEADER
    first = buf.next_frame()
    assert first is not None and first.channel == 3
    assert amqp.Message.decode(first.payload) == msg
    assert buf.next_frame() == amqp.Frame(0, 0, None, b"")
    assert buf.next_frame() is None
    assert buf.buffered_bytes == 5
    buf.feed(frame[5:])
    assert buf.next_frame() == first


def test_extended_header_is_skipped() -> None:
    body = amqp.encode_value(amqp.Close())
    frame = (12 + len(body)).to_bytes(4, "big") + b"\x03\x00\x00\x00" + b"EXTH" + body
    assert amqp.decode_frame(frame).performative == amqp.Close()


def test_oversize_frame_refused_at_header() -> None:
    buf = amqp.FrameBuffer(max_frame_size=512)
    buf.feed(b"\xff\xff\xff\xff\x02\x00\x00\x00")  # a 4 GiB frame: refused before any body arrives
    with pytest.raises(amqp.FramingError) as info:
        buf.next_frame()
    assert info.value.condition == amqp.Condition.FRAMING_ERROR
    assert isinstance(info.value, amqp.DecodeError)


@pytest.mark.parametrize(
    "hexed",
    [
        "0000000402000000",  # SIZE < 8
        "0000000801000000",  # DOFF < 2
        "0000000803000000",  # DOFF past SIZE
        "0000000802070000",  # unknown frame type
    ],
)
def test_bad_frame_headers(hexed: str) -> None:
    buf = amqp.FrameBuffer()
    buf.feed(bytes.fromhex(hexed))
    with pytest.raises(amqp.FramingError):
        buf.next_frame()


@pytest.mark.parametrize(
    ("hexed", "condition"),
    [
        ("0000000c0200000000531045", "amqp:invalid-field"),  # open without container-id
        ("0000000c0201000000531845", "amqp:decode-error"),  # close in a SASL frame
        ("0000001002000000005344c003015000", "amqp:decode-error"),  # sasl-outcome in an AMQP frame
        ("0000000c0200000040404040", "amqp:decode-error"),  # body is not described
        ("0000000d020000000053185001", "amqp:decode-error"),  # close with a ubyte instead of a list
        ("0000000f02000000005318c0025201", "amqp:decode-error"),  # close.error is a uint
        ("0000000f0200000000531dc00201a1", "amqp:decode-error"),  # truncated inside the frame
    ],
)
def test_bad_frame_bodies(hexed: str, condition: str) -> None:
    with pytest.raises(amqp.DecodeError) as info:
        amqp.decode_frame(bytes.fromhex(hexed))
    assert info.value.condition == condition


def test_protocol_headers() -> None:
    buf = amqp.FrameBuffer()
    buf.feed(b"AMQ")
    assert buf.next_protocol_header() is None
    buf.feed(b"P\x03\x01\x00\x00")
    assert buf.next_protocol_header() == amqp.SASL_HEADER
    bad = amqp.FrameBuffer()
    bad.feed(b"GET ")
    with pytest.raises(amqp.FramingError):
        bad.next_protocol_header()


def test_mandatory_field_cannot_be_encoded_as_none() -> None:
    with pytest.raises(amqp.EncodeError):
        amqp.encode_value(amqp.Open(container_id=None))  # type: ignore[arg-type]
    with pytest.raises(amqp.EncodeError):  # mandatory and multiple: at least one value
        amqp.encode_value(amqp.SaslMechanisms(sasl_server_mechanisms=()))


def test_empty_mandatory_multiple_field_is_invalid() -> None:
    body = bytes.fromhex("005340c00501e00200a3")  # sasl-mechanisms [an empty array of symbols]
    frame = (8 + len(body)).to_bytes(4, "big") + b"\x02\x01\x00\x00" + body
    with pytest.raises(amqp.DecodeError) as info:
        amqp.decode_frame(frame)
    assert info.value.condition == amqp.Condition.INVALID_FIELD


def test_conditions() -> None:
    assert amqp.Condition.DECODE_ERROR == Symbol("amqp:decode-error")
    assert amqp.Condition.UNATTACHED_HANDLE == "amqp:session:unattached-handle"
    assert len(amqp.Condition.all()) == 25


def test_large_frames_through_the_buffer_equal_a_whole_frame_decode() -> None:
    """Frames above 16 KiB: the performative is read from the frame's head, the payload copied once."""
    big = bytes(range(256)) * 300  # 75 KiB
    transfer = amqp.Transfer(handle=0, delivery_id=7, delivery_tag=b"t")
    # a performative longer than the head the buffer looks at first (1 KiB): decoded from the whole frame
    attach = amqp.Attach(name="n" * 40_000, handle=1, role=True)
    frames = [
        amqp.encode_frame(transfer, 2, big),
        amqp.encode_frame(attach, 0),
        amqp.encode_frame(transfer, 1, amqp.Message(body=big).encode()),
        (8 + 20_000).to_bytes(4, "big") + b"\x02\x00\x00\x00" + bytes(20_000),  # body is not a performative
    ]
    for frame in frames:
        for chunk in (len(frame), 4096, 1):
            buf = amqp.FrameBuffer()
            for i in range(0, len(frame), chunk):
                buf.feed(frame[i : i + chunk])
            try:
                expected = amqp.decode_frame(frame)
            except amqp.DecodeError as exc:
                with pytest.raises(amqp.DecodeError) as info:
                    buf.next_frame()
                assert info.value.condition == exc.condition
            else:
                got = buf.next_frame()
                assert got == expected and type(got.payload) is bytes
            assert buf.buffered_bytes == 0


def test_a_decoded_frame_reads_its_message_where_it_lies() -> None:
    """decode_frame keeps the payload where it lies: message() decodes it there; payload is copied once."""
    message = amqp.Message(properties=amqp.Properties(message_id="m-1"), body=bytes(range(256)) * 256)
    transfer = amqp.Transfer(handle=0, delivery_id=7, delivery_tag=b"t")
    raw = amqp.encode_frame(transfer, 5, message.encode())
    frame = amqp.decode_frame(raw)
    assert frame.message() == message  # before the payload was ever read
    assert frame.payload == message.encode() and frame.payload is frame.payload  # copied out once, kept
    assert frame.message() == message  # and from the copy
    fresh = amqp.decode_frame(raw)
    assert fresh == frame and hash(fresh) == hash(frame)  # equality reads the payload
    assert amqp.Frame(0, 5, transfer, message.encode()) == frame
    assert amqp.Frame(0, 5, transfer, b"other") != frame
    assert repr(amqp.decode_frame(amqp.encode_frame(amqp.Close()))) == (
        f"Frame(type=0, channel=0, performative={amqp.Close()!r}, payload=b'')"
    )
    assert amqp.decode_frame(amqp.encode_frame(amqp.Close())).message() == amqp.Message()
    match amqp.decode_frame(raw):
        case amqp.Frame(0, 5, amqp.Transfer(delivery_id=7), payload):
            assert payload == message.encode()
        case _:
            pytest.fail("a frame's attributes match positionally")
    with pytest.raises(AttributeError):
        frame.payload = b""  # type: ignore[misc]
    with pytest.raises(AttributeError):
        fresh.unknown  # noqa: B018
    # a damaged payload: the error's offset counts from the frame's first byte
    head = raw[: -len(message.encode())]
    bad = (len(head) + 4).to_bytes(4, "big") + head[4:] + b"\x00\x53\x99\x40"  # no such section
    with pytest.raises(amqp.DecodeError) as info:
        amqp.decode_frame(bad).message()
    assert info.value.offset == len(head)


def test_a_lazy_payload_read_from_many_threads_at_once_is_the_same_bytes() -> None:
    """Frames are read-only values: reading a decoded frame's payload (or its message) from several threads
    at the same moment gives every thread the same bytes, never an AttributeError or a KeyError."""
    message = amqp.Message(body=bytes(range(256)) * 64)
    raw = amqp.encode_frame(amqp.Transfer(handle=0, delivery_id=1, delivery_tag=b"t"), 0, message.encode())
    failures: list[BaseException] = []

    def read(frame: amqp.Frame, barrier: threading.Barrier, got: list[object]) -> None:
        barrier.wait()
        try:
            got.append(frame.message() if len(got) % 2 else frame.payload)
            got.append(frame.payload)
        except Exception as exc:
            failures.append(exc)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # the threads switch as often as the interpreter allows: races show
    try:
        for _ in range(300):
            frame, barrier, got = amqp.decode_frame(raw), threading.Barrier(4), []
            threads = [threading.Thread(target=read, args=(frame, barrier, got)) for _ in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert not failures, failures[:3]
            assert all(g == message or g == message.encode() for g in got) and len(got) == 8
    finally:
        sys.setswitchinterval(interval)
