"""Protocol headers, frames and the incremental frame buffer (spec 2.2, 2.3, 5.2.1, 5.3.1).

Theory of operation
-------------------
A connection starts with an 8-byte protocol header (``AMQP`` + protocol id + 1.0.0: 0 = AMQP, 2 = TLS,
3 = SASL), then carries frames::

    +------------+------+------+---------+--------------------+-----------------------------------+
    | SIZE (u32) | DOFF | TYPE | CHANNEL | extended header    | body: performative [+ payload]    |
    |            | (u8) | (u8) | (u16)   | (DOFF*4 - 8 bytes) | (absent: empty frame / heartbeat) |
    +------------+------+------+---------+--------------------+-----------------------------------+

SIZE counts the whole frame, header included (so >= 8); DOFF is the body offset in 4-byte words (>= 2).
TYPE 0 is an AMQP frame (the channel is the session's), TYPE 1 a SASL frame (channel ignored).

:class:`FrameBuffer` keeps one ``bytearray``. Once 8 bytes are there it parses the header **once**, checks
SIZE against ``max_frame_size`` and DOFF against SIZE *before* buffering the body (a peer announcing a
4 GiB frame is refused at once, without waiting for or storing its bytes), remembers how many bytes the
frame needs and, on later calls, only compares that with the buffered length (no rescanning); when the
whole frame is there it is decoded and removed with one ``del buf[:size]``.
"""

from __future__ import annotations

import enum
import struct
from typing import Any, Final

import attrs

from . import _decode as D
from ._errors import DecodeError, FramingError
from ._messages import Message, _decode_message
from ._performatives import PERFORMATIVES, SASL_FRAMES, Disposition, Transfer

__all__ = [
    "AMQP_HEADER",
    "EMPTY_FRAME",
    "MIN_MAX_FRAME_SIZE",
    "SASL_HEADER",
    "TLS_HEADER",
    "Frame",
    "FrameBuffer",
    "FrameType",
    "decode_frame",
    "encode_empty_frame",
    "encode_frame",
]

AMQP_HEADER: Final = b"AMQP\x00\x01\x00\x00"  # 2.2: protocol id 0
TLS_HEADER: Final = b"AMQP\x02\x01\x00\x00"  # 5.2.1: protocol id 2
SASL_HEADER: Final = b"AMQP\x03\x01\x00\x00"  # 5.3.1: protocol id 3
EMPTY_FRAME: Final = b"\x00\x00\x00\x08\x02\x00\x00\x00"  # 2.4.5: an empty AMQP frame on channel 0
#: The smallest max-frame-size a peer may announce (spec 2.7.1, MIN-MAX-FRAME-SIZE).
MIN_MAX_FRAME_SIZE: Final = 512
DEFAULT_MAX_FRAME_SIZE: Final = 0xFFFF_FFFF  # spec default of open.max-frame-size

_HEADER: Final = struct.Struct(">IBBH")


class FrameType(enum.IntEnum):
    """The TYPE byte of the frame header (spec 2.3.2, 5.3.1)."""

    AMQP = 0
    SASL = 1


_FRAME_TYPE: Final[dict[type, int]] = {
    **{cls: FrameType.AMQP for cls in PERFORMATIVES},
    **{cls: FrameType.SASL for cls in SASL_FRAMES},
}
_ALLOWED: Final[dict[int, frozenset[type]]] = {
    FrameType.AMQP: frozenset(PERFORMATIVES),
    FrameType.SASL: frozenset(SASL_FRAMES),
}


class Frame:
    """One decoded frame (read-only; frames compare equal when all four attributes do).

    Attributes:
        type: :class:`FrameType` value (0 AMQP, 1 SASL).
        channel: the channel (session) number; 0 for SASL frames.
        performative: the decoded performative or SASL frame; ``None`` for an empty frame (heartbeat).
        payload: the bytes after the performative (the message bytes of a transfer; empty otherwise).

    A frame from :func:`decode_frame` keeps the frame's bytes and the payload's offset in them, and copies
    the payload out only when ``payload`` is first read; :meth:`message` decodes it where it lies.
    """

    __match_args__ = ("type", "channel", "performative", "payload")
    # The decoders build a frame with object.__new__ and one __dict__ (type, channel, performative, and
    # either "payload" or the not yet copied "_buf"/"_at"); __getattr__ runs only for the latter's payload.
    type: int
    channel: int
    performative: Any

    def __init__(self, type: int, channel: int, performative: Any, payload: bytes = b"") -> None:
        _set_dict(self, "__dict__", {
            "type": type, "channel": channel, "performative": performative, "payload": bytes(payload),
        })  # fmt: skip

    def __getattr__(self, name: str) -> Any:
        d = self.__dict__
        if name == "payload":
            try:
                payload = d["payload"] = d["_buf"][d["_at"] :]
            except KeyError:  # another thread copied it out meanwhile
                if "payload" in d:
                    return d["payload"]
            else:
                d.pop("_buf", None)  # the frame's bytes are not kept twice
                d.pop("_at", None)
                return payload
        raise AttributeError(f"'Frame' object has no attribute {name!r}")

    def message(self) -> Message:
        """The payload decoded as one whole message, as ``Message.decode(frame.payload)``.

        Read straight from the frame's bytes when the payload was not copied out yet (a 64 KiB body is then
        copied once, into the message, not twice); a :class:`DecodeError`'s offset then counts from the
        start of the frame.
        """
        d = self.__dict__
        buf, at = d.get("_buf"), d.get("_at")
        if buf is not None and at is not None:
            return _decode_message(buf, at)
        return _decode_message(self.payload)

    def _key(self) -> tuple[int, int, Any, bytes]:
        return self.type, self.channel, self.performative, self.payload

    def __eq__(self, other: object) -> bool:
        return self._key() == other._key() if type(other) is Frame else NotImplemented

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return (
            f"Frame(type={self.type!r}, channel={self.channel!r}, performative={self.performative!r}, "
            f"payload={self.payload!r})"
        )

    def __setattr__(self, name: str, value: Any) -> None:
        raise attrs.exceptions.FrozenInstanceError()

    def __delattr__(self, name: str) -> None:
        raise attrs.exceptions.FrozenInstanceError()


def encode_frame(performative: Any, channel: int = 0, payload: bytes = b"") -> bytes:
    """Encode a whole frame: header, performative and (for a transfer) the payload.

    Args:
        performative: a performative (frame type 0) or SASL frame (frame type 1) instance.
        channel: the outgoing channel number (ignored by peers for SASL frames; keep 0).
        payload: bytes appended after the performative (the message section bytes of a transfer).

    Raises:
        EncodeError: the performative has a field that cannot be encoded (a local bug).
        TypeError: ``performative`` is not a performative or SASL frame.
    """
    ftype = _FRAME_TYPE.get(type(performative))
    if ftype is None:
        raise TypeError(f"not a performative or SASL frame: {type(performative).__name__}")
    body = performative._encode()
    return _HEADER.pack(8 + len(body) + len(payload), 2, ftype, channel) + body + payload


def encode_frame_within(performative: Any, channel: int, max_frame_size: int) -> bytes:
    """:func:`encode_frame` for a ``close``, ``end``, ``detach`` or ``disposition`` whose error description
    would take the frame past the peer's ``max_frame_size``: the description is cut (ending in ``...``) so
    that it fits. Descriptions quote what a peer sent (an address, a claimed user), and a frame above the
    peer's limit is a framing error there, which ends the whole connection instead of one delivery or link.
    A frame that does not fit even without its description is returned as it is.
    """
    frame = encode_frame(performative, channel)
    excess = len(frame) - max_frame_size
    if excess <= 0:
        return frame
    holder = performative.state if isinstance(performative, Disposition) else performative
    error = getattr(holder, "error", None)
    description = getattr(error, "description", None)
    if not description:
        return frame
    raw = description.encode()
    if excess + 3 > len(raw):
        return frame
    cut = raw[: len(raw) - excess - 3].decode(errors="ignore") + "..."
    holder = attrs.evolve(holder, error=attrs.evolve(error, description=cut))
    if isinstance(performative, Disposition):
        return encode_frame(attrs.evolve(performative, state=holder), channel)
    return encode_frame(holder, channel)


def encode_empty_frame(channel: int = 0) -> bytes:
    """An empty AMQP frame (no performative): the heartbeat of spec 2.4.5."""
    if channel == 0:
        return EMPTY_FRAME
    return _HEADER.pack(8, 2, 0, channel)


def _check_header(size: int, doff: int, ftype: int, max_frame_size: int) -> None:
    if size < 8:
        raise FramingError(f"frame SIZE {size} is below the 8-byte header", 0)
    if size > max_frame_size:
        raise FramingError(f"frame SIZE {size} exceeds max-frame-size {max_frame_size}", 0)
    if doff < 2:
        raise FramingError(f"frame DOFF {doff} is below 2", 4)
    if doff * 4 > size:
        raise FramingError(f"frame DOFF {doff} points past the frame's SIZE {size}", 4)
    if ftype not in _ALLOWED:
        raise FramingError(f"unknown frame TYPE 0x{ftype:02x}", 5)


#: Above this SIZE, :meth:`FrameBuffer.next_frame` copies a frame's payload out of its buffer directly.
_LARGE_FRAME_BYTES: Final = 16384
#: How many bytes after the frame header such a frame's performative is first decoded from (a transfer's
#: performative takes a few dozen; a longer one is decoded from the whole frame).
_HEAD_BYTES: Final = 1024
_frame_new: Final = object.__new__
_set_dict: Final = object.__setattr__
_set_frame_dict: Final = D.dict_setter(Frame)
_DESCRIBED: Final = D.TYPED[0x00]
_BY_CODE: Final = D.COMPOSITES_BY_CODE
_AMQP_DECODERS: Final = {int(c.DESCRIPTOR_CODE): c._decode for c in PERFORMATIVES}  # type: ignore[attr-defined]
_SASL_DECODERS: Final = {int(c.DESCRIPTOR_CODE): c._decode for c in SASL_FRAMES}  # type: ignore[attr-defined]
_FAILURES: Final = D.DECODER_FAILURES
_unpack_header: Final = _HEADER.unpack_from


_TRANSFER: Final = D.DECODER_MEMO.transfer
_decode_transfer: Final = Transfer._decode  # type: ignore[attr-defined]
_U32: Final = struct.Struct(">I").unpack_from
_transfer_new: Final = object.__new__
_set_transfer_dict: Final = D.dict_setter(Transfer)


def _transfer(data: bytes, pos: int) -> tuple[Any, int]:
    """Decode the transfer performative at ``data[pos]`` (its list constructor); remember its head and tail.

    A transfer whose bytes before the delivery-id and after the delivery-tag are those of the last one
    (``DecoderMemo.transfer``: the same handle, message-format, settled... in a list8 of the same size)
    decodes only the delivery-id (uint) and delivery-tag (vbin8) from their own bytes; any other transfer
    goes through the full decoder, which judges it.
    """
    head, size, constant, tail = _TRANSFER
    end = pos + size
    if end <= len(data) and data.startswith(head, pos):
        q = pos + len(head)
        c = data[q]
        if c == 0x70 and q + 5 < end:
            delivery_id = _U32(data, q + 1)[0]
            q += 5
        elif c == 0x52 and q + 2 < end:
            delivery_id = data[q + 1]
            q += 2
        elif c == 0x43:
            delivery_id = 0
            q += 1
        else:
            delivery_id = -1
        # every read stays inside this transfer's list (``end``): a shorter transfer goes to the full decoder
        if delivery_id >= 0 and q + 1 < end and data[q] == 0xA0:
            tag_end = q + 2 + data[q + 1]
            if tag_end + len(tail) == end and (not tail or data.startswith(tail, tag_end)):
                fields = constant.copy()
                fields["delivery_id"] = delivery_id
                fields["delivery_tag"] = data[q + 2 : tag_end]
                transfer = _transfer_new(Transfer)
                _set_transfer_dict(transfer, fields)
                return transfer, end
    transfer, end = _decode_transfer(data, pos)
    fields = transfer.__dict__
    if data[pos] == 0xC0 and "delivery_id" in fields and "state" not in fields:
        q = pos + 3
        q += 1 if data[q] == 0x43 else 2 if data[q] == 0x52 else 5  # the handle (a uint)
        head_end = q
        c = data[q]
        q += 1 if c == 0x43 else 2 if c == 0x52 else 5  # the delivery-id
        # learn only a transfer whose list goes on with a vbin8 delivery-tag (a list that ends after the
        # delivery-id is followed by the payload, not by more fields)
        if q + 1 < end and data[q] == 0xA0 and q + 2 + data[q + 1] <= end:
            tag_end = q + 2 + data[q + 1]
            constant = dict(fields)
            del constant["delivery_id"]
            constant.pop("delivery_tag", None)
            _TRANSFER[:] = [data[pos:head_end], end - pos, constant, data[tag_end:end]]
    return transfer, end


_AMQP_DECODERS[0x14] = _transfer


def _decode_body(data: bytes, size: int, doff: int, ftype: int, channel: int) -> Frame:
    """Decode the body of one whole frame; ``data`` is exactly the frame's bytes."""
    pos = doff * 4
    frame = _frame_new(Frame)
    if pos == size:
        _set_frame_dict(frame, {"type": ftype, "channel": channel, "performative": None, "payload": b""})
        return frame
    performative, end = _performative(data, pos, ftype)
    payload = data[end:] if end < size else b""
    _set_frame_dict(frame, {
        "type": ftype, "channel": channel, "performative": performative, "payload": payload,
    })  # fmt: skip
    return frame


def _performative(data: bytes, pos: int, ftype: int) -> tuple[Any, int]:
    """(performative, end) of the frame body starting at ``data[pos]``.

    Every read is bounded by the performative's own declared sizes, so when ``data`` holds only the start
    of a frame, this either decodes the same performative as from the whole frame or raises.
    """
    try:
        if data[pos] != 0x00:
            raise DecodeError(
                f"frame body must start with a described performative, not 0x{data[pos]:02x}", pos
            )
        dec = _BY_CODE.get(data[pos + 2]) if data[pos + 1] == 0x53 else None
        if dec is _decode_transfer:
            dec = _transfer
        if dec is not None:  # the usual `00 53 code` form: straight to the performative's decoder
            performative, end = dec(data, pos + 3)
        else:
            performative, end = _DESCRIBED(data, pos + 1)
    except _FAILURES as exc:
        raise D.as_decode_error(exc, data, pos) from None
    if type(performative) not in _ALLOWED[ftype]:
        kind = "SASL" if ftype == FrameType.SASL else "AMQP"
        raise DecodeError(f"a {kind} frame cannot carry {type(performative).__name__}", pos)
    return performative, end


def decode_frame(data: bytes | bytearray | memoryview, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> Frame:
    """Decode exactly one whole frame (``len(data)`` must equal its SIZE).

    Raises:
        FramingError: bad SIZE / DOFF / TYPE, or ``data`` is not exactly one frame.
        DecodeError: the body is not a valid performative.
    """
    if type(data) is not bytes:
        data = bytes(data)
    n = len(data)
    if n < 8:
        raise FramingError(f"a frame needs at least 8 bytes, got {n}", n)
    size, doff, ftype, channel = _unpack_header(data, 0)
    if size != n or size > max_frame_size or doff < 2 or doff * 4 > size or ftype > 1:
        _check_header(size, doff, ftype, max_frame_size)
        raise FramingError(f"frame SIZE {size} does not match the {n} bytes given", 0)
    pos = doff * 4
    if pos < size and data[pos] == 0x00 and data[pos + 1] == 0x53:
        # The usual `00 53 code` performative: decoded here directly (the hot path of every transfer).
        # Only the decoders of this frame type's performatives are looked up, so the result needs no check.
        dec = (_SASL_DECODERS if ftype else _AMQP_DECODERS).get(data[pos + 2])
        if dec is not None:
            try:
                performative, end = dec(data, pos + 3)
            except _FAILURES as exc:
                raise D.as_decode_error(exc, data, pos) from None
            frame = _frame_new(Frame)
            _set_frame_dict(frame, {
                "type": ftype, "channel": channel, "performative": performative, "_buf": data, "_at": end,
            } if end < size else {
                "type": ftype, "channel": channel, "performative": performative, "payload": b"",
            })  # fmt: skip
            return frame
    return _decode_body(data, size, doff, ftype, channel)


class FrameBuffer:
    """Incremental frame decoder: ``feed`` bytes as they arrive, take protocol headers and frames out.

    Args:
        max_frame_size: the largest frame accepted (our own announced ``max-frame-size``); settable later,
            e.g. once the Open exchange is done.
    """

    __slots__ = ("_buf", "_header", "_need", "max_frame_size")

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        self._buf = bytearray()
        self._need = 0  # SIZE of the frame whose header was already parsed, 0 when none
        self._header: tuple[int, int, int, int] = (0, 0, 0, 0)
        self.max_frame_size = max_frame_size

    @property
    def buffered_bytes(self) -> int:
        """How many received bytes are waiting (an incomplete header or frame)."""
        return len(self._buf)

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Append received bytes."""
        self._buf += data

    def next_protocol_header(self) -> bytes | None:
        """Take the next 8-byte protocol header, or ``None`` if fewer than 8 bytes are buffered.

        Raises:
            FramingError: the bytes are not an ``AMQP`` protocol header (checked as soon as they differ,
                even before 8 bytes arrived). The protocol id and version are returned, not judged.
        """
        buf = self._buf
        n = len(buf)
        if buf[: min(n, 4)] != b"AMQP"[: min(n, 4)]:
            raise FramingError(f"not an AMQP protocol header: {bytes(buf[:8])!r}", 0)
        if n < 8:
            return None
        header = bytes(buf[:8])
        del buf[:8]
        return header

    def next_frame(self) -> Frame | None:
        """Take the next whole frame, or ``None`` if it has not fully arrived yet.

        Raises:
            FramingError: SIZE below 8 or above ``max_frame_size``, DOFF below 2 or past SIZE, unknown TYPE
                (raised as soon as the 8-byte header is buffered).
            DecodeError: the frame's body is not a valid performative (the frame is consumed).
        """
        buf = self._buf
        need = self._need
        if not need:
            if len(buf) < 8:
                return None
            size, doff, ftype, channel = header = _HEADER.unpack_from(buf, 0)
            _check_header(size, doff, ftype, self.max_frame_size)
            self._header = header
            self._need = need = size
        if len(buf) < need:
            return None
        size, doff, ftype, channel = self._header
        self._need = 0
        if size > _LARGE_FRAME_BYTES:
            # Large frames (a big transfer): the performative is decoded from a copy of the frame's first
            # bytes, and the payload is copied out of the buffer once (copying the whole frame and then
            # slicing the payload off it would copy it twice).
            pos = doff * 4
            with memoryview(buf) as view:
                head = bytes(view[: pos + _HEAD_BYTES])
                try:
                    performative, end = _performative(head, pos, ftype) if pos + 3 <= size else (None, 0)
                except DecodeError:  # not within the head (or malformed): judged on the whole frame below
                    performative = None
                if performative is not None:
                    payload = bytes(view[end:size]) if end < size else b""
                else:
                    data = bytes(view[:size])
            del buf[:size]
            if performative is None:
                return _decode_body(data, size, doff, ftype, channel)
            frame = _frame_new(Frame)
            _set_frame_dict(frame, {
                "type": ftype, "channel": channel, "performative": performative, "payload": payload,
            })  # fmt: skip
            return frame
        data = bytes(buf[:size])  # small frames: the slice is cheaper than setting up the view
        del buf[:size]
        return _decode_body(data, size, doff, ftype, channel)

    def frames(self) -> list[Frame]:
        """Every whole frame currently buffered (stops at the first incomplete one)."""
        out = []
        while (frame := self.next_frame()) is not None:
            out.append(frame)
        return out


def is_transfer(frame: Frame) -> bool:
    """True if ``frame`` carries a :class:`Transfer`."""
    return type(frame.performative) is Transfer
