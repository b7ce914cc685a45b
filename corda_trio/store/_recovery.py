"""Recovery, checking and repair of one queue directory (blocking: run in a worker thread).

Theory of operation
-------------------
Recovery reads every segment in number order, scans its records with the pure scanner (headers and
checksums only, payloads are never copied) and rebuilds the *live set*: a dict ``message id -> packed
location`` of every enqueue record without a matching ack record. Dict insertion order is id order, which
is FIFO order, because ids increase through the log (compaction rewrites a segment in place and keeps
the order). The scan of 1 GiB costs one read per segment and one ``crc32`` per record.

Where a scan stops early, :func:`~._record.classify_stop` decides: a torn tail of the last segment is
truncated (``ftruncate`` + ``fsync``) and reported; anything else raises :class:`CorruptSegmentError`
naming file and offset. Leftovers of an interrupted compaction (``*.seg.compact``) are deleted: the rename
that publishes a compacted segment is the commit point, so an unrenamed copy is garbage by definition.

``check`` does the same without changing anything. ``repair`` handles a corrupt segment by copying it
into ``quarantine/``, keeping the valid prefix in place, and listing what the rest held (found by looking
for well-formed records after the bad spot): lost enqueues are lost messages; lost acks mean those
messages may be delivered again (consumers deduplicate).
"""

from __future__ import annotations

import enum
import os
import shutil
import struct
import time
from array import array
from typing import Final

import attrs

from ._errors import CorruptSegmentError
from ._record import (
    SEGMENT_HEADER_BYTES,
    RecordKind,
    Verdict,
    classify_stop,
    decode_segment_header,
    find_records,
    scan_records,
    unpack_location,
)
from ._segment import (
    COMPACT_SUFFIX,
    QUARANTINE_DIR,
    fsync_dir,
    is_compaction_leftover,
    list_segment_numbers,
    open_segment,
    segment_path,
    stray_entries,
    write_all,
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

    @property
    def highest_id(self) -> int:
        """The highest message id this loss may have held (-1: none): new ids start above it."""
        return max((*self.enqueue_ids, *self.ack_ids, self.damaged_id or -1), default=-1)


@attrs.frozen(kw_only=True)
class RepairAction:
    """One quarantined segment."""

    path: str
    offset: int
    reason: str
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


@attrs.define(eq=False)
class SegmentState:
    """Runtime bookkeeping of one segment file (mutated only on the event loop thread).

    ``live_bytes`` / ``live_count`` cover enqueue records not yet acked; ``min_id`` / ``max_id`` the enqueue
    ids physically present (-1 when none); ``ack_count`` the ack records physically present. ``fd`` is
    closed once the segment is retired (replaced by compaction) and no reader holds it (``readers``).
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


@attrs.define(eq=False)
class RecoveredLog:
    """The state of a queue rebuilt from disk: segments (with open descriptors in OPEN/REPAIR mode), the
    live set in FIFO order, and the next message id."""

    segments: list[SegmentState]
    live: dict[int, int]
    next_id: int
    report: RecoveryReport


_ENQ: Final = int(RecordKind.ENQUEUE)
_ACK: Final = int(RecordKind.ACK)
_HEADER: Final = struct.Struct("<IIBBHQQI")


def _read_file(path: str) -> bytes:
    with open(path, "rb", buffering=0) as f:
        return f.read()


def _find_records_after(data: bytes, start: int) -> LostRecords:
    """Best-effort list of what ``data[start:]`` held (used to report losses and to keep ids above
    them): its well-formed records, and the id the damaged record at ``start`` claims, if it has one."""
    found = find_records(data, start)
    damaged_id = None
    if len(data) - start >= _HEADER.size and not (found and found[0][0] == start):
        claimed = _HEADER.unpack_from(data, start)[5]
        damaged_id = claimed if claimed < 1 << 62 else None  # a wild value is no id worth keeping clear
    return LostRecords(
        enqueue_ids=tuple(mid for _o, _l, kind, mid in found if kind == _ENQ),
        ack_ids=tuple(mid for _o, _l, kind, mid in found if kind == _ACK),
        unreadable_bytes=len(data) - start - sum(length for _o, length, _k, _m in found),
        dropped_bytes=len(data) - start,
        damaged_id=damaged_id,
    )


def _replace_with_prefix(queue_dir: str, path: str, data: bytes, keep: int) -> None:
    """Atomically replace ``path`` by its first ``keep`` bytes (tmp file, fsync, rename, fsync dir)."""
    tmp = path[: -len(".seg")] + COMPACT_SUFFIX
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    try:
        write_all(fd, memoryview(data)[:keep], sync=True)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(queue_dir)


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


def recover_queue(queue_dir: str, mode: RecoveryMode = RecoveryMode.OPEN) -> RecoveredLog:
    """Rebuild a queue's state from its directory.

    Args:
        queue_dir: the queue's directory (it must exist).
        mode: see :class:`RecoveryMode`. In ``CHECK`` mode nothing is written and no descriptor is left
            open; in ``OPEN`` and ``REPAIR`` modes every segment gets a descriptor (the caller owns them).

    Returns:
        The recovered log; its ``report`` says what was found and done.

    Raises:
        CorruptSegmentError: a record or header is invalid in a way a crash cannot explain (not in
            ``REPAIR`` mode, which quarantines instead).
        OSError: the directory could not be read or written.
    """
    started = time.perf_counter()
    removed: list[str] = []
    repairs: list[RepairAction] = []
    torn: TornTail | None = None
    writable = mode is not RecoveryMode.CHECK
    strays = tuple(stray_entries(queue_dir))
    for entry in sorted(os.listdir(queue_dir)):
        if is_compaction_leftover(queue_dir, entry):
            path = os.path.join(queue_dir, entry)
            removed.append(path)
            if writable:
                os.unlink(path)
    if removed and writable:
        fsync_dir(queue_dir)

    numbers = list_segment_numbers(queue_dir)
    states: list[SegmentState] = []
    live: dict[int, int] = {}
    acks = array("Q")
    last_id = -1
    next_id = 0
    enqueue_records = 0
    try:
        for index, number in enumerate(numbers):
            path = segment_path(queue_dir, number)
            is_last = index == len(numbers) - 1
            data = _read_file(path)
            try:
                header_number, base_id = decode_segment_header(data)
                if header_number != number:
                    raise ValueError(f"header says segment {header_number}, file name says {number}")
            except ValueError as exc:
                if is_last and (len(data) < SEGMENT_HEADER_BYTES or not data.strip(b"\x00")):
                    # Crash between creating the last segment and syncing its header: it holds nothing.
                    torn = TornTail(
                        path=path, offset=0, dropped_bytes=len(data), reason=f"segment header: {exc}"
                    )
                    if writable:
                        os.unlink(path)
                        fsync_dir(queue_dir)
                    break
                if mode is not RecoveryMode.REPAIR:
                    raise CorruptSegmentError(path, 0, f"segment header: {exc}") from None
                target = _quarantine(queue_dir, path)
                os.unlink(path)
                fsync_dir(queue_dir)
                repairs.append(
                    RepairAction(
                        path=path, offset=0, reason=f"segment header: {exc}", quarantined_as=target,
                        kept_bytes=0, lost=_find_records_after(data, 0),
                    )
                )  # fmt: skip
                continue
            next_id = max(next_id, base_id)
            result = scan_records(data, SEGMENT_HEADER_BYTES, number, last_id)
            size = len(data)
            if result.stop is not None:
                reason = result.stop.value + (f" ({result.detail})" if result.detail else "")
                verdict = classify_stop(data, result, is_last_segment=is_last)
                if verdict is Verdict.TORN_TAIL:
                    torn = TornTail(
                        path=path, offset=result.end, dropped_bytes=size - result.end, reason=reason,
                        claimed_id=_find_records_after(data, result.end).damaged_id,
                    )  # fmt: skip
                    if writable:
                        os.truncate(path, result.end)
                        fd = os.open(path, os.O_RDWR)
                        try:
                            os.fsync(fd)
                        finally:
                            os.close(fd)
                elif mode is RecoveryMode.REPAIR:
                    target = _quarantine(queue_dir, path)
                    _replace_with_prefix(queue_dir, path, data, result.end)
                    repairs.append(
                        RepairAction(
                            path=path, offset=result.end, reason=reason, quarantined_as=target,
                            kept_bytes=result.end, lost=_find_records_after(data, result.end),
                        )
                    )  # fmt: skip
                else:
                    raise CorruptSegmentError(path, result.end, reason)
                size = result.end
            ids = result.enqueue_ids
            live.update(zip(ids, result.enqueue_locations, strict=True))
            acks.extend(result.ack_ids)
            enqueue_records += len(ids)
            last_id = result.last_enqueue_id
            states.append(
                SegmentState(
                    number=number, path=path, base_id=base_id, size=size, live_bytes=result.enqueue_bytes,
                    live_count=len(ids), min_id=ids[0] if ids else -1, max_id=ids[-1] if ids else -1,
                    ack_count=len(result.ack_ids),
                )
            )  # fmt: skip
        by_number = {s.number: s for s in states}
        stale = 0
        pop = live.pop
        for ack in acks:
            loc = pop(ack, None)
            if loc is None:
                stale += 1  # its enqueue was compacted away already
                continue
            seg, _off, length, _meta, _ts = unpack_location(loc)
            state = by_number[seg]
            state.live_bytes -= length
            state.live_count -= 1
        next_id = max(next_id, last_id + 1, max(acks, default=-1) + 1)
        # Ids are never reused, not even those of messages a torn tail or a repair dropped: a receiver
        # that deduplicates by id would drop a new message that took one. The floor is made durable by
        # starting a new segment whose header's base id is above them.
        # (A claimed id far above every other one is damage, not an id ever handed out.)
        plausible = next_id + (1 << 32)
        lost_ids = [r.lost.highest_id for r in repairs]
        if torn is not None and torn.claimed_id is not None:
            lost_ids.append(torn.claimed_id)
        lost_ceiling = max((i for i in lost_ids if i < plausible), default=-1)
        if lost_ceiling >= next_id:
            next_id = lost_ceiling + 1
            if writable and states:
                from ._segment import create_segment

                number = max(numbers[-1], states[-1].number) + 1
                fd = create_segment(queue_dir, number, next_id)
                states.append(
                    SegmentState(
                        number=number, path=segment_path(queue_dir, number), base_id=next_id,
                        size=SEGMENT_HEADER_BYTES, live_bytes=0, live_count=0, min_id=-1, max_id=-1,
                        ack_count=0, fd=fd,
                    )
                )  # fmt: skip
        if writable and not states:
            # Fresh queue (or its only segment was an empty torn one): start segment 1.
            from ._segment import create_segment  # local: keeps the import list of the common path short

            number = (numbers[-1] + 1) if numbers else 1
            fd = create_segment(queue_dir, number, next_id)
            states.append(
                SegmentState(
                    number=number, path=segment_path(queue_dir, number), base_id=next_id,
                    size=SEGMENT_HEADER_BYTES, live_bytes=0, live_count=0, min_id=-1, max_id=-1, ack_count=0,
                    fd=fd,
                )
            )  # fmt: skip
        if writable:
            for state in states:
                if state.fd < 0:
                    state.fd = open_segment(state.path)
    except BaseException:
        for state in states:
            if state.fd >= 0:
                os.close(state.fd)
        raise
    report = RecoveryReport(
        directory=queue_dir,
        segments=len(states),
        enqueue_records=enqueue_records,
        ack_records=len(acks),
        stale_acks=stale,
        live_messages=len(live),
        live_bytes=sum(s.live_bytes for s in states),
        next_id=next_id,
        torn_tail=torn,
        removed_files=tuple(removed),
        stray_files=strays,
        repairs=tuple(repairs),
        duration_seconds=time.perf_counter() - started,
    )
    return RecoveredLog(segments=states, live=live, next_id=next_id, report=report)
