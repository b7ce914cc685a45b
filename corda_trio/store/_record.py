"""PURE codec of the write-ahead log (format version 2): segment headers, records, seals, the manifest,
and the recovery scanner.

No I/O, clock or logging here (``tests/test_layering.py`` checks it): callers pass bytes and timestamps
in and get bytes, offsets and verdicts out. ``protocol_spec/store-format.md`` is the normative description
of the bytes; this module is its reference implementation. (Format version 1 is read by
:mod:`._record_v1`, for migration only.)

Theory of operation
-------------------
A queue's log is a chain of segment files listed by a small *manifest* (first and last segment number).
Each segment starts with a 48-byte header and is followed by records, back to back, little-endian::

    offset size  field
    0      4     length       whole record in bytes, header included (>= 40)
    4      4     crc          CRC-32 (zlib polynomial) of bytes [8, length) of this record
    8      1     kind         1 = enqueue, 2 = ack, 3 = seal
    9      1     flags        0
    10     2     reserved     0
    12     4     sequence     low 32 bits of the record's sequence number (+1 per record, per queue)
    16     4     meta_length  length of the opaque application blob (0 in acks and seals)
    20     8     message_id   unsigned 64-bit, assigned by the store, strictly increasing per queue
    28     8     timestamp    enqueue time, milliseconds since the Unix epoch (0 in acks and seals)
    36     4     length_check the bitwise complement of ``length``
    40     ...   meta bytes, then payload bytes (enqueue), or the seal's body

Every record a queue writes takes the next *sequence number*; they are contiguous across segments: the
segment header holds the sequence number of its first record, and a segment is closed by a *seal* record
(taking no number of its own) that says how many records the segment holds and which sequence number
the next segment starts at. Compaction drops records from sealed segments (marking the header
*compacted*: gaps are then allowed inside it, but the seal's count must still match). So:

* a sealed segment must be whole: a missing seal (a truncation at a record boundary), a record after it,
  a count or sequence mismatch, a gap to the next segment, are all corruption;
* only the *active* (last, unsealed) segment can end in a torn write, and only where a crash could have
  left one (:func:`classify_stop`): a record cut short by the end of the file, or damage overlapping
  zero-filled blocks (a power loss). A record whose length covers it completely but whose checksum
  fails, with no zero block in it, is a bit flip: corruption. ``length_check`` makes a flipped
  ``length`` field (which would otherwise look like a record running past the end) detectable too.

The scanner walks a segment buffer without copying payloads: it reads only headers (``unpack_from``)
and checksums each record through a ``memoryview`` slice: one ``crc32`` per record, as the encoder (the
length check is one more field of the same ``pack``).
"""

from __future__ import annotations

import enum
import operator
import re
import struct
import zlib
from array import array
from collections.abc import Callable
from typing import Final

import attrs

__all__ = [
    "ACK_RECORD_BYTES",
    "FORMAT_VERSION",
    "MANIFEST_BYTES",
    "MAX_RECORD_BYTES",
    "RECORD_HEADER_BYTES",
    "SEAL_RECORD_BYTES",
    "SEGMENT_COMPACTED",
    "SEGMENT_HEADER_BYTES",
    "SEGMENT_MAGIC",
    "SEGMENT_ORIGIN",
    "RecordKind",
    "ScanResult",
    "Seal",
    "SegmentHeader",
    "StopReason",
    "Verdict",
    "append_ack",
    "append_enqueue",
    "append_enqueue_located",
    "append_seal",
    "check_record",
    "classify_stop",
    "decode_enqueue_body",
    "decode_manifest",
    "decode_seal_record",
    "decode_segment_header",
    "encode_manifest",
    "encode_segment_header",
    "find_records",
    "pack_location",
    "peek_format_version",
    "scan_records",
    "unpack_location",
]

SEGMENT_MAGIC: Final = b"CTWALSEG"
FORMAT_VERSION: Final = 2
#: magic(8) version(u32) header_length(u32) segment_number(u64) base_id(u64) first_seq(u64) flags(u32)
#: header_crc(u32)
_SEGMENT_HEADER: Final = struct.Struct("<8sIIQQQII")
SEGMENT_HEADER_BYTES: Final = _SEGMENT_HEADER.size  # 48
_SEGMENT_CRC_SPAN: Final = 44
#: header flag: the segment was rewritten by compaction (records may be missing between sequence numbers)
SEGMENT_COMPACTED: Final = 1
#: header flag: the segment starts a new chain, written by a migration or a repair (its leftover, when the
#: manifest was never switched to it, is removed at the next open)
SEGMENT_ORIGIN: Final = 2
_KNOWN_SEGMENT_FLAGS: Final = SEGMENT_COMPACTED | SEGMENT_ORIGIN

#: length(u32) crc(u32) kind(u8) flags(u8) reserved(u16) sequence(u32) meta_length(u32) message_id(u64)
#: timestamp_ms(u64) length_check(u32)
_RECORD_HEADER: Final = struct.Struct("<IIBBHIIQQI")
RECORD_HEADER_BYTES: Final = _RECORD_HEADER.size  # 40
#: bytes [8, 40): kind .. length_check
_RECORD_TAIL: Final = struct.Struct("<BBHIIQQI")
_RECORD_PREFIX: Final = struct.Struct("<II")  # length, crc
_U32: Final = struct.Struct("<I")
_pack_tail: Final = _RECORD_TAIL.pack
_pack_prefix: Final = _RECORD_PREFIX.pack
_pack_u32: Final = _U32.pack
_crc32: Final = zlib.crc32
ACK_RECORD_BYTES: Final = RECORD_HEADER_BYTES
#: seal body: next_seq(u64) records(u64) next_id(u64)
_SEAL_BODY: Final = struct.Struct("<QQQ")
SEAL_RECORD_BYTES: Final = RECORD_HEADER_BYTES + _SEAL_BODY.size  # 64
#: Upper bound of one record (header + meta + payload): 256 MiB. Larger length fields are corruption.
MAX_RECORD_BYTES: Final = 256 * 1024 * 1024
_MASK32: Final = 0xFFFFFFFF

#: manifest: magic(8) version(u32) reserved(u32) first(u64) last(u64) reserved(u32) crc(u32)
MANIFEST_MAGIC: Final = b"CTWALMAN"
_MANIFEST: Final = struct.Struct("<8sIIQQII")
MANIFEST_BYTES: Final = _MANIFEST.size  # 40
#: A manifest is read up to this many bytes (plus one, to tell that there is more): whatever holds more is
#: not one, and is not read further (a manifest name pointing at /dev/zero must not fill the memory).
MANIFEST_READ_LIMIT: Final = 4096


class RecordKind(enum.IntEnum):
    """The ``kind`` byte of a record."""

    ENQUEUE = 1
    ACK = 2
    SEAL = 3


_ENQUEUE: Final = int(RecordKind.ENQUEUE)
_ACK: Final = int(RecordKind.ACK)
_SEAL: Final = int(RecordKind.SEAL)


# ---------------------------------------------------------------------------------------- segment header


@attrs.frozen
class SegmentHeader:
    """A decoded segment header."""

    number: int
    #: a floor for message ids: the next id the queue assigns is at least this (ids never go backwards)
    base_id: int
    #: the sequence number of the segment's first record (as written, before any compaction)
    first_seq: int
    flags: int = 0

    @property
    def compacted(self) -> bool:
        return bool(self.flags & SEGMENT_COMPACTED)

    @property
    def origin(self) -> bool:
        return bool(self.flags & SEGMENT_ORIGIN)


def encode_segment_header(segment_number: int, base_id: int, first_seq: int = 0, flags: int = 0) -> bytes:
    """The 48-byte header that starts segment ``segment_number``."""
    body = _SEGMENT_HEADER.pack(
        SEGMENT_MAGIC, FORMAT_VERSION, SEGMENT_HEADER_BYTES, segment_number, base_id, first_seq, flags, 0
    )[:_SEGMENT_CRC_SPAN]
    return body + _pack_u32(zlib.crc32(body))


def peek_format_version(data: bytes | bytearray | memoryview, magic: bytes = SEGMENT_MAGIC) -> int | None:
    """The format version a segment file (or, with ``magic=MANIFEST_MAGIC``, a manifest) claims in its first
    12 bytes (``None``: too short or not one). Every format so far starts with its magic and a ``u32``
    version, and a newer one must too: that is how a build tells a file written by a newer build."""
    if len(data) < 12 or bytes(data[:8]) != magic:
        return None
    return int(_U32.unpack_from(data, 8)[0])


def decode_segment_header(data: bytes | bytearray | memoryview) -> SegmentHeader:
    """Validate a segment header.

    Raises:
        ValueError: the header is short, has the wrong magic, an unknown version or flags, or a bad
            checksum (the message says which).
    """
    if len(data) < SEGMENT_HEADER_BYTES:
        raise ValueError(f"segment header is {len(data)} bytes, expected {SEGMENT_HEADER_BYTES}")
    magic, version, header_len, number, base_id, first_seq, flags, crc = _SEGMENT_HEADER.unpack_from(data, 0)
    if magic != SEGMENT_MAGIC:
        raise ValueError(f"bad segment magic {bytes(magic)!r}, expected {SEGMENT_MAGIC!r}")
    if version != FORMAT_VERSION or header_len != SEGMENT_HEADER_BYTES:
        raise ValueError(f"unsupported segment format version {version} (header length {header_len})")
    if zlib.crc32(memoryview(data)[:_SEGMENT_CRC_SPAN]) != crc:
        raise ValueError("segment header checksum mismatch")
    if flags & ~_KNOWN_SEGMENT_FLAGS:
        raise ValueError(f"unknown segment flags {flags:#x}")
    return SegmentHeader(int(number), int(base_id), int(first_seq), int(flags))


# ---------------------------------------------------------------------------------------- manifest


def encode_manifest(first: int, last: int) -> bytes:
    """The manifest of a queue whose segments are ``first`` .. ``last`` (every one of them present)."""
    body = _MANIFEST.pack(MANIFEST_MAGIC, FORMAT_VERSION, 0, first, last, 0, 0)[:-4]
    return body + _pack_u32(zlib.crc32(body))


def decode_manifest(data: bytes) -> tuple[int, int]:
    """``(first, last)`` of a manifest.

    Raises:
        ValueError: not a valid manifest (the message says why).
    """
    if len(data) > MANIFEST_READ_LIMIT:
        raise ValueError(f"manifest is larger than {MANIFEST_READ_LIMIT} bytes, expected {MANIFEST_BYTES}")
    if len(data) != MANIFEST_BYTES:
        raise ValueError(f"manifest is {len(data)} bytes, expected {MANIFEST_BYTES}")
    magic, version, _r, first, last, _r2, crc = _MANIFEST.unpack(data)
    if magic != MANIFEST_MAGIC:
        raise ValueError(f"bad manifest magic {bytes(magic)!r}")
    if zlib.crc32(data[:-4]) != crc:
        raise ValueError("manifest checksum mismatch")
    if version != FORMAT_VERSION:
        raise ValueError(f"unsupported manifest version {version}")
    if not 1 <= first <= last:
        raise ValueError(f"manifest lists segments {first}..{last}")
    return int(first), int(last)


# ---------------------------------------------------------------------------------------- records


def append_enqueue(
    buf: bytearray, message_id: int, timestamp_ms: int, meta: bytes, payload: bytes, sequence: int = 0
) -> int:
    """Append one enqueue record to ``buf``; returns the record's length in bytes.

    The same bytes as :func:`append_enqueue_located`, which the group commit uses (it also wants the
    record's index entry).
    """
    start = len(buf)
    append_enqueue_located(buf, message_id, timestamp_ms, meta, payload, sequence)
    return len(buf) - start


def append_enqueue_located(
    buf: bytearray, message_id: int, timestamp_ms: int, meta: bytes, payload: bytes, sequence: int
) -> int:
    """Append one enqueue record to ``buf``; return its packed location (:func:`pack_location`) in
    segment 0 at its offset in ``buf``: the group commit's per-record index entry, computed while the
    lengths are at hand (the writer later adds the batch's segment and file offset in one addition).

    This is the hot path of every enqueue: a few ``pack`` calls and ``crc32`` calls over the caller's
    buffers (the header part once), no intermediate copies besides the appends themselves.
    """
    offset = len(buf)
    meta_len = len(meta)
    length = RECORD_HEADER_BYTES + meta_len + len(payload)
    if length > MAX_RECORD_BYTES:
        raise ValueError(f"record of {length} bytes exceeds the maximum of {MAX_RECORD_BYTES}")
    tail = _pack_tail(
        _ENQUEUE, 0, 0, sequence & _MASK32, meta_len, message_id, timestamp_ms, length ^ _MASK32
    )
    # _append_framed's bytes, inlined: the call would cost about a tenth of an enqueue's encoding
    # (measured side by side with timeit on 1 KiB payloads).
    if meta_len:
        buf += _pack_prefix(length, _crc32(payload, _crc32(meta, _crc32(tail))))
        buf += tail
        buf += meta
    else:
        buf += _pack_prefix(length, _crc32(payload, _crc32(tail)))
        buf += tail
    buf += payload
    return (timestamp_ms << _TS_SHIFT) | (meta_len << _META_SHIFT) | (length << _LEN_SHIFT) | offset


def _append_framed(buf: bytearray, length: int, tail: bytes, meta: bytes, body: bytes) -> None:
    """Append ``length``, the CRC-32 of ``tail + meta + body``, then those three: the framing that every
    record of every format version has (``tail`` is the header after the CRC, as its version packs it).
    One ``crc32`` call per part, chained, and no intermediate copies."""
    buf += _pack_prefix(length, _crc32(body, _crc32(meta, _crc32(tail))))
    buf += tail
    buf += meta
    buf += body


def _append_bodyless(buf: bytearray, kind: int, sequence: int, message_id: int, body: bytes) -> None:
    length = RECORD_HEADER_BYTES + len(body)
    tail = _pack_tail(kind, 0, 0, sequence & _MASK32, 0, message_id, 0, length ^ _MASK32)
    _append_framed(buf, length, tail, b"", body)


def append_ack(buf: bytearray, message_id: int, sequence: int = 0) -> None:
    """Append one 40-byte ack record for ``message_id`` to ``buf``."""
    _append_bodyless(buf, _ACK, sequence, message_id, b"")


@attrs.frozen
class Seal:
    """The seal record that closes a segment."""

    #: the sequence number the next segment starts at (every record of this one is below it)
    next_seq: int
    #: how many records (enqueues and acks) the segment holds before its seal
    records: int
    #: the next message id when the segment was sealed (a floor, like a header's ``base_id``)
    next_id: int


def append_seal(buf: bytearray, seal: Seal) -> None:
    """Append the 64-byte seal record ``seal`` to ``buf``."""
    _append_bodyless(buf, _SEAL, seal.next_seq, 0, _SEAL_BODY.pack(seal.next_seq, seal.records, seal.next_id))


def check_record(data: bytes | bytearray | memoryview, pos: int) -> tuple[RecordKind, int, int]:
    """Check the whole record at ``pos`` of ``data`` (length, length check, checksum, kind, flags), as a
    scan would, for a reader that knows where its records are; returns ``(kind, message_id, length)``.

    Raises:
        ValueError: what is wrong with it (the caller names the place).
    """
    view = memoryview(data)
    if len(view) - pos < RECORD_HEADER_BYTES:
        raise ValueError("short record header")
    length, crc, kind, flags, reserved, _seq, meta_len, mid, _ts, check = _RECORD_HEADER.unpack_from(
        view, pos
    )
    if check != length ^ _MASK32 or length < RECORD_HEADER_BYTES or length > MAX_RECORD_BYTES:
        raise ValueError(f"bad record header (length {length})")
    if pos + length > len(view):
        raise ValueError(f"a record of {length} bytes runs past the end")
    if _crc32(view[pos + 8 : pos + length]) != crc:
        raise ValueError("checksum mismatch")
    if flags or reserved or kind not in (_ENQUEUE, _ACK, _SEAL) or RECORD_HEADER_BYTES + meta_len > length:
        raise ValueError(f"bad record (kind {kind}, flags {flags}, meta length {meta_len})")
    return RecordKind(kind), mid, length


def decode_seal_record(record: bytes | bytearray | memoryview) -> Seal:
    """Decode a segment's seal record (its last :data:`SEAL_RECORD_BYTES`), checked.

    Raises:
        ValueError: it is not a well-formed seal record.
    """
    kind, _mid, length = check_record(record, 0)
    if kind != RecordKind.SEAL or length != SEAL_RECORD_BYTES:
        raise ValueError(f"no seal record (a {kind.name.lower()} record of {length} bytes)")
    return Seal(*_SEAL_BODY.unpack_from(record, RECORD_HEADER_BYTES))


def decode_enqueue_body(record: bytes | memoryview) -> tuple[int, int, bytes, bytes]:
    """Decode a whole enqueue record read back from disk: ``(message_id, timestamp_ms, meta, payload)``.

    The checksum is verified again: a record read lazily for delivery is checked like one scanned.

    Raises:
        ValueError: the bytes are not one valid enqueue record.
    """
    return _decode_enqueue(record, _RECORD_HEADER, _pick_fields)


#: A record header's fields that every format version has, picked out of its unpacked header:
#: ``(length, crc, kind, flags, meta_length, message_id, timestamp_ms)``. The format-1 reader
#: (:mod:`._record_v1`) passes its own header struct and picker to the shared helpers below.
_FieldPicker = Callable[[tuple[int, ...]], tuple[int, ...]]
_pick_fields: Final[_FieldPicker] = operator.itemgetter(0, 1, 2, 3, 6, 7, 8)  # type: ignore[assignment]


def _decode_enqueue(
    record: bytes | memoryview, header: struct.Struct, pick: _FieldPicker
) -> tuple[int, int, bytes, bytes]:
    header_bytes = header.size
    if len(record) < header_bytes:
        raise ValueError("record shorter than its header")
    length, crc, kind, flags, meta_len, message_id, ts = pick(header.unpack_from(record, 0))
    if length != len(record) or kind != _ENQUEUE or flags or header_bytes + meta_len > length:
        raise ValueError(f"not a well-formed enqueue record (length {length}, kind {kind})")
    view = memoryview(record)
    if zlib.crc32(view[8:length]) != crc:
        raise ValueError(f"checksum mismatch in record of message {message_id}")
    body = header_bytes + meta_len
    return message_id, ts, bytes(view[header_bytes:body]), bytes(view[body:length])


# A message's location packed into one int, so that the in-memory index of a million messages is one
# dict of ints (about 100 bytes per message) rather than a million objects. Fields, low bits first:
# offset (40 bits), record length (32), meta length (32), segment number (32), enqueue timestamp ms (rest).
_OFFSET_BITS: Final = 40
_LEN_SHIFT: Final = 40
_META_SHIFT: Final = 72
_SEG_SHIFT: Final = 104
_TS_SHIFT: Final = 136
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


# ---------------------------------------------------------------------------------------- scanning


class StopReason(enum.Enum):
    """Why :func:`scan_records` stopped before the end of the buffer."""

    SHORT_HEADER = "fewer bytes left than a record header"
    BAD_HEADER = "record length field does not match its check"
    BAD_LENGTH = "record length field out of range"
    PAST_END = "record runs past the end of the file"
    BAD_CHECKSUM = "checksum mismatch"
    BAD_KIND = "unknown record kind or non-zero reserved field"
    BAD_META = "meta length larger than the record"
    ID_NOT_INCREASING = "enqueue message id not greater than the previous one"
    BAD_ACK = "ack record with a body"
    BAD_SEQUENCE = "record sequence number out of order"
    BAD_SEAL = "seal record does not match the segment"
    AFTER_SEAL = "record after the segment's seal"


@attrs.define(eq=False)
class ScanResult:
    """Output of :func:`scan_records`: parallel arrays, no per-record objects.

    ``enqueue_ids[i]`` lives at ``enqueue_locations[i]`` (a :func:`pack_location`); ``ack_ids`` lists acks
    in log order with ``ack_offsets``. ``end`` is the offset just after the last good record (the seal
    included); when the scan stopped early ``stop`` says why and ``stop_offset == end``. ``records``
    counts the enqueue and ack records, ``next_seq`` is the sequence number after the last of them (or
    the seal's), ``seal`` the seal record if the segment has one (at ``seal_offset``).
    """

    enqueue_ids: array[int]
    enqueue_locations: list[int]
    enqueue_bytes: int
    ack_ids: array[int]
    ack_offsets: array[int]
    end: int
    last_enqueue_id: int
    records: int = 0
    next_seq: int = 0
    seal: Seal | None = None
    seal_offset: int = -1
    stop: StopReason | None = None
    detail: str = ""


def scan_records(
    data: bytes | bytearray | memoryview,
    start: int,
    segment: int,
    previous_enqueue_id: int,
    first_seq: int = 0,
    contiguous: bool = True,
) -> ScanResult:
    """Scan records of one segment from ``start`` (just after the header) to the end of ``data``.

    Args:
        data: the whole segment file.
        start: offset of the first record (:data:`SEGMENT_HEADER_BYTES`).
        segment: the segment number, packed into each location.
        previous_enqueue_id: the highest enqueue id of earlier segments (or -1): ids must keep increasing.
        first_seq: the header's ``first_seq``: sequence numbers are checked against it.
        contiguous: every sequence number must follow the previous one (a segment not compacted);
            otherwise they must only increase.
    """
    return _scan_records(data, start, segment, previous_enqueue_id, first_seq, contiguous, None)


#: Unpacks a header without sequence number or length check (format 1) at an offset:
#: ``(length, crc, kind, flags, reserved, meta_length, message_id, timestamp_ms)``.
_UnsequencedUnpack = Callable[[memoryview, int], tuple[int, int, int, int, int, int, int, int]]


def _scan_records(
    data: bytes | bytearray | memoryview,
    start: int,
    segment: int,
    previous_enqueue_id: int,
    first_seq: int,
    contiguous: bool,
    unsequenced: tuple[int, _UnsequencedUnpack] | None,
) -> ScanResult:
    # ``unsequenced``: (header size, unpack) of a format without sequence numbers, length checks or seals
    # (format 1, :mod:`._record_v1`). Its records are given the sequence number and length check that
    # always pass, so the rest of the rules (and their order) are the same for both formats; the only
    # per-record cost to format 2 is the test below which unpack to use.
    view = memoryview(data)
    size = len(view)
    unpack = _RECORD_HEADER.unpack_from
    header = RECORD_HEADER_BYTES
    unpack_unsequenced = None
    if unsequenced is not None:
        header, unpack_unsequenced = unsequenced
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
    seq0 = first_seq & _MASK32
    prev_d = -1  # sequence number of the previous record, relative to first_seq
    records = 0
    seal: Seal | None = None
    seal_offset = -1
    stop: StopReason | None = None
    detail = ""
    while pos < size:
        if seal is not None:
            stop = StopReason.AFTER_SEAL
            break
        if size - pos < header:
            stop = StopReason.SHORT_HEADER
            break
        if unpack_unsequenced is None:
            length, crc, kind, flags, reserved, seq, meta_len, mid, ts, check = unpack(view, pos)
        else:
            length, crc, kind, flags, reserved, meta_len, mid, ts = unpack_unsequenced(view, pos)
            seq, check = (seq0 + prev_d + 1) & _MASK32, length ^ _MASK32
        end = pos + length
        if length < header or length > MAX_RECORD_BYTES or end > size or crc32(view[pos + 8 : end]) != crc:
            # Which part is bad? The length check says whether the length is as written.
            if check != length ^ _MASK32:
                stop = StopReason.BAD_HEADER
            elif length < header or length > MAX_RECORD_BYTES:
                stop, detail = StopReason.BAD_LENGTH, f"length {length}"
            elif end > size:
                stop, detail = StopReason.PAST_END, f"length {length}, {size - pos} bytes left"
            else:
                stop = StopReason.BAD_CHECKSUM
            break
        if flags or reserved:
            stop, detail = StopReason.BAD_KIND, f"kind {kind}, flags {flags}, reserved {reserved}"
            break
        d = (seq - seq0) & _MASK32
        if (d != prev_d + 1) if contiguous else (d <= prev_d):
            stop, detail = StopReason.BAD_SEQUENCE, f"sequence {first_seq + d} after {first_seq + prev_d}"
            break
        if kind == _ENQUEUE:
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
        elif kind == _ACK:
            if length != header or meta_len:
                stop = StopReason.BAD_ACK
                break
            acks.append(mid)
            ack_offsets.append(pos)
        elif kind == _SEAL and unpack_unsequenced is None:
            if length != SEAL_RECORD_BYTES or meta_len or mid or ts:
                stop, detail = StopReason.BAD_SEAL, f"length {length}"
                break
            candidate = Seal(*_SEAL_BODY.unpack_from(view, pos + header))
            if candidate.next_seq != first_seq + d or candidate.records != records:
                stop = StopReason.BAD_SEAL
                detail = (
                    f"seal says {candidate.records} records up to sequence {candidate.next_seq}, "
                    f"the segment holds {records} up to {first_seq + d}"
                )
                break
            seal, seal_offset = candidate, pos
            prev_d = d - 1  # the seal takes no sequence number: next_seq is the next segment's first
            pos = end
            continue
        else:
            stop, detail = StopReason.BAD_KIND, f"kind {kind}, flags {flags}, reserved {reserved}"
            break
        prev_d = d
        records += 1
        pos = end
    return ScanResult(
        enqueue_ids=ids,
        enqueue_locations=locs,
        enqueue_bytes=enqueue_bytes,
        ack_ids=acks,
        ack_offsets=ack_offsets,
        end=pos,
        last_enqueue_id=last,
        records=records,
        next_seq=seal.next_seq if seal is not None else first_seq + prev_d + 1,
        seal=seal,
        seal_offset=seal_offset,
        stop=stop,
        detail=detail,
    )


def find_records(data: bytes | bytearray, start: int) -> list[tuple[int, int, int, int]]:
    """Well-formed records (good checksum) anywhere in ``data[start:]``: ``(offset, length, kind, id)``.

    Used after a scan stopped: to tell a torn tail (nothing valid can follow it) from corruption, and to
    list what a damaged segment held past the bad spot. Candidates are found with ``bytes.find`` on
    the kind/flags/reserved bytes, so this is fast even on a large segment.
    """
    return _find_records(
        data, start, _RECORD_HEADER, _pick_fields, (b"\x01\x00\x00", b"\x02\x00\x00", b"\x03\x00\x00")
    )


def _find_records(
    data: bytes | bytearray,
    start: int,
    header: struct.Struct,
    pick: _FieldPicker,
    markers: tuple[bytes, ...],
) -> list[tuple[int, int, int, int]]:
    raw = bytes(data) if not isinstance(data, bytes) else data
    header_bytes = header.size
    candidates: list[int] = []
    for marker in markers:
        pos = raw.find(marker, start + 8)
        while pos != -1:
            candidates.append(pos - 8)
            pos = raw.find(marker, pos + 1)
    candidates.sort()
    view = memoryview(raw)
    found: list[tuple[int, int, int, int]] = []
    next_free = start
    for pos in candidates:
        if pos < next_free or pos + header_bytes > len(raw):
            continue
        length, crc, kind, _flags, meta_len, mid, _ts = pick(header.unpack_from(raw, pos))
        if length < header_bytes or pos + length > len(raw) or header_bytes + meta_len > length:
            continue
        if kind == _ACK and length != header_bytes:
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


#: The granularity at which a power loss can leave blocks that read back as zeros (a disk sector).
ZERO_BLOCK: Final = 512
#: A zero run shorter than this does not count as a lost block (an ack's zero timestamp, say).
_ZERO_RUN: Final = re.compile(rb"\x00{16,}")


def _overlaps_zero_block(data: bytes | bytearray | memoryview, lo: int, hi: int) -> bool:
    """Whether ``[lo, hi)`` overlaps a run of at least 16 zero bytes that ends at a sector boundary
    (:data:`ZERO_BLOCK`) or at the end of the file: what a sector that never reached the disk reads back
    as (the run may start mid-sector: the bytes before it in that sector were written earlier)."""
    raw = bytes(data)
    size = len(raw)
    for match in _ZERO_RUN.finditer(raw, lo):
        if match.start() >= hi:
            break
        if match.end() == size or match.end() % ZERO_BLOCK == 0:
            return True
    return False


def classify_stop(
    data: bytes | bytearray | memoryview, result: ScanResult, *, is_active_segment: bool
) -> Verdict:
    """Decide whether the place where ``result`` stopped is a torn tail or corruption.

    Only the active (last, unsealed) segment can have a torn tail, and only of a shape a crash leaves:
    a header cut short, a record whose (intact) header says it runs past the end of the file, or a
    record whose header or body is damaged where blocks read back as zeros (a power loss). Anything else
    (a bit flip in a record the file holds completely, a record whose checksum is good but whose content
    is wrong) is corruption, and so is any well-formed record after the bad spot: an interrupted append
    leaves a prefix of what was written, so nothing valid can follow it.
    """
    if result.stop is None:
        raise ValueError("the scan did not stop early")
    if not is_active_segment or result.seal is not None:
        return Verdict.CORRUPT
    pos = result.end
    stop = result.stop
    if stop in (StopReason.SHORT_HEADER, StopReason.PAST_END):
        verdict = Verdict.TORN_TAIL
    elif stop is StopReason.BAD_HEADER:
        end = min(len(data), pos + RECORD_HEADER_BYTES)
        verdict = Verdict.TORN_TAIL if _overlaps_zero_block(data, pos, end) else Verdict.CORRUPT
    elif stop is StopReason.BAD_CHECKSUM:
        length = _U32.unpack_from(data, pos)[0]
        verdict = Verdict.TORN_TAIL if _overlaps_zero_block(data, pos, pos + length) else Verdict.CORRUPT
    else:
        verdict = Verdict.CORRUPT
    if verdict is Verdict.TORN_TAIL and find_records(bytes(data), pos + 1):
        return Verdict.CORRUPT
    return verdict
