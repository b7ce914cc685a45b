"""Python representations of the AMQP 1.0 primitive types (spec part 1.6) that Python lacks.

Mapping (encode direction; decoding returns the same types, so that re-encoding a decoded value is canonical):

=====================  =======================================================================
AMQP type              Python value
=====================  =======================================================================
null                   ``None``
boolean                ``bool``
ubyte/ushort/uint/     :class:`UByte` / :class:`UShort` / :class:`UInt` / :class:`ULong` (``int`` subclasses)
ulong
byte/short/int         :class:`Byte` / :class:`Short` / :class:`Int` (``int`` subclasses)
long                   plain ``int`` (also :class:`Long`, which decodes back as plain ``int``)
float / double         :class:`Float` (``float`` subclass, 32-bit) / plain ``float``
decimal32/64/128       :class:`Decimal32` / :class:`Decimal64` / :class:`Decimal128` (the exact IEEE bytes)
char                   :class:`Char` (``str`` of one code point)
timestamp              :class:`Timestamp` (``int``: milliseconds since the Unix epoch)
uuid                   ``uuid.UUID``
binary                 ``bytes`` (``bytearray`` / ``memoryview`` are accepted when encoding)
string                 plain ``str``
symbol                 :class:`Symbol` (``str`` subclass, ASCII only)
list                   ``list`` (``tuple`` is accepted when encoding)
map                    ``dict``
array                  :class:`Array`
described              :class:`Described`, or a composite class (``Open``, ``Source``, ...) when the
                       descriptor is one the codec knows
=====================  =======================================================================

The integer wrappers compare and hash equal to the plain ``int`` of the same value, so ``UInt(5) == 5``;
their constructors check the range (``ValueError`` when out of range, ``TypeError`` for a non-integer).
"""

from __future__ import annotations

import struct
from typing import Any, Final

import attrs

__all__ = [
    "Array",
    "Byte",
    "Char",
    "Decimal32",
    "Decimal64",
    "Decimal128",
    "Described",
    "Float",
    "Int",
    "Long",
    "Short",
    "Symbol",
    "Timestamp",
    "UByte",
    "UInt",
    "ULong",
    "UShort",
]


class _RangedInt(int):
    """Base of the fixed-width integer wrappers: range-checked on construction, repr shows the type."""

    __slots__ = ()
    MIN: int = 0
    MAX: int = 0

    def __new__(cls, value: Any = 0) -> Any:
        if isinstance(value, float) or isinstance(value, str | bytes):
            raise TypeError(f"{cls.__name__} needs an integer, not {type(value).__name__}")
        self = int.__new__(cls, value)
        if not cls.MIN <= self <= cls.MAX:
            raise ValueError(f"{cls.__name__} out of range [{cls.MIN}, {cls.MAX}]: {int(value)}")
        return self

    def __repr__(self) -> str:
        return f"{type(self).__name__}({int(self)})"

    __str__ = __repr__

    def __reduce__(self) -> Any:
        return (type(self), (int(self),))


class UByte(_RangedInt):
    """AMQP ubyte: 8-bit unsigned integer."""

    __slots__ = ()
    MIN, MAX = 0, 0xFF


class UShort(_RangedInt):
    """AMQP ushort: 16-bit unsigned integer."""

    __slots__ = ()
    MIN, MAX = 0, 0xFFFF


class UInt(_RangedInt):
    """AMQP uint: 32-bit unsigned integer."""

    __slots__ = ()
    MIN, MAX = 0, 0xFFFF_FFFF


class ULong(_RangedInt):
    """AMQP ulong: 64-bit unsigned integer."""

    __slots__ = ()
    MIN, MAX = 0, 0xFFFF_FFFF_FFFF_FFFF


class Byte(_RangedInt):
    """AMQP byte: 8-bit two's-complement integer."""

    __slots__ = ()
    MIN, MAX = -0x80, 0x7F


class Short(_RangedInt):
    """AMQP short: 16-bit two's-complement integer."""

    __slots__ = ()
    MIN, MAX = -0x8000, 0x7FFF


class Int(_RangedInt):
    """AMQP int: 32-bit two's-complement integer."""

    __slots__ = ()
    MIN, MAX = -0x8000_0000, 0x7FFF_FFFF


class Long(_RangedInt):
    """AMQP long: 64-bit two's-complement integer. Plain ``int`` encodes as long too; decodes as ``int``."""

    __slots__ = ()
    MIN, MAX = -0x8000_0000_0000_0000, 0x7FFF_FFFF_FFFF_FFFF


class Timestamp(_RangedInt):
    """AMQP timestamp: signed 64-bit milliseconds since the Unix epoch (spec 1.6.20)."""

    __slots__ = ()
    MIN, MAX = -0x8000_0000_0000_0000, 0x7FFF_FFFF_FFFF_FFFF


_F32: Final = struct.Struct(">f")


class Float(float):
    """AMQP float: IEEE 754 binary32. The value is rounded to 32 bits on construction."""

    __slots__ = ()

    def __new__(cls, value: Any = 0.0) -> Float:
        f = float(value)
        try:
            f = _F32.unpack(_F32.pack(f))[0]
        except OverflowError:
            raise ValueError(f"Float out of binary32 range: {f!r}") from None
        return float.__new__(cls, f)

    def __repr__(self) -> str:
        return f"Float({float(self)!r})"


class Symbol(str):
    """AMQP symbol: a string of ASCII characters used as a name (descriptors, conditions, capabilities)."""

    __slots__ = ()

    def __new__(cls, value: str = "") -> Symbol:
        if not isinstance(value, str):
            raise TypeError(f"Symbol needs a str, not {type(value).__name__}")
        if not value.isascii():
            raise ValueError(f"Symbol must be ASCII: {value!r}")
        return str.__new__(cls, value)

    def __repr__(self) -> str:
        return f"Symbol({str.__repr__(self)})"


class Char(str):
    """AMQP char: a single Unicode code point (encoded as UTF-32BE)."""

    __slots__ = ()

    def __new__(cls, value: str = "\0") -> Char:
        if not isinstance(value, str) or len(value) != 1:
            raise ValueError(f"Char needs exactly one character: {value!r}")
        return str.__new__(cls, value)

    def __repr__(self) -> str:
        return f"Char({str.__repr__(self)})"


class _FixedBytes(bytes):
    SIZE: int = 0

    def __new__(cls, value: bytes = b"") -> Any:
        self = bytes.__new__(cls, value)
        if len(self) != cls.SIZE:
            raise ValueError(f"{cls.__name__} needs exactly {cls.SIZE} bytes, got {len(self)}")
        return self

    def __repr__(self) -> str:
        return f"{type(self).__name__}({bytes(self)!r})"


class Decimal32(_FixedBytes):
    """AMQP decimal32: IEEE 754-2008 decimal32, kept as its 4 exact bytes (big-endian as on the wire)."""

    SIZE = 4


class Decimal64(_FixedBytes):
    """AMQP decimal64: IEEE 754-2008 decimal64, kept as its 8 exact bytes."""

    SIZE = 8


class Decimal128(_FixedBytes):
    """AMQP decimal128: IEEE 754-2008 decimal128, kept as its 16 exact bytes."""

    SIZE = 16


#: AMQP type names an :class:`Array` may hold, with the Python classes that name them as a convenience.
ARRAY_ELEMENT_TYPES: Final = (
    "null", "boolean", "ubyte", "ushort", "uint", "ulong", "byte", "short", "int", "long", "float", "double",
    "decimal32", "decimal64", "decimal128", "char", "timestamp", "uuid", "binary", "string", "symbol", "list",
    "map", "array",
)  # fmt: skip


def _element_type(value: Any) -> str:
    if isinstance(value, str) and value in ARRAY_ELEMENT_TYPES:
        return str(value)
    import uuid

    by_class: dict[Any, str] = {
        type(None): "null", bool: "boolean", UByte: "ubyte", UShort: "ushort", UInt: "uint", ULong: "ulong",
        Byte: "byte", Short: "short", Int: "int", Long: "long", int: "long", Float: "float", float: "double",
        Decimal32: "decimal32", Decimal64: "decimal64", Decimal128: "decimal128", Char: "char",
        Timestamp: "timestamp", uuid.UUID: "uuid", bytes: "binary", str: "string", Symbol: "symbol",
        list: "list", dict: "map",
    }  # fmt: skip
    if value in by_class:
        return by_class[value]
    if value is Array:
        return "array"
    raise ValueError(f"not an AMQP array element type: {value!r}")


@attrs.frozen
class Array:
    """AMQP array (spec 1.6.23 / 1.2.3): a sequence of values of one type, written with one constructor.

    Args:
        type: the AMQP type name of the elements (``"symbol"``, ``"uint"``, ...; a wrapper class such as
            ``Symbol`` or ``UInt`` is accepted and converted). For an array of described values this is the
            type of the values *under* the descriptor.
        items: the elements (any iterable; stored as a tuple). Each must fit ``type``.
        descriptor: for arrays of described types, the common descriptor (a :class:`ULong` or
            :class:`Symbol`); the items are then the undescribed values.
    """

    type: str = attrs.field(converter=_element_type)
    items: tuple[Any, ...] = attrs.field(converter=tuple, default=())
    descriptor: Any = None

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self) -> Any:
        return iter(self.items)


@attrs.frozen
class Described:
    """AMQP described type (spec 1.2): a ``value`` annotated with a ``descriptor``.

    The descriptor is an :class:`ULong` (numeric, ``domain-id << 32 | descriptor-id``) or a :class:`Symbol`;
    a plain ``int`` is taken as a numeric descriptor. Decoding gives this class only for descriptors the
    codec does not know; known ones decode to their composite class (``Open``, ``Source``, ...).
    """

    descriptor: Any = attrs.field(converter=lambda d: ULong(d) if type(d) is int else d)
    value: Any = None
