"""Golden vectors of protocol_spec/amqp-codec.md (protocol_spec/vectors/amqp-codec.json), both directions.

Every decoder is fed the vector whole, byte by byte (FrameBuffer) or as every proper prefix (which must be a
DecodeError, never a wrong value), and with trailing data that must be left untouched.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from corda_trio import amqp

ROOT = Path(__file__).resolve().parents[2]
VECTORS = json.loads((ROOT / "protocol_spec" / "vectors" / "amqp-codec.json").read_text(encoding="utf-8"))
NAMESPACE: dict[str, Any] = {name: getattr(amqp, name) for name in amqp.__all__}
NAMESPACE.update(UUID=uuid.UUID, __builtins__={})
TRAILER = b"\x40\x00\x53\x18\x45trailing"


def expected(expr: str) -> Any:
    return eval(expr, NAMESPACE)  # the repository's own vector file, in a namespace of amqp names only


def ids(kind: str) -> list[str]:
    return [v["name"] for v in VECTORS[kind]]


def test_vector_file_covers_every_kind() -> None:
    assert {type(expected(v["performative"])) for v in VECTORS["frames"] if "performative" in v} >= {
        *amqp.PERFORMATIVES,
        *amqp.SASL_FRAMES,
        type(None),
    }
    assert any("capture" in v["source"] for v in VECTORS["frames"])
    assert any("capture" in v["source"] for v in VECTORS["messages"])


@pytest.mark.parametrize("vec", VECTORS["values"], ids=ids("values"))
def test_values(vec: dict[str, Any]) -> None:
    data = bytes.fromhex(vec["hex"])
    value = expected(vec["value"])
    if vec["canonical"]:
        assert amqp.encode_value(value) == data
    decoded, end = amqp.decode_value(data)
    assert (decoded, end) == (value, len(data))
    assert type(decoded) is type(value)
    assert amqp.decode_value(data + TRAILER) == (value, len(data))
    assert amqp.decode_value(TRAILER[:3] + data, 3) == (value, len(data) + 3)
    for cut in range(len(data)):
        with pytest.raises(amqp.DecodeError):
            amqp.decode_value(data[:cut])


@pytest.mark.parametrize("vec", VECTORS["negative_values"], ids=ids("negative_values"))
def test_negative_values(vec: dict[str, Any]) -> None:
    data = bytes.fromhex(vec["hex"])
    with pytest.raises(amqp.DecodeError) as info:
        amqp.decode_value(data)
    assert info.value.condition == vec["condition"]
    assert 0 <= info.value.offset <= len(data)


@pytest.mark.parametrize("vec", VECTORS["frames"], ids=ids("frames"))
def test_frames(vec: dict[str, Any]) -> None:
    data = bytes.fromhex(vec["hex"])
    if vec.get("protocol_header"):
        buf = amqp.FrameBuffer()
        buf.feed(data + TRAILER)
        assert buf.next_protocol_header() == data
        assert buf.buffered_bytes == len(TRAILER)
        return
    performative = expected(vec["performative"])
    if vec["canonical"]:
        if performative is None:
            assert amqp.encode_empty_frame(vec["channel"]) == data
        else:
            assert amqp.encode_frame(performative, vec["channel"]) == data
    frame = amqp.decode_frame(data)
    assert frame == amqp.Frame(vec["type"], vec["channel"], performative, b"")
    # whole, with trailing bytes left in the buffer
    buf = amqp.FrameBuffer()
    buf.feed(data + TRAILER)
    assert buf.next_frame() == frame
    assert buf.buffered_bytes == len(TRAILER)
    # byte by byte: nothing until the last byte
    buf = amqp.FrameBuffer()
    for i, byte in enumerate(data):
        buf.feed(bytes((byte,)))
        got = buf.next_frame()
        assert (got is None) == (i < len(data) - 1)
    assert got == frame
    assert buf.buffered_bytes == 0


@pytest.mark.parametrize("vec", VECTORS["negative_frames"], ids=ids("negative_frames"))
def test_negative_frames(vec: dict[str, Any]) -> None:
    data = bytes.fromhex(vec["hex"])
    buf = amqp.FrameBuffer(max_frame_size=vec["max_frame_size"])
    with pytest.raises(amqp.DecodeError) as info:
        for byte in data:  # the error comes as soon as the bytes that prove it arrive
            buf.feed(bytes((byte,)))
            buf.next_frame()
        buf.feed(b"\x00" * 1024)
        buf.next_frame()
    assert info.value.condition == vec["condition"]
    if vec["condition"] == amqp.Condition.FRAMING_ERROR:
        assert isinstance(info.value, amqp.FramingError)
        assert buf.buffered_bytes <= 8  # refused at the header, before buffering the body


@pytest.mark.parametrize("vec", VECTORS["messages"], ids=ids("messages"))
def test_messages(vec: dict[str, Any]) -> None:
    data = bytes.fromhex(vec["hex"])
    message = expected(vec["value"])
    if vec["canonical"]:
        assert message.encode() == data
    assert amqp.Message.decode(data) == message
    assert amqp.Message.decode(memoryview(TRAILER + data), len(TRAILER)) == message
    assert amqp.Message.decode(amqp.Message.decode(data).encode()) == message  # our re-encoding is equivalent
    for cut in range(1, len(data)):
        try:
            partial = amqp.Message.decode(data[:cut])
        except amqp.DecodeError:
            continue
        assert partial != message  # a prefix that ends on a section boundary is a smaller, valid message


@pytest.mark.parametrize("vec", VECTORS["negative_messages"], ids=ids("negative_messages"))
def test_negative_messages(vec: dict[str, Any]) -> None:
    with pytest.raises(amqp.DecodeError) as info:
        amqp.Message.decode(bytes.fromhex(vec["hex"]))
    assert info.value.condition == vec["condition"]


CAPTURES = ROOT / "protocol_spec" / "vectors" / "captures"


def test_every_captured_frame_decodes_and_is_in_the_vectors() -> None:
    """The captures of real peers' frames agree with the copies in the vectors file."""
    copied = {v["hex"] for v in VECTORS["frames"]}
    probes = sorted(CAPTURES.glob("*-probe*.json"))
    assert probes
    for probe in probes:
        for frame in json.loads(probe.read_text())["frames"]:
            assert frame["hex"] in copied, (probe.name, frame["what"])
            decoded = amqp.decode_frame(bytes.fromhex(frame["hex"]))
            assert decoded.type == frame["type"] and decoded.channel == frame["channel"]
            code = int(frame["decoded"].split("ulong(")[1].split(")")[0])
            assert decoded.performative.DESCRIPTOR_CODE == code
