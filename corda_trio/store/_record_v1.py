"""PURE codec of format version 1 (read only: a store written in it is migrated when it opens).

Format version 1 had 32-byte record headers without a sequence number and no seal records, so it could
not tell a bit flip in the last record, a truncation at a record boundary or a deleted segment from a
clean state (``protocol_spec/store-format.md`` §8). This module keeps its reader so that such a store
still opens: ``_recovery.py`` recovers it with these rules, then rewrites its live messages into one
format-2 segment. The encoders remain for the migration tests.

What both versions share lives in :mod:`._record` and is used from there: the record kinds, the record
size limit, the framing (length, CRC-32 over the rest), the packed locations, the scanner, its result,
stop reasons and verdicts, and decoding an enqueue record and searching for records (all parametrised
by each version's header layout; format 1's records pass the sequence and length checks it lacks).
What stays here is what version 1 does differently: its segment and record header layouts and its
torn-tail rule (it cannot tell a bit flip from a torn write).
"""

from __future__ import annotations

import operator
import struct
import zlib
from typing import Final

from ._record import (
    MAX_RECORD_BYTES,
    SEGMENT_MAGIC,
    RecordKind,
    ScanResult,
    StopReason,
    Verdict,
    _append_framed,
    _decode_enqueue,
    _FieldPicker,
    _find_records,
    _scan_records,
    pack_location,
    unpack_location,
)

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
_pack_tail: Final = _RECORD_TAIL.pack
ACK_RECORD_BYTES: Final = RECORD_HEADER_BYTES
#: (length, crc, kind, flags, meta_length, message_id, timestamp_ms) of an unpacked format-1 header
_pick_fields: Final[_FieldPicker] = operator.itemgetter(0, 1, 2, 3, 7, 5, 6)  # type: ignore[assignment]
#: find_records' candidates: the kind byte and the zero flags and reserved bytes (no seals in format 1)
_MARKERS: Final = (b"\x01\x00\x00\x00", b"\x02\x00\x00\x00")

_ENQUEUE: Final = int(RecordKind.ENQUEUE)
_ACK: Final = int(RecordKind.ACK)


# The segment header differs from format 2's (no first sequence number or flags, the CRC before a
# reserved word), so it keeps its own encoder and decoder.


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

    Only the migration tests write format 1 now (format 2's encoder is the hot path).
    """
    offset = len(buf)
    meta_len = len(meta)
    length = RECORD_HEADER_BYTES + meta_len + len(payload)
    if length > MAX_RECORD_BYTES:
        raise ValueError(f"record of {length} bytes exceeds the maximum of {MAX_RECORD_BYTES}")
    tail = _pack_tail(_ENQUEUE, 0, 0, message_id, timestamp_ms, meta_len)
    _append_framed(buf, length, tail, meta, payload)
    return pack_location(0, offset, length, meta_len, timestamp_ms)


def append_ack(buf: bytearray, message_id: int) -> None:
    """Append one 32-byte ack record for ``message_id`` to ``buf``."""
    _append_framed(buf, ACK_RECORD_BYTES, _pack_tail(_ACK, 0, 0, message_id, 0, 0), b"", b"")


def decode_enqueue_body(record: bytes | memoryview) -> tuple[int, int, bytes, bytes]:
    """Decode a whole enqueue record read back from disk: ``(message_id, timestamp_ms, meta, payload)``.

    The checksum is verified again: a record read lazily for delivery is checked like one scanned.

    Raises:
        ValueError: the bytes are not one valid enqueue record.
    """
    return _decode_enqueue(record, _RECORD_HEADER, _pick_fields)


def scan_records(
    data: bytes | bytearray | memoryview, start: int, segment: int, previous_enqueue_id: int
) -> ScanResult:
    """Scan records of one segment from ``start`` (just after the header) to the end of ``data``.

    Format 2's scanner (:func:`._record.scan_records`) with this format's header: no sequence numbers,
    length checks or seals, so it stops only for the reasons format 1 knows. ``records`` and
    ``next_seq`` of the result count the records, as if numbered from 0.
    """
    return _scan_records(data, start, segment, previous_enqueue_id, 0, True, (RECORD_HEADER_BYTES, _unpack))


def _unpack(view: memoryview, pos: int) -> tuple[int, int, int, int, int, int, int, int]:
    """``(length, crc, kind, flags, reserved, meta_length, message_id, timestamp_ms)`` at ``pos``."""
    length, crc, kind, flags, reserved, message_id, ts, meta_len = _RECORD_HEADER.unpack_from(view, pos)
    return length, crc, kind, flags, reserved, meta_len, message_id, ts


def find_records(data: bytes | bytearray, start: int) -> list[tuple[int, int, int, int]]:
    """Well-formed records (good checksum) anywhere in ``data[start:]``: ``(offset, length, kind, id)``.

    Used after a scan stopped: to tell a torn tail (nothing valid can follow it) from corruption, and to
    list what a quarantined segment held past the bad spot. Candidates are found with ``bytes.find`` on
    the kind/flags/reserved bytes, so this is fast even on a large segment.
    """
    return _find_records(data, start, _RECORD_HEADER, _pick_fields, _MARKERS)


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
