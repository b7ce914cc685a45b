"""msgpack encoding of RPC frames (the frames themselves are built and checked in ``_protocol``)."""

from __future__ import annotations

from typing import Any

import msgpack

from ._protocol import ErrorCode, RpcProtocolError

__all__ = ["pack", "unpack"]


def pack(frame: dict[str, Any]) -> bytes:
    """One frame as msgpack bytes."""
    return msgpack.packb(frame, use_bin_type=True)


def unpack(data: bytes | str) -> Any:
    """Decode one websocket message.

    Raises:
        RpcProtocolError: a text message, or bytes that are not one msgpack value.
    """
    if isinstance(data, str):
        raise RpcProtocolError(ErrorCode.MALFORMED, "text messages are not used: send binary msgpack")
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        # (msgpack's FormatError, for a reserved type byte such as 0xc1, carries no text)
        detail = str(exc) or "a byte that begins no msgpack value"
        raise RpcProtocolError(ErrorCode.MALFORMED, f"not msgpack: {type(exc).__name__}: {detail}") from None
