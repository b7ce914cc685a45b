"""Composite types (spec 1.4 "composite type representation"): schema-driven encoders and decoders.

Theory of operation
-------------------
A composite is a described list: ``0x00 <descriptor> <list>`` whose elements are the fields in spec order.
Each composite class here is a frozen attrs class whose fields carry their AMQP type in ``metadata`` (see
:func:`field`); the :func:`composite` class decorator reads that table **once** and generates (``exec``) a
specialised encoder and decoder for the class, so the hot paths do no reflection at all:

* the encoder reads each attribute, writes ``null`` for a value that is ``None`` or equal to the spec
  default (the receiver maps null back to the default, spec 1.4), encodes the rest with the type-specific
  encoder of the field, drops trailing nulls and picks ``list0`` / ``list8`` / ``list32``;
* the decoder accepts all three list encodings, decodes each field through the field's constructor table
  (plain ``int`` / ``str`` / ``bytes``..., see ``_decode.FIELD_TABLES``), maps null or a missing trailing
  field to the spec default, checks mandatory fields, ignores extra trailing fields (the spec allows newer
  versions to add fields), checks that the fields end exactly where the list's size says, and sets the
  instance's ``__dict__`` in one step with the fields present on the wire only (bypassing ``__init__``,
  which for a frozen class costs about twice as much); the spec defaults of the other fields are class
  attributes, which attribute lookup falls back to. This is why composites are dict-based rather than
  slotted attrs classes: measured, a slotted instance needs one descriptor call per field. Field values
  are not re-validated beyond their wire type.

Both are registered with the value codec, so ``encode_value`` / ``decode_value`` handle composites anywhere
(inside maps, as delivery states, ...). A class is identified on decode by its numeric descriptor
(``0x00 0x53 code`` or ``0x00 0x80 ulong``) or its symbolic one (``amqp:open:list``).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any, Final

import attrs

from . import _decode as D
from . import _encode as E
from ._errors import Condition, DecodeError, EncodeError
from ._types import Array, Symbol, ULong

__all__ = ["composite", "field"]

NOTHING: Final = attrs.NOTHING


def field(kind: str, default: Any = NOTHING, *, allowed: tuple[type, ...] | None = None) -> Any:
    """Declare a composite field.

    Args:
        kind: the wire type of the field: ``boolean``, ``ubyte``, ``ushort``, ``uint``, ``ulong``,
            ``timestamp``, ``binary``, ``string``, ``symbol``, ``symbols`` (symbol, multiple="true"),
            ``fields`` (map with symbol keys), ``annotations`` (map with symbol or ulong keys), ``map``,
            ``any`` (the spec's ``*``), ``message-id`` (``*``; a plain ``int`` is written as ulong), or
            ``described`` (a composite; ``allowed`` lists the classes).
        default: the spec default; omitted means mandatory (no default, never null on the wire).
        allowed: for ``described`` fields, the accepted classes.
    """
    return attrs.field(default=default, metadata={"amqp": (kind, allowed)})


def _enc_binary(v: Any) -> bytes:
    if type(v) is not bytes:
        if not isinstance(v, bytes | bytearray | memoryview):
            raise EncodeError(f"binary field needs bytes, not {type(v).__name__}")
        v = bytes(v)
    return E.enc_binary(v)


def _enc_symbols(v: Any) -> bytes:
    """A symbol field with multiple="true": always written as an array of symbols (as Proton does)."""
    if isinstance(v, str):
        v = (v,)
    elif not isinstance(v, tuple | list | frozenset | set):
        raise EncodeError(f"a multiple symbol field needs a tuple of symbols, not {type(v).__name__}")
    return E.enc_array(Array("symbol", tuple(v)))


def _map_keys(key_encoder: Callable[[Any], bytes]) -> Callable[[Any], bytes]:
    def enc(v: Any) -> bytes:
        if not isinstance(v, dict):
            raise EncodeError(f"map field needs a dict, not {type(v).__name__}")
        parts: list[bytes] = []
        append = parts.append
        for k, x in v.items():
            append(key_encoder(k))
            append(E.encode_value(x))
        return E._compound(0xC1, 0xD1, 2 * len(v), b"".join(parts))

    return enc


def _symbol_key(k: Any) -> bytes:
    if isinstance(k, str):
        return E.enc_symbol(k)
    raise EncodeError(f"this map needs symbol keys, not {k!r}")


def _annotation_key(k: Any) -> bytes:
    if isinstance(k, str):
        return E.enc_symbol(k)
    if isinstance(k, int) and not isinstance(k, bool):
        return E.enc_ulong(k)
    raise EncodeError(f"annotation keys are symbols or ulongs, not {k!r}")


def _enc_message_id(v: Any) -> bytes:
    """message-id (spec 3.2.11-3.2.15): ulong, uuid, binary or string; a plain ``int`` is a ulong."""
    if type(v) is int:
        return E.enc_ulong(v)
    return E.encode_value(v)


def _enc_map(v: Any) -> bytes:
    if not isinstance(v, dict):
        raise EncodeError(f"map field needs a dict, not {type(v).__name__}")
    return E.enc_map(v)


FIELD_ENCODERS: Final[dict[str, Callable[[Any], bytes]]] = {
    "boolean": E.enc_bool,
    "ubyte": E.enc_ubyte,
    "ushort": E.enc_ushort,
    "uint": E.enc_uint,
    "ulong": E.enc_ulong,
    "timestamp": E.enc_timestamp,
    "binary": _enc_binary,
    "string": E.enc_string,
    "symbol": E.enc_symbol,
    "symbols": _enc_symbols,
    "fields": _map_keys(_symbol_key),
    "annotations": _map_keys(_annotation_key),
    "map": _enc_map,
    "list": E.enc_list,
    "any": E.encode_value,
    "message-id": _enc_message_id,
    "described": E.encode_value,
}
FIELD_DECODE_KIND: Final = {"fields": "map", "annotations": "map", "message-id": "any"}


def missing_field(cls_name: str, name: str) -> EncodeError:
    return EncodeError(f"{cls_name}.{name} is mandatory and cannot be None")


def descriptor_prefix(code: int) -> bytes:
    return b"\x00\x53" + bytes((code,))


def composite(code: int, name: str) -> Callable[[type], type]:
    """Class decorator: register an attrs class as the composite with descriptor ``code`` / ``name``.

    Must be applied on top of ``@attrs.frozen(kw_only=True, slots=False)``; the fields must be declared with
    :func:`field`, in spec order.
    """

    def wrap(cls: type) -> type:
        specs = []
        for a in attrs.fields(cls):  # type: ignore[misc]
            kind, allowed = a.metadata["amqp"]
            default = None if a.default is NOTHING else a.default
            specs.append((a.name, kind, default, a.default is NOTHING, allowed))
        prefix = descriptor_prefix(code)
        encode = _make_encoder(cls, prefix, specs)
        decode = _make_decoder(cls, specs)
        cls.DESCRIPTOR_CODE = ULong(code)  # type: ignore[attr-defined]
        cls.DESCRIPTOR_NAME = Symbol(name)  # type: ignore[attr-defined]
        cls.FIELD_KINDS = tuple((s[0], s[1]) for s in specs)  # type: ignore[attr-defined]
        # Class-level defaults: a decoded instance's __dict__ holds only the fields present on the wire, and
        # attribute lookup finds the spec default on the class for the others (no per-instance copy).
        for field_name, _kind, default, mandatory, _allowed in specs:
            if not mandatory:
                type.__setattr__(cls, field_name, default)
        cls._encode = encode  # type: ignore[attr-defined]
        cls._decode = staticmethod(decode)  # type: ignore[attr-defined]
        E.register_encoder(cls, encode)
        D.COMPOSITES_BY_CODE[code] = decode
        D.COMPOSITES_BY_NAME[name] = decode
        return cls

    return wrap


def _make_encoder(cls: type, prefix: bytes, specs: list[tuple[Any, ...]]) -> Callable[[Any], bytes]:
    ns: dict[str, Any] = {
        "NULL": E.NULL,
        "PREFIX0": prefix + E.LIST0,
        "PREFIX8": prefix + b"\xc0",
        "PREFIX32": prefix + b"\xd0",
        "pack_II": struct.Struct(">II").pack,
        "missing": missing_field,
        "CLS": cls.__name__,
        "EncodeError": EncodeError,
        "TRUE": E.TRUE,
        "FALSE": E.FALSE,
        "STR8": E._STR8,
        "BIN8": E._BIN8,
        "SMALLUINT": E._SMALLUINT,
        "pack_BI": struct.Struct(">BI").pack,
    }
    # Each field's encoding goes to a local e<i> (NULL for None or the default); then an if/elif chain
    # from the last field backwards picks the tuple without the trailing nulls (no list, no popping).
    n = len(specs)
    lines = ["def encode(self):"]
    for i, (name, kind, default, mandatory, _allowed) in enumerate(specs):
        ns[f"E{i}"] = FIELD_ENCODERS[kind]
        ns[f"D{i}"] = default
        lines.append(f"    v = self.{name}")
        if mandatory:
            lines.append(f"    if v is None: raise missing(CLS, {name!r})")
            if kind == "symbols":  # mandatory + multiple: at least one value (spec 1.3)
                lines.append(f"    if not v: raise missing(CLS, {name!r})")
            lines.append(f"    e{i} = {_inline(kind, i)}")
        elif default is None:
            lines.append(f"    e{i} = NULL if v is None else {_inline(kind, i)}")
        else:
            lines.append(f"    e{i} = NULL if v is None or v == D{i} else {_inline(kind, i)}")
    for i in range(n - 1, -1, -1):
        fields = ", ".join(f"e{j}" for j in range(i + 1))
        keyword = "if" if i == n - 1 else "elif"
        lines += [f"    {keyword} e{i} is not NULL:", f"        p = ({fields},)"]
    lines += [
        ("    else:" if n else "    if True:"),
        "        return PREFIX0",
        "    body = b''.join(p)",
        "    s = len(body)",
        "    k = len(p)",
        "    if s < 255:",
        "        return PREFIX8 + bytes((s + 1, k)) + body",
        "    return PREFIX32 + pack_II(s + 4, k) + body",
    ]
    exec("\n".join(lines), ns)  # the source is built above from the class's own field table
    return ns["encode"]  # type: ignore[no-any-return]


def _inline(kind: str, i: int) -> str:
    """The expression encoding ``v`` for a field of ``kind``: the usual values inline, the rest via ``E<i>``.

    Each inline branch produces exactly what the field's encoder would (the fallback is that encoder), and
    saves a call per field.
    """
    if kind == "boolean":
        return "(TRUE if v else FALSE)"
    if kind == "uint":
        return (
            f"((SMALLUINT[v] if v < 256 else pack_BI(0x70, v)) if type(v) is int and 0 <= v <= 0xFFFFFFFF "
            f"else E{i}(v))"
        )
    if kind in ("string", "any", "message-id"):
        return f"(STR8[len(v)] + v.encode() if type(v) is str and len(v) < 256 and v.isascii() else E{i}(v))"
    if kind == "binary":
        return f"(BIN8[len(v)] + v if type(v) is bytes and len(v) < 256 else E{i}(v))"
    return f"E{i}(v)"


def _make_decoder(cls: type, specs: list[tuple[Any, ...]]) -> Callable[[Any, int], tuple[Any, int]]:
    ns: dict[str, Any] = {
        "new": object.__new__,
        "set_dict": D.dict_setter(cls),
        "C": cls,
        "U32x2": struct.Struct(">II").unpack_from,
        "U32": struct.Struct(">I").unpack_from,
        "DecodeError": DecodeError,
        "truncated": D.truncated,
        "TYPED": D.TYPED,
        "INVALID_FIELD": Condition.INVALID_FIELD,
    }
    n = len(specs)
    required = max((i + 1 for i, spec in enumerate(specs) if spec[3]), default=0)
    lines = [
        "def decode(buf, pos):",
        "    start = pos",
        "    c = buf[pos]",
        "    if c == 0xc0:",
        "        size = buf[pos + 1]",
        "        count = buf[pos + 2]",
        "        end = pos + 2 + size",
        "        pos += 3",
        "        if size < 1: raise DecodeError('list8 size must count its count byte', start)",
        "    elif c == 0x45:",
        "        count = 0",
        "        pos += 1",
        "        end = pos",
        "    elif c == 0xd0:",
        "        size, count = U32x2(buf, pos + 1)",
        "        end = pos + 5 + size",
        "        pos += 9",
        "        if size < 4: raise DecodeError('list32 size must count its count field', start)",
        "    else:",
        f"        raise DecodeError('{cls.__name__} must be a list, found constructor 0x%02x' % c, start)",
        "    if end > len(buf): raise truncated(start)",
        "    if count > end - pos: raise DecodeError('list count cannot fit in its size', start)",
    ]
    if required:
        lines.append(
            f"    if count < {required}: raise DecodeError('{cls.__name__} lacks mandatory fields', start, "
            "condition=INVALID_FIELD)"
        )
    lines.append("    d = {}")

    # The instance dict starts empty (defaults live on the class); field i is decoded inside "if count > i"
    # (nested, so absent trailing fields cost nothing) and stored only when it is not null.
    for i, (name, kind, _default, mandatory, allowed) in enumerate(specs):
        ns[f"T{i}"] = D.FIELD_TABLES[FIELD_DECODE_KIND.get(kind, kind)]
        ns[f"A{i}"] = allowed
        ind = "    " * (i + 1)
        lines += [f"{ind}if count > {i}:", f"{ind}    c = buf[pos]"]
        # Inline the one-byte encodings of the commonest field types; the rest go through the table.
        if kind in ("uint", "ulong"):
            small, zero = (0x52, 0x43) if kind == "uint" else (0x53, 0x44)
            lines += [
                f"{ind}    if c == {small}:",
                f"{ind}        d[{name!r}] = buf[pos + 1]",
                f"{ind}        pos += 2",
                f"{ind}    elif c == {zero}:",
                f"{ind}        d[{name!r}] = 0",
                f"{ind}        pos += 1",
            ]
        elif kind == "boolean":
            lines += [
                f"{ind}    if c == 0x42:",
                f"{ind}        d[{name!r}] = False",
                f"{ind}        pos += 1",
                f"{ind}    elif c == 0x41:",
                f"{ind}        d[{name!r}] = True",
                f"{ind}        pos += 1",
            ]
        else:
            lines += [f"{ind}    if False:", f"{ind}        pass"]
        if kind == "uint":
            lines += [
                f"{ind}    elif c == 0x70:",
                f"{ind}        d[{name!r}] = U32(buf, pos + 1)[0]",
                f"{ind}        pos += 5",
            ]
        elif kind in ("binary", "string", "any", "message-id"):
            code, conv = (0xA0, "") if kind == "binary" else (0xA1, ".decode()")
            lines += [
                f"{ind}    elif c == {code}:",
                f"{ind}        e = pos + 2 + buf[pos + 1]",
                f"{ind}        if e > end: raise truncated(pos)",
                f"{ind}        d[{name!r}] = buf[pos + 2 : e]{conv}",
                f"{ind}        pos = e",
            ]
        lines += [f"{ind}    elif c == 0x40:"]
        if mandatory:
            lines.append(
                f"{ind}        raise DecodeError('{cls.__name__}.{name} is mandatory but null', pos, "
                "condition=INVALID_FIELD)"
            )
        else:
            lines.append(f"{ind}        pos += 1")
        lines += [f"{ind}    else:", f"{ind}        v, pos = T{i}[c](buf, pos + 1)"]
        if allowed is not None:
            lines.append(
                f"{ind}        if not isinstance(v, A{i}): raise DecodeError("
                f"'{cls.__name__}.{name} cannot hold ' + type(v).__name__, pos, condition=INVALID_FIELD)"
            )
        if mandatory and kind == "symbols":  # mandatory + multiple: at least one value (spec 1.3)
            lines.append(
                f"{ind}        if not v: raise DecodeError('{cls.__name__}.{name} needs at least one value', "
                "pos, condition=INVALID_FIELD)"
            )
        lines.append(f"{ind}        d[{name!r}] = v")
    ind = "    " * (n + 1)
    lines += [
        f"{ind}if count > {n}:",
        f"{ind}    for _ in range(count - {n}):",
        f"{ind}        _, pos = TYPED[buf[pos]](buf, pos + 1)",
        "    if pos != end:",
        f"        raise DecodeError('{cls.__name__} fields do not match the list size', pos)",
        "    o = new(C)",
        "    set_dict(o, d)",
        "    return o, pos",
    ]
    exec("\n".join(lines), ns)  # the source is built above from the class's own field table
    return ns["decode"]  # type: ignore[no-any-return]
