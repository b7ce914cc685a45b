"""Compaction of one queue generation: rewrite sealed segments that are mostly acked.

Theory of operation
-------------------
*Generations.* A queue's directory can be deleted and a queue of the same name declared again while a
compaction of the old one is running (its rewrite happens on a worker thread and cannot be interrupted
half-way). Working by path, the rewrite would land in the *new* queue's directory: the new queue's
segment replaced by the old one's records. So compaction never works by path. The broker opens each
queue's directory once (:class:`QueueGeneration`: an ``O_DIRECTORY`` descriptor plus a generation number
the broker never reuses) and every file operation of a compaction is relative to that descriptor
(``dir_fd=``): after a delete it reaches the deleted directory's inode or fails, never a directory created
later under the same name. Deleting a queue also stops its :class:`Compactor` first
(:meth:`Compactor.stop`: the background task is cancelled, a running rewrite is waited for), so a
compaction never outlives its queue, and what it raised while the directory went away is not reported:
the queue is gone.

*What is rewritten.* Sealed segments whose live bytes fell to ``compact_live_ratio`` of their size or less
(or, on request, every sealed segment with anything to reclaim, then the current segment, sealed first,
if its acked records surely take more room than the seal and the next segment's header add: a request never
makes a queue larger). What stays: live enqueues, and acks whose
enqueue may still exist in an older segment. For the queue's first segment that is known from the index
alone (its live enqueues are the first entries of the live set; no older segment exists for its acks to
stand for), so a worker thread reads back only those records, each checked: a queue that keeps up, whose
first segment is acked or nearly so, reads next to nothing. Any other segment is read and scanned whole on
a worker thread (a full 64 MiB segment costs a few hundred milliseconds of CPU: never on the event loop),
and the event loop picks what stays from the scan. The thread then writes the kept records to
``<segment>.seg.compact`` between a copy of the header (flagged *compacted*: sequence numbers may now
skip) and a new seal (the same next sequence number, the new record count), fsyncs it, renames it over the
segment and fsyncs the directory. The rename is the commit point: before it the old file is intact (the
leftover temp file is deleted at recovery); after it the new file holds every live record exactly once, in
the same order. A segment with nothing to keep is unlinked if it is the queue's first: the manifest is
first replaced to start at the next segment (a crash before the unlink leaves a file below the manifest's
first, which recovery deletes). Any other segment with nothing to keep becomes a *stub* (header and seal
only) until every older segment is gone: a missing segment in the middle of the chain is always an error,
never a compaction. The replaced or unlinked file is released a step at a time on a worker thread
(:func:`._segment.release_file`: freeing a whole segment's blocks at once stalls every fsync on the file
system for tens of milliseconds).

Messages acked while a compaction runs are simply kept (their ack records, in later segments, stay too:
an ack is dropped only when no older segment can hold its enqueue). Readers that already hold the old
descriptor keep reading the old inode; it is closed when the last one is done.
"""

from __future__ import annotations

import itertools
import logging
import os
from typing import TYPE_CHECKING, Final

import attrs
import trio

from ._errors import StoreClosedError, StoreFailedError
from ._record import (
    ACK_RECORD_BYTES,
    SEAL_RECORD_BYTES,
    SEGMENT_COMPACTED,
    SEGMENT_HEADER_BYTES,
    RecordKind,
    ScanResult,
    Seal,
    SegmentHeader,
    append_seal,
    check_record,
    decode_seal_record,
    decode_segment_header,
    encode_segment_header,
    pack_location,
    scan_records,
    unpack_location,
)
from ._recovery import SegmentState
from ._segment import (
    COMPACT_SUFFIX,
    SEGMENT_SUFFIX,
    close_quietly,
    pread_exact,
    release_file,
    write_all,
    write_manifest,
)

if TYPE_CHECKING:
    from ._wal import DurableLog

__all__ = ["Compactor", "QueueGeneration"]

logger = logging.getLogger("corda_trio.store")

_generations: Final = itertools.count(1)
_O_DIRECTORY: Final = getattr(os, "O_DIRECTORY", 0)
_O_CLOEXEC: Final = getattr(os, "O_CLOEXEC", 0)


@attrs.define(eq=False)
class QueueGeneration:
    """One incarnation of a queue's directory: its descriptor, held from open to delete or close.

    ``number`` is unique in the process (a re-declared queue gets a new one); ``dir_fd`` is the
    directory as it was opened, whatever its path names later.
    """

    name: str
    path: str
    number: int
    dir_fd: int
    closed: bool = False

    @classmethod
    def open(cls, name: str, path: str) -> QueueGeneration:
        """Open the (existing) directory ``path`` of queue ``name`` (blocking)."""
        fd = os.open(path, os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC)
        return cls(name=name, path=path, number=next(_generations), dir_fd=fd)

    def close(self) -> None:
        """Close the directory descriptor (once nothing works on this generation any more)."""
        if not self.closed:
            self.closed = True
            close_quietly(self.dir_fd)


@attrs.define(eq=False)
class Compactor:
    """The compaction of one queue generation: a background task and the operator's requests."""

    log: DurableLog
    generation: QueueGeneration
    _lock: trio.Lock = attrs.field(factory=trio.Lock, init=False)
    _scope: trio.CancelScope = attrs.field(factory=trio.CancelScope, init=False)
    _stopped: bool = attrs.field(default=False, init=False)
    _task_done: trio.Event = attrs.field(factory=trio.Event, init=False)
    _pass_done: trio.Event = attrs.field(factory=trio.Event, init=False)

    @trio.lowlevel.enable_ki_protection  # store internals: a Ctrl-C lands at a checkpoint, never half-way
    async def run(self) -> None:
        """Compact sealed segments as they become mostly acked, until :meth:`stop` or the log closes."""
        log = self.log
        try:
            with self._scope:
                while not self._stopped and not log.closing and log.failure is None:
                    await log.compact_wanted.wait()
                    log.compact_wanted = trio.Event()
                    if self._stopped or log.closing or log.failure is not None:
                        return
                    try:
                        await self.compact(only_dirty=True)
                    except StoreFailedError as exc:
                        # The segment being compacted is intact (the rename is the commit point); try
                        # again when something changes. Running out of disk must not stop the queue.
                        logger.error("queue %s: compaction failed, will retry later: %s", log.name, exc)
                    except StoreClosedError:
                        return
                    finally:
                        self._pass_done.set()
                        self._pass_done = trio.Event()
        finally:
            self._task_done.set()

    @trio.lowlevel.enable_ki_protection  # store internals: a Ctrl-C lands at a checkpoint, never half-way
    async def stop(self) -> None:
        """Stop compacting this generation: cancel the background task and wait until no compaction
        runs (a rewrite already on its worker thread is finished first). Later requests raise
        :class:`StoreClosedError`."""
        self._stopped = True
        self._scope.cancel()
        with trio.CancelScope(shield=True):
            async with self._lock:
                pass

    async def wait_for_pass(self) -> None:
        """Wait until the background task has finished its next pass (whatever it did)."""
        await self._pass_done.wait()

    async def wait_task_done(self) -> None:
        """Wait until the background task (if it was started) has returned."""
        await self._task_done.wait()

    def _check(self) -> None:
        if self._stopped or self.log.closing:
            raise StoreClosedError(f"queue {self.log.name} is closed")

    @trio.lowlevel.enable_ki_protection  # store internals: a Ctrl-C lands at a checkpoint, never half-way
    async def compact(self, *, only_dirty: bool = False, seal_tail: bool = False) -> int:
        """Compact sealed segments; returns the number of bytes reclaimed (what the queue's files shrank
        by: the seal and the header that ``seal_tail`` wrote are counted off).

        Args:
            only_dirty: the background policy: only segments changed since their last compaction whose
                live bytes fell to ``compact_live_ratio`` of their size. Otherwise every sealed segment
                holding anything reclaimable is compacted.
            seal_tail: also compact the current segment: once the sealed ones are done, have the writer
                start a new segment, and compact the one it sealed (operator command and tests; the
                background task never does this). Only if that reclaims more than the seal and the new
                segment's header add (:func:`_sealing_pays`): otherwise the queue would grow, and the
                current segment is left as it is.

        Raises:
            StoreClosedError: the queue was closed or deleted (before or during the compaction).
            StoreFailedError: the log failed, or a segment could not be rewritten (it is intact).
        """
        self._check()
        log = self.log
        async with self._lock:
            self._check()
            reclaimed = await self._compact_sealed(only_dirty)
            if seal_tail and _sealing_pays(log):
                await log.seal_tail()
                reclaimed -= SEAL_RECORD_BYTES + SEGMENT_HEADER_BYTES  # what sealing wrote: counted off
                reclaimed += await self._compact_sealed(only_dirty)  # the one just sealed, and what it freed
            return reclaimed

    async def _compact_sealed(self, only_dirty: bool) -> int:
        """One pass over the sealed segments (see :meth:`compact`); returns the bytes reclaimed."""
        log = self.log
        reclaimed = 0
        for number in sorted(log.segments):
            self._check()
            state = log.segments.get(number)
            if state is None or state is log.tail or log.failure is not None:
                continue
            data_bytes = state.record_bytes()
            if only_dirty:
                if not (state.dirty and log.worth_compacting(state)):
                    continue
            elif not state.dirty and state.live_bytes + state.ack_count * ACK_RECORD_BYTES >= data_bytes:
                if data_bytes or state.number != min(log.segments):
                    continue  # (a first stub is reclaimable: it can go)
            try:
                reclaimed += await self._compact_one(state)
            except OSError as exc:
                self._check()  # the directory went away under a delete: that is all it was
                raise StoreFailedError(
                    f"queue {log.name}: compaction of {state.path} failed (the segment is intact): {exc}"
                ) from exc
        return reclaimed

    def _first_segment_keep(self, state: SegmentState) -> tuple[list[tuple[int, int]], list[int]] | None:
        """The first segment's live enqueues, from the index: ``((offset, length), ids)`` in log order.

        They are the first entries of the live set (ids only grow, segment after segment, and the live set
        is in id order). ``None`` if the index disagrees (then the segment is scanned instead)."""
        keep: list[tuple[int, int]] = []
        ids: list[int] = []
        if state.live_count:
            for mid, loc in self.log.live.items():
                if mid > state.max_id:
                    break
                seg, off, length, _meta, _ts = unpack_location(loc)
                if seg != state.number:
                    return None
                keep.append((off, length))
                ids.append(mid)
        return (keep, ids) if len(ids) == state.live_count else None

    async def _compact_one(self, state: SegmentState) -> int:
        log = self.log
        live = log.live
        is_first = state.number == min(log.segments)
        index = self._first_segment_keep(state) if is_first else None
        if index is not None:
            # What stays is known without reading the segment: its live enqueues (no older segment exists
            # for its acks to stand for). Only those are read back (checked) to be copied.
            keep, kept_ids = index
            kept_acks = 0
            if _nothing_to_drop(state, keep, is_first):
                state.dirty = False
                return 0
            data, header, old_seal, copy = b"", None, None, keep
            if keep:
                read = await trio.to_thread.run_sync(
                    _read_kept, state.fd, state.size, keep, kept_ids, limiter=log.io_limiter
                )
                if isinstance(read, str):
                    raise StoreFailedError(
                        f"queue {log.name}: segment {state.path} changed or is unreadable ({read}); "
                        "compaction stopped"
                    )
                data, header, old_seal, copy = read
        else:
            data, header, result = await trio.to_thread.run_sync(
                _read_and_scan, state.fd, state.number, limiter=log.io_limiter
            )
            if header is None:
                raise StoreFailedError(f"queue {log.name}: {state.path}: {result}; compaction stopped")
            assert isinstance(result, ScanResult)
            if result.stop is not None or result.end != state.size or result.seal is None:
                problem = result.stop.value if result.stop else "size mismatch" if result.seal else "no seal"
                raise StoreFailedError(
                    f"queue {log.name}: segment {state.path} changed or is unreadable at offset "
                    f"{result.end} ({problem}); compaction stopped"
                )
            old_seal = result.seal
            # Which acks must stay: those whose enqueue may still be in an older segment.
            older = [
                (s.min_id, s.max_id)
                for s in log.segments.values()
                if s.number < state.number and s.min_id >= 0
            ]
            keep, kept_ids, kept_acks = [], [], 0  # keep: (offset, length) in log order
            for mid, loc in zip(result.enqueue_ids, result.enqueue_locations, strict=True):
                if mid in live:
                    _seg, off, length, _meta, _ts = unpack_location(loc)
                    keep.append((off, length))
                    kept_ids.append(mid)
            for mid, off in zip(result.ack_ids, result.ack_offsets, strict=True):
                if any(lo <= mid <= hi for lo, hi in older):
                    keep.append((off, ACK_RECORD_BYTES))
                    kept_acks += 1
            keep.sort()
            copy = keep
            if _nothing_to_drop(state, keep, is_first):
                state.dirty = False
                return 0
        self._check()
        name = os.path.basename(state.path)
        if keep or not is_first:
            assert header is not None and old_seal is not None
            head = encode_segment_header(
                state.number, header.base_id, header.first_seq, header.flags | SEGMENT_COMPACTED
            )
            seal = bytearray()
            append_seal(seal, Seal(old_seal.next_seq, len(keep), old_seal.next_id))
            new_fd, new_size, new_offsets = await trio.to_thread.run_sync(
                rewrite_segment, self.generation.dir_fd, name, data, copy, head, bytes(seal),
                limiter=log.io_limiter,
            )  # fmt: skip
        else:
            # The first segment, nothing to keep: the manifest starts after it, then it goes.
            following = min(n for n in log.segments if n > state.number)
            async with log.manifest_lock:
                self._check()
                new_fd, new_size, new_offsets = await trio.to_thread.run_sync(
                    _drop_first, self.generation.dir_fd, name, following, log.tail.number,
                    limiter=log.io_limiter,
                )  # fmt: skip
        if self._stopped:  # deleted meanwhile: the rewrite reached the old directory only
            if new_fd >= 0:
                close_quietly(new_fd)
            self._check()
        # The rename (or unlink) is durable now: switch the index over, synchronously.
        old_size = state.size
        offset_of = dict(zip((off for off, _l in keep), new_offsets, strict=True))
        log.compactions += 1
        log.compacted_bytes += old_size - new_size
        if new_fd < 0:
            del log.segments[state.number]
        else:
            new = SegmentState(
                number=state.number, path=state.path, base_id=state.base_id, size=new_size, live_bytes=0,
                live_count=0, min_id=-1, max_id=-1, ack_count=kept_acks, fd=new_fd,
                first_seq=state.first_seq, records=len(keep), sealed=True,
            )  # fmt: skip
            for mid in kept_ids:
                loc = live.get(mid)
                if loc is None:  # acked during the compaction: its record stays until the next one
                    new.dirty = True
                    continue
                seg, off, length, meta_len, ts = unpack_location(loc)
                live[mid] = pack_location(seg, offset_of[off], length, meta_len, ts)
                new.live_bytes += length
                new.live_count += 1
            if kept_ids:
                new.min_id, new.max_id = kept_ids[0], kept_ids[-1]
            log.segments[state.number] = new
            if new.dirty and log.worth_compacting(new):
                log.compact_wanted.set()
        state.retired = True
        retired_fd = state.fd if state.readers == 0 else -1
        # Acks in later segments may have become unnecessary; a stub after a dropped first one can go.
        for later in log.segments.values():
            if later.number > state.number and (later.ack_count or new_fd < 0):
                later.dirty = True
                if later is not log.tail and log.worth_compacting(later):
                    log.compact_wanted.set()
        logger.debug(
            "queue %s: compacted segment %d: %d -> %d bytes", log.name, state.number, old_size, new_size
        )
        if retired_fd >= 0:
            # The last descriptor of a replaced or unlinked file: it goes a step at a time (freeing a full
            # segment at once stalls every fsync on the file system; see release_file), on a thread of
            # its own (not one of the queue's I/O threads, which deliveries need).
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(release_file, retired_fd)
        return old_size - new_size


def _sealing_pays(log: DurableLog) -> bool:
    """Whether compacting the current segment (``log.tail``) surely reclaims more than sealing it adds (its
    seal record, and the header of the segment the writer starts next). What it surely reclaims: its acked
    enqueues, and its acks too when no older segment holds an enqueue (an ack that may stand for one must
    stay). A queue whose current segment is all live messages (a dedup queue that keeps its ids for days,
    say) would otherwise grow by each ``store compact`` and reclaim nothing."""
    tail = log.tail
    older = [s for n, s in log.segments.items() if n < tail.number]
    droppable = tail.record_bytes() - tail.live_bytes
    if any(s.min_id >= 0 for s in older):
        droppable -= tail.ack_count * ACK_RECORD_BYTES
    if not older and not tail.live_count:
        return droppable > 0  # it goes whole, seal and header too: the next segment's header is all it costs
    return droppable > SEAL_RECORD_BYTES + SEGMENT_HEADER_BYTES


def _nothing_to_drop(state: SegmentState, keep: list[tuple[int, int]], is_first: bool) -> bool:
    """Every record of ``state`` stays (every ack still needed), or it is a stub that must stay (not the
    first segment): a rewrite would reclaim nothing."""
    return sum(length for _o, length in keep) == state.record_bytes() and (bool(keep) or not is_first)


def _read_kept(
    fd: int, size: int, keep: list[tuple[int, int]], ids: list[int]
) -> tuple[bytes, SegmentHeader, Seal, list[tuple[int, int]]] | str:
    """Read the header, the seal and the enqueue records ``keep`` (of messages ``ids``) of a sealed segment
    of ``size`` bytes, each checked (blocking: on a worker thread). Returns ``(data, header, seal,
    copy)``: ``data`` holds the header and the records, ``copy`` their places in it (for
    :func:`rewrite_segment`); or what is wrong."""
    out = bytearray(pread_exact(fd, 0, SEGMENT_HEADER_BYTES))
    try:
        header = decode_segment_header(out)
        seal = decode_seal_record(pread_exact(fd, size - SEAL_RECORD_BYTES, SEAL_RECORD_BYTES))
    except ValueError as exc:
        return str(exc)
    copy: list[tuple[int, int]] = []
    i = 0
    while i < len(keep):  # each run of adjacent records in one read
        start, end, j = keep[i][0], keep[i][0], i
        while j < len(keep) and keep[j][0] == end:
            end += keep[j][1]
            j += 1
        chunk = pread_exact(fd, start, end - start)
        for (off, length), mid in zip(keep[i:j], ids[i:j], strict=True):
            try:
                kind, got_id, got_length = check_record(chunk, off - start)
            except ValueError as exc:
                return f"offset {off}: {exc}"
            if kind != RecordKind.ENQUEUE or got_id != mid or got_length != length:
                return f"offset {off}: not the enqueue record of message {mid}"
            copy.append((len(out) + off - start, length))
        out += chunk
        i = j
    return bytes(out), header, seal, copy


def _read_and_scan(fd: int, number: int) -> tuple[bytes, SegmentHeader | None, ScanResult | str]:
    """Read segment ``number`` whole and scan its records (blocking, CPU-bound: on a worker thread).
    Returns ``(data, header, scan)``, or ``(data, None, what is wrong with the header)``."""
    data = pread_exact(fd, 0, os.fstat(fd).st_size)
    try:
        header = decode_segment_header(data)
    except ValueError as exc:
        return data, None, str(exc)
    return (
        data,
        header,
        scan_records(data, SEGMENT_HEADER_BYTES, number, -1, header.first_seq, not header.compacted),
    )


def _drop_first(dir_fd: int, name: str, following: int, last: int) -> tuple[int, int, list[int]]:
    """Replace the manifest to start at segment ``following``, then unlink ``name`` (blocking)."""
    write_manifest(dir_fd, following, last)
    return rewrite_segment(dir_fd, name, b"", [])


def rewrite_segment(
    dir_fd: int, name: str, data: bytes, keep: list[tuple[int, int]], head: bytes | None = None,
    seal: bytes = b"",
) -> tuple[int, int, list[int]]:  # fmt: skip
    """Write the kept records of segment ``name`` (in the directory ``dir_fd``) to a temp file, between
    ``head`` (the new header; default: the old one) and ``seal``, and rename it over the segment (module
    docstring). With nothing to keep and no new header the segment is unlinked. Returns ``(new
    descriptor or -1 if deleted, new size, new offset of each kept record)``. Blocking."""
    view = memoryview(data)
    if not keep and head is None:
        os.unlink(name, dir_fd=dir_fd)
        os.fsync(dir_fd)
        return -1, 0, []
    tmp = name[: -len(SEGMENT_SUFFIX)] + COMPACT_SUFFIX
    out = bytearray(view[:SEGMENT_HEADER_BYTES] if head is None else head)
    offsets = []
    for off, length in keep:
        offsets.append(len(out))
        out += view[off : off + length]
    out += seal
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | _O_CLOEXEC, 0o644, dir_fd=dir_fd)
    try:
        write_all(fd, out, sync=True)
    finally:
        os.close(fd)
    os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    os.fsync(dir_fd)
    return os.open(name, os.O_RDWR | os.O_APPEND | _O_CLOEXEC, dir_fd=dir_fd), len(out), offsets
