"""Value codec: golden encodings of every type and encoding (spec part 1.6), both ways, and bad input."""

from __future__ import annotations

import uuid

import pytest

from corda_trio import amqp
from corda_trio.amqp import (
    Array,
    Byte,
    Char,
    Decimal32,
    Decimal64,
    Decimal128,
    DecodeError,
    Described,
    EncodeError,
    Float,
    Int,
    Long,
    Short,
    Symbol,
    Timestamp,
    UByte,
    UInt,
    ULong,
    UShort,
)

U = uuid.UUID("00112233-4455-6677-8899-aabbccddeeff")

# (value, canonical hex): encode gives exactly these bytes, and decode gives the value back.
CANONICAL = [
    (None, "40"),
    (True, "41"),
    (False, "42"),
    (UByte(7), "5007"),
    (UShort(0x1234), "601234"),
    (UInt(0), "43"),
    (UInt(255), "52ff"),
    (UInt(256), "7000000100"),
    (ULong(0), "44"),
    (ULong(1), "5301"),
    (ULong(2**64 - 1), "80ffffffffffffffff"),
    (Byte(-1), "51ff"),
    (Short(-2), "61fffe"),
    (Int(-128), "5480"),
    (Int(128), "7100000080"),
    (0, "5500"),
    (-128, "5580"),
    (127, "557f"),
    (128, "810000000000000080"),
    (-(2**63), "818000000000000000"),
    (Float(1.5), "723fc00000"),
    (1.5, "823ff8000000000000"),
    (Decimal32(b"\x22\x50\x00\x01"), "7422500001"),
    (Decimal64(b"\x01" * 8), "840101010101010101"),
    (Decimal128(b"\x02" * 16), "9402020202020202020202020202020202"),
    (Char("€"), "73000020ac"),
    (Timestamp(1311704463521), "830000013167adb8a1"),
    (U, "9800112233445566778899aabbccddeeff"),
    (b"", "a000"),
    (b"\x01\x02", "a0020102"),
    (b"x" * 256, "b000000100" + "78" * 256),
    ("", "a100"),
    ("héllo", "a106" + "héllo".encode().hex()),
    ("y" * 300, "b10000012c" + "79" * 300),
    (Symbol("PLAIN"), "a305504c41494e"),
    (Symbol("s" * 256), "b300000100" + "73" * 256),
    ([], "45"),
    ([None, True], "c003024041"),
    ([0] * 100, "c0c964" + "5500" * 100),
    ({}, "c10100"),
    ({Symbol("a"): 1}, "c10602a30161" + "5501"),
    (Array("symbol", [Symbol("ANONYMOUS")]), "e00c01a309414e4f4e594d4f5553"),
    (Array("uint", [UInt(1), UInt(300)]), "e00a0270000000010000012c"),
    (Array("uint", [UInt(1), UInt(2)]), "e00402520102"),
    (Array("boolean", [True, False]), "e00402560100"),
    (Array("long", []), "e0020055"),
    (Array("ulong", [ULong(1)], descriptor=Symbol("d")), "e0070100a301645301"),
    (Described(Symbol("x:y"), "v"), "00a303783a79a10176"),
    (Described(ULong(0x1234), None), "00800000000000001234" + "40"),
]


@pytest.mark.parametrize(("value", "hexed"), CANONICAL, ids=[h[:24] for _, h in CANONICAL])
def test_encode_canonical(value: object, hexed: str) -> None:
    assert amqp.encode_value(value).hex() == hexed


@pytest.mark.parametrize(("value", "hexed"), CANONICAL, ids=[h[:24] for _, h in CANONICAL])
def test_decode_canonical_whole_bytewise_trailing(value: object, hexed: str) -> None:
    data = bytes.fromhex(hexed)
    decoded, end = amqp.decode_value(data)
    assert end == len(data)
    assert decoded == value
    assert type(decoded) is type(value)
    # trailing bytes are left alone
    decoded2, end2 = amqp.decode_value(data + b"\x40\x41garbage")
    assert (decoded2, end2) == (decoded, len(data))
    # at an offset, from a memoryview and a bytearray
    assert amqp.decode_value(memoryview(b"\xff\xff" + data), 2) == (decoded, len(data) + 2)
    assert amqp.decode_value(bytearray(data))[0] == value
    # every proper prefix is truncated, never a wrong value
    for cut in range(len(data)):
        with pytest.raises(DecodeError):
            amqp.decode_value(data[:cut])


# Non-canonical encodings every decoder must accept (peers use them).
NON_CANONICAL = [
    ("5600", False),
    ("5601", True),
    ("7000000000", UInt(0)),
    ("5200", UInt(0)),
    ("800000000000000001", ULong(1)),
    ("7100000001", Int(1)),
    ("810000000000000001", 1),
    ("b000000000", b""),
    ("b100000001" + "61", "a"),
    ("b300000001" + "61", Symbol("a")),
    ("c00100", []),
    ("d00000000400000000", []),
    ("d0000000060000000241" + "42", [True, False]),
    ("d1000000040000000" + "0", {}),
    ("f00000000c0000000152000000000000000000000001", None),  # placeholder replaced below
]
NON_CANONICAL[-1] = ("f000000009000000017000000005", Array("uint", [UInt(5)]))


@pytest.mark.parametrize(("hexed", "value"), NON_CANONICAL)
def test_decode_non_canonical(hexed: str, value: object) -> None:
    data = bytes.fromhex(hexed)
    assert amqp.decode_value(data) == (value, len(data))


def test_long_class_decodes_as_plain_int() -> None:
    assert amqp.encode_value(Long(5)) == amqp.encode_value(5)
    assert type(amqp.decode_value(amqp.encode_value(Long(5)))[0]) is int


def test_nested_compounds_round_trip() -> None:
    value = {
        "list": [1, "two", Symbol("three"), [UInt(4), {Symbol("k"): None}], Array("string", ["a", "b"])],
        Symbol("arr"): Array("list", [[1, 2], [], ["x"]]),
        ULong(9): Array("map", [{"a": 1}, {}]),
        "arrays": Array("array", [Array("int", [Int(1)]), Array("int", [])]),
        "described": Described(Symbol("amqp:x"), [1, 2]),
        "big": ["z" * 100] * 5,
    }
    encoded = amqp.encode_value(value)
    assert amqp.decode_value(encoded) == (value, len(encoded))
    assert amqp.encode_value(amqp.decode_value(encoded)[0]) == encoded


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (object(), EncodeError),
        ("\ud800", EncodeError),
        (2**64, EncodeError),
        (-(2**63) - 1, EncodeError),
        (Array("symbol", ["é"]), EncodeError),
        (Array("uint", [-1]), EncodeError),
        (Array("string", [1]), EncodeError),
    ],
)
def test_encode_errors(value: object, error: type[Exception]) -> None:
    with pytest.raises(error):
        amqp.encode_value(value)


@pytest.mark.parametrize(
    ("cls", "bad"),
    [(UByte, 256), (UByte, -1), (UShort, 65536), (UInt, 2**32), (ULong, -1), (Byte, 128), (Short, -32769),
     (Int, 2**31), (Long, 2**63), (Float, 1e39)],
)  # fmt: skip
def test_wrappers_are_range_checked(cls: type, bad: object) -> None:
    with pytest.raises(ValueError):
        cls(bad)


def test_wrappers_compare_equal_to_plain_values() -> None:
    assert UInt(5) == 5 and hash(UInt(5)) == hash(5)
    assert Symbol("a") == "a"
    assert repr(UInt(5)) == "UInt(5)"
    with pytest.raises(ValueError):
        Symbol("é")
    with pytest.raises(ValueError):
        Char("ab")
    with pytest.raises(ValueError):
        Decimal32(b"123")


# Malformed input: (hex, condition) -> DecodeError with that condition.
NEGATIVE = [
    ("", "amqp:decode-error"),  # empty
    ("ff", "amqp:decode-error"),  # unknown constructor
    ("01", "amqp:decode-error"),
    ("5602", "amqp:decode-error"),  # boolean byte not 0/1
    ("a005616263", "amqp:decode-error"),  # binary runs past the end
    ("b0ffffffff00", "amqp:decode-error"),  # 4 GiB binary declared in 6 bytes: no allocation
    ("d0fffffff0ffffffff", "amqp:decode-error"),  # 4 GiB list
    ("c0050340404040", "amqp:decode-error"),  # list size larger than its elements... and count mismatch
    ("c00202404040", "amqp:decode-error"),  # count 2 cannot fit in 1 byte
    ("c10301a100", "amqp:decode-error"),  # odd map count
    ("c1050241014102", "amqp:decode-error"),  # duplicate key / bad
    ("c10602c0010040", "amqp:decode-error"),  # unhashable (list) map key
    ("a102c328", "amqp:decode-error"),  # invalid UTF-8
    ("a301ff", "amqp:decode-error"),  # non-ASCII symbol
    ("7300110000", "amqp:decode-error"),  # char beyond U+10FFFF
    ("e0020199", "amqp:decode-error"),  # array of an invalid constructor
    ("f00000000500ffffff40", "amqp:resource-limit-exceeded"),  # 16M zero-width elements
    ("f000000005ffffffff70", "amqp:decode-error"),  # 4G uint elements in 1 byte
    ("c000", "amqp:decode-error"),  # list8 size 0 (must count the count byte)
    ("000040", "amqp:decode-error"),  # described descriptor is described
]


@pytest.mark.parametrize(("hexed", "condition"), NEGATIVE)
def test_decode_negative(hexed: str, condition: str) -> None:
    data = bytes.fromhex(hexed)
    with pytest.raises(DecodeError) as info:
        amqp.decode_value(data)
    assert info.value.condition == condition
    assert 0 <= info.value.offset <= len(data)


def test_deep_nesting_is_a_decode_error() -> None:
    data = b"\xe0\x00\x01" * 0  # arrays cannot nest unboundedly without size; use lists of lists
    depth = 5000
    data = b"".join(bytes((0xD0,)) + (4 + 9 * (depth - i - 1) + 1).to_bytes(4, "big") + b"\x00\x00\x00\x01"
                    for i in range(depth)) + b"\x40"  # fmt: skip
    with pytest.raises(DecodeError):
        amqp.decode_value(data)


def test_public_surface_resolves() -> None:
    """Every name in ``amqp.__all__`` and ``amqp.codec.__all__`` exists (trio's test_exports habit); the wire
    internals live in ``amqp.codec`` and stay importable from ``amqp`` too."""
    for name in amqp.__all__:
        assert getattr(amqp, name) is not None, name
    for name in amqp.codec.__all__:
        assert getattr(amqp.codec, name) is getattr(amqp, name, getattr(amqp.codec, name)), name
    main_names = {
        "encode_value", "decode_value", "Message", "DecodeError", "FramingError", "AmqpError", "Condition",
        "Symbol", "Array", "Described", "Open", "Transfer", "SaslOutcome", "Accepted", "Source", "Target",
        "ErrorCondition", "codec",
    }  # fmt: skip
    assert main_names <= set(amqp.__all__)
    wire_names = {"Frame", "FrameBuffer", "encode_frame", "decode_frame", "encode_empty_frame"}
    wire_names.add("PERFORMATIVES")
    assert wire_names <= set(amqp.codec.__all__)
    assert not wire_names & set(amqp.__all__)
    for name in wire_names:  # compatibility: still importable from the package
        assert getattr(amqp, name) is getattr(amqp.codec, name)


def test_memoised_map_entries_stay_correct() -> None:
    """Recurring small map entries are memoised by their bytes; that never changes what decodes or fails."""
    from corda_trio.amqp import _decode

    props = {"platform-topic": "platform.session", "platform-version": Int(13), "send-seq-no": 7, "k": "é"}
    data = amqp.encode_value(props)
    for _ in range(3):  # miss, then hits
        value, end = amqp.decode_value(data)
        assert (value, end) == (props, len(data))
        assert type(value["platform-version"]) is Int and type(value["send-seq-no"]) is int
    for cut in range(1, len(data)):  # a memoised entry cut short is still a DecodeError
        with pytest.raises(DecodeError):
            amqp.decode_value(data[:cut])
    bad = bytearray(data)
    bad[-1] = 0xFF  # the last string is no longer UTF-8
    with pytest.raises(DecodeError):
        amqp.decode_value(bytes(bad))
    for i in range(_decode._ENTRIES_MAX + 10):  # one-off entries fill the memo: it starts afresh, bounded
        amqp.decode_value(amqp.encode_value({"_AMQ_DUPL_ID": f"N-{i}"}))
    assert len(_decode._ENTRIES) <= _decode._ENTRIES_MAX
    assert amqp.decode_value(data) == (props, len(data))


def test_memoised_entries_in_another_order_or_another_map() -> None:
    """The per-place memo sees other maps and reordered entries: it must only ever match equal bytes."""
    first = {"a": "1", "b": "2", "c": Int(3)}
    reordered = {"c": Int(3), "a": "1", "b": "2"}
    changed = {"a": "1", "b": "X", "c": Int(4)}
    for value in (first, reordered, changed, first, {"a": "1"}, {}, first):
        data = amqp.encode_value(value)
        decoded, _ = amqp.decode_value(data)
        assert decoded == value and list(decoded) == list(value)
        assert amqp.encode_value(decoded) == data
    nested = {"a": "1", "m": {"a": "1", "b": "2"}}  # the inner map shares places with the outer one
    assert amqp.decode_value(amqp.encode_value(nested))[0] == nested
