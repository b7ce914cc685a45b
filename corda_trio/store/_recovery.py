"""Recovery, checking, repair and migration of one queue directory (blocking: run in a worker thread).

Theory of operation
-------------------
Recovery reads the queue's manifest (first and last segment number), then every segment it lists, in
number order, scans its records with the pure scanner (headers and checksums only, payloads are never
copied) and rebuilds the *live set*: a dict ``message id -> packed location`` of every enqueue record
without a matching ack record. Dict insertion order is id order, which is FIFO order, because ids
increase through the log (compaction rewrites a segment in place and keeps the order). The scan of
1 GiB costs one read per segment and one ``crc32`` per record.

Nothing is lost silently. Every segment the manifest lists must be there; every segment but the last
must end with its seal record; sequence numbers must run on from one segment to the next. Where a scan
stops early, :func:`~._record.classify_stop` decides: a torn tail of the active segment (a shape only a
crash leaves) is truncated (``ftruncate`` + ``fsync``) and reported; anything else raises
:class:`CorruptSegmentError` naming file and offset. What a crash can leave besides is recognised and
tidied: a compaction's temp file (``*.seg.compact``), a manifest's temp file, a segment below the
manifest's first (compacted away, the unlink not done yet), a segment just created after the manifest's
last (its rotation interrupted), a rebuilt segment the manifest was never switched to.

``check`` does the same without changing anything. ``repair`` salvages a damaged queue: damaged segments
are copied into ``quarantine/``, every well-formed record before the damage is kept, and what is lost is
reported (the ids of the well-formed records found after a bad spot, the number of records a sequence gap
or a missing segment held and the range their ids were in); the surviving live messages are then written
into one new segment (a *rebuild*) and the manifest switched to it. Lost enqueues are lost messages;
lost acks mean those messages may be delivered again (consumers deduplicate).

A queue written in format version 1 (no manifest, :mod:`._record_v1`) is recovered with that format's
rules and then migrated by the same rebuild; ``check`` leaves it as it is.
"""

from __future__ import annotations

import enum
import errno
import os
import shutil
import struct
import time
from array import array
from typing import Any, Final

import attrs

from . import _record_v1 as v1
from ._errors import CorruptSegmentError
from ._record import (
    SEAL_RECORD_BYTES,
    SEGMENT_HEADER_BYTES,
    SEGMENT_ORIGIN,
    RecordKind,
    Seal,
    Verdict,
    append_enqueue,
    append_seal,
    classify_stop,
    decode_enqueue_body,
    decode_manifest,
    decode_segment_header,
    encode_segment_header,
    find_records,
    peek_format_version,
    scan_records,
    unpack_location,
)
from ._segment import (
    COMPACT_SUFFIX,
    MANIFEST_NAME,
    MANIFEST_TMP,
    QUARANTINE_DIR,
    check_queue_format,
    create_segment,
    fsync_dir,
    is_compaction_leftover,
    list_segment_numbers,
    open_segment,
    pread_exact,
    read_manifest,
    segment_path,
    stray_entries,
    write_all,
    write_manifest_at,
)

__all__ = [
    "LostRecords",
    "RecoveredLog",
    "RecoveryMode",
    "RecoveryReport",
    "RepairAction",
    "SegmentState",
    "TornTail",
    "recover_queue",
]


class RecoveryMode(enum.Enum):
    """What :func:`recover_queue` may do to the files."""

    OPEN = "open"  # truncate torn tails, delete compaction leftovers, open descriptors
    CHECK = "check"  # read only; report what OPEN would do
    REPAIR = "repair"  # OPEN, plus quarantine corrupt segments instead of raising


@attrs.frozen(kw_only=True)
class TornTail:
    """An incomplete last append that recovery cut off."""

    path: str
    offset: int
    dropped_bytes: int
    reason: str
    #: the message id the cut record's header claims, when enough of it was there (never acknowledged:
    #: its write did not finish; new ids start above it all the same)
    claimed_id: int | None = None


@attrs.frozen(kw_only=True)
class LostRecords:
    """Records that were in the unreadable part of a quarantined segment (best effort: found by looking
    for well-formed records after the bad spot; ``unreadable_bytes`` could not be attributed)."""

    enqueue_ids: tuple[int, ...]
    ack_ids: tuple[int, ...]
    unreadable_bytes: int
    #: every byte cut from the segment (well-formed records and unreadable bytes alike)
    dropped_bytes: int = 0
    #: the id the damaged record's header claims (``None``: too little of it to tell); it may itself
    #: be damaged, so it is reported, never trusted
    damaged_id: int | None = None
    #: records known to be missing (a sequence gap, a missing segment) though none of their bytes is
    #: left; their ids are unknown, but lie within ``id_range`` when that is known
    missing_records: int = 0
    #: ``(lowest, highest)`` id the missing records can have held (``None``: unknown)
    id_range: tuple[int, int] | None = None

    @property
    def highest_id(self) -> int:
        """The highest message id this loss may have held (-1: none): new ids start above it."""
        ceiling = self.id_range[1] if self.id_range is not None else -1
        return max((*self.enqueue_ids, *self.ack_ids, self.damaged_id or -1, ceiling), default=-1)


@attrs.frozen(kw_only=True)
class RepairAction:
    """One damage that a repair dropped: a quarantined segment, a sequence gap, a missing segment."""

    path: str
    offset: int
    reason: str
    #: the copy in ``quarantine/`` ("" when no bytes were there to copy: a gap or a missing file)
    quarantined_as: str
    kept_bytes: int
    lost: LostRecords


@attrs.frozen(kw_only=True)
class RecoveryReport:
    """What recovery found in one queue directory."""

    directory: str
    segments: int
    enqueue_records: int
    ack_records: int
    stale_acks: int
    live_messages: int
    live_bytes: int
    next_id: int
    torn_tail: TornTail | None
    removed_files: tuple[str, ...]
    #: entries of the queue directory that the store did not write: left alone (never read, never
    #: deleted) and reported
    stray_files: tuple[str, ...]
    repairs: tuple[RepairAction, ...]
    duration_seconds: float
    #: the format version the queue was found in (1: migrated to the current one, except by ``check``)
    found_format: int = 2


@attrs.define(eq=False)
class SegmentState:
    """Runtime bookkeeping of one segment file (mutated only on the event loop thread).

    ``live_bytes`` / ``live_count`` cover enqueue records not yet acked; ``min_id`` / ``max_id`` the enqueue
    ids physically present (-1 when none); ``ack_count`` the ack records physically present. ``fd`` is
    closed once the segment is retired (replaced by compaction) and no reader holds it (``readers``).
    ``first_seq`` is the header's, ``records`` the number of enqueue and ack records in the file,
    ``sealed`` whether it ends with its seal record.
    """

    number: int
    path: str
    base_id: int
    size: int
    live_bytes: int
    live_count: int
    min_id: int
    max_id: int
    ack_count: int
    fd: int = -1
    readers: int = 0
    retired: bool = False
    dirty: bool = False
    first_seq: int = 0
    records: int = 0
    sealed: bool = False

    def record_bytes(self) -> int:
        """Bytes of the segment's enqueue and ack records (its header and seal left out)."""
        return self.size - SEGMENT_HEADER_BYTES - (SEAL_RECORD_BYTES if self.sealed else 0)


@attrs.define(eq=False)
class RecoveredLog:
    """The state of a queue rebuilt from disk: segments (with open descriptors in OPEN/REPAIR mode), the
    live set in FIFO order, and the next message id."""

    segments: list[SegmentState]
    live: dict[int, int]
    next_id: int
    report: RecoveryReport
    #: the sequence number of the next record the queue writes
    next_seq: int = 0


_ENQ: Final = int(RecordKind.ENQUEUE)
_ACK: Final = int(RecordKind.ACK)
_HEADER: Final = struct.Struct("<IIBBHIIQQI")
_V1_HEADER: Final = struct.Struct("<IIBBHQQI")


def _read_file(path: str) -> bytes:
    """The whole segment (recovery scans it in memory).

    Raises:
        OSError: it cannot be read; ``ENOMEM`` when it is larger than this process can hold (a segment
            extended by gigabytes, say): one line for the operator, never a ``MemoryError`` traceback.
    """
    with open(path, "rb", buffering=0) as f:
        try:
            return f.read()
        except MemoryError:
            size = os.fstat(f.fileno()).st_size
            raise OSError(
                errno.ENOMEM, f"{size:,} bytes, more than this process can hold in memory to scan", path
            ) from None


def _find_records_after(data: bytes, start: int, version: int = 2) -> LostRecords:
    """Best-effort list of what ``data[start:]`` held (used to report losses and to keep ids above
    them): its well-formed records, and the id the damaged record at ``start`` claims, if it has one."""
    found = (find_records if version == 2 else v1.find_records)(data, start)
    found = [f for f in found if f[2] != int(RecordKind.SEAL)]
    header, id_field = (_HEADER, 7) if version == 2 else (_V1_HEADER, 5)
    damaged_id = None
    if len(data) - start >= header.size and not (found and found[0][0] == start):
        claimed = header.unpack_from(data, start)[id_field]
        damaged_id = claimed if claimed < 1 << 62 else None  # a wild value is no id worth keeping clear
    return LostRecords(
        enqueue_ids=tuple(mid for _o, _l, kind, mid in found if kind == _ENQ),
        ack_ids=tuple(mid for _o, _l, kind, mid in found if kind == _ACK),
        unreadable_bytes=len(data) - start - sum(length for _o, length, _k, _m in found),
        dropped_bytes=len(data) - start,
        damaged_id=damaged_id,
    )


def _quarantine(queue_dir: str, path: str) -> str:
    """Copy ``path`` into ``queue_dir/quarantine/`` (durably) and return the copy's path."""
    qdir = os.path.join(queue_dir, QUARANTINE_DIR)
    os.makedirs(qdir, exist_ok=True)
    base = os.path.basename(path)
    n = 0
    while os.path.exists(target := os.path.join(qdir, f"{base}.corrupt-{n}")):
        n += 1
    shutil.copyfile(path, target)
    fd = os.open(target, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_dir(qdir)
    fsync_dir(queue_dir)
    return target


def _sync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _state(number: int, path: str, base_id: int, first_seq: int, *, fd: int = -1) -> SegmentState:
    """A segment holding no record yet."""
    return SegmentState(
        number=number, path=path, base_id=base_id, size=SEGMENT_HEADER_BYTES, live_bytes=0, live_count=0,
        min_id=-1, max_id=-1, ack_count=0, fd=fd, first_seq=first_seq,
    )  # fmt: skip


@attrs.define(eq=False)
class _Found:
    """What a scan of segments gathered (shared by the strict pass, the salvage and format 1)."""

    states: list[SegmentState] = attrs.field(factory=list)
    live: dict[int, int] = attrs.field(factory=dict)
    acks: array[int] = attrs.field(factory=lambda: array("Q"))
    enqueue_records: int = 0
    last_id: int = -1
    next_id: int = 0

    def add(self, state: SegmentState, result: Any) -> None:
        ids = result.enqueue_ids
        self.live.update(zip(ids, result.enqueue_locations, strict=True))
        self.acks.extend(result.ack_ids)
        self.enqueue_records += len(ids)
        self.last_id = result.last_enqueue_id
        state.live_bytes = result.enqueue_bytes
        state.live_count = len(ids)
        state.min_id = ids[0] if ids else -1
        state.max_id = ids[-1] if ids else -1
        state.ack_count = len(result.ack_ids)
        self.states.append(state)

    def apply_acks(self) -> int:
        """Remove acked messages from the live set; returns the number of stale acks."""
        by_number = {s.number: s for s in self.states}
        stale = 0
        pop = self.live.pop
        for ack in self.acks:
            loc = pop(ack, None)
            if loc is None:
                stale += 1  # its enqueue was compacted away already
                continue
            seg, _off, length, _meta, _ts = unpack_location(loc)
            state = by_number[seg]
            state.live_bytes -= length
            state.live_count -= 1
        self.next_id = max(self.next_id, self.last_id + 1, max(self.acks, default=-1) + 1)
        return stale


def _id_floor(next_id: int, torn: TornTail | None, repairs: list[RepairAction]) -> int:
    """Ids are never reused, not even those of messages a torn tail or a repair dropped: a receiver
    that deduplicates by id would drop a new message that took one. (A claimed id far above every other
    one is damage, not an id ever handed out.)"""
    plausible = next_id + (1 << 32)
    lost_ids = [r.lost.highest_id for r in repairs if r.lost.id_range is None]
    if torn is not None and torn.claimed_id is not None:
        lost_ids.append(torn.claimed_id)
    ceiling = max((i for i in lost_ids if i < plausible), default=-1)
    # a range worked out from the surviving segments is no claim: it holds whatever its size
    ceiling = max([ceiling, *(r.lost.highest_id for r in repairs if r.lost.id_range is not None)])
    return max(next_id, ceiling + 1)


def recover_queue(queue_dir: str, mode: RecoveryMode = RecoveryMode.OPEN) -> RecoveredLog:
    """Rebuild a queue's state from its directory.

    Args:
        queue_dir: the queue's directory (it must exist).
        mode: see :class:`RecoveryMode`. In ``CHECK`` mode nothing is written and no descriptor is left
            open; in ``OPEN`` and ``REPAIR`` modes every segment gets a descriptor (the caller owns them).

    Returns:
        The recovered log; its ``report`` says what was found and done.

    Raises:
        NewerFormatError: a newer build wrote the manifest or a segment (in every mode: nothing changed).
        CorruptSegmentError: a record, header, seal or the manifest is invalid, a segment is missing or
            the sequence has a gap: anything a crash cannot explain (not in ``REPAIR`` mode, which
            salvages instead and reports what was lost).
        OSError: the directory could not be read or written.
    """
    check_queue_format(queue_dir)  # (before anything is removed or salvaged: a newer build's files stay)
    started = time.perf_counter()
    writable = mode is not RecoveryMode.CHECK
    strays = tuple(stray_entries(queue_dir))
    removed: list[str] = []
    for entry in sorted(os.listdir(queue_dir)):
        if is_compaction_leftover(queue_dir, entry) or entry == MANIFEST_TMP:
            path = os.path.join(queue_dir, entry)
            removed.append(path)
            if writable:
                os.unlink(path)
    if removed and writable:
        fsync_dir(queue_dir)
    numbers = list_segment_numbers(queue_dir)
    versions = {n: _peek_version(segment_path(queue_dir, n)) for n in numbers}
    if read_manifest(queue_dir) is None and 1 in versions.values():
        return _migrate_v1(queue_dir, mode, numbers, versions, removed, strays, started)
    try:
        return _recover_v2(queue_dir, mode, removed, strays, started)
    except CorruptSegmentError:
        if mode is not RecoveryMode.REPAIR:
            raise
    repairs, torn = _salvage_and_rebuild(queue_dir, removed)
    # (what was in the way of the rebuild, a manifest name that was no file of ours, say, is replaced now)
    strays = tuple(stray_entries(queue_dir))
    recovered = _recover_v2(queue_dir, RecoveryMode.OPEN, removed, strays, started)
    recovered.report = attrs.evolve(
        recovered.report, repairs=tuple(repairs), torn_tail=torn or recovered.report.torn_tail
    )
    return recovered


def _peek_version(path: str) -> int | None:
    with open(path, "rb", buffering=0) as f:
        return peek_format_version(f.read(12))


def _report(
    queue_dir: str, found: _Found, stale: int, next_id: int, torn: TornTail | None, removed: list[str],
    strays: tuple[str, ...], repairs: list[RepairAction], started: float, found_format: int = 2,
) -> RecoveryReport:  # fmt: skip
    return RecoveryReport(
        directory=queue_dir, segments=len(found.states), enqueue_records=found.enqueue_records,
        ack_records=len(found.acks), stale_acks=stale, live_messages=len(found.live),
        live_bytes=sum(s.live_bytes for s in found.states), next_id=next_id, torn_tail=torn,
        removed_files=tuple(removed), stray_files=strays, repairs=tuple(repairs),
        duration_seconds=time.perf_counter() - started, found_format=found_format,
    )  # fmt: skip


def _recover_v2(
    queue_dir: str, mode: RecoveryMode, removed: list[str], strays: tuple[str, ...], started: float
) -> RecoveredLog:
    """The strict pass over a format-2 queue (module docstring)."""
    writable = mode is not RecoveryMode.CHECK
    manifest_path = os.path.join(queue_dir, MANIFEST_NAME)
    numbers = list_segment_numbers(queue_dir)
    raw = read_manifest(queue_dir)
    torn: TornTail | None = None
    write_manifest = False
    if raw is None:
        if not numbers:  # a new queue
            return _fresh(queue_dir, mode, removed, strays, started)
        # Created, and the crash came before its manifest: one segment, no record yet.
        path = segment_path(queue_dir, numbers[0])
        data = _read_file(path)
        if len(numbers) > 1 or len(data) > SEGMENT_HEADER_BYTES:
            raise CorruptSegmentError(
                manifest_path, 0, f"manifest missing, segments {numbers[0]} to {numbers[-1]} present"
            )
        if len(data) < SEGMENT_HEADER_BYTES or not data.strip(b"\x00"):
            # ... or even before its header was synced: start again.
            if writable:
                os.unlink(path)
                fsync_dir(queue_dir)
            recovered = _fresh(queue_dir, mode, removed, strays, started)
            recovered.report = attrs.evolve(
                recovered.report,
                torn_tail=TornTail(
                    path=path, offset=0, dropped_bytes=len(data), reason="segment header cut short"
                ),
            )
            return recovered
        first = last = numbers[0]
        write_manifest = True
    else:
        try:
            first, last = decode_manifest(raw)
        except ValueError as exc:
            raise CorruptSegmentError(manifest_path, 0, f"manifest: {exc}") from None
    # Below the manifest's first: compacted away, the unlink was not done (or a rebuild's old files).
    for number in [n for n in numbers if n < first]:
        path = segment_path(queue_dir, number)
        removed.append(path)
        if writable:
            os.unlink(path)
    chain = list(range(first, last + 1))
    present = set(numbers)
    for number in [n for n in numbers if n > last]:
        path = segment_path(queue_dir, number)
        data = _read_file(path)
        try:
            header = decode_segment_header(data)
        except ValueError as exc:
            if number == last + 1 and (len(data) < SEGMENT_HEADER_BYTES or not data.strip(b"\x00")):
                # A rotation's new segment, cut before its header was synced: it holds nothing.
                torn = TornTail(path=path, offset=0, dropped_bytes=len(data), reason=f"segment header: {exc}")
                if writable:
                    os.unlink(path)
                continue
            raise CorruptSegmentError(path, 0, f"segment header: {exc}") from None
        if number == last + 1 and header.origin:
            removed.append(path)  # a rebuild whose manifest switch never happened
            if writable:
                os.unlink(path)
            continue
        if number == last + 1 and len(data) == SEGMENT_HEADER_BYTES:
            chain.append(number)  # a rotation's new segment, before the manifest listed it: adopted
            write_manifest = True
            continue
        raise CorruptSegmentError(
            path, 0 if number > last + 1 else SEGMENT_HEADER_BYTES,
            f"segment {number} is not listed by the manifest (segments {first} to {last})",
        )  # fmt: skip
    if writable:
        fsync_dir(queue_dir)
    for number in chain:
        if number not in present:
            raise CorruptSegmentError(
                segment_path(queue_dir, number), 0,
                f"segment file missing (the manifest lists segments {first} to {last})",
            )  # fmt: skip
    found = _Found()
    seal: Seal | None = None
    next_seq = 0
    try:
        for index, number in enumerate(chain):
            path = segment_path(queue_dir, number)
            is_last = index == len(chain) - 1
            data = _read_file(path)
            try:
                header = decode_segment_header(data)
                if header.number != number:
                    raise ValueError(f"header says segment {header.number}, file name says {number}")
            except ValueError as exc:
                raise CorruptSegmentError(path, 0, f"segment header: {exc}") from None
            if index and header.first_seq != next_seq:
                raise CorruptSegmentError(
                    path, 0, f"sequence gap: segment {chain[index - 1]} ends before sequence {next_seq}, "
                    f"segment {number} starts at {header.first_seq} (records are missing)",
                )  # fmt: skip
            found.next_id = max(found.next_id, header.base_id)
            result = scan_records(
                data, SEGMENT_HEADER_BYTES, number, found.last_id, header.first_seq, not header.compacted
            )
            size = len(data)
            if result.stop is not None:
                reason = result.stop.value + (f" ({result.detail})" if result.detail else "")
                active = is_last and not header.compacted
                if classify_stop(data, result, is_active_segment=active) is not Verdict.TORN_TAIL:
                    raise CorruptSegmentError(path, result.end, reason)
                torn = TornTail(
                    path=path, offset=result.end, dropped_bytes=size - result.end, reason=reason,
                    claimed_id=_find_records_after(data, result.end).damaged_id,
                )  # fmt: skip
                if writable:
                    os.truncate(path, result.end)
                    _sync_path(path)
                size = result.end
            seal = result.seal
            if seal is None and (not is_last or header.compacted):
                raise CorruptSegmentError(
                    path, size, "a sealed segment ends without its seal record (cut at a record boundary?)"
                )
            if seal is not None:
                found.next_id = max(found.next_id, seal.next_id)
            next_seq = result.next_seq
            state = SegmentState(
                number=number, path=path, base_id=header.base_id, size=size, live_bytes=0, live_count=0,
                min_id=-1, max_id=-1, ack_count=0, first_seq=header.first_seq, records=result.records,
                sealed=seal is not None,
            )  # fmt: skip
            found.add(state, result)
        stale = found.apply_acks()
        next_id = _id_floor(found.next_id, torn, [])
        if writable:
            tail = found.states[-1]
            if tail.sealed or next_id > found.next_id:
                # A new segment: the last one is sealed (a rotation was cut short), or the id floor rose
                # (the new header makes it durable).
                if not tail.sealed:
                    buf = bytearray()
                    append_seal(buf, Seal(next_seq, tail.records, next_id))
                    with open(tail.path, "ab", buffering=0) as f:
                        f.write(buf)
                        os.fsync(f.fileno())
                    tail.size += len(buf)
                    tail.sealed = True
                number = chain[-1] + 1  # (a torn one there was removed above: segments stay consecutive)
                fd = create_segment(queue_dir, number, next_id, next_seq)
                found.states.append(_state(number, segment_path(queue_dir, number), next_id, next_seq, fd=fd))
                write_manifest = True
            if write_manifest:
                write_manifest_at(queue_dir, found.states[0].number, found.states[-1].number)
            for state in found.states:
                if state.fd < 0:
                    state.fd = open_segment(state.path)
    except BaseException:
        for state in found.states:
            if state.fd >= 0:
                os.close(state.fd)
        raise
    report = _report(queue_dir, found, stale, next_id, torn, removed, strays, [], started)
    return RecoveredLog(
        segments=found.states, live=found.live, next_id=next_id, report=report, next_seq=next_seq
    )


def _fresh(
    queue_dir: str, mode: RecoveryMode, removed: list[str], strays: tuple[str, ...], started: float
) -> RecoveredLog:
    """A queue without segments: in a writing mode, its first segment and manifest are created."""
    found = _Found()
    if mode is not RecoveryMode.CHECK:
        fd = create_segment(queue_dir, 1, 0, 0)
        found.states.append(_state(1, segment_path(queue_dir, 1), 0, 0, fd=fd))
        try:
            write_manifest_at(queue_dir, 1, 1)
        except BaseException:
            os.close(fd)
            raise
    report = _report(queue_dir, found, 0, 0, None, removed, strays, [], started)
    return RecoveredLog(segments=found.states, live=found.live, next_id=0, report=report, next_seq=0)


# ---------------------------------------------------------------------------------------- repair


def _salvage_and_rebuild(queue_dir: str, removed: list[str]) -> tuple[list[RepairAction], TornTail | None]:
    """Keep every well-formed record before each damage, report what is lost, and rebuild the queue
    from the surviving live messages (module docstring). Returns the repairs and a torn tail."""
    repairs: list[RepairAction] = []
    torn: TornTail | None = None
    manifest: tuple[int, int] | None = None
    raw = read_manifest(queue_dir)
    if raw is not None:
        try:
            manifest = decode_manifest(raw)
        except ValueError as exc:
            repairs.append(
                _gap(os.path.join(queue_dir, MANIFEST_NAME), f"manifest: {exc} (rebuilt)", 0, None)
            )
    numbers = list_segment_numbers(queue_dir)
    if manifest is not None:
        numbers = [n for n in numbers if manifest[0] <= n]
        # (every segment the manifest lists is expected, also when none of them is left)
        expected = range(manifest[0], max([manifest[1], *numbers]) + 1)
    else:
        expected = range(numbers[0], numbers[-1] + 1) if numbers else range(0)
    found = _Found()
    paths: dict[int, str] = {}
    next_seq: int | None = None  # where the previous segment's records ended (None: unknown)
    last_max_id = -1
    for number in expected:
        path = segment_path(queue_dir, number)
        if number not in numbers:
            if number == expected[-1]:
                # The active segment: how many ids it handed out is unknown. It cannot have held more
                # records than a location can address (2**40 bytes, 40 per record): new ids start above.
                floor = max(found.next_id, last_max_id + 1)
                ids = (floor, floor + _MAX_SEGMENT_RECORDS - 1)
            else:
                ids = (last_max_id + 1, -1)  # bounded by the next segment's base id (the gap below)
            repairs.append(_gap(path, "segment file missing", 0, ids))
            continue
        data = _read_file(path)
        try:
            header = decode_segment_header(data)
            if header.number != number:
                raise ValueError(f"header says segment {header.number}, file name says {number}")
        except ValueError as exc:
            # (a segment the manifest lists had its header synced before it was listed: one cut or zeroed
            # there is damage, its records lost; only one beyond the manifest can be a rotation's crash)
            unlisted = manifest is None or number > manifest[1]
            blank = len(data) < SEGMENT_HEADER_BYTES or not data.strip(b"\x00")
            if blank and not unlisted:
                floor = max(found.next_id, last_max_id + 1)
                ids = (floor, floor + _MAX_SEGMENT_RECORDS - 1) if number == expected[-1] else (floor, -1)
                repairs.append(_gap(path, f"segment header: {exc} (its records are lost)", 0, ids))
            elif not (blank and number == numbers[-1]):
                repairs.append(_quarantined(queue_dir, path, data, 0, f"segment header: {exc}"))
            next_seq = None
            continue
        if manifest is not None and number > manifest[1] and header.origin:
            continue  # a rebuild that never took over
        if next_seq is not None and header.first_seq > next_seq:
            missing = header.first_seq - next_seq
            reason = f"sequence numbers {next_seq} to {header.first_seq - 1} missing"
            repairs.append(
                _gap(path, reason, missing, (last_max_id + 1, max(header.base_id, last_max_id + 1)))
            )
        found.next_id = max(found.next_id, header.base_id)
        result = scan_records(
            data, SEGMENT_HEADER_BYTES, number, found.last_id, header.first_seq, not header.compacted
        )
        is_last = number == expected[-1]
        if result.stop is not None:
            reason = result.stop.value + (f" ({result.detail})" if result.detail else "")
            active = is_last and not header.compacted
            if classify_stop(data, result, is_active_segment=active) is Verdict.TORN_TAIL:
                torn = TornTail(
                    path=path, offset=result.end, dropped_bytes=len(data) - result.end, reason=reason,
                    claimed_id=_find_records_after(data, result.end).damaged_id,
                )  # fmt: skip
            else:
                repairs.append(_quarantined(queue_dir, path, data, result.end, reason))
            next_seq = None
        elif result.seal is None and not is_last:
            reason = "no seal record at the end (cut at a record boundary): the rest of the segment is lost"
            repairs.append(_gap(path, reason, 0, None, offset=result.end))
            next_seq = result.next_seq  # the next segment's first sequence number says how many
        else:
            next_seq = result.next_seq
        if result.seal is not None:
            found.next_id = max(found.next_id, result.seal.next_id)
        paths[number] = path
        state = _state(number, path, header.base_id, header.first_seq)
        found.add(state, result)
        if result.enqueue_ids:
            last_max_id = result.enqueue_ids[-1]
    found.apply_acks()
    next_id = _id_floor(found.next_id, torn, repairs)
    start_seq = max((s.first_seq + s.records for s in found.states), default=0)
    _rebuild(
        queue_dir, paths, found.live, next_id, start_seq, decode_enqueue_body, list_segment_numbers(queue_dir)
    )
    return repairs, torn


def _gap(
    path: str, reason: str, missing: int, id_range: tuple[int, int] | None, offset: int = 0
) -> RepairAction:
    lost = LostRecords(
        enqueue_ids=(), ack_ids=(), unreadable_bytes=0, missing_records=missing,
        id_range=id_range if id_range is not None and id_range[1] >= id_range[0] else None,
    )  # fmt: skip
    return RepairAction(
        path=path, offset=offset, reason=reason, quarantined_as="", kept_bytes=offset, lost=lost
    )


def _quarantined(
    queue_dir: str, path: str, data: bytes, offset: int, reason: str, version: int = 2
) -> RepairAction:
    target = _quarantine(queue_dir, path)
    return RepairAction(
        path=path, offset=offset, reason=reason, quarantined_as=target, kept_bytes=offset,
        lost=_find_records_after(data, offset, version),
    )  # fmt: skip


_REBUILD_FLUSH: Final = 4 * 1024 * 1024
_MAX_SEGMENT_RECORDS: Final = (1 << 40) // 40


def _rebuild(
    queue_dir: str, paths: dict[int, str], live: dict[int, int], next_id: int, next_seq: int,
    decode: Any, old_numbers: list[int],
) -> None:  # fmt: skip
    """Write every live message (in id order, with ids, timestamps and headers unchanged) into one new
    format-2 segment, then make it the queue's only segment.

    The segment is written as a compaction temp file, synced and renamed into place (it is flagged
    *origin*: should the crash come before the manifest names it, the next open removes it); the
    manifest switch is the commit point; the old segments (now below the manifest's first) are then
    deleted, or by the next open if the crash comes first.
    """
    number = max(old_numbers, default=0) + 1
    path = segment_path(queue_dir, number)
    tmp = path[: -len(".seg")] + COMPACT_SUFFIX
    buf = bytearray(encode_segment_header(number, next_id, next_seq, SEGMENT_ORIGIN))
    fds: dict[int, int] = {}
    out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    try:
        seq = next_seq
        for mid, loc in live.items():
            seg, off, length, _meta, _ts = unpack_location(loc)
            fd = fds.get(seg)
            if fd is None:
                fd = fds[seg] = os.open(paths[seg], os.O_RDONLY)
            rid, ts, meta, payload = decode(pread_exact(fd, off, length))
            if rid != mid:
                raise OSError(f"{paths[seg]}: the record at offset {off} holds message {rid}, not {mid}")
            append_enqueue(buf, mid, ts, meta, payload, seq)
            seq += 1
            if len(buf) >= _REBUILD_FLUSH:
                write_all(out, buf, sync=False)
                buf.clear()
        write_all(out, buf, sync=True)
    finally:
        os.close(out)
        for fd in fds.values():
            os.close(fd)
    os.replace(tmp, path)
    fsync_dir(queue_dir)
    write_manifest_at(queue_dir, number, number)
    for old in old_numbers:
        try:
            os.unlink(segment_path(queue_dir, old))
        except FileNotFoundError:
            pass
    fsync_dir(queue_dir)


# ---------------------------------------------------------------------------------------- format 1


def _migrate_v1(
    queue_dir: str, mode: RecoveryMode, numbers: list[int], versions: dict[int, int | None],
    removed: list[str], strays: tuple[str, ...], started: float,
) -> RecoveredLog:  # fmt: skip
    """Recover a format-1 queue with that format's rules; in a writing mode, migrate it (rebuild)."""
    writable = mode is not RecoveryMode.CHECK
    for number in [n for n in numbers if versions[n] == 2]:
        # Format-2 segments beside format-1 ones and no manifest: a migration cut short.
        path = segment_path(queue_dir, number)
        removed.append(path)
        if writable:
            os.unlink(path)
    old = [n for n in numbers if versions[n] != 2]
    if writable:
        fsync_dir(queue_dir)
    found, stale, next_id, torn, repairs = _recover_v1(queue_dir, mode, old)
    if not writable:
        report = _report(queue_dir, found, stale, next_id, torn, removed, strays, repairs, started, 1)
        return RecoveredLog(segments=found.states, live=found.live, next_id=next_id, report=report)
    paths = {s.number: s.path for s in found.states}
    _rebuild(queue_dir, paths, found.live, next_id, 0, v1.decode_enqueue_body, old)
    recovered = _recover_v2(queue_dir, RecoveryMode.OPEN, removed, strays, started)
    recovered.report = attrs.evolve(recovered.report, torn_tail=torn, repairs=tuple(repairs), found_format=1)
    return recovered


def _recover_v1(
    queue_dir: str, mode: RecoveryMode, numbers: list[int]
) -> tuple[_Found, int, int, TornTail | None, list[RepairAction]]:
    """Format 1's recovery (no manifest, no sequence, no seals): torn tails of the last segment are cut
    (in a writing mode), a corrupt record raises, or in ``REPAIR`` mode its segment is quarantined and
    cut before it. No descriptor is left open."""
    repairs: list[RepairAction] = []
    torn: TornTail | None = None
    found = _Found()
    for index, number in enumerate(numbers):
        path = segment_path(queue_dir, number)
        is_last = index == len(numbers) - 1
        data = _read_file(path)
        try:
            header_number, base_id = v1.decode_segment_header(data)
            if header_number != number:
                raise ValueError(f"header says segment {header_number}, file name says {number}")
        except ValueError as exc:
            if is_last and (len(data) < v1.SEGMENT_HEADER_BYTES or not data.strip(b"\x00")):
                torn = TornTail(path=path, offset=0, dropped_bytes=len(data), reason=f"segment header: {exc}")
                break
            if mode is not RecoveryMode.REPAIR:
                raise CorruptSegmentError(path, 0, f"segment header: {exc}") from None
            repairs.append(_quarantined(queue_dir, path, data, 0, f"segment header: {exc}", version=1))
            continue
        found.next_id = max(found.next_id, base_id)
        result = v1.scan_records(data, v1.SEGMENT_HEADER_BYTES, number, found.last_id)
        size = len(data)
        if result.stop is not None:
            reason = result.stop.value + (f" ({result.detail})" if result.detail else "")
            verdict = v1.classify_stop(data, result, is_last_segment=is_last)
            if verdict is v1.Verdict.TORN_TAIL:
                torn = TornTail(
                    path=path, offset=result.end, dropped_bytes=size - result.end, reason=reason,
                    claimed_id=_find_records_after(data, result.end, version=1).damaged_id,
                )  # fmt: skip
            elif mode is RecoveryMode.REPAIR:
                repairs.append(_quarantined(queue_dir, path, data, result.end, reason, version=1))
            else:
                raise CorruptSegmentError(path, result.end, reason)
            size = result.end
        state = SegmentState(
            number=number, path=path, base_id=base_id, size=size, live_bytes=0, live_count=0, min_id=-1,
            max_id=-1, ack_count=0,
        )  # fmt: skip
        found.add(state, result)
    stale = found.apply_acks()
    return found, stale, _id_floor(found.next_id, torn, repairs), torn, repairs
