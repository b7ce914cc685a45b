"""The AMQP 1.0 message format (spec 3.2): sections, and :class:`Message` with ``encode`` / ``decode``.

A bare message is a sequence of described sections, in this order (each optional)::

    header (0x70, list)  delivery-annotations (0x71, map)  message-annotations (0x72, map)
    properties (0x73, list)  application-properties (0x74, map)
    body: data (0x75, binary)+ | amqp-sequence (0x76, list)+ | amqp-value (0x77, *)
    footer (0x78, map)

:class:`Message` ``body`` is one of:

* ``None``: no body section;
* ``bytes``: exactly one data section (the usual case, and what Corda's P2P messages use);
* ``tuple[bytes, ...]`` of two or more: that many data sections;
* :class:`AmqpValue`: one amqp-value section;
* :class:`AmqpSequence`, or a ``tuple`` of them: one or more amqp-sequence sections.

Decoding is strict about the order: a section out of order, a repeated non-body section, a mix of body kinds
or an unknown section descriptor raises :class:`DecodeError`.
"""

# ruff: noqa: RUF009  (`field` is attrs.field with AMQP metadata: ruff cannot see that)
from __future__ import annotations

import struct
from operator import itemgetter
from typing import Any, Final

import attrs

from . import _decode as D
from . import _encode as E
from ._composite import FIELD_ENCODERS, composite, field
from ._errors import DecodeError, EncodeError
from ._types import Int, Long, Symbol, UInt, ULong

__all__ = [
    "ENCODER_MEMO",
    "SECTION_CODES",
    "AmqpSequence",
    "AmqpValue",
    "EncoderMemo",
    "Header",
    "Message",
    "Properties",
]

#: Section descriptor codes (spec 3.2.1-3.2.10), by section name.
SECTION_CODES: Final = {
    "header": 0x70,
    "delivery-annotations": 0x71,
    "message-annotations": 0x72,
    "properties": 0x73,
    "application-properties": 0x74,
    "data": 0x75,
    "amqp-sequence": 0x76,
    "amqp-value": 0x77,
    "footer": 0x78,
}
_SECTION_NAMES: Final = {
    "amqp:header:list": 0x70,
    "amqp:delivery-annotations:map": 0x71,
    "amqp:message-annotations:map": 0x72,
    "amqp:properties:list": 0x73,
    "amqp:application-properties:map": 0x74,
    "amqp:data:binary": 0x75,
    "amqp:amqp-sequence:list": 0x76,
    "amqp:value:*": 0x77,
    "amqp:footer:map": 0x78,
}


@composite(0x70, "amqp:header:list")
@attrs.frozen(kw_only=True, slots=False)
class Header:
    """Transport headers of a message (spec 3.2.1)."""

    durable: bool = field("boolean", False)
    priority: int = field("ubyte", 4)
    ttl: int | None = field("uint", None)
    first_acquirer: bool = field("boolean", False)
    delivery_count: int = field("uint", 0)


@composite(0x73, "amqp:properties:list")
@attrs.frozen(kw_only=True, slots=False)
class Properties:
    """Immutable properties of a message (spec 3.2.4).

    ``message_id`` / ``correlation_id`` are message-id values (spec 3.2.11-3.2.15): a plain ``int`` is
    written as ulong, ``str`` as string, ``bytes`` as binary, ``uuid.UUID`` as uuid. ``to`` / ``reply_to``
    are addresses (usually ``str``). Timestamps are ``int`` milliseconds since the epoch.
    """

    message_id: Any = field("message-id", None)
    user_id: bytes | None = field("binary", None)
    to: Any = field("any", None)
    subject: str | None = field("string", None)
    reply_to: Any = field("any", None)
    correlation_id: Any = field("message-id", None)
    content_type: Symbol | None = field("symbol", None)
    content_encoding: Symbol | None = field("symbol", None)
    absolute_expiry_time: int | None = field("timestamp", None)
    creation_time: int | None = field("timestamp", None)
    group_id: str | None = field("string", None)
    group_sequence: int | None = field("uint", None)
    reply_to_group_id: str | None = field("string", None)


@attrs.frozen
class AmqpValue:
    """An amqp-value body section (spec 3.2.8): one AMQP value of any type."""

    value: Any = None


@attrs.frozen
class AmqpSequence:
    """An amqp-sequence body section (spec 3.2.7): a list of AMQP values."""

    items: list[Any] = attrs.field(factory=list, converter=list)


# --- encoding ------------------------------------------------------------------------------------------

_DA: Final = b"\x00\x53\x71"
_MA: Final = b"\x00\x53\x72"
_AP: Final = b"\x00\x53\x74"
_DATA8: Final = b"\x00\x53\x75\xa0"
_DATA32: Final = b"\x00\x53\x75\xb0"
_SEQ: Final = b"\x00\x53\x76"
_VALUE: Final = b"\x00\x53\x77"
_FOOTER: Final = b"\x00\x53\x78"
_STR8: Final = E._STR8


class EncoderMemo:
    """The message encoder's memory of recurring application-properties entries (one per process).

    ``entries`` maps ``(key, value, type of value)`` to the entry's encoded bytes (the type is part of the
    key because ``Int(13)`` equals ``13`` but encodes differently); only values of the exact types in
    ``_MEMO_TYPES`` (immutable, hashable) are remembered, and only once the same value was seen under that
    key twice in a row (``last`` holds the value last seen per key), so one-off values such as dedup ids and
    sequence numbers never fill it. ``keys`` maps a key to its encoded bytes. Each is bounded and cleared
    when full, so recurring entries come back after one miss.

    ``shape`` is the application-properties *shape* learnt from the last two maps with the same keys and
    value types in the same order: ``[keys, value types, getter of the unchanged places, their values, runs,
    changing places]``. A map with those keys and types whose unchanged places hold equal values (of types
    whose equal values encode alike: ``_MEMO_TYPES``) is the runs (the encoded unchanged entries plus the
    next changing entry's key) joined with its changing values, encoded. ``seen`` holds the last map encoded
    in full, to learn from: ``[keys, types, values, encoded entries]``.
    """

    __slots__ = ("entries", "keys", "last", "seen", "shape")

    def __init__(self) -> None:
        self.entries: dict[tuple[str, Any, type], bytes] = {}
        self.keys: dict[str, bytes] = {}
        self.last: dict[str, Any] = {}
        self.shape: list[Any] = []
        self.seen: list[Any] = []
        self.clear()

    def clear(self) -> None:
        """Forget everything."""
        self.entries.clear()
        self.keys.clear()
        self.last.clear()
        self.shape[:] = [None, None, None, None, (), ()]
        self.seen[:] = [None, None, None, None]


#: The process's encoder memo (see :class:`EncoderMemo`).
ENCODER_MEMO: Final = EncoderMemo()
_ENTRY_MEMO: Final = ENCODER_MEMO.entries
_KEY_MEMO: Final = ENCODER_MEMO.keys
_LAST_VALUE: Final = ENCODER_MEMO.last
_ENTRY_MEMO_MAX: Final = 256
#: Value types whose equal values always encode to the same bytes (not float: 0.0 == -0.0; not containers).
_MEMO_TYPES: Final = frozenset({str, int, bool, Int, Long, UInt, ULong, Symbol, bytes, type(None)})
_SHAPE: Final = ENCODER_MEMO.shape
_SEEN: Final = ENCODER_MEMO.seen


def _app_value(v: Any) -> bytes:
    if type(v) is str and len(v) < 256 and v.isascii():
        return _STR8[len(v)] + v.encode()
    enc = E._ENCODERS.get(type(v))
    return enc(v) if enc is not None else E.encode_value(v)


def _app_properties(props: dict[str, Any]) -> bytes:
    """application-properties (3.2.5): string keys, simple values (any value is accepted here)."""
    if not isinstance(props, dict):
        raise EncodeError(f"application_properties must be a dict, not {type(props).__name__}")
    shape = _SHAPE
    keys = tuple(props)
    values = tuple(props.values())
    types = tuple(map(type, values))
    if keys == shape[0] and types == shape[1] and shape[2](values) == shape[3]:
        # the learnt shape: the unchanged entries' bytes, with the changing values encoded in between
        runs = shape[4]
        parts = [runs[0]]
        append = parts.append
        for i, run in zip(shape[5], runs[1:], strict=True):
            append(_app_value(values[i]))
            append(run)
        return E._compound(0xC1, 0xD1, 2 * len(keys), b"".join(parts))
    entries = _app_entries(props)
    _learn_app_shape(keys, types, values, entries)
    return E._compound(0xC1, 0xD1, 2 * len(keys), b"".join(entries))


def _learn_app_shape(
    keys: tuple[Any, ...], types: tuple[type, ...], values: tuple[Any, ...], entries: list[bytes]
) -> None:
    """Compare a map encoded in full with the one before; with the same keys and types, learn its shape."""
    seen = _SEEN
    same = keys == seen[0] and types == seen[1]
    previous = seen[2]
    seen[:] = [keys, types, values, entries]
    if not same or not all(type(k) is str for k in keys):
        return
    memo_types = _MEMO_TYPES
    unchanged = [i for i, t in enumerate(types) if t in memo_types and values[i] == previous[i]]
    changing = [i for i in range(len(keys)) if i not in unchanged]
    runs = []
    run = b""
    for i, key in enumerate(keys):
        if i in unchanged:
            run += entries[i]
            continue
        runs.append(run + _app_key(key))
        run = b""
    runs.append(run)
    getter: Any
    if not unchanged:
        getter = _nothing
    elif len(unchanged) == 1:
        getter = itemgetter(slice(unchanged[0], unchanged[0] + 1))
    else:
        getter = itemgetter(*unchanged)
    _SHAPE[:] = [keys, types, getter, getter(values), tuple(runs), tuple(changing)]


def _nothing(values: tuple[Any, ...]) -> tuple[Any, ...]:
    return ()


def _app_key(k: str) -> bytes:
    if len(k) < 64 and k.isascii():
        return _STR8[len(k)] + k.encode()
    return E.enc_string(k)


def _app_entries(props: dict[str, Any]) -> list[bytes]:
    """The encoded entries of an application-properties map, one ``bytes`` per entry."""
    parts: list[bytes] = []
    append = parts.append
    encoders = E._ENCODERS
    enc_value = E.encode_value
    memo = _ENTRY_MEMO
    keys = _KEY_MEMO
    last = _LAST_VALUE
    memo_types = _MEMO_TYPES
    for k, v in props.items():
        t = type(v)
        memoisable = t in memo_types and type(k) is str
        if memoisable:
            entry = memo.get((k, v, t))
            if entry is not None:
                append(entry)
                continue
        kb = keys.get(k) if type(k) is str else None
        if kb is None:
            if type(k) is str and len(k) < 64 and k.isascii():
                kb = _STR8[len(k)] + k.encode()
                if len(keys) >= _ENTRY_MEMO_MAX:
                    keys.clear()
                keys[k] = kb
            elif isinstance(k, str):
                kb = E.enc_string(k)
            else:
                raise EncodeError(f"application-properties keys must be strings, not {k!r}")
        if t is str and len(v) < 256 and v.isascii():  # the usual value: inlined
            vb = _STR8[len(v)] + v.encode()
        else:
            enc = encoders.get(t)
            vb = enc(v) if enc is not None else enc_value(v)
        if memoisable:
            seen = last.get(k, last)  # (``last`` itself: nothing seen yet)
            if seen is not last and type(seen) is t and seen == v:  # the same value again: it recurs
                if len(memo) >= _ENTRY_MEMO_MAX:
                    memo.clear()
                memo[(k, v, t)] = kb + vb
            else:
                if len(last) >= _ENTRY_MEMO_MAX:
                    last.clear()
                last[k] = v
        append(kb + vb)
    return parts


_annotations: Final = FIELD_ENCODERS["annotations"]  # symbol (or ulong) keys, any values


def _data(part: Any) -> list[bytes]:
    if type(part) is not bytes:
        if not isinstance(part, bytes | bytearray | memoryview):
            raise EncodeError(f"a data section holds bytes, not {type(part).__name__}")
        part = bytes(part)
    n = len(part)
    if n < 256:
        return [_DATA8 + bytes((n,)), part]
    if n > 0xFFFF_FFFF:
        raise EncodeError("a data section holds at most 4 GiB - 1")
    return [_DATA32 + n.to_bytes(4, "big"), part]


def _body(body: Any) -> list[bytes]:
    if body is None:
        return []
    if isinstance(body, bytes | bytearray | memoryview):
        return _data(body)
    if isinstance(body, AmqpValue):
        return [_VALUE, E.encode_value(body.value)]
    if isinstance(body, AmqpSequence):
        return [_SEQ, E.enc_list(body.items)]
    if isinstance(body, tuple | list) and body:
        if all(isinstance(p, bytes | bytearray | memoryview) for p in body):
            return [b for p in body for b in _data(p)]
        if all(isinstance(p, AmqpSequence) for p in body):
            return [b for p in body for b in (_SEQ, E.enc_list(p.items))]
    raise EncodeError(
        "Message.body must be None, bytes, a tuple of bytes, AmqpValue, AmqpSequence or a tuple of "
        f"AmqpSequence, not {type(body).__name__}"
    )


# --- decoding ------------------------------------------------------------------------------------------

_obj_new: Final = object.__new__
_set_properties_dict: Final = D.dict_setter(Properties)
_MAP_TABLE: Final = D.FIELD_TABLES["map"]
_BIN_TABLE: Final = D.FIELD_TABLES["binary"]
_LIST_TABLE: Final = D.FIELD_TABLES["list"]
_TYPED: Final = D.TYPED
_map_items: Final = D._map_items
_by_shape: Final = D.map_by_shape
_learn_shape: Final = D.learn_map_shape
_FAILURES: Final = D.DECODER_FAILURES
# Headers repeat (durable, default priority...): see ``_decode.DecoderMemo``.
_HEADER_CACHE: Final = D.DECODER_MEMO.headers
_HEADER_CACHE_SIZE: Final = D._HEADERS_MAX
_LAST_HEADER: Final = D.DECODER_MEMO.last_header
_PROPS_TAIL: Final = D.DECODER_MEMO.properties_tail
_U32: Final = struct.Struct(">I").unpack_from
_decode_header: Final = Header._decode  # type: ignore[attr-defined]
_decode_properties: Final = Properties._decode  # type: ignore[attr-defined]


def _section_code(buf: Any, pos: int) -> tuple[int, int]:
    """(section code, position of the section's value) for the section starting at ``pos``."""
    if buf[pos] != 0x00:
        raise DecodeError(f"expected a described message section, found constructor 0x{buf[pos]:02x}", pos)
    if buf[pos + 1] == 0x53:
        return buf[pos + 2], pos + 3
    descriptor, vpos = _TYPED[buf[pos + 1]](buf, pos + 2)
    if type(descriptor) is ULong:
        return int(descriptor), vpos
    if type(descriptor) is Symbol and descriptor in _SECTION_NAMES:
        return _SECTION_NAMES[descriptor], vpos
    raise DecodeError(f"unknown message section descriptor {descriptor!r}", pos)


_LAYOUT: Final = D.DECODER_MEMO.message
_DATA8: Final = b"\x00\x53\x75\xa0"
_DATA32: Final = b"\x00\x53\x75\xb0"


def _learn_layout(buf: bytes, offset: int, header: Header | None, props: Properties) -> None:
    """Remember the layout of a valid message (see ``DecoderMemo.message``) if it has the usual one.

    Called only after a strict decode of the whole message succeeded with its application-properties
    decoded by the remembered shape, so every byte read here was already judged.
    """
    if D.DECODE_MODE.opaque:
        return
    p = offset
    if header is not None:
        if not buf.startswith(b"\x00\x53\x70\xc0", p):
            return
        p += 5 + buf[p + 4]
    if p + 8 > len(buf) or not buf.startswith(b"\x00\x53\x73\xc0", p) or buf[p + 6] != 0xA1:
        return
    pend = p + 5 + buf[p + 4]
    id_at = p + 8
    mid_end = id_at + buf[p + 7]
    if mid_end > pend or not buf.startswith(b"\x00\x53\x74\xc1", pend):
        return
    fields = dict(props.__dict__)
    _LAYOUT[:] = [buf[offset:id_at], buf[p + 7], header, fields, buf[mid_end : pend + 6], buf[pend + 4] - 1,
                  buf[pend + 5]]  # fmt: skip


def _decode_message(buf: bytes | bytearray | memoryview, offset: int = 0) -> Message:
    """Decode a message from all the bytes of ``buf`` from ``offset`` on (this is ``Message.decode``).

    A described value inside a section whose descriptor is a spec type but whose contents do not conform
    (``Described(0x23, "x")`` in an ``amqp-value``) comes back as a plain :class:`Described`: the strict pass
    fails, and one retry in the decoder's opaque mode (``_decode.DecodeMode``) keeps such values as they are.

    Raises:
        DecodeError: the bytes are not a valid sequence of message sections.
    """
    if type(buf) is not bytes:
        buf = bytes(buf)
    pos = offset
    try:
        end = len(buf)
        header = da = ma = props = ap = footer = body = None
        bodies: list[Any] | None = None
        last = 0
        shaped = False
        prefix, id_size, layout_header, layout_fields, tail, map_size, map_count = _LAYOUT
        if buf.startswith(prefix, pos):
            # The layout of the last such message (DecoderMemo.message): the same header, properties other
            # than the message id, and application-properties keys; decode the id, the map by its shape,
            # and a final data section here; anything else goes on in the loop below.
            q = pos + len(prefix)
            mid_end = q + id_size
            if buf.startswith(tail, mid_end):
                mpos = mid_end + len(tail)
                mend = mpos + map_size
                if mend <= end:
                    ap = _by_shape(buf, mpos, mend, map_count)
                    if ap is not None:
                        try:
                            message_id = buf[q:mid_end].decode()
                        except UnicodeDecodeError:
                            ap = None  # judged (and reported precisely) by the loop
                    if ap is not None:
                        fields = layout_fields.copy()  # message_id included: overwritten, never added
                        fields["message_id"] = message_id
                        props = _obj_new(Properties)
                        _set_properties_dict(props, fields)
                        header = layout_header
                        pos = mend
                        last = 0x74
                        if buf.startswith(_DATA32, pos):
                            if pos + 8 + _U32(buf, pos + 4)[0] == end:
                                body = buf[pos + 8 : end]
                                pos = end
                        elif buf.startswith(_DATA8, pos) and pos + 5 + buf[pos + 4] == end:
                            body = buf[pos + 5 : end]
                            pos = end
        while pos < end:
            start = pos
            if buf[pos] == 0x00 and buf[pos + 1] == 0x53:
                code = buf[pos + 2]
                pos += 3
            else:
                code, pos = _section_code(buf, pos)
            if code <= last and (code != last or code < 0x75 or code > 0x76):
                raise DecodeError(f"message section 0x{code:02x} is out of order or repeated", start)
            last = code
            c = buf[pos]
            if code == 0x75:  # data
                if c == 0xB0:
                    dend = pos + 5 + _U32(buf, pos + 1)[0]
                    if dend > end:
                        raise D.truncated(pos)
                    v = buf[pos + 5 : dend]
                    pos = dend
                elif c == 0x40:
                    raise DecodeError("a data section cannot be null", pos)
                else:
                    v, pos = _BIN_TABLE[c](buf, pos + 1)
                if bodies is None:
                    bodies = [v]
                else:
                    bodies.append(v)
            elif code == 0x74:  # application-properties
                if c == 0xC1 and buf[pos + 1]:
                    # The same keys in the same order as the last maps: decode by their shape (see
                    # DecoderMemo.shape); otherwise in full, and learn the shape.
                    mend = pos + 2 + buf[pos + 1]
                    count = buf[pos + 2]
                    ap = _by_shape(buf, pos + 3, mend, count) if mend <= end else None
                    if ap is None:
                        mpos = pos + 3
                        ap, pos = _map_items(buf, mpos, mend, count)
                        _learn_shape(buf, mpos, count, ap)
                    else:
                        pos = mend
                        shaped = True
                else:
                    ap, pos = _MAP_TABLE[c](buf, pos + 1)
            elif code == 0x73:
                # A list8 whose first field (message-id) is a str8 and whose other fields are the same bytes
                # as last time: only the message id is new (see DecoderMemo.properties_tail).
                tail = _PROPS_TAIL
                if c == 0xC0 and buf[pos + 3] == 0xA1:
                    vpos = pos
                    pend = pos + 2 + buf[pos + 1]
                    mid_end = pos + 5 + buf[pos + 4]
                    if (
                        buf[pos + 2] == tail[2]
                        and mid_end + len(tail[0]) == pend <= end
                        and buf.startswith(tail[0], mid_end)
                    ):
                        fields = tail[1].copy()
                        fields["message_id"] = buf[pos + 5 : mid_end].decode()
                        props = _obj_new(Properties)
                        _set_properties_dict(props, fields)
                        pos = pend
                        continue
                    props, pos = _decode_properties(buf, vpos)
                    if pos == pend and mid_end <= pend:  # a valid list8: remember what follows the id
                        fields = dict(props.__dict__)
                        del fields["message_id"]
                        tail[:] = [buf[mid_end:pend], fields, buf[vpos + 2]]
                else:
                    props, pos = _decode_properties(buf, pos)
            elif code == 0x70:
                # Headers repeat (durable, default priority...): decoded ones are immutable, so they are
                # cached by their exact bytes (bounded): no Header is built again for every message.
                if c == 0xC0:
                    hend = pos + 2 + buf[pos + 1]
                    if buf.startswith(_LAST_HEADER[0], pos):  # the same header as the last one: no slicing
                        header = _LAST_HEADER[1]
                        pos = hend
                    else:
                        raw = buf[pos:hend]
                        header = _HEADER_CACHE.get(raw)
                        if header is None:
                            header, pos = _decode_header(buf, pos)
                            if len(_HEADER_CACHE) < _HEADER_CACHE_SIZE:
                                _HEADER_CACHE[raw] = header
                        else:
                            pos = hend
                        _LAST_HEADER[:] = (raw, header)
                else:
                    header, pos = _decode_header(buf, pos)
            elif code == 0x72:
                ma, pos = _MAP_TABLE[c](buf, pos + 1)
            elif code == 0x71:
                da, pos = _MAP_TABLE[c](buf, pos + 1)
            elif code == 0x76:
                if c == 0x40:
                    raise DecodeError("an amqp-sequence section cannot be null", pos)
                if bodies is not None and type(bodies[0]) is not AmqpSequence:
                    raise DecodeError(
                        "a message body mixes data, amqp-sequence and amqp-value sections", start
                    )
                v, pos = _LIST_TABLE[c](buf, pos + 1)
                if bodies is None:
                    bodies = [AmqpSequence(v)]
                else:
                    bodies.append(AmqpSequence(v))
            elif code == 0x77:
                if bodies is not None:
                    raise DecodeError(
                        "a message body mixes data, amqp-sequence and amqp-value sections", start
                    )
                v, pos = _TYPED[c](buf, pos + 1)
                body = AmqpValue(v)
            elif code == 0x78:
                footer, pos = _MAP_TABLE[c](buf, pos + 1)
            else:
                raise DecodeError(f"unknown message section descriptor 0x{code:02x}", start)
        if bodies is not None:
            body = bodies[0] if len(bodies) == 1 else tuple(bodies)
        if shaped and props is not None and da is None and ma is None:
            _learn_layout(buf, offset, header, props)
        m = _obj_new(Message)
        _set_message_dict(m, {
            "header": header, "delivery_annotations": da, "message_annotations": ma, "properties": props,
            "application_properties": ap, "body": body, "footer": footer,
        })  # fmt: skip
        return m
    except _FAILURES as exc:
        failure = D.as_decode_error(exc, buf, offset)
    except DecodeError as exc:
        failure = exc
    return _decode_opaque(buf, offset, failure)


def _decode_opaque(buf: bytes, offset: int, failure: DecodeError) -> Message:
    """The strict pass failed: retry once in the decoder's opaque mode, or raise ``failure``."""
    mode = D.DECODE_MODE
    if mode.opaque:
        raise failure
    mode.opaque = True
    try:
        return _decode_message(buf, offset)
    finally:
        mode.opaque = False


@attrs.frozen(kw_only=True, slots=False)  # dict-based: the decoder fills __dict__ in one step
class Message:
    """An AMQP 1.0 bare (or annotated) message (spec 3.2). See the module docstring for ``body``."""

    header: Header | None = None
    delivery_annotations: dict[Any, Any] | None = None
    message_annotations: dict[Any, Any] | None = None
    properties: Properties | None = None
    application_properties: dict[str, Any] | None = None
    body: Any = None
    footer: dict[Any, Any] | None = None

    def encode_parts(self) -> list[bytes]:
        """The encoded sections as a list of byte strings (join them, or write them out as they are)."""
        parts: list[bytes] = []
        if self.header is not None:
            parts.append(self.header._encode())  # type: ignore[attr-defined]
        if self.delivery_annotations is not None:
            parts += (_DA, _annotations(self.delivery_annotations))
        if self.message_annotations is not None:
            parts += (_MA, _annotations(self.message_annotations))
        if self.properties is not None:
            parts.append(self.properties._encode())  # type: ignore[attr-defined]
        if self.application_properties is not None:
            parts += (_AP, _app_properties(self.application_properties))
        body = self.body
        if type(body) is bytes:
            n = len(body)
            parts += (_DATA8 + bytes((n,)) if n < 256 else _DATA32 + n.to_bytes(4, "big"), body)
        elif body is not None:
            parts += _body(body)
        if self.footer is not None:
            parts += (_FOOTER, _annotations(self.footer))
        return parts

    def encode(self) -> bytes:
        """The message's sections, encoded (the payload of a transfer).

        Raises:
            EncodeError: a field cannot be encoded (a local bug).
        """
        return b"".join(self.encode_parts())

    #: ``Message.decode(buf, offset=0) -> Message``: decode the sections in ``buf[offset:]``; raises
    #: :class:`DecodeError` when they are not a valid message (a staticmethod: one call, no wrapper).
    decode = staticmethod(_decode_message)


_set_message_dict: Final = D.dict_setter(Message)
