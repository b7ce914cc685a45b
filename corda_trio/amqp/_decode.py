"""Decoding of AMQP 1.0 values (spec part 1): every encoding of every type, bounded, one error type.

Theory of operation
-------------------
A decoder is a function ``f(buf, pos) -> (value, new_pos)`` where ``pos`` is the index just *after* the
constructor byte; tables of 256 such functions, indexed by the constructor byte, do the dispatch, so decoding
one value is ``TYPED[buf[pos]](buf, pos + 1)`` with no branching on the type. ``buf`` is ``bytes`` (the
entry points convert a ``memoryview`` or ``bytearray`` once); slices of it become the decoded values.

* ``TYPED`` gives the representation that re-encodes canonically (wrappers such as :class:`UInt`,
  :class:`Symbol`); it is what :func:`decode_value` and the ``*``-typed fields of composites use.
* ``FIELD_TABLES[kind]`` are the tables the composite decoders use for a field whose type the schema knows
  (``"uint"``, ``"symbol"``, ``"boolean"``, ...): they accept exactly the constructors of that type plus
  ``null``, and return plain Python values (``int`` rather than ``UInt``) because the schema already fixes
  how the field re-encodes. Any other constructor raises :class:`DecodeError`.

Bounds: every variable-width value checks its declared size against the buffer *before* touching the bytes,
and a compound's element count against its size (each element takes at least one byte), so a declared size
of 4 GiB in a 20-byte buffer is an immediate :class:`DecodeError`, never an allocation. Arrays of zero-width
elements (``null``, ``true``, ``uint0``...) carry no bytes per element, so their count is capped at
``MAX_ZERO_WIDTH_ARRAY_COUNT``. Reads past the end of the buffer (``IndexError`` / ``struct.error``) and
nesting deeper than the interpreter's recursion limit are converted to :class:`DecodeError` at the entry
points (:func:`decode_value`, composite and frame decoders), which are the only places that catch.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable
from itertools import islice
from typing import Any, Final

from ._errors import Condition, DecodeError
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
    Short,
    Symbol,
    Timestamp,
    UByte,
    UInt,
    ULong,
    UShort,
)

__all__ = ["MAX_ZERO_WIDTH_ARRAY_COUNT", "decode_value"]

Decoder = Callable[[Any, int], tuple[Any, int]]

#: Upper bound on the element count of an array whose element constructor has no per-element bytes.
MAX_ZERO_WIDTH_ARRAY_COUNT: Final = 65536

_U16: Final = struct.Struct(">H").unpack_from
_I16: Final = struct.Struct(">h").unpack_from
_U32: Final = struct.Struct(">I").unpack_from
_I32: Final = struct.Struct(">i").unpack_from
_U64: Final = struct.Struct(">Q").unpack_from
_I64: Final = struct.Struct(">q").unpack_from
_F32: Final = struct.Struct(">f").unpack_from
_F64: Final = struct.Struct(">d").unpack_from
_U32x2: Final = struct.Struct(">II").unpack_from

_int_new: Final = int.__new__
_str_new: Final = str.__new__
_float_new: Final = float.__new__
_bytes_new: Final = bytes.__new__
_obj_new: Final = object.__new__


def dict_setter(cls: type) -> Callable[[Any, dict[str, Any]], None]:
    """``setter(obj, d)`` makes ``d`` the ``__dict__`` of ``obj``, a ``cls`` made by ``object.__new__``.

    The decoders fill an instance in one step this way. It is the ``__set__`` of the ``__dict__`` descriptor
    of ``cls``, which ``object.__setattr__(instance, "__dict__", d)`` would look up on every call (and it
    bypasses a ``__setattr__`` that refuses changes, as that does).
    """
    for klass in cls.__mro__:
        descriptor = vars(klass).get("__dict__")
        if descriptor is not None:
            return descriptor.__set__  # type: ignore[no-any-return]
    raise TypeError(f"{cls.__name__} instances have no __dict__")


def truncated(pos: int) -> DecodeError:
    return DecodeError("truncated: the value runs past the end of the buffer", pos)


# --- fixed-width ---------------------------------------------------------------------------------------


def _null(buf: Any, pos: int) -> tuple[Any, int]:
    return None, pos


def _true(buf: Any, pos: int) -> tuple[Any, int]:
    return True, pos


def _false(buf: Any, pos: int) -> tuple[Any, int]:
    return False, pos


def _boolean(buf: Any, pos: int) -> tuple[Any, int]:
    b = buf[pos]
    if b == 1:
        return True, pos + 1
    if b == 0:
        return False, pos + 1
    raise DecodeError(f"boolean byte must be 0x00 or 0x01, not 0x{b:02x}", pos)


def _ubyte(buf: Any, pos: int) -> tuple[Any, int]:
    return _int_new(UByte, buf[pos]), pos + 1


def _ushort(buf: Any, pos: int) -> tuple[Any, int]:
    return _int_new(UShort, _U16(buf, pos)[0]), pos + 2


def _uint(buf: Any, pos: int) -> tuple[Any, int]:
    return _int_new(UInt, _U32(buf, pos)[0]), pos + 4


def _smalluint(buf: Any, pos: int) -> tuple[Any, int]:
    return _int_new(UInt, buf[pos]), pos + 1


_UINT0: Final = UInt(0)
_ULONG0: Final = ULong(0)


def _uint0(buf: Any, pos: int) -> tuple[Any, int]:
    return _UINT0, pos


def _ulong(buf: Any, pos: int) -> tuple[Any, int]:
    return _int_new(ULong, _U64(buf, pos)[0]), pos + 8


def _smallulong(buf: Any, pos: int) -> tuple[Any, int]:
    return _int_new(ULong, buf[pos]), pos + 1


def _ulong0(buf: Any, pos: int) -> tuple[Any, int]:
    return _ULONG0, pos


def _byte(buf: Any, pos: int) -> tuple[Any, int]:
    b = buf[pos]
    return _int_new(Byte, b - 256 if b > 127 else b), pos + 1


def _short(buf: Any, pos: int) -> tuple[Any, int]:
    return _int_new(Short, _I16(buf, pos)[0]), pos + 2


def _int(buf: Any, pos: int) -> tuple[Any, int]:
    return _int_new(Int, _I32(buf, pos)[0]), pos + 4


def _smallint(buf: Any, pos: int) -> tuple[Any, int]:
    b = buf[pos]
    return _int_new(Int, b - 256 if b > 127 else b), pos + 1


def _long(buf: Any, pos: int) -> tuple[Any, int]:
    return _I64(buf, pos)[0], pos + 8


def _smalllong(buf: Any, pos: int) -> tuple[Any, int]:
    b = buf[pos]
    return (b - 256 if b > 127 else b), pos + 1


def _float(buf: Any, pos: int) -> tuple[Any, int]:
    return _float_new(Float, _F32(buf, pos)[0]), pos + 4


def _double(buf: Any, pos: int) -> tuple[Any, int]:
    return _F64(buf, pos)[0], pos + 8


def _fixed_bytes(cls: type, size: int) -> Decoder:
    def decode(buf: Any, pos: int) -> tuple[Any, int]:
        end = pos + size
        if end > len(buf):
            raise truncated(pos)
        return _bytes_new(cls, buf[pos:end]), end

    return decode


def _char(buf: Any, pos: int) -> tuple[Any, int]:
    cp = _U32(buf, pos)[0]
    if cp > 0x10FFFF:
        raise DecodeError(f"char code point out of range: 0x{cp:x}", pos - 1)
    return _str_new(Char, chr(cp)), pos + 4


def _timestamp(buf: Any, pos: int) -> tuple[Any, int]:
    return _int_new(Timestamp, _I64(buf, pos)[0]), pos + 8


def _uuid(buf: Any, pos: int) -> tuple[Any, int]:
    end = pos + 16
    if end > len(buf):
        raise truncated(pos)
    return uuid.UUID(bytes=buf[pos:end]), end


# --- variable-width ------------------------------------------------------------------------------------
# (``buf`` is always ``bytes`` here: the entry points convert other buffers once, see ``guarded``.)


def _vbin8(buf: bytes, pos: int) -> tuple[Any, int]:
    end = pos + 1 + buf[pos]
    if end > len(buf):
        raise truncated(pos)
    return buf[pos + 1 : end], end


def _vbin32(buf: bytes, pos: int) -> tuple[Any, int]:
    end = pos + 4 + _U32(buf, pos)[0]
    if end > len(buf):
        raise truncated(pos)
    return buf[pos + 4 : end], end


def _bad_utf8(exc: UnicodeDecodeError, start: int) -> DecodeError:
    return DecodeError(f"string is not valid UTF-8: {exc.reason}", start + exc.start)


def _str8(buf: bytes, pos: int) -> tuple[Any, int]:
    end = pos + 1 + buf[pos]
    if end > len(buf):
        raise truncated(pos)
    try:
        return buf[pos + 1 : end].decode(), end
    except UnicodeDecodeError as exc:
        raise _bad_utf8(exc, pos + 1) from None


def _str32(buf: bytes, pos: int) -> tuple[Any, int]:
    end = pos + 4 + _U32(buf, pos)[0]
    if end > len(buf):
        raise truncated(pos)
    try:
        return buf[pos + 4 : end].decode(), end
    except UnicodeDecodeError as exc:
        raise _bad_utf8(exc, pos + 4) from None


def _ascii(buf: bytes, start: int, end: int) -> Symbol:
    try:
        return _str_new(Symbol, buf[start:end].decode("ascii"))
    except UnicodeDecodeError as exc:
        raise DecodeError("symbol is not ASCII", start + exc.start) from None


def _sym8(buf: bytes, pos: int) -> tuple[Any, int]:
    end = pos + 1 + buf[pos]
    if end > len(buf):
        raise truncated(pos)
    return _ascii(buf, pos + 1, end), end


def _sym32(buf: bytes, pos: int) -> tuple[Any, int]:
    end = pos + 4 + _U32(buf, pos)[0]
    if end > len(buf):
        raise truncated(pos)
    return _ascii(buf, pos + 4, end), end


# --- compounds -----------------------------------------------------------------------------------------


def _list0(buf: Any, pos: int) -> tuple[Any, int]:
    return [], pos


def _list_items(buf: Any, pos: int, end: int, count: int) -> tuple[Any, int]:
    if end > len(buf):
        raise truncated(pos)
    if count > end - pos:
        raise DecodeError(f"list count {count} cannot fit in its size", pos)
    table = TYPED
    out = []
    append = out.append
    for _ in range(count):
        v, pos = table[buf[pos]](buf, pos + 1)
        append(v)
    if pos != end:
        raise DecodeError("list elements do not match the list's declared size", pos)
    return out, pos


def _list8(buf: Any, pos: int) -> tuple[Any, int]:
    size = buf[pos]
    if size < 1:
        raise DecodeError("list8 size must count its count byte", pos)
    return _list_items(buf, pos + 2, pos + 1 + size, buf[pos + 1])


def _list32(buf: Any, pos: int) -> tuple[Any, int]:
    size, count = _U32x2(buf, pos)
    if size < 4:
        raise DecodeError("list32 size must count its count field", pos)
    return _list_items(buf, pos + 8, pos + 4 + size, count)


_PREVIOUS_SLOTS: Final = 16
_ENTRIES_MAX: Final = 256
_ENTRY_MAX_BYTES: Final = 96
_HEADERS_MAX: Final = 256


class DecoderMemo:
    """The decoder's memory of recurring input: one explicit object, :data:`DECODER_MEMO`, per process.

    Decoding is a pure function of the bytes, and every memoised value is immutable, so whatever this object
    holds can only make decoding faster, never different; :meth:`clear` forgets everything (tests do it to
    start from a known state). Each store is bounded.

    Attributes:
        entries: small map entries whose key is a str8 and whose value is a str8 or a one-byte integer,
            keyed by the entry's exact bytes -> ``(key, value)``: the same application-properties entries
            (Corda's platform-topic, versions, vendor...) recur in every message. When full (one-off entries
            fill it) it is cleared, so recurring entries come back after one miss.
        previous: per place in a map (the first :data:`_PREVIOUS_SLOTS`), the memoised entry last seen
            there ``(raw bytes, key, value, length)``, checked first with a plain ``startswith`` (no slice,
            no hash): application-properties keep their order from message to message. Every slot always
            holds a genuine entry, so a match is always right.
        volatile: per place, the key ``(exact bytes, decoded, length)`` of an entry whose value changes from
            one map to the next (Corda's dedup id and sequence number, longs): its value is decoded directly,
            without slicing the entry for ``entries`` or filling that with one-off values. The sentinel
            never matches (0xFF is no AMQP constructor).
        prefix: ``[raw bytes, dict, entry count]`` of the leading entries of the last map whose first
            entries all came from ``previous``: when a map starts with exactly these bytes, its dict starts
            as a copy of that one (one ``startswith``, one C-level copy instead of a loop over them).
        headers: message header sections by their exact bytes -> ``Header`` (``_messages.py``).
        last_header: ``[raw bytes, Header]`` of the last header section decoded.
        properties_tail: ``[raw bytes, fields, list count]`` of the last properties section (list8) after
            its message-id (a str8): the fields after the message id (to, user-id...) recur from message to
            message, so a section ending in exactly these bytes decodes only its message id.
        shape: the application-properties *shape* learnt from the last two maps with the same keys in the
            same order (see :func:`map_by_shape`): ``[entry count, first run, dict, steps]`` where a run is
            the exact bytes of the entries whose value did not change plus the key of the next entry whose
            value did, ``dict`` the last such map (every key, in order), and each step is ``(key, next
            run)``. A map that matches it decodes as a copy of the dict with each changing entry's value
            decoded and set (no key added: the copy is never resized).
        transfer: ``[head, list end, fields, tail]`` of the last transfer performative (a list8) with a
            delivery-id and a binary delivery-tag: ``head`` is its bytes up to the delivery-id (list header
            and handle), ``tail`` those after the tag (message-format, settled...; never a delivery state),
            ``fields`` what head and tail decoded to. A transfer with exactly that head and tail decodes only
            its delivery-id and tag (``_frames.py``).
        shape_seen: ``[spans]`` of the last application-properties map learnt from (key bytes, value bytes,
            value constructor per entry), to compare the next one with.
        message: the *layout* of the last message that began with a header (list8) or none, then
            properties (list8, str8 message-id first), then application-properties decoded by ``shape``:
            ``[prefix, id length, header, fields, tail, map size - 1, map count]`` where ``prefix`` is its
            bytes up to the message id's UTF-8 (header section, properties list header, ``a1`` + length),
            ``tail`` those after the id up to the map's first entry (the other properties fields, the
            application-properties section and map header), ``fields`` the properties fields decoded (a
            copy gets the new message id).
            A message with exactly that prefix and tail decodes only its message id, its map by ``shape``
            and what follows (``_messages.py``).
    """

    __slots__ = (
        "entries", "headers", "last_header", "message", "prefix", "previous", "properties_tail", "shape",
        "shape_seen", "transfer", "volatile",
    )  # fmt: skip

    def __init__(self) -> None:
        self.entries: dict[bytes, tuple[str, Any]] = {}
        self.previous: list[tuple[bytes, Any, Any, int]] = []
        self.volatile: list[tuple[bytes, Any, int]] = []
        self.headers: dict[bytes, Any] = {}
        self.last_header: list[Any] = []
        self.prefix: list[Any] = []
        self.properties_tail: list[Any] = []
        self.shape: list[Any] = []
        self.shape_seen: list[Any] = []
        self.transfer: list[Any] = []
        self.message: list[Any] = []
        self.clear()

    def clear(self) -> None:
        """Forget everything (in place: the decoders hold these containers)."""
        self.entries.clear()
        self.previous[:] = [(b"\xa1\x00\xa1\x00", "", "", 4)] * _PREVIOUS_SLOTS
        self.volatile[:] = [(b"\xff", None, 0)] * _PREVIOUS_SLOTS
        self.headers.clear()
        self.last_header[:] = [b"\x00\x00", None]
        self.prefix[:] = [b"\xff", {}, 0]
        self.properties_tail[:] = [b"\xff", {}, -1]
        self.shape[:] = [-1, b"\xff", {}, ()]
        self.shape_seen[:] = [None]
        self.transfer[:] = [b"\xff", 0, {}, b""]
        self.message[:] = [b"\xff", 0, None, {}, b"", 0, -1]


#: The process's decoder memo (see :class:`DecoderMemo`).
DECODER_MEMO: Final = DecoderMemo()
_ENTRIES: Final = DECODER_MEMO.entries
_PREVIOUS: Final = DECODER_MEMO.previous
_VOLATILE: Final = DECODER_MEMO.volatile
_PREFIX: Final = DECODER_MEMO.prefix


def _map_items(buf: bytes, pos: int, end: int, count: int) -> tuple[Any, int]:
    if end > len(buf):
        raise truncated(pos)
    if count & 1:
        raise DecodeError(f"map has an odd number of elements ({count})", pos)
    if count > end - pos:
        raise DecodeError(f"map count {count} cannot fit in its size", pos)
    table = TYPED
    entries = _ENTRIES
    previous = _PREVIOUS
    volatile = _VOLATILE
    start = pos
    prefix = _PREFIX
    if prefix[2] <= count >> 1 and buf.startswith(prefix[0], pos):  # the same leading entries as before
        out: dict[Any, Any] = prefix[1].copy()
        first = hits = prefix[2]
        pos += len(prefix[0])
    else:
        out = {}
        first = hits = 0
    hits_end = pos
    for i in range(first, count >> 1):
        if i < _PREVIOUS_SLOTS:
            prev = previous[i]
            if buf.startswith(prev[0], pos):  # the entry found at this place last time: no slicing at all
                out[prev[1]] = prev[2]
                pos += prev[3]
                if hits == i:
                    hits += 1
                    hits_end = pos
                continue
            vol = volatile[i]
            if buf.startswith(vol[0], pos):  # a known key whose value changes every time: decode the value
                pos += vol[2]
                c = buf[pos]
                if c == 0xA1:
                    e = pos + 2 + buf[pos + 1]
                    v = buf[pos + 2 : e].decode()
                    pos = e
                elif c == 0x81:  # long (Corda's send-seq-no)
                    v = _I64(buf, pos + 1)[0]
                    pos += 9
                else:
                    v, pos = table[c](buf, pos + 1)
                out[vol[1]] = v
                continue
        entry_start = pos
        kend = 0
        c = buf[pos]
        vend = 0
        if c == 0xA1:  # str8 key (application-properties): inlined, it is the hot path
            kend = pos + 2 + buf[pos + 1]  # no bound check: a string past `end` fails the size check below
            c = buf[kend]
            if c == 0xA1:
                vend = kend + 2 + buf[kend + 1]
            elif c == 0x54 or c == 0x55:
                vend = kend + 2
            if vend and vend - pos <= _ENTRY_MAX_BYTES:
                raw = buf[pos:vend]
                entry = entries.get(raw)
                if entry is not None:  # seen before: the same bytes decode to the same immutable values
                    out[entry[0]] = entry[1]
                    if i < _PREVIOUS_SLOTS:
                        previous[i] = (raw, entry[0], entry[1], vend - pos)
                    pos = vend
                    continue
            else:
                vend = 0
            k = buf[pos + 2 : kend].decode()
            pos = kend
        else:
            k, pos = table[c](buf, pos + 1)
            c = buf[pos]
        if c == 0xA1:  # str8 value: inlined as well
            e = pos + 2 + buf[pos + 1]
            v = buf[pos + 2 : e].decode()
            pos = e
        elif c == 0x54:  # smallint value (e.g. Corda's platform-version)
            b = buf[pos + 1]
            v = _int_new(Int, b - 256 if b > 127 else b)
            pos += 2
        elif c == 0x55:  # smalllong value
            b = buf[pos + 1]
            v = b - 256 if b > 127 else b
            pos += 2
        else:
            v, pos = table[c](buf, pos + 1)
        out[k] = v
        if kend and i < _PREVIOUS_SLOTS and (not vend or previous[i][1] == k) and kend <= end:
            # the same key as last time here with another value, or a value the memo does not take (a
            # long): remember the key, memoise nothing
            volatile[i] = (buf[entry_start:kend], k, kend - entry_start)
            continue
        if vend and pos == vend <= end:  # a valid, memoisable entry
            if len(entries) >= _ENTRIES_MAX:  # full (of one-off values such as dedup ids): start afresh
                entries.clear()
            entries[raw] = (k, v)
            if i < _PREVIOUS_SLOTS:
                previous[i] = (raw, k, v, len(raw))
    if pos != end:
        raise DecodeError("map elements do not match the map's declared size", min(pos, end))
    if len(out) != count >> 1:
        raise DecodeError("map has duplicate keys", start)
    if hits > first and hits >= 2:  # a longer run of remembered leading entries: keep it as the prefix
        prefix[:] = [buf[start:hits_end], dict(islice(out.items(), hits)), hits]
    return out, pos


_SHAPE: Final = DECODER_MEMO.shape
_SHAPE_SEEN: Final = DECODER_MEMO.shape_seen
#: Value constructors of fixed width (bytes after the constructor) that a shape's changing entries decode
#: directly, bounded by the map's end; str8 / sym8 / vbin8 are handled on their own; anything else (nested
#: compounds, described values) falls back to :func:`_map_items`.
_SHAPE_FIXED: Final = {
    0x40: 0, 0x41: 0, 0x42: 0, 0x43: 0, 0x44: 0, 0x45: 0, 0x50: 1, 0x51: 1, 0x52: 1, 0x53: 1, 0x54: 1,
    0x55: 1, 0x56: 1, 0x60: 2, 0x61: 2, 0x70: 4, 0x71: 4, 0x72: 4, 0x73: 4, 0x80: 8, 0x81: 8, 0x82: 8,
    0x83: 8, 0x98: 16, 0xA0: -1, 0xA3: -1,
}  # fmt: skip
#: Constructors whose decoded value is immutable and the same in every decode mode: an unchanged entry with
#: such a value may be shared by the dicts of later maps (through a copy of the run's dict).
_SHAREABLE: Final = frozenset(_SHAPE_FIXED) | {0xA1, 0xB0, 0xB1, 0xB3}


def map_by_shape(buf: bytes, pos: int, end: int, count: int) -> dict[Any, Any] | None:
    """Decode a map's entries ``buf[pos:end]`` by the remembered application-properties shape, or ``None``.

    ``None`` means only "does not have that shape" (the caller then decodes the map with
    :func:`_map_items`, which judges it): every byte this reads lies inside ``buf[pos:end]``, and the result
    is a map with exactly the shape's keys (so no duplicates), each changing value decoded from its own
    bytes, the unchanged ones equal to what those same bytes decoded to before. The caller checks
    ``end <= len(buf)``.
    """
    shape_count, run, keys, steps = _SHAPE
    if count != shape_count or not buf.startswith(run, pos):
        return None
    out: dict[Any, Any] = keys.copy()  # every key in order; each changing value is overwritten below
    pos += len(run)
    for key, run in steps:
        if pos >= end:
            return None
        c = buf[pos]
        if c == 0xA1:
            e = pos + 2 + buf[pos + 1]
            if e > end:
                return None
            out[key] = buf[pos + 2 : e].decode()
            pos = e
        elif c == 0x81:  # long (Corda's send-seq-no)
            if pos + 9 > end:
                return None
            out[key] = _I64(buf, pos + 1)[0]
            pos += 9
        else:
            width = _SHAPE_FIXED.get(c)
            if width is None or pos + 1 + (width if width >= 0 else 1 + buf[pos + 1]) > end:
                return None
            out[key], pos = TYPED[c](buf, pos + 1)
        if run and not buf.startswith(run, pos):  # (the last changing entry may end the map)
            return None
        pos += len(run)
    if pos != end:
        return None
    return out


def learn_map_shape(buf: bytes, pos: int, count: int, out: dict[Any, Any]) -> None:
    """Remember the shape of a valid map (``out`` decoded from ``buf[pos:]``) for :func:`map_by_shape`.

    A shape is learnt from two consecutive maps with the same keys (str8 / sym8) in the same order: the
    entries whose bytes are the same in both, with a shareable value, become runs; the others are decoded
    each time.
    """
    spans = []
    for _ in range(count >> 1):
        k = pos
        if buf[pos] != 0xA1 and buf[pos] != 0xA3:
            _SHAPE_SEEN[0] = None
            return
        kend = pos + 2 + buf[pos + 1]
        c = buf[kend]
        _, pos = TYPED[c](buf, kend + 1)
        spans.append((buf[k:kend], buf[kend:pos], c))
    seen = _SHAPE_SEEN[0]
    _SHAPE_SEEN[0] = spans
    if seen is None or len(seen) != len(spans) or any(a[0] != b[0] for a, b in zip(seen, spans, strict=True)):
        return
    first: tuple[bytes, dict[Any, Any]] | None = None
    steps = []
    run = b""
    entries: dict[Any, Any] = {}
    changing = None
    for key, (kb, vb, c), (_, old, _) in zip(out, spans, seen, strict=True):
        if vb == old and c in _SHAREABLE:
            run += kb + vb
            entries[key] = out[key]
            continue
        run += kb
        if first is None:
            first = (run, entries)
        else:
            steps.append((changing, run, entries or None))
        changing, run, entries = key, b"", {}
    if first is None:
        first = (run, entries)
    else:
        steps.append((changing, run, entries or None))
    _SHAPE[:] = [count, first[0], dict(out), tuple((key, run) for key, run, _ in steps)]


def _map8(buf: Any, pos: int) -> tuple[Any, int]:
    size = buf[pos]
    if size < 1:
        raise DecodeError("map8 size must count its count byte", pos)
    return _map_items(buf, pos + 2, pos + 1 + size, buf[pos + 1])


def _map32(buf: Any, pos: int) -> tuple[Any, int]:
    size, count = _U32x2(buf, pos)
    if size < 4:
        raise DecodeError("map32 size must count its count field", pos)
    return _map_items(buf, pos + 8, pos + 4 + size, count)


# AMQP type name of each constructor (for Array.type) and the constructors without per-element bytes.
TYPE_NAMES: Final[dict[int, str]] = {
    0x40: "null", 0x41: "boolean", 0x42: "boolean", 0x56: "boolean", 0x50: "ubyte", 0x60: "ushort",
    0x70: "uint", 0x52: "uint", 0x43: "uint", 0x80: "ulong", 0x53: "ulong", 0x44: "ulong", 0x51: "byte",
    0x61: "short", 0x71: "int", 0x54: "int", 0x81: "long", 0x55: "long", 0x72: "float", 0x82: "double",
    0x74: "decimal32", 0x84: "decimal64", 0x94: "decimal128", 0x73: "char", 0x83: "timestamp", 0x98: "uuid",
    0xA0: "binary", 0xB0: "binary", 0xA1: "string", 0xB1: "string", 0xA3: "symbol", 0xB3: "symbol",
    0x45: "list", 0xC0: "list", 0xD0: "list", 0xC1: "map", 0xD1: "map", 0xE0: "array", 0xF0: "array",
}  # fmt: skip
ZERO_WIDTH: Final = frozenset({0x40, 0x41, 0x42, 0x43, 0x44, 0x45})


def _array_items(buf: Any, pos: int, end: int, count: int) -> tuple[Any, int]:
    if end > len(buf):
        raise truncated(pos)
    start = pos
    c = buf[pos]
    pos += 1
    descriptor = None
    if c == 0x00:
        descriptor, pos = TYPED[buf[pos]](buf, pos + 1)
        c = buf[pos]
        pos += 1
    name = TYPE_NAMES.get(c)
    if name is None:
        raise DecodeError(f"invalid array element constructor 0x{c:02x}", pos - 1)
    if c in ZERO_WIDTH:
        if count > MAX_ZERO_WIDTH_ARRAY_COUNT:
            raise DecodeError(
                f"array of {count} zero-width elements exceeds {MAX_ZERO_WIDTH_ARRAY_COUNT}",
                start,
                condition=Condition.RESOURCE_LIMIT_EXCEEDED,
            )
    elif count > end - pos:
        raise DecodeError(f"array count {count} cannot fit in its size", start)
    fn = TYPED[c]
    items = []
    append = items.append
    for _ in range(count):
        v, pos = fn(buf, pos)
        append(v)
    if pos != end:
        raise DecodeError("array elements do not match the array's declared size", pos)
    arr = _obj_new(Array)
    _set_array(arr, name, tuple(items), descriptor)
    return arr, pos


def _set_array(arr: Array, name: str, items: tuple[Any, ...], descriptor: Any) -> None:
    object.__setattr__(arr, "type", name)
    object.__setattr__(arr, "items", items)
    object.__setattr__(arr, "descriptor", descriptor)


def _array8(buf: Any, pos: int) -> tuple[Any, int]:
    size = buf[pos]
    if size < 2:
        raise DecodeError("array8 size must count its count byte and constructor", pos)
    return _array_items(buf, pos + 2, pos + 1 + size, buf[pos + 1])


def _array32(buf: Any, pos: int) -> tuple[Any, int]:
    size, count = _U32x2(buf, pos)
    if size < 5:
        raise DecodeError("array32 size must count its count field and constructor", pos)
    return _array_items(buf, pos + 8, pos + 4 + size, count)


# --- described -----------------------------------------------------------------------------------------

#: What a decoder raises on malformed input besides DecodeError (reads past the end, bad UTF-8, deep nesting,
#: unhashable map keys); the entry points convert these with :func:`as_decode_error`.
DECODER_FAILURES: Final = (IndexError, struct.error, RecursionError, ValueError, TypeError, OverflowError)

#: Composite decoders by numeric descriptor (domain 0) and by symbolic descriptor; filled by _composite.py.
#: Each is ``f(buf, pos) -> (instance, pos)`` with ``pos`` at the described value's constructor.
COMPOSITES_BY_CODE: Final[dict[int, Decoder]] = {}
COMPOSITES_BY_NAME: Final[dict[str, Decoder]] = {}


class DecodeMode:
    """How described values with a known descriptor but non-conforming contents are treated.

    ``strict`` (the default, and always for frames and performatives) raises :class:`DecodeError`.
    ``opaque`` is set only while :meth:`Message.decode <corda_trio.amqp.Message.decode>` retries a message
    whose sections failed the strict pass: inside message sections an application may put any described
    value (``Described(0x23, "x")``), and such a value then comes back as a plain :class:`Described`, as
    Proton hands it to the application. The decoder is synchronous, so the mode cannot leak to another
    decode (the retry restores it in ``finally``).
    """

    __slots__ = ("opaque",)

    def __init__(self) -> None:
        self.opaque = False


#: The decoder's mode (see :class:`DecodeMode`); only ``_messages.py`` switches it, around one call.
DECODE_MODE: Final = DecodeMode()


def _described(buf: Any, pos: int) -> tuple[Any, int]:
    c = buf[pos]
    if c == 0x53:  # smallulong: the common case for every spec-defined type
        code = buf[pos + 1]
        dec = COMPOSITES_BY_CODE.get(code)
        pos += 2
        if dec is not None and not DECODE_MODE.opaque:
            return dec(buf, pos)
        descriptor: Any = _int_new(ULong, code)
    else:
        if c == 0x00:
            raise DecodeError("a descriptor cannot itself be described", pos)
        descriptor, pos = TYPED[c](buf, pos + 1)
        if type(descriptor) is ULong:
            dec = COMPOSITES_BY_CODE.get(descriptor)
        elif type(descriptor) is Symbol:
            dec = COMPOSITES_BY_NAME.get(descriptor)
        else:
            dec = None
    if dec is not None:
        if not DECODE_MODE.opaque:
            return dec(buf, pos)
        try:
            return dec(buf, pos)
        except (DecodeError, *DECODER_FAILURES):
            pass  # opaque mode: the contents do not fit the spec type; keep it as a plain described value
    value, pos = TYPED[buf[pos]](buf, pos + 1)
    d = _obj_new(Described)
    object.__setattr__(d, "descriptor", descriptor)
    object.__setattr__(d, "value", value)
    return d, pos


def _invalid(buf: Any, pos: int) -> tuple[Any, int]:
    raise DecodeError(f"invalid constructor 0x{buf[pos - 1]:02x}", pos - 1)


TYPED: Final[list[Decoder]] = [_invalid] * 256
for _code, _fn in {
    0x00: _described, 0x40: _null, 0x41: _true, 0x42: _false, 0x56: _boolean, 0x50: _ubyte, 0x60: _ushort,
    0x70: _uint, 0x52: _smalluint, 0x43: _uint0, 0x80: _ulong, 0x53: _smallulong, 0x44: _ulong0, 0x51: _byte,
    0x61: _short, 0x71: _int, 0x54: _smallint, 0x81: _long, 0x55: _smalllong, 0x72: _float, 0x82: _double,
    0x74: _fixed_bytes(Decimal32, 4), 0x84: _fixed_bytes(Decimal64, 8), 0x94: _fixed_bytes(Decimal128, 16),
    0x73: _char, 0x83: _timestamp, 0x98: _uuid, 0xA0: _vbin8, 0xB0: _vbin32, 0xA1: _str8, 0xB1: _str32,
    0xA3: _sym8, 0xB3: _sym32, 0x45: _list0, 0xC0: _list8, 0xD0: _list32, 0xC1: _map8, 0xD1: _map32,
    0xE0: _array8, 0xF0: _array32,
}.items():  # fmt: skip
    TYPED[_code] = _fn


# --- field tables: schema-typed, plain values ------------------------------------------------------------


def _plain_uint(buf: Any, pos: int) -> tuple[Any, int]:
    return _U32(buf, pos)[0], pos + 4


def _plain_small(buf: Any, pos: int) -> tuple[Any, int]:
    return buf[pos], pos + 1


def _plain_zero(buf: Any, pos: int) -> tuple[Any, int]:
    return 0, pos


def _plain_ulong(buf: Any, pos: int) -> tuple[Any, int]:
    return _U64(buf, pos)[0], pos + 8


def _plain_ushort(buf: Any, pos: int) -> tuple[Any, int]:
    return _U16(buf, pos)[0], pos + 2


def _plain_timestamp(buf: Any, pos: int) -> tuple[Any, int]:
    return _I64(buf, pos)[0], pos + 8


def _symbols_one(fn: Decoder) -> Decoder:
    def decode(buf: Any, pos: int) -> tuple[Any, int]:
        v, pos = fn(buf, pos)
        return (v,), pos

    return decode


def _symbols_array(fn: Decoder) -> Decoder:
    def decode(buf: Any, pos: int) -> tuple[Any, int]:
        arr, end = fn(buf, pos)
        if arr.type != "symbol" or arr.descriptor is not None:
            raise DecodeError(f"expected an array of symbols, found an array of {arr.type}", pos - 1)
        return arr.items, end

    return decode


def _table(kind: str, entries: dict[int, Decoder]) -> list[Decoder]:
    def wrong(buf: Any, pos: int) -> tuple[Any, int]:
        raise DecodeError(f"expected {kind}, found constructor 0x{buf[pos - 1]:02x}", pos - 1)

    table = [wrong] * 256
    table[0x40] = _null
    for code, fn in entries.items():
        table[code] = fn
    return table


FIELD_TABLES: Final[dict[str, list[Decoder]]] = {
    "any": TYPED,
    "boolean": _table("boolean", {0x41: _true, 0x42: _false, 0x56: _boolean}),
    "ubyte": _table("ubyte", {0x50: _plain_small}),
    "ushort": _table("ushort", {0x60: _plain_ushort}),
    "uint": _table("uint", {0x70: _plain_uint, 0x52: _plain_small, 0x43: _plain_zero}),
    "ulong": _table("ulong", {0x80: _plain_ulong, 0x53: _plain_small, 0x44: _plain_zero}),
    "timestamp": _table("timestamp", {0x83: _plain_timestamp}),
    "binary": _table("binary", {0xA0: _vbin8, 0xB0: _vbin32}),
    "string": _table("string", {0xA1: _str8, 0xB1: _str32}),
    "symbol": _table("symbol", {0xA3: _sym8, 0xB3: _sym32}),
    "symbols": _table(
        "symbol or array of symbols",
        {
            0xA3: _symbols_one(_sym8),
            0xB3: _symbols_one(_sym32),
            0xE0: _symbols_array(_array8),
            0xF0: _symbols_array(_array32),
        },
    ),
    "map": _table("map", {0xC1: _map8, 0xD1: _map32}),
    "list": _table("list", {0x45: _list0, 0xC0: _list8, 0xD0: _list32}),
    "described": _table("a described type", {0x00: _described}),
}


def as_decode_error(exc: BaseException, buf: Any, offset: int) -> DecodeError:
    """The :class:`DecodeError` for an exception in :data:`DECODER_FAILURES` raised while decoding ``buf``."""
    if isinstance(exc, IndexError | struct.error):
        return truncated(len(buf))
    if isinstance(exc, RecursionError):
        return DecodeError("values are nested too deeply", offset)
    if isinstance(exc, UnicodeDecodeError):
        return DecodeError(f"string is not valid UTF-8: {exc.reason}", offset)
    if isinstance(exc, TypeError):  # an unhashable map key (a list, a map...): legal AMQP, not a dict key
        return DecodeError(f"unsupported map key: {exc}", offset)
    return DecodeError(f"malformed value: {exc}", offset)  # pragma: no cover - defensive


def guarded(fn: Callable[..., Any], buf: Any, offset: int, *args: Any) -> Any:
    """Run a decoder on ``bytes``, converting every failure on malformed input into :class:`DecodeError`.

    The decoders index and slice ``bytes`` only (slices of ``bytes`` are the decoded ``bytes`` / ``str``
    values, with no second copy); a ``memoryview`` or ``bytearray`` is converted here, once.
    """
    if type(buf) is not bytes:
        buf = bytes(buf)
    try:
        return fn(buf, offset, *args)
    except DECODER_FAILURES as exc:
        raise as_decode_error(exc, buf, offset) from None


def _decode_one(buf: Any, offset: int) -> tuple[Any, int]:
    return TYPED[buf[offset]](buf, offset + 1)


def decode_value(buf: bytes | bytearray | memoryview, offset: int = 0) -> tuple[Any, int]:
    """Decode one AMQP value starting at ``buf[offset]``.

    Args:
        buf: the encoded bytes (``bytes``, ``bytearray`` or ``memoryview``); bytes after the value are left
            alone.
        offset: where the value's constructor is.

    Returns:
        ``(value, end)``: the decoded value (see the mapping in :mod:`corda_trio.amqp._types`) and the index
        just after it.

    Raises:
        DecodeError: the bytes are not one complete, valid AMQP value (``offset`` says where). Truncated
            input is a ``DecodeError`` too: the caller that streams must wait for a whole frame first.
    """
    if offset < 0:
        raise DecodeError("negative offset", offset)
    return guarded(_decode_one, buf, offset)  # type: ignore[no-any-return]
