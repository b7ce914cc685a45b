"""Encoding of AMQP 1.0 values (spec part 1.6): always the smallest form a value fits.

Theory of operation
-------------------
``encode_value`` dispatches on the exact Python type through one dict (``_ENCODERS``); a miss falls back to
walking the MRO, so subclasses (``IntEnum`` members, ``str`` subclasses) still encode as their base. Each
encoder returns a ``bytes`` object: small constant encodings (null, booleans, small integers, string and
binary headers) are precomputed, the rest use precompiled :class:`struct.Struct` objects, and compounds are
built with one ``b"".join``. Composite classes (performatives, sections, delivery states...) register their
own generated encoders here (see ``_composite.py``), so ``encode_value(Open(...))`` works.

"Smallest form" rules: ``uint``/``ulong`` zero use ``uint0``/``ulong0``, below 256 the ``small`` forms;
``int``/``long`` in [-128, 127] the ``small`` forms; booleans ``true``/``false``; empty list ``list0``;
variable-width values (binary, string, symbol, list, map, array) the 8-bit-size form when it fits.
Arrays use, for the whole array, the smallest constructor that fits *every* element, but never a
zero-width constructor other than ``null`` (``0x41``/``0x42``/``0x43``/``0x44`` carry no per-element
data and several peers reject them inside arrays): boolean arrays use ``0x56``.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable
from typing import Any, Final

from ._errors import EncodeError
from ._types import (
    Array,
    Byte,
    Char,
    Decimal32,
    Decimal64,
    Decimal128,
    Described,
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

__all__ = ["encode_value"]

NULL: Final = b"\x40"
TRUE: Final = b"\x41"
FALSE: Final = b"\x42"
LIST0: Final = b"\x45"

_S_B: Final = struct.Struct(">BB")
_S_b: Final = struct.Struct(">Bb")
_S_H: Final = struct.Struct(">BH")
_S_h: Final = struct.Struct(">Bh")
_S_I: Final = struct.Struct(">BI")
_S_i: Final = struct.Struct(">Bi")
_S_Q: Final = struct.Struct(">BQ")
_S_q: Final = struct.Struct(">Bq")
_S_f: Final = struct.Struct(">Bf")
_S_d: Final = struct.Struct(">Bd")
_S_II: Final = struct.Struct(">BII")
_S_BB: Final = struct.Struct(">BBB")

# Precomputed small encodings.
_SMALLUINT: Final = [b"\x43", *(bytes((0x52, i)) for i in range(1, 256))]
_SMALLULONG: Final = [b"\x44", *(bytes((0x53, i)) for i in range(1, 256))]
_SMALLLONG: Final = [bytes((0x55, i & 0xFF)) for i in range(-128, 128)]
_SMALLINT: Final = [bytes((0x54, i & 0xFF)) for i in range(-128, 128)]
_UBYTE: Final = [bytes((0x50, i)) for i in range(256)]
_STR8: Final = [bytes((0xA1, i)) for i in range(256)]
_SYM8: Final = [bytes((0xA3, i)) for i in range(256)]
_BIN8: Final = [bytes((0xA0, i)) for i in range(256)]


def _range_error(kind: str, v: Any) -> EncodeError:
    return EncodeError(f"{kind} out of range: {v!r}")


def enc_null(v: Any) -> bytes:
    return NULL


def enc_bool(v: Any) -> bytes:
    return TRUE if v else FALSE


def enc_ubyte(v: int) -> bytes:
    if 0 <= v <= 0xFF:
        return _UBYTE[v]
    raise _range_error("ubyte", v)


def enc_ushort(v: int) -> bytes:
    if 0 <= v <= 0xFFFF:
        return _S_H.pack(0x60, v)
    raise _range_error("ushort", v)


def enc_uint(v: int) -> bytes:
    if 0 <= v < 256:
        return _SMALLUINT[v]
    if 0 <= v <= 0xFFFF_FFFF:
        return _S_I.pack(0x70, v)
    raise _range_error("uint", v)


def enc_ulong(v: int) -> bytes:
    if 0 <= v < 256:
        return _SMALLULONG[v]
    if 0 <= v <= 0xFFFF_FFFF_FFFF_FFFF:
        return _S_Q.pack(0x80, v)
    raise _range_error("ulong", v)


def enc_byte(v: int) -> bytes:
    if -0x80 <= v <= 0x7F:
        return _S_b.pack(0x51, v)
    raise _range_error("byte", v)


def enc_short(v: int) -> bytes:
    if -0x8000 <= v <= 0x7FFF:
        return _S_h.pack(0x61, v)
    raise _range_error("short", v)


def enc_int(v: int) -> bytes:
    if -128 <= v <= 127:
        return _SMALLINT[v + 128]
    if -0x8000_0000 <= v <= 0x7FFF_FFFF:
        return _S_i.pack(0x71, v)
    raise _range_error("int", v)


def enc_long(v: int) -> bytes:
    if -128 <= v <= 127:
        return _SMALLLONG[v + 128]
    if -0x8000_0000_0000_0000 <= v <= 0x7FFF_FFFF_FFFF_FFFF:
        return _S_q.pack(0x81, v)
    raise _range_error("long", v)


def enc_float(v: float) -> bytes:
    try:
        return _S_f.pack(0x72, v)
    except (OverflowError, struct.error):
        raise _range_error("float", v) from None


def enc_double(v: float) -> bytes:
    return _S_d.pack(0x82, v)


def enc_decimal32(v: bytes) -> bytes:
    return b"\x74" + v


def enc_decimal64(v: bytes) -> bytes:
    return b"\x84" + v


def enc_decimal128(v: bytes) -> bytes:
    return b"\x94" + v


def enc_char(v: str) -> bytes:
    if len(v) != 1:
        raise EncodeError(f"char needs exactly one character: {v!r}")
    return _S_I.pack(0x73, ord(v))


def enc_timestamp(v: int) -> bytes:
    if -0x8000_0000_0000_0000 <= v <= 0x7FFF_FFFF_FFFF_FFFF:
        return _S_q.pack(0x83, v)
    raise _range_error("timestamp", v)


def enc_uuid(v: uuid.UUID) -> bytes:
    return b"\x98" + v.bytes


def enc_binary(v: bytes) -> bytes:
    n = len(v)
    if n < 256:
        return _BIN8[n] + v
    if n <= 0xFFFF_FFFF:
        return _S_I.pack(0xB0, n) + v
    raise _range_error("binary length", n)


def enc_string(v: str) -> bytes:
    try:
        b = v.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise EncodeError(f"string is not valid Unicode (lone surrogate?): {exc}") from None
    n = len(b)
    if n < 256:
        return _STR8[n] + b
    if n <= 0xFFFF_FFFF:
        return _S_I.pack(0xB1, n) + b
    raise _range_error("string length", n)


def enc_symbol(v: str) -> bytes:
    try:
        b = v.encode("ascii")
    except UnicodeEncodeError:
        raise EncodeError(f"symbol must be ASCII: {v!r}") from None
    n = len(b)
    if n < 256:
        return _SYM8[n] + b
    if n <= 0xFFFF_FFFF:
        return _S_I.pack(0xB3, n) + b
    raise _range_error("symbol length", n)


def _compound(code8: int, code32: int, count: int, body: bytes) -> bytes:
    n = len(body)
    if n < 255 and count < 256:
        return _S_BB.pack(code8, n + 1, count) + body
    if n <= 0xFFFF_FFFB and count <= 0xFFFF_FFFF:
        return _S_II.pack(code32, n + 4, count) + body
    raise _range_error("compound size", n)


def enc_list(v: Any) -> bytes:
    if not v:
        return LIST0
    return _compound(0xC0, 0xD0, len(v), b"".join([encode_value(x) for x in v]))


def enc_map(v: dict[Any, Any]) -> bytes:
    parts: list[bytes] = []
    append = parts.append
    for k, x in v.items():
        append(encode_value(k))
        append(encode_value(x))
    return _compound(0xC1, 0xD1, 2 * len(v), b"".join(parts))


def enc_described(v: Described) -> bytes:
    return b"\x00" + encode_value(v.descriptor) + encode_value(v.value)


# --- arrays -------------------------------------------------------------------------------------------
# For each element type: a function items -> (constructor byte, payload). The payload is every element's
# encoding without its constructor, all written with that one constructor.


def _fixed(code: int, fmt: str) -> Callable[[tuple[Any, ...]], tuple[int, bytes]]:
    def array_payload(items: tuple[Any, ...]) -> tuple[int, bytes]:
        try:
            return code, struct.pack(f">{len(items)}{fmt}", *items)
        except (struct.error, OverflowError) as exc:
            raise EncodeError(f"array element out of range for constructor 0x{code:02x}: {exc}") from None

    return array_payload


def _small_or(
    code8: int, fmt8: str, code: int, fmt: str, lo: int, hi: int
) -> Callable[..., tuple[int, bytes]]:
    small, wide = _fixed(code8, fmt8), _fixed(code, fmt)

    def array_payload(items: tuple[Any, ...]) -> tuple[int, bytes]:
        if all(lo <= x <= hi for x in items):
            return small(items)
        return wide(items)

    return array_payload


def _variable(code8: int, code32: int, to_bytes: Callable[[Any], bytes]) -> Callable[..., tuple[int, bytes]]:
    def array_payload(items: tuple[Any, ...]) -> tuple[int, bytes]:
        raw = [to_bytes(x) for x in items]
        if all(len(b) < 256 for b in raw):
            return code8, b"".join(bytes((len(b),)) + b for b in raw)
        return code32, b"".join(struct.pack(">I", len(b)) + b for b in raw)

    return array_payload


def _as_binary(x: Any) -> bytes:
    if not isinstance(x, bytes | bytearray | memoryview):
        raise EncodeError(f"binary array element must be bytes: {x!r}")
    return bytes(x)


def _as_utf8(x: Any) -> bytes:
    if not isinstance(x, str):
        raise EncodeError(f"string array element must be str: {x!r}")
    try:
        return x.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise EncodeError(f"string is not valid Unicode: {exc}") from None


def _as_ascii(x: Any) -> bytes:
    if not isinstance(x, str):
        raise EncodeError(f"symbol array element must be str: {x!r}")
    try:
        return x.encode("ascii")
    except UnicodeEncodeError:
        raise EncodeError(f"symbol must be ASCII: {x!r}") from None


def _compound_elements(kind: str) -> Callable[..., tuple[int, bytes]]:
    """Lists, maps and arrays as array elements: all 8-bit-size forms if every element fits, else 32."""

    def parts_of(x: Any) -> tuple[int, bytes]:
        if kind == "list":
            if not isinstance(x, list | tuple):
                raise EncodeError(f"list array element must be a list: {x!r}")
            return len(x), b"".join([encode_value(e) for e in x])
        if kind == "map":
            if not isinstance(x, dict):
                raise EncodeError(f"map array element must be a dict: {x!r}")
            return 2 * len(x), b"".join([encode_value(k) + encode_value(e) for k, e in x.items()])
        if not isinstance(x, Array):
            raise EncodeError(f"array array element must be an Array: {x!r}")
        head, payload = _array_parts(x)
        return len(x.items), head + payload

    code8, code32 = {"list": (0xC0, 0xD0), "map": (0xC1, 0xD1), "array": (0xE0, 0xF0)}[kind]

    def array_payload(items: tuple[Any, ...]) -> tuple[int, bytes]:
        raw = [parts_of(x) for x in items]
        if all(len(b) < 255 and c < 256 for c, b in raw):
            return code8, b"".join(bytes((len(b) + 1, c)) + b for c, b in raw)
        return code32, b"".join(struct.pack(">II", len(b) + 4, c) + b for c, b in raw)

    return array_payload


def _bools(items: tuple[Any, ...]) -> tuple[int, bytes]:
    return 0x56, bytes(1 if x else 0 for x in items)


def _nulls(items: tuple[Any, ...]) -> tuple[int, bytes]:
    if any(x is not None for x in items):
        raise EncodeError("null array elements must be None")
    return 0x40, b""


def _chars(items: tuple[Any, ...]) -> tuple[int, bytes]:
    if any(not isinstance(x, str) or len(x) != 1 for x in items):
        raise EncodeError("char array elements must be one-character strings")
    return 0x73, struct.pack(f">{len(items)}I", *(ord(x) for x in items))


def _fixed_bytes(code: int, size: int) -> Callable[..., tuple[int, bytes]]:
    def array_payload(items: tuple[Any, ...]) -> tuple[int, bytes]:
        for x in items:
            if not isinstance(x, bytes) or len(x) != size:
                raise EncodeError(f"array element needs exactly {size} bytes: {x!r}")
        return code, b"".join(items)

    return array_payload


def _uuids(items: tuple[Any, ...]) -> tuple[int, bytes]:
    if any(not isinstance(x, uuid.UUID) for x in items):
        raise EncodeError("uuid array elements must be uuid.UUID")
    return 0x98, b"".join(x.bytes for x in items)


_ARRAY_PAYLOAD: Final[dict[str, Callable[[tuple[Any, ...]], tuple[int, bytes]]]] = {
    "null": _nulls,
    "boolean": _bools,
    "ubyte": _fixed(0x50, "B"),
    "ushort": _fixed(0x60, "H"),
    "uint": _small_or(0x52, "B", 0x70, "I", 0, 255),
    "ulong": _small_or(0x53, "B", 0x80, "Q", 0, 255),
    "byte": _fixed(0x51, "b"),
    "short": _fixed(0x61, "h"),
    "int": _small_or(0x54, "b", 0x71, "i", -128, 127),
    "long": _small_or(0x55, "b", 0x81, "q", -128, 127),
    "float": _fixed(0x72, "f"),
    "double": _fixed(0x82, "d"),
    "decimal32": _fixed_bytes(0x74, 4),
    "decimal64": _fixed_bytes(0x84, 8),
    "decimal128": _fixed_bytes(0x94, 16),
    "char": _chars,
    "timestamp": _fixed(0x83, "q"),
    "uuid": _uuids,
    "binary": _variable(0xA0, 0xB0, _as_binary),
    "string": _variable(0xA1, 0xB1, _as_utf8),
    "symbol": _variable(0xA3, 0xB3, _as_ascii),
    "list": _compound_elements("list"),
    "map": _compound_elements("map"),
    "array": _compound_elements("array"),
}


def _array_parts(v: Array) -> tuple[bytes, bytes]:
    """(element constructor incl. descriptor, payload) of an array."""
    items = v.items
    if v.type in ("boolean", "ubyte", "ushort", "uint", "ulong", "byte", "short", "int", "long", "timestamp"):
        for x in items:
            if not isinstance(x, int):
                raise EncodeError(f"{v.type} array element must be an int: {x!r}")
    elif v.type in ("float", "double"):
        for x in items:
            if not isinstance(x, int | float) or isinstance(x, bool):
                raise EncodeError(f"{v.type} array element must be a float: {x!r}")
    code, payload = _ARRAY_PAYLOAD[v.type](items)
    if v.descriptor is None:
        return bytes((code,)), payload
    return b"\x00" + encode_value(v.descriptor) + bytes((code,)), payload


def enc_array(v: Array) -> bytes:
    head, payload = _array_parts(v)
    count = len(v.items)
    n = len(head) + len(payload)
    if n < 255 and count < 256:
        return _S_BB.pack(0xE0, n + 1, count) + head + payload
    if n <= 0xFFFF_FFFB and count <= 0xFFFF_FFFF:
        return _S_II.pack(0xF0, n + 4, count) + head + payload
    raise _range_error("array size", n)


_ENCODERS: Final[dict[type, Callable[[Any], bytes]]] = {
    type(None): enc_null,
    bool: enc_bool,
    int: enc_long,
    float: enc_double,
    str: enc_string,
    bytes: enc_binary,
    bytearray: lambda v: enc_binary(bytes(v)),
    memoryview: lambda v: enc_binary(bytes(v)),
    list: enc_list,
    tuple: enc_list,
    dict: enc_map,
    uuid.UUID: enc_uuid,
    UByte: enc_ubyte,
    UShort: enc_ushort,
    UInt: enc_uint,
    ULong: enc_ulong,
    Byte: enc_byte,
    Short: enc_short,
    Int: enc_int,
    Long: enc_long,
    Float: enc_float,
    Timestamp: enc_timestamp,
    Char: enc_char,
    Symbol: enc_symbol,
    Decimal32: enc_decimal32,
    Decimal64: enc_decimal64,
    Decimal128: enc_decimal128,
    Array: enc_array,
    Described: enc_described,
}


def register_encoder(cls: type, encoder: Callable[[Any], bytes]) -> None:
    """Let ``encode_value`` encode instances of ``cls`` (used by the composite classes)."""
    _ENCODERS[cls] = encoder


def encode_value(value: Any) -> bytes:
    """Encode one Python value as an AMQP 1.0 value in its smallest form.

    Args:
        value: see the type mapping in :mod:`corda_trio.amqp._types`; composites (``Open``, ``Source``...)
            are accepted too.

    Returns:
        The encoded bytes (constructor included).

    Raises:
        EncodeError: the value has no AMQP encoding (unknown type, out of range, non-ASCII symbol...). This is
            a bug in the caller, never a peer's fault.
    """
    enc = _ENCODERS.get(type(value))
    if enc is None:
        enc = _lookup_subclass(value)
    return enc(value)


def _lookup_subclass(value: Any) -> Callable[[Any], bytes]:
    for base in type(value).__mro__[1:]:
        enc = _ENCODERS.get(base)
        if enc is not None:
            return enc
    raise EncodeError(f"no AMQP encoding for {type(value).__name__}: {value!r}")
