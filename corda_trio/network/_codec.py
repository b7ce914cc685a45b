"""Canonical msgpack encoding of the network map's wire forms.

``decode`` refuses anything that would not re-encode to the same bytes (non-shortest integers, maps, floats,
extension types, trailing bytes), so that every signed or hashed value has exactly one encoding.
"""

from __future__ import annotations

from typing import Any, Final

import msgpack

from ._errors import MalformedPayloadError

__all__ = ["MAX_PAYLOAD_BYTES", "decode", "encode"]

#: Largest payload we decode (a map of 100k entries is ~3.5 MB).
MAX_PAYLOAD_BYTES: Final[int] = 64 * 1024 * 1024


def encode(obj: Any) -> bytes:
    """msgpack with bin for bytes and str for text (shortest forms; msgpack always chooses them)."""
    return msgpack.packb(obj, use_bin_type=True)


def decode(data: bytes, *, what: str = "payload") -> Any:
    """Decode ``data`` and check that it is the canonical encoding of what it decodes to.

    Raises:
        MalformedPayloadError: not msgpack, trailing data, types outside arrays/ints/bytes/str/bool/nil, or a
            non-canonical encoding.
    """
    if len(data) > MAX_PAYLOAD_BYTES:
        raise MalformedPayloadError(f"{what}: {len(data)} bytes is larger than {MAX_PAYLOAD_BYTES}")
    try:
        obj = msgpack.unpackb(data, raw=False, use_list=True, strict_map_key=True)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError, TypeError) as exc:
        raise MalformedPayloadError(f"{what} is not valid msgpack: {type(exc).__name__}") from None
    _check_types(obj, what)
    if encode(obj) != data:
        raise MalformedPayloadError(f"{what} is not in canonical encoding")
    return obj


def _check_types(obj: Any, what: str, depth: int = 0) -> None:
    if depth > 8:
        raise MalformedPayloadError(f"{what} is nested too deeply")
    if isinstance(obj, list):
        for item in obj:
            _check_types(item, what, depth + 1)
    elif obj is not None and not isinstance(obj, bool | int | bytes | str):
        raise MalformedPayloadError(f"{what} contains a {type(obj).__name__}, which the wire form never uses")
