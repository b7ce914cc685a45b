"""Interop with Qpid Proton-C (python-qpid-proton), an independent AMQP 1.0 implementation, both ways.

What we encode, ``proton.Data`` / ``proton.Message`` decode to the same values; what Proton encodes (in its
own, often wider, encodings), we decode to the same values. Proton is a required test oracle: these tests
never skip.
"""

from __future__ import annotations

import uuid
from typing import Any

import proton
import pytest
from hypothesis import given
from hypothesis import strategies as st
from proton import Data

from corda_trio import amqp
from corda_trio.amqp import (
    Array,
    Byte,
    Char,
    Decimal32,
    Decimal64,
    Decimal128,
    Described,
    Float,
    Int,
    Short,
    Symbol,
    Timestamp,
    UByte,
    UInt,
    ULong,
    UShort,
)  # fmt: skip

pytestmark = pytest.mark.interop

# --- our representation <-> Proton's --------------------------------------------------------------------

TO_PROTON_SCALAR: dict[type, Any] = {
    UByte: proton.ubyte, UShort: proton.ushort, UInt: proton.uint, ULong: proton.ulong, Byte: proton.byte,
    Short: proton.short, Int: proton.int32, Float: proton.float32, Char: proton.char,
    Timestamp: proton.timestamp, Symbol: proton.symbol,
    Decimal32: lambda v: proton.decimal32(int.from_bytes(v, "big")),
    Decimal64: lambda v: proton.decimal64(int.from_bytes(v, "big")),
    Decimal128: lambda v: proton.decimal128(bytes(v)),
}  # fmt: skip
ARRAY_CODES = {
    "boolean": Data.BOOL, "ubyte": Data.UBYTE, "ushort": Data.USHORT, "uint": Data.UINT, "ulong": Data.ULONG,
    "byte": Data.BYTE, "short": Data.SHORT, "int": Data.INT, "long": Data.LONG, "float": Data.FLOAT,
    "double": Data.DOUBLE, "char": Data.CHAR, "timestamp": Data.TIMESTAMP, "uuid": Data.UUID,
    "binary": Data.BINARY, "string": Data.STRING, "symbol": Data.SYMBOL, "list": Data.LIST, "map": Data.MAP,
    "decimal32": Data.DECIMAL32, "decimal64": Data.DECIMAL64, "decimal128": Data.DECIMAL128,
}  # fmt: skip
ARRAY_NAMES = {code: name for name, code in ARRAY_CODES.items()}
FROM_PROTON_SCALAR: dict[type, Any] = {
    proton.ubyte: UByte, proton.ushort: UShort, proton.uint: UInt, proton.ulong: ULong, proton.byte: Byte,
    proton.short: Short, proton.int32: Int, proton.float32: Float, proton.char: Char,
    proton.timestamp: Timestamp, proton.symbol: Symbol,
    proton.decimal32: lambda v: Decimal32(int(v).to_bytes(4, "big")),
    proton.decimal64: lambda v: Decimal64(int(v).to_bytes(8, "big")),
    proton.decimal128: lambda v: Decimal128(bytes(v)),
}  # fmt: skip


def to_proton(v: Any) -> Any:
    conv = TO_PROTON_SCALAR.get(type(v))
    if conv is not None:
        return conv(v)
    if isinstance(v, list):
        return [to_proton(x) for x in v]
    if isinstance(v, dict):
        return {to_proton(k): to_proton(x) for k, x in v.items()}
    if isinstance(v, Described):
        return proton.Described(to_proton(v.descriptor), to_proton(v.value))
    if isinstance(v, Array):
        descriptor = proton.UNDESCRIBED if v.descriptor is None else to_proton(v.descriptor)
        return proton.Array(descriptor, ARRAY_CODES[v.type], *(to_proton(x) for x in v.items))
    return v  # None, bool, int (long), float (double), str, bytes, uuid.UUID


def from_proton(v: Any) -> Any:
    conv = FROM_PROTON_SCALAR.get(type(v))
    if conv is not None:
        return conv(v)
    if isinstance(v, memoryview | bytearray):
        return bytes(v)
    if isinstance(v, list):
        return [from_proton(x) for x in v]
    if isinstance(v, dict):
        return {from_proton(k): from_proton(x) for k, x in v.items()}
    if isinstance(v, proton.Described):
        return Described(from_proton(v.descriptor), from_proton(v.value))
    if isinstance(v, proton.Array):
        descriptor = None if v.descriptor is proton.UNDESCRIBED else from_proton(v.descriptor)
        return Array(ARRAY_NAMES[v.type], [from_proton(x) for x in v.elements], descriptor=descriptor)
    return v


def proton_decode(data: bytes) -> Any:
    """Proton's decoding, converted to our representation while the Data (which owns binaries) lives."""
    d = Data()
    consumed = d.decode(data)
    assert consumed == len(data)
    d.rewind()
    d.next()
    return from_proton(d.get_object())


def proton_encode(value: Any) -> bytes:
    d = Data()
    d.put_object(value)
    return d.encode()  # type: ignore[no-any-return]


# --- strategies ---------------------------------------------------------------------------------------

I64 = (-(2**63), 2**63 - 1)
symbols = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=40).map(Symbol)
SCALARS: dict[str, st.SearchStrategy[Any]] = {
    "boolean": st.booleans(),
    "ubyte": st.integers(0, 255).map(UByte),
    "ushort": st.integers(0, 2**16 - 1).map(UShort),
    "uint": st.integers(0, 2**32 - 1).map(UInt),
    "ulong": st.integers(0, 2**64 - 1).map(ULong),
    "byte": st.integers(-128, 127).map(Byte),
    "short": st.integers(-(2**15), 2**15 - 1).map(Short),
    "int": st.integers(-(2**31), 2**31 - 1).map(Int),
    "long": st.integers(*I64),
    "float": st.floats(width=32, allow_nan=False).map(Float),
    "double": st.floats(allow_nan=False),
    "decimal32": st.binary(min_size=4, max_size=4).map(Decimal32),
    "decimal64": st.binary(min_size=8, max_size=8).map(Decimal64),
    "decimal128": st.binary(min_size=16, max_size=16).map(Decimal128),
    "char": st.characters(exclude_categories=("Cs",)).map(Char),
    "timestamp": st.integers(*I64).map(Timestamp),
    "uuid": st.uuids(),
    "binary": st.binary(max_size=300),
    "string": st.text(max_size=300),
    "symbol": symbols,
}
scalars = st.none() | st.one_of(*SCALARS.values())
# Not binary keys: Proton's Python binding returns them as (unhashable) memoryviews.
keys = st.one_of(*(SCALARS[k] for k in ("ulong", "long", "string", "symbol", "uuid", "uint")))


@st.composite
def arrays(draw: st.DrawFn) -> Array:
    kind = draw(st.sampled_from(sorted(SCALARS)))
    items = draw(st.lists(SCALARS[kind], max_size=10))
    descriptor = draw(st.none() | symbols.filter(lambda s: not s.startswith("amqp:")))
    return Array(kind, items, descriptor=descriptor)


values = st.recursive(
    scalars | arrays(),
    lambda children: st.one_of(
        st.lists(children, max_size=6),
        st.dictionaries(keys, children, max_size=6),
        # A described value directly inside a described value is legal AMQP (two descriptors), but Proton's
        # Python binding drops the value that follows it: keep the value of a Described undescribed.
        st.builds(
            Described,
            symbols.filter(lambda s: not s.startswith("amqp:")),
            children.filter(lambda c: not isinstance(c, Described)),
        ),
    ),
    max_leaves=25,
)


@given(values)
def test_ours_to_proton(value: Any) -> None:
    encoded = amqp.encode_value(value)
    assert proton_decode(encoded) == value


@given(values)
def test_proton_to_ours(value: Any) -> None:
    encoded = proton_encode(to_proton(value))
    decoded, end = amqp.decode_value(encoded)
    assert end == len(encoded)
    assert decoded == value


def test_proton_encoding_of_scalars_matches_ours() -> None:
    """For scalars Proton also writes the smallest form, so the bytes are identical."""
    scalars = [
        None, True, False, UByte(1), UShort(2), UInt(0), UInt(7), UInt(70000), ULong(0), ULong(9),
        ULong(2**40),
        Byte(-3), Short(-4), Int(5), Int(-70000), 0, -5, 2**40, Float(0.5), 0.25, Char("x"),
        Timestamp(1700000000000), uuid.UUID(int=7), b"bin", "str", Symbol("sym"),
    ]  # fmt: skip
    for value in scalars:
        assert proton_encode(to_proton(value)) == amqp.encode_value(value), value


# --- performatives: Proton's Data sees the same described lists -----------------------------------------


def test_performatives_decode_in_proton() -> None:
    perf = amqp.Attach(
        name="internal.peers.DLx", handle=3, role=amqp.Role.SENDER, snd_settle_mode=0,
        source=amqp.Source(address="internal.peers.DLx"), target=amqp.Target(address="p2p.inbound.DLx"),
        initial_delivery_count=0, max_message_size=10485760,
    )  # fmt: skip
    got = proton_decode(amqp.encode_value(perf))
    assert isinstance(got, Described) and got.descriptor == 0x12
    fields = got.value
    assert fields[:4] == ["internal.peers.DLx", 3, False, 0]
    assert fields[5].value == ["internal.peers.DLx"] and fields[6].value == ["p2p.inbound.DLx"]
    assert fields[9:11] == [0, 10485760]
    assert amqp.decode_value(proton_encode(to_proton(got)))[0] == perf


# --- messages -----------------------------------------------------------------------------------------

app_values = st.one_of(
    st.booleans(), st.integers(*I64), SCALARS["int"], st.text(max_size=50), st.binary(max_size=20),
    SCALARS["double"], SCALARS["ulong"], SCALARS["timestamp"], st.uuids(),
)  # fmt: skip


def cstr(max_size: int) -> st.SearchStrategy[str]:
    """Proton's message properties are C strings: a NUL ends them, so none are generated there."""
    return st.text(st.characters(exclude_characters="\x00", exclude_categories=("Cs",)), max_size=max_size)


messages = st.builds(
    amqp.Message,
    header=st.builds(amqp.Header, durable=st.booleans(), priority=st.integers(0, 255),
                     ttl=st.none() | st.integers(0, 2**32 - 1), first_acquirer=st.booleans(),
                     delivery_count=st.integers(0, 2**32 - 1)),
    properties=st.builds(
        amqp.Properties,
        message_id=st.none() | SCALARS["ulong"] | cstr(30) | st.uuids() | st.binary(max_size=16),
        user_id=st.none() | st.binary(max_size=20), to=st.none() | cstr(30),
        subject=st.none() | cstr(30), reply_to=st.none() | cstr(30),
        correlation_id=st.none() | cstr(30), content_type=st.none() | symbols,
        content_encoding=st.none() | symbols, absolute_expiry_time=st.none() | st.integers(0, 2**50),
        creation_time=st.none() | st.integers(0, 2**50), group_id=st.none() | cstr(10),
        group_sequence=st.none() | st.integers(0, 2**32 - 1), reply_to_group_id=st.none() | cstr(10),
    ),
    message_annotations=st.none() | st.dictionaries(symbols, app_values, max_size=3),
    application_properties=st.dictionaries(cstr(30), app_values, max_size=9),
    body=st.binary(max_size=3000),
)  # fmt: skip


def _ms(seconds: float | None) -> int | None:
    return None if seconds is None or seconds == 0 else round(seconds * 1000)


def _sym(v: str | None) -> str | None:
    """Proton's binding reads an absent content-type as symbol('None'), so '' / 'None' / None are one."""
    return None if v in (None, "", "None") else v


def check_same(ours: amqp.Message, pm: proton.Message) -> None:
    h, p = ours.header, ours.properties
    assert h is not None and p is not None
    assert (pm.durable, pm.priority, pm.first_acquirer, pm.delivery_count) == (
        h.durable, h.priority, h.first_acquirer, h.delivery_count)  # fmt: skip
    assert _ms(pm.ttl) == (h.ttl or None)
    assert from_proton(pm.id) == p.message_id
    assert (bytes(pm.user_id) or None) == (p.user_id or None)
    assert (pm.address, pm.subject, pm.reply_to) == (p.to, p.subject, p.reply_to)
    assert from_proton(pm.correlation_id) == p.correlation_id
    assert (_sym(pm.content_type), _sym(pm.content_encoding)) == (
        _sym(p.content_type),
        _sym(p.content_encoding),
    )
    assert _ms(pm.expiry_time) == (p.absolute_expiry_time or None)
    assert _ms(pm.creation_time) == (p.creation_time or None)
    assert (pm.group_id, pm.reply_to_group_id) == (p.group_id, p.reply_to_group_id)
    assert (pm.group_sequence or None) == (p.group_sequence or None)
    assert from_proton(pm.annotations or None) == (ours.message_annotations or None)
    assert from_proton(pm.properties) == ours.application_properties
    assert bytes(pm.body) == ours.body


@given(messages)
def test_message_ours_to_proton(message: amqp.Message) -> None:
    pm = proton.Message()
    pm.decode(message.encode())
    check_same(message, pm)


@given(messages)
def test_message_proton_to_ours(message: amqp.Message) -> None:
    h, p = message.header, message.properties
    assert h is not None and p is not None
    pm = proton.Message(inferred=True)  # inferred: bytes body as a data section, not amqp-value
    pm.durable, pm.priority, pm.first_acquirer, pm.delivery_count = (
        h.durable, h.priority, h.first_acquirer, h.delivery_count)  # fmt: skip
    if h.ttl:
        pm.ttl = h.ttl / 1000
    pm.id = to_proton(p.message_id)
    pm.user_id = p.user_id or b""
    pm.address, pm.subject, pm.reply_to = p.to, p.subject, p.reply_to
    pm.correlation_id = p.correlation_id
    pm.content_type, pm.content_encoding = p.content_type, p.content_encoding
    if p.absolute_expiry_time:
        pm.expiry_time = p.absolute_expiry_time / 1000
    if p.creation_time:
        pm.creation_time = p.creation_time / 1000
    pm.group_id, pm.reply_to_group_id = p.group_id, p.reply_to_group_id
    if p.group_sequence:
        pm.group_sequence = p.group_sequence
    pm.annotations = to_proton(message.message_annotations)
    pm.properties = to_proton(message.application_properties)
    pm.body = message.body
    ours = amqp.Message.decode(pm.encode())
    check_same(ours, pm)
    assert ours.application_properties == message.application_properties
    assert ours.body == message.body


def test_transfer_frame_payload_decodes_in_proton() -> None:
    """A whole P2P transfer frame: its payload is what Proton's Message decodes."""
    msg = amqp.Message(
        header=amqp.Header(durable=True),
        properties=amqp.Properties(message_id="N-1-2-3", to="p2p.inbound.DLx"),
        application_properties={"platform-topic": "t", "platform-version": Int(4), "send-seq-no": 9},
        body=b"\x00" * 1024,
    )
    transfer = amqp.Transfer(handle=0, delivery_id=0, delivery_tag=b"0")
    frame = amqp.decode_frame(amqp.encode_frame(transfer, 1, msg.encode()))
    pm = proton.Message()
    pm.decode(frame.payload)
    assert pm.durable and pm.id == "N-1-2-3" and pm.address == "p2p.inbound.DLx"
    assert pm.properties == {"platform-topic": "t", "platform-version": 4, "send-seq-no": 9}
    assert type(pm.properties["platform-version"]) is proton.int32
    assert bytes(pm.body) == b"\x00" * 1024
