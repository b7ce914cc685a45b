"""Property tests of the codec: round trips per type, canonical re-encoding, composites, messages, frames.

Properties: ``decode(encode(x)) == x`` with the same Python types; ``encode(decode(b)) == b``
for our (canonical) encodings; a frame stream split at random points decodes to the same frames.
"""

from __future__ import annotations

import itertools
import math
import struct
import uuid
from typing import Any

import attrs
from hypothesis import given
from hypothesis import strategies as st

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

I64 = (-(2**63), 2**63 - 1)
symbols = st.text(st.characters(min_codepoint=0, max_codepoint=127), max_size=300).map(Symbol)
f32 = st.floats(width=32, allow_nan=False).map(Float)

SCALARS: dict[str, st.SearchStrategy[Any]] = {
    "null": st.none(),
    "boolean": st.booleans(),
    "ubyte": st.integers(0, 2**8 - 1).map(UByte),
    "ushort": st.integers(0, 2**16 - 1).map(UShort),
    "uint": st.integers(0, 2**32 - 1).map(UInt),
    "ulong": st.integers(0, 2**64 - 1).map(ULong),
    "byte": st.integers(-(2**7), 2**7 - 1).map(Byte),
    "short": st.integers(-(2**15), 2**15 - 1).map(Short),
    "int": st.integers(-(2**31), 2**31 - 1).map(Int),
    "long": st.integers(*I64),
    "float": f32,
    "double": st.floats(allow_nan=False),
    "decimal32": st.binary(min_size=4, max_size=4).map(Decimal32),
    "decimal64": st.binary(min_size=8, max_size=8).map(Decimal64),
    "decimal128": st.binary(min_size=16, max_size=16).map(Decimal128),
    "char": st.characters().map(Char),
    "timestamp": st.integers(*I64).map(Timestamp),
    "uuid": st.uuids(),
    "binary": st.binary(max_size=300),
    "string": st.text(max_size=300),
    "symbol": symbols,
}
scalars = st.one_of(*SCALARS.values())
hashable = st.one_of(*(SCALARS[k] for k in SCALARS if k not in ("float", "double")))


@st.composite
def arrays(draw: st.DrawFn, elements: st.SearchStrategy[Any] | None = None) -> Array:
    kind = draw(st.sampled_from(sorted(SCALARS)))
    items = draw(st.lists(SCALARS[kind], max_size=20))
    if kind == "null":
        items = [None] * len(items)
    descriptor = draw(st.none() | symbols.filter(lambda s: not s.startswith("amqp:")))
    return Array(kind, items, descriptor=descriptor)


# Numeric descriptors at or above 0x100 are not spec composites, so they stay Described.
descriptors = st.one_of(
    symbols.filter(lambda s: not s.startswith("amqp:")), st.integers(0x100, 2**64 - 1).map(ULong)
)


def _extend(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.lists(children, max_size=8),
        st.dictionaries(hashable, children, max_size=8),
        st.builds(Described, descriptors, children),
        st.lists(children, max_size=4).map(lambda xs: Array("list", [xs] if xs else [])),
        st.dictionaries(st.text(max_size=5), children, max_size=3).map(lambda d: Array("map", [d])),
    )


values = st.recursive(st.one_of(scalars, arrays()), _extend, max_leaves=30)


@given(values)
def test_value_round_trip_and_canonical(value: Any) -> None:
    encoded = amqp.encode_value(value)
    decoded, end = amqp.decode_value(encoded)
    assert end == len(encoded)
    assert decoded == value
    assert type(decoded) is type(value)
    assert amqp.encode_value(decoded) == encoded


@given(st.sampled_from(sorted(SCALARS)), st.data())
def test_each_type_round_trips_with_trailing_data(kind: str, data: st.DataObject) -> None:
    value = data.draw(SCALARS[kind])
    encoded = amqp.encode_value(value)
    trailer = data.draw(st.binary(max_size=8))
    assert amqp.decode_value(encoded + trailer) == (value, len(encoded))


@given(st.integers(0, 2**32 - 1), st.integers(0, 2**64 - 1), st.integers(*I64))
def test_integers_use_the_smallest_form(u32: int, u64: int, i64: int) -> None:
    assert len(amqp.encode_value(UInt(u32))) == (1 if u32 == 0 else 2 if u32 < 256 else 5)
    assert len(amqp.encode_value(ULong(u64))) == (1 if u64 == 0 else 2 if u64 < 256 else 9)
    assert len(amqp.encode_value(i64)) == (2 if -128 <= i64 <= 127 else 9)


@given(st.binary(min_size=4, max_size=4))
def test_float_bits_survive_including_nan(bits: bytes) -> None:
    encoded = b"\x72" + bits
    value, _ = amqp.decode_value(encoded)
    assert isinstance(value, Float)
    if not math.isnan(value):
        assert amqp.encode_value(value) == encoded
    else:  # NaN payloads need not survive Python's float, but NaN-ness does
        assert math.isnan(struct.unpack(">f", amqp.encode_value(value)[1:])[0])


# --- composites ----------------------------------------------------------------------------------------

simple_fields = st.dictionaries(symbols, scalars, max_size=4)
FIELD_STRATEGIES: dict[str, st.SearchStrategy[Any]] = {
    "boolean": st.booleans(),
    "ubyte": st.integers(0, 255),
    "ushort": st.integers(0, 2**16 - 1),
    "uint": st.integers(0, 2**32 - 1),
    "ulong": st.integers(0, 2**64 - 1),
    "timestamp": st.integers(*I64),
    "binary": st.binary(max_size=64),
    "string": st.text(max_size=64),
    "symbol": symbols,
    "symbols": st.lists(symbols, max_size=4).map(tuple),
    "fields": simple_fields,
    "annotations": st.dictionaries(symbols | st.integers(0, 2**64 - 1).map(ULong), scalars, max_size=4),
    "map": st.dictionaries(hashable, scalars, max_size=4),
    "any": scalars,
    "message-id": st.one_of(st.integers(0, 2**64 - 1).map(ULong), st.uuids(), st.binary(max_size=16),
                            st.text(max_size=16)),
}  # fmt: skip


def composite_strategy(cls: type, depth: int = 0) -> st.SearchStrategy[Any]:
    kwargs: dict[str, st.SearchStrategy[Any]] = {}
    for a in attrs.fields(cls):
        kind, allowed = a.metadata["amqp"]
        if kind == "described":
            options = [c for c in allowed if c is not Described]
            strategy = (
                st.one_of(*(composite_strategy(c, depth + 1) for c in options)) if depth < 2 else st.nothing()
            )
        elif kind == "symbols" and a.default is attrs.NOTHING:  # mandatory + multiple: at least one
            strategy = st.lists(symbols, min_size=1, max_size=4).map(tuple)
        else:
            strategy = FIELD_STRATEGIES[kind]
        if a.default is not attrs.NOTHING:
            strategy = st.none() | strategy if a.default is None else st.just(a.default) | strategy
        kwargs[a.name] = strategy
    return st.builds(cls, **kwargs)


COMPOSITES = [*amqp.PERFORMATIVES, *amqp.SASL_FRAMES, *amqp.DELIVERY_STATES, amqp.ErrorCondition, amqp.Source,
              amqp.Target, amqp.Header, amqp.Properties]  # fmt: skip
composites = st.sampled_from(COMPOSITES).flatmap(composite_strategy)


@given(composites)
def test_composite_round_trip_and_canonical(value: Any) -> None:
    encoded = amqp.encode_value(value)
    decoded, end = amqp.decode_value(encoded)
    assert (decoded, end) == (value, len(encoded))
    assert amqp.encode_value(decoded) == encoded


# --- messages and frames -------------------------------------------------------------------------------

bodies = st.one_of(
    st.none(),
    st.binary(max_size=2000),
    st.lists(st.binary(max_size=50), min_size=2, max_size=4).map(tuple),
    values.map(amqp.AmqpValue),
    st.lists(scalars, max_size=5).map(amqp.AmqpSequence),
    st.lists(st.lists(scalars, max_size=3).map(amqp.AmqpSequence), min_size=2, max_size=3).map(tuple),
)
messages = st.builds(
    amqp.Message,
    header=st.none() | composite_strategy(amqp.Header),
    delivery_annotations=st.none() | FIELD_STRATEGIES["annotations"],
    message_annotations=st.none() | FIELD_STRATEGIES["annotations"],
    properties=st.none() | composite_strategy(amqp.Properties),
    application_properties=st.none() | st.dictionaries(st.text(max_size=20), scalars, max_size=10),
    body=bodies,
    footer=st.none() | FIELD_STRATEGIES["annotations"],
)


@given(messages)
def test_message_round_trip_and_canonical(message: amqp.Message) -> None:
    encoded = message.encode()
    decoded = amqp.Message.decode(encoded)
    assert decoded == message
    assert decoded.encode() == encoded
    assert b"".join(message.encode_parts()) == encoded


frame_lists = st.lists(
    st.one_of(
        st.tuples(st.sampled_from([*amqp.PERFORMATIVES]).flatmap(composite_strategy), st.integers(0, 65535)),
        st.tuples(st.sampled_from([*amqp.SASL_FRAMES]).flatmap(composite_strategy), st.just(0)),
        st.tuples(st.none(), st.integers(0, 65535)),
    ),
    min_size=1,
    max_size=6,
)


@given(frame_lists, st.lists(st.integers(0, 10_000), max_size=8))
def test_frame_stream_split_anywhere_gives_the_same_frames(frames: list[Any], cuts: list[int]) -> None:
    stream = b"".join(
        amqp.encode_empty_frame(ch) if p is None else amqp.encode_frame(p, ch) for p, ch in frames
    )
    points = sorted({0, len(stream), *(c % (len(stream) + 1) for c in cuts)})
    buf = amqp.FrameBuffer()
    got = []
    for a, b in itertools.pairwise(points):
        buf.feed(stream[a:b])
        got += buf.frames()
    assert [(f.performative, f.channel) for f in got] == [(p, ch) for p, ch in frames]
    assert buf.buffered_bytes == 0


@given(st.uuids())
def test_uuid_is_sixteen_raw_bytes(u: uuid.UUID) -> None:
    assert amqp.encode_value(u) == b"\x98" + u.bytes
