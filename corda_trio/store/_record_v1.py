"""PURE codec of format version 1 (read only: a store written in it is migrated when it opens).

Format version 1 had 32-byte record headers without a sequence number and no seal records, so it could
not tell a bit flip in the last record, a truncation at a record boundary or a deleted segment from a
clean state (``protocol_spec/store-format.md`` §8). This module keeps its reader so that such a store
still opens: ``_recovery.py`` recovers it with these rules, then rewrites its live messages into one
format-2 segment. The encoders remain for the migration tests.
"""

from __future__ import annotations

import enum
import struct
import zlib
from array import array
from typing import Final

import attrs

__all__ = [
    "ACK_RECORD_BYTES",
    "FORMAT_VERSION",
    "MAX_RECORD_BYTES",
    "RECORD_HEADER_BYTES",
    "SEGMENT_HEADER_BYTES",
    "SEGMENT_MAGIC",
    "RecordKind",
    "ScanResult",
    "StopReason",
    "Verdict",
    "append_ack",
    "append_enqueue",
    "append_enqueue_located",
    "classify_stop",
    "decode_enqueue_body",
    "decode_segment_header",
    "encode_segment_header",
    "find_records",
    "pack_location",
    "scan_records",
    "unpack_location",
]

SEGMENT_MAGIC: Final = b"CTWALSEG"
FORMAT_VERSION: Final = 1
#: magic(8) version(u32) header_length(u32) segment_number(u64) base_id(u64) crc(u32) reserved(u32)
_SEGMENT_HEADER: Final = struct.Struct("<8sIIQQII")
SEGMENT_HEADER_BYTES: Final = _SEGMENT_HEADER.size  # 40
_SEGMENT_CRC_SPAN: Final = 32

#: length(u32) crc(u32) kind(u8) flags(u8) reserved(u16) message_id(u64) timestamp_ms(u64) meta_length(u32)
_RECORD_HEADER: Final = struct.Struct("<IIBBHQQI")
RECORD_HEADER_BYTES: Final = _RECORD_HEADER.size  # 32
#: the checksummed part of the header: kind .. meta_length
_RECORD_TAIL: Final = struct.Struct("<BBHQQI")
_RECORD_PREFIX: Final = struct.Struct("<II")  # length, crc
_pack_tail: Final = _RECORD_TAIL.pack
_pack_prefix: Final = _RECORD_PREFIX.pack
_crc32: Final = zlib.crc32
ACK_RECORD_BYTES: Final = RECORD_HEADER_BYTES
#: Upper bound of one record (header + meta + payload): 256 MiB. Larger length fields are corruption.
MAX_RECORD_BYTES: Final = 256 * 1024 * 1024


class RecordKind(enum.IntEnum):
    """The ``kind`` byte of a record."""

    ENQUEUE = 1
    ACK = 2


_ENQUEUE: Final = int(RecordKind.ENQUEUE)
_ACK: Final = int(RecordKind.ACK)


def encode_segment_header(segment_number: int, base_id: int) -> bytes:
    """The 40-byte header that starts segment ``segment_number``.

    ``base_id`` is the next message id the queue would assign when the segment was created: every id in
    this segment and later ones is at least ``base_id``, and it survives even when compaction has removed
    every older segment, so ids never go backwards after a restart.
    """
    fields = (SEGMENT_MAGIC, FORMAT_VERSION, SEGMENT_HEADER_BYTES, segment_number, base_id)
    crc = zlib.crc32(_SEGMENT_HEADER.pack(*fields, 0, 0)[:_SEGMENT_CRC_SPAN])
    return _SEGMENT_HEADER.pack(*fields, crc, 0)


def decode_segment_header(data: bytes | bytearray | memoryview) -> tuple[int, int]:
    """Validate a segment header and return ``(segment_number, base_id)``.

    Raises:
        ValueError: the header is short, has the wrong magic, an unknown version or a bad checksum
            (the message says which).
    """
    if len(data) < SEGMENT_HEADER_BYTES:
        raise ValueError(f"segment header is {len(data)} bytes, expected {SEGMENT_HEADER_BYTES}")
    magic, version, header_len, number, base_id, crc, reserved = _SEGMENT_HEADER.unpack_from(data, 0)
    if magic != SEGMENT_MAGIC:
        raise ValueError(f"bad segment magic {bytes(magic)!r}, expected {SEGMENT_MAGIC!r}")
    if zlib.crc32(memoryview(data)[:_SEGMENT_CRC_SPAN]) != crc:
        raise ValueError("segment header checksum mismatch")
    if version != FORMAT_VERSION or header_len != SEGMENT_HEADER_BYTES or reserved:
        raise ValueError(f"unsupported segment format version {version} (header length {header_len})")
    return int(number), int(base_id)


def append_enqueue(buf: bytearray, message_id: int, timestamp_ms: int, meta: bytes, payload: bytes) -> int:
    """Append one enqueue record to ``buf``; returns the record's length in bytes.

    The same bytes as :func:`append_enqueue_located`, which the group commit uses (it also wants the
    record's index entry).
    """
    start = len(buf)
    append_enqueue_located(buf, message_id, timestamp_ms, meta, payload)
    return len(buf) - start


def append_enqueue_located(
    buf: bytearray, message_id: int, timestamp_ms: int, meta: bytes, payload: bytes
) -> int:
    """Append one enqueue record to ``buf``; return its packed location (:func:`pack_location`) in
    segment 0 at its offset in ``buf``: the group commit's per-record index entry, computed while the
    lengths are at hand (the writer later adds the batch's segment and file offset in one addition).

    This is the hot path of every enqueue: two ``pack`` calls and two or three ``crc32`` calls over the
    caller's buffers, no intermediate copies besides the appends themselves.
    """
    offset = len(buf)
    meta_len = len(meta)
    length = RECORD_HEADER_BYTES + meta_len + len(payload)
    if length > MAX_RECORD_BYTES:
        raise ValueError(f"record of {length} bytes exceeds the maximum of {MAX_RECORD_BYTES}")
    tail = _pack_tail(_ENQUEUE, 0, 0, message_id, timestamp_ms, meta_len)
    if meta_len:
        buf += _pack_prefix(length, _crc32(payload, _crc32(meta, _crc32(tail))))
        buf += tail
        buf += meta
    else:
        buf += _pack_prefix(length, _crc32(payload, _crc32(tail)))
        buf += tail
    buf += payload
    return (timestamp_ms << _TS_SHIFT) | (meta_len << _META_SHIFT) | (length << _LEN_SHIFT) | offset


def append_ack(buf: bytearray, message_id: int) -> None:
    """Append one 32-byte ack record for ``message_id`` to ``buf``."""
    tail = _RECORD_TAIL.pack(_ACK, 0, 0, message_id, 0, 0)
    buf += ACK_RECORD_BYTES.to_bytes(4, "little")
    buf += zlib.crc32(tail).to_bytes(4, "little")
    buf += tail


def decode_enqueue_body(record: bytes | memoryview) -> tuple[int, int, bytes, bytes]:
    """Decode a whole enqueue record read back from disk: ``(message_id, timestamp_ms, meta, payload)``.

    The checksum is verified again: a record read lazily for delivery is checked like one scanned.

    Raises:
        ValueError: the bytes are not one valid enqueue record.
    """
    if len(record) < RECORD_HEADER_BYTES:
        raise ValueError("record shorter than its header")
    length, crc, kind, flags, _r, message_id, ts, meta_len = _RECORD_HEADER.unpack_from(record, 0)
    if length != len(record) or kind != _ENQUEUE or flags or RECORD_HEADER_BYTES + meta_len > length:
        raise ValueError(f"not a well-formed enqueue record (length {length}, kind {kind})")
    view = memoryview(record)
    if zlib.crc32(view[8:length]) != crc:
        raise ValueError(f"checksum mismatch in record of message {message_id}")
    body = RECORD_HEADER_BYTES + meta_len
    return message_id, ts, bytes(view[RECORD_HEADER_BYTES:body]), bytes(view[body:length])


# A message's location packed into one int, so that the in-memory index of a million messages is one
# dict of ints (about 100 bytes per message) rather than a million objects. Fields, low bits first:
# offset (40 bits), record length (32), meta length (32), segment number (32), enqueue timestamp ms (rest).
_OFFSET_BITS: Final = 40
_LEN_SHIFT: Final = 40
_META_SHIFT: Final = 72
_SEG_SHIFT: Final = 104
_TS_SHIFT: Final = 136
_MASK32: Final = 0xFFFFFFFF
_MASK40: Final = (1 << _OFFSET_BITS) - 1


def pack_location(segment: int, offset: int, length: int, meta_length: int, timestamp_ms: int) -> int:
    """Pack where an enqueue record lives into one int (see :func:`unpack_location`)."""
    return (
        (timestamp_ms << _TS_SHIFT)
        | (segment << _SEG_SHIFT)
        | (meta_length << _META_SHIFT)
        | (length << _LEN_SHIFT)
        | offset
    )


def unpack_location(loc: int) -> tuple[int, int, int, int, int]:
    """``(segment, offset, length, meta_length, timestamp_ms)`` of a packed location."""
    return (
        (loc >> _SEG_SHIFT) & _MASK32,
        loc & _MASK40,
        (loc >> _LEN_SHIFT) & _MASK32,
        (loc >> _META_SHIFT) & _MASK32,
        loc >> _TS_SHIFT,
    )


class StopReason(enum.Enum):
    """Why :func:`scan_records` stopped before the end of the buffer."""

    SHORT_HEADER = "fewer bytes left than a record header"
    BAD_LENGTH = "record length field out of range"
    PAST_END = "record runs past the end of the file"
    BAD_CHECKSUM = "checksum mismatch"
    BAD_KIND = "unknown record kind or non-zero reserved field"
    BAD_META = "meta length larger than the record"
    ID_NOT_INCREASING = "enqueue message id not greater than the previous one"
    BAD_ACK = "ack record with a body"


@attrs.define(eq=False)
class ScanResult:
    """Output of :func:`scan_records`: parallel arrays, no per-record objects.

    ``enqueue_ids[i]`` lives at ``enqueue_locations[i]`` (a :func:`pack_location`); ``ack_ids`` lists acks
    in log order with ``ack_offsets``. ``end`` is the offset just after the last good record; when the scan
    stopped early ``stop`` says why and ``stop_offset == end``.
    """

    enqueue_ids: array[int]
    enqueue_locations: list[int]
    enqueue_bytes: int
    ack_ids: array[int]
    ack_offsets: array[int]
    end: int
    last_enqueue_id: int
    stop: StopReason | None = None
    detail: str = ""


def scan_records(
    data: bytes | bytearray | memoryview, start: int, segment: int, previous_enqueue_id: int
) -> ScanResult:
    """Scan records of one segment from ``start`` (just after the header) to the end of ``data``.

    Args:
        data: the whole segment file.
        start: offset of the first record (:data:`SEGMENT_HEADER_BYTES`).
        segment: the segment number, packed into each location.
        previous_enqueue_id: the highest enqueue id of earlier segments (or -1): ids must keep increasing.
    """
    view = memoryview(data)
    size = len(view)
    unpack = _RECORD_HEADER.unpack_from
    crc32 = zlib.crc32
    ids: array[int] = array("Q")
    locs: list[int] = []
    acks: array[int] = array("Q")
    ack_offsets: array[int] = array("Q")
    add_id = ids.append
    add_loc = locs.append
    seg_bits = segment << _SEG_SHIFT
    last = previous_enqueue_id
    enqueue_bytes = 0
    pos = start
    header = RECORD_HEADER_BYTES
    stop: StopReason | None = None
    detail = ""
    while pos < size:
        if size - pos < header:
            stop = StopReason.SHORT_HEADER
            break
        length, crc, kind, flags, reserved, mid, ts, meta_len = unpack(view, pos)
        if length < header or length > MAX_RECORD_BYTES:
            stop, detail = StopReason.BAD_LENGTH, f"length {length}"
            break
        end = pos + length
        if end > size:
            stop, detail = StopReason.PAST_END, f"length {length}, {size - pos} bytes left"
            break
        if crc32(view[pos + 8 : end]) != crc:
            stop = StopReason.BAD_CHECKSUM
            break
        if kind == _ENQUEUE and not flags and not reserved:
            if header + meta_len > length:
                stop, detail = StopReason.BAD_META, f"meta length {meta_len}"
                break
            if mid <= last:
                stop, detail = StopReason.ID_NOT_INCREASING, f"id {mid} after {last}"
                break
            last = mid
            add_id(mid)
            add_loc((ts << _TS_SHIFT) | seg_bits | (meta_len << _META_SHIFT) | (length << _LEN_SHIFT) | pos)
            enqueue_bytes += length
        elif kind == _ACK and not flags and not reserved:
            if length != header or meta_len:
                stop = StopReason.BAD_ACK
                break
            acks.append(mid)
            ack_offsets.append(pos)
        else:
            stop, detail = StopReason.BAD_KIND, f"kind {kind}, flags {flags}, reserved {reserved}"
            break
        pos = end
    return ScanResult(
        enqueue_ids=ids,
        enqueue_locations=locs,
        enqueue_bytes=enqueue_bytes,
        ack_ids=acks,
        ack_offsets=ack_offsets,
        end=pos,
        last_enqueue_id=last,
        stop=stop,
        detail=detail,
    )


def find_records(data: bytes | bytearray, start: int) -> list[tuple[int, int, int, int]]:
    """Well-formed records (good checksum) anywhere in ``data[start:]``: ``(offset, length, kind, id)``.

    Used after a scan stopped: to tell a torn tail (nothing valid can follow it) from corruption, and to
    list what a quarantined segment held past the bad spot. Candidates are found with ``bytes.find`` on
    the kind/flags/reserved bytes, so this is fast even on a large segment.
    """
    raw = bytes(data) if not isinstance(data, bytes) else data
    candidates: list[int] = []
    for marker in (b"\x01\x00\x00\x00", b"\x02\x00\x00\x00"):
        pos = raw.find(marker, start + 8)
        while pos != -1:
            candidates.append(pos - 8)
            pos = raw.find(marker, pos + 1)
    candidates.sort()
    view = memoryview(raw)
    found: list[tuple[int, int, int, int]] = []
    next_free = start
    for pos in candidates:
        if pos < next_free or pos + RECORD_HEADER_BYTES > len(raw):
            continue
        length, crc, kind, _flags, _reserved, mid, _ts, meta_len = _RECORD_HEADER.unpack_from(raw, pos)
        if length < RECORD_HEADER_BYTES or pos + length > len(raw) or RECORD_HEADER_BYTES + meta_len > length:
            continue
        if kind == _ACK and length != RECORD_HEADER_BYTES:
            continue
        if zlib.crc32(view[pos + 8 : pos + length]) != crc:
            continue
        found.append((pos, length, kind, mid))
        next_free = pos + length
    return found


class Verdict(enum.Enum):
    """What a scan stop means (see the module docstring)."""

    TORN_TAIL = "torn tail"
    CORRUPT = "corrupt record"


def classify_stop(
    data: bytes | bytearray | memoryview, result: ScanResult, *, is_last_segment: bool
) -> Verdict:
    """Decide whether the place where ``result`` stopped is a torn tail or corruption.

    Only the last segment can have a torn tail. There, whatever follows the last well-formed record is a
    torn tail if no well-formed record follows it: a header cut short, a length running past the end, a
    record whose checksum fails, zero-filled blocks (allocated but never written: a power loss), or a
    mix of these. A well-formed record after the bad spot, or a record whose checksum is good but whose
    content is wrong (an id out of order, an unknown kind), is corruption.
    """
    if result.stop is None:
        raise ValueError("the scan did not stop early")
    if not is_last_segment:
        return Verdict.CORRUPT
    verdict = _classify_last(data, result)
    if verdict is Verdict.TORN_TAIL and find_records(bytes(data), result.end + 1):
        # An append cut short leaves a prefix: nothing valid can follow the incomplete record. A valid
        # record after it means the bad one was damaged in place (a flipped length bit, say).
        return Verdict.CORRUPT
    return verdict


#: Stops that an append cut short can produce: what follows the last whole record is a prefix of the
#: write, and with a power loss some of its blocks may read back as zeros (allocated, never written).
_TORN_STOPS: Final = frozenset(
    {StopReason.SHORT_HEADER, StopReason.PAST_END, StopReason.BAD_LENGTH, StopReason.BAD_CHECKSUM}
)


def _classify_last(data: bytes | bytearray | memoryview, result: ScanResult) -> Verdict:
    # A record whose checksum is good but whose content is wrong was written so: never a torn write.
    # Anything else is a torn tail here, provided no well-formed record follows (``classify_stop``).
    return Verdict.TORN_TAIL if result.stop in _TORN_STOPS else Verdict.CORRUPT
