"""The write-ahead log of one durable queue: group commit, lazy payload reads, compaction.

Theory of operation
-------------------
*Group commit.* Appenders never touch the disk. ``add_enqueue`` / ``add_ack`` encode the record straight
into the pending batch (one ``bytearray``; the codec also returns the record's batch-relative index
entry) and return that batch; the caller then parks in the batch's ``waiters`` list
(``trio.lowlevel.wait_task_rescheduled``), and every appender of the batch is rescheduled at once when
it is durable (``Batch.finish``). Taking the pending batch (``_launch``: a new empty one replaces it) and
starting its *job* is synchronous, so it happens wherever the batch becomes ready; up to
``pipeline_depth`` jobs are in flight. A job is a ``write`` + ``fdatasync`` of the batch, done by the
broker's commit helper process (:mod:`._committer`, the default) or on a worker thread of the commit
limiter (after the previous job's ``write`` returned: a ``threading.Event`` chain keeps writes ordered).
A sync covers every byte written before it started, so batches are published (indexed, appenders woken)
strictly in write order, each only after a sync that covers it returned. Nothing is acknowledged before
that (with ``fsync="none"`` the sync is skipped, which is for benchmarks only and says so).

*Cohorts.* With one batch at a time, 64 appenders that each wait for their record all end up in every
batch, and the event loop idles while it is synced: a group commit then costs the sync *plus* the event
loop's work for 64 records. So a batch is started once it holds half the appenders waiting when the last
batch was done (``_start_at``; ``_job_done`` counts them: that batch's, those in flight, the pending
ones): ``add_enqueue`` / ``add_ack`` start it on the spot if a slot is free, ``_job_done`` starts it
first thing when a slot frees, and the writer task (woken when a batch becomes non-empty) takes a smaller
one after letting the current scheduler round add to it. The appenders settle into two cohorts: one
refills the next batch while the other one's sync runs, so the event loop's work overlaps the disk's.
One appender alone still gets its batch started at once. This only pays if the job's completion reaches
the event loop while it is busy, which a worker thread cannot do well: it needs the GIL after each system
call and a busy Trio loop lets go of it only between scheduler rounds; hence the helper process. On
threads (``helper is None``) ``_start_at`` stays out of reach: the writer task takes the batch whole.

*Cost per record.* The enqueue path is the hot loop of the whole node, so the work per record is kept to
the floor: one codec call (two ``pack``, two ``crc32``, three appends), four list appends, one park
(``wait_task_rescheduled``: no ``trio.Event``, no parking lot; a cancelled appender removes itself from
the list, and its record may or may not be stored) and one wake-up with a shared ``Value(None)``.
Everything else is done once per batch: sizes and statistics are derived from the batch, the index is
updated with one ``dict.update``, the appenders are woken by one loop of ``trio.lowlevel.reschedule``. A
batch costs the event loop one ``sendmsg`` to the helper and one reply read by its reader task (or, on
threads, one ``start_thread_soon`` and one ``run_sync_soon``). ``bench/wal.py`` reports the event loop's
CPU per record.

*Early delivery.* A queue declared with ``early_delivery`` (the node's outbound queues, whose consumer is a
bridge to a peer that drops duplicates by their dedup id) hands each batch's messages to its consumers when
the batch's write is started (``_launch``), not once it is durable: the bridge sends them while the sync
runs instead of after it. Appenders still return only once their batch is durable, and an ack is always a
later record than the enqueue it acks, in the same segment (rotation waits until every written batch is
durable), so no ack can be durable without its message. What a crash may do: a message reaches its consumer
(and the peer) although its ``enqueue`` never returned and the crash (of the process before the batch
reached the commit helper, of the machine or the disk before the sync) lost it, and after the restart its
id may be given to another message (recovery cannot see the ids of a batch that never reached the disk);
a sender that then sends it again with its dedup id, as the flow framework does, has it dropped by the
receiver, which knows messages by that id, never by the store's. Order is kept: a batch is delivered early
only while no batch that was not is still waiting for its sync, and only while the payload cache has room
(the consumer must read the payloads from memory: the helper may not have written them yet); otherwise it
waits for its sync.

*Index.* ``live`` maps message id to a packed location (segment, offset, lengths, timestamp) for every
durable (or delivered early), unacked message; insertion order is id order. Payloads are read lazily
with ``pread`` when a message is delivered, except for recently enqueued ones kept in a bounded cache, so
a queue of a million messages costs about a hundred bytes each in memory, not its payloads.

*Sequence.* Every record gets the queue's next sequence number as it is encoded (``next_seq``; a
retracted enqueue gives its number back, like its id), so the records on disk are numbered without gaps
across segments, which is what lets recovery notice a record or a segment that went missing.

*Rotation.* Before a batch is written, a tail segment that would exceed ``segment_bytes`` is sealed and a
new segment is created first: once every written batch is durable, the seal record (how many records the
segment holds, which sequence number comes next) is appended and synced, the new segment is created
(header + fsync + directory fsync), and the manifest is replaced to list it. Only the last write of the
last segment can therefore be torn, and a sealed segment is always whole, which is what recovery relies
on.

*Compaction.* Sealed segments that are mostly acked are rewritten by :mod:`._compaction`, which works on
the queue's directory descriptor (its generation), never on paths; the log only says when a segment may
have become worth it (``compact_wanted``) and seals the tail on request (:meth:`DurableLog.seal_tail`).
"""

from __future__ import annotations

import functools
import logging
import math
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Final

import attrs
import outcome
import trio

from corda_trio import files, logs

from ._committer import CommitHelper
from ._errors import StoreClosedError, StoreFailedError, write_failure_text
from ._record import (
    ACK_RECORD_BYTES,
    RECORD_HEADER_BYTES,
    SEGMENT_HEADER_BYTES,
    Seal,
    append_ack,
    append_enqueue_located,
    append_seal,
    decode_enqueue_body,
    pack_location,
    unpack_location,
)
from ._recovery import RecoveredLog, SegmentState
from ._segment import (
    close_quietly,
    pread_exact,
    release_file,
    rotate_segment,
    segment_path,
    sync_file,
    write_all,
)

__all__ = ["Batch", "DurableLog", "LogConfig", "StoredMessage"]

logger = logging.getLogger("corda_trio.store")

_MASK32: Final = 0xFFFFFFFF
_current_task = trio.lowlevel.current_task
_reschedule = trio.lowlevel.reschedule


class _Resume(outcome.Value):  # type: ignore[type-arg]
    """``Value(None)`` that can be unwrapped any number of times: one instance wakes every appender
    (``reschedule`` would otherwise build a fresh ``Value`` for each of them; this is the hot path)."""

    __slots__ = ()

    def unwrap(self) -> None:
        return None


_RESUME: Final = _Resume(None)
_wait_task_rescheduled = trio.lowlevel.wait_task_rescheduled
_current_effective_deadline = trio.current_effective_deadline
_NEG_INF: Final = float("-inf")
_ABORT_SUCCEEDED: Final = trio.lowlevel.Abort.SUCCEEDED
#: Reads of at most this many records go to one worker-thread call.
READ_BATCH_RECORDS: Final = 256
#: How long a lazy ack record may wait in the pending batch for a batch somebody waits on (then it is
#: written on its own): what a crash can bring back of a consumer that acks lazily.
LAZY_ACK_SECONDS: Final = 0.05


@attrs.frozen(kw_only=True)
class LogConfig:
    """Tuning of one durable log (the broker builds it from :class:`~._broker.BrokerConfig`)."""

    segment_bytes: int
    compact_live_ratio: float
    cache_bytes: int
    sync: bool
    #: How many fdatasync calls of one queue may overlap (writes stay strictly ordered); see
    #: ``BrokerConfig.flush_pipeline_depth``.
    pipeline_depth: int = 1


@attrs.frozen(kw_only=True)
class StoredMessage:
    """A message as stored: id, enqueue time (ms since the epoch), opaque headers blob and payload."""

    message_id: int
    timestamp_ms: int
    headers: bytes
    payload: bytes


@attrs.define(eq=False)
class Batch:
    """Records waiting for one group commit; every appender of the batch parks in its ``waiters``."""

    buf: bytearray = attrs.field(factory=bytearray)
    #: ids of the enqueue records, in order
    ids: list[int] = attrs.field(factory=list)
    #: their packed locations relative to the start of ``buf`` in segment 0 (see ``_publish``)
    locs: list[int] = attrs.field(factory=list)
    #: their (meta, payload), for the payload cache
    bodies: list[tuple[bytes, bytes]] = attrs.field(factory=list)
    #: number of ack records (32 bytes each; the rest of ``buf`` is enqueue records)
    acks: int = 0
    #: how many of them are lazy (nobody waits for them: they do not count as appenders of a cohort)
    lazy_acks: int = 0
    #: the tasks parked in :meth:`wait` (or in ``Queue.enqueue``), woken by :meth:`finish`
    waiters: list[trio.lowlevel.Task] = attrs.field(factory=list)
    #: set by :meth:`finish`: the batch is durable, or failed (then ``error`` is set)
    finished: bool = False
    #: ``time.monotonic()`` when its write was started (for the commit latency statistic)
    launched_at: float = 0.0
    error: BaseException | None = None
    # set when the batch is written: its segment, offset there and write sequence number
    segment: SegmentState | None = None
    base: int = 0
    seq: int = -1
    #: its records were indexed and handed to ``on_ready`` when it was written (early delivery)
    indexed: bool = False

    async def wait(self) -> None:
        """Wait until this batch is durable.

        If cancelled while waiting, the batch's records may or may not be stored.

        Raises:
            StoreFailedError: the write or fsync failed; nothing of this batch may be assumed durable.
        """
        if self.finished:
            await trio.lowlevel.checkpoint()
        else:
            await park(self.waiters)
        self.raise_if_failed()

    def raise_if_failed(self) -> None:
        """Raise :class:`StoreFailedError` if the batch failed (after it finished)."""
        if self.error is not None:
            why = write_failure_text(self.error)
            raise StoreFailedError(f"write-ahead log write failed: {why}") from self.error

    def finish(self) -> None:
        """The batch is durable (or ``error`` is set): wake every task parked on it, once."""
        if self.finished:
            return
        self.finished = True
        waiters = self.waiters
        self.waiters = []
        for task in waiters:
            _reschedule(task, _RESUME)


@trio.lowlevel.enable_ki_protection  # never parked-and-gone: a Ctrl-C waits for the trap
async def park(waiters: list[trio.lowlevel.Task]) -> None:
    """Park the calling task in ``waiters`` until :meth:`Batch.finish` reschedules it.

    This is what ``trio.Event.wait`` does, minus its parking lot: one list append, one closure, one
    trap. A cancelled waiter takes itself off the list (the batch's records may still be stored).
    """
    task = _current_task()
    waiters.append(task)

    def abort(_raise_cancel: object) -> trio.lowlevel.Abort:
        waiters.remove(task)
        return _ABORT_SUCCEEDED

    await _wait_task_rescheduled(abort)


@attrs.define(eq=False, repr=False)
class DurableLog:
    """The on-disk log of one durable queue and its in-memory index (see the module docstring).

    All methods run on the Trio thread; blocking work goes to worker threads: appends, fsyncs and segment
    creation through ``limiter`` (the broker's commit limiter), payload reads and compaction through
    ``io_limiter``, so that a long compaction never holds up a group commit.
    ``on_ready`` is called (synchronously) with the ids of each batch once its messages may be consumed, in
    id order: once the batch is durable or, with ``early_delivery``, once it is written.
    """

    name: str
    directory: str
    config: LogConfig
    limiter: trio.CapacityLimiter
    io_limiter: trio.CapacityLimiter
    on_ready: Callable[[list[int]], None]
    segments: dict[int, SegmentState]
    live: dict[int, int]
    next_id: int
    #: the sequence number of the next record
    next_seq: int = 0
    #: the broker's commit helper process; ``None``: write and sync on worker threads of ``limiter``
    helper: CommitHelper | None = None
    #: called once, with the error, when the log fails for good (a write or fsync failed)
    on_failure: Callable[[BaseException], None] | None = None
    #: hand each batch's messages to ``on_ready`` when its write starts, not once it is durable (module
    #: docstring); appenders still wait for durability
    early_delivery: bool = False
    #: held while the manifest is replaced (rotation adds a segment, compaction removes the first)
    manifest_lock: trio.Lock = attrs.field(factory=trio.Lock)
    tail: SegmentState = attrs.field(init=False)
    pending: Batch = attrs.field(factory=Batch, init=False)
    cache: dict[int, tuple[bytes, bytes]] = attrs.field(factory=dict, init=False)
    cache_bytes: int = attrs.field(default=0, init=False)
    live_bytes: int = attrs.field(default=0, init=False)
    failure: BaseException | None = attrs.field(default=None, init=False)
    closing: bool = attrs.field(default=False, init=False)
    # statistics
    batches: int = attrs.field(default=0, init=False)
    records_written: int = attrs.field(default=0, init=False)
    bytes_written: int = attrs.field(default=0, init=False)
    fsyncs: int = attrs.field(default=0, init=False)
    #: Seconds from starting a batch's write to its write (and fsync) having returned, summed over batches.
    commit_seconds: float = attrs.field(default=0.0, init=False)
    compactions: int = attrs.field(default=0, init=False)
    compacted_bytes: int = attrs.field(default=0, init=False)
    _work: trio.Event = attrs.field(factory=trio.Event, init=False)
    #: set when a segment may have become worth compacting (:class:`~._compaction.Compactor` waits on it)
    compact_wanted: trio.Event = attrs.field(factory=trio.Event, init=False)
    _writer_done: trio.Event = attrs.field(factory=trio.Event, init=False)
    _seal_requests: list[trio.Event] = attrs.field(factory=list, init=False)
    _written: deque[Batch] = attrs.field(factory=deque, init=False)
    _next_seq: int = attrs.field(default=0, init=False)
    _durable_seq: int = attrs.field(default=-1, init=False)
    _drained: trio.Event = attrs.field(factory=trio.Event, init=False)
    _write_error: BaseException | None = attrs.field(default=None, init=False)
    #: the writer task is starting the pending batch itself (rotating, or waiting for a thread)
    _writer_busy: bool = attrs.field(default=False, init=False)
    #: records (enqueues and acks) at which the pending batch is started at once if a job slot and a
    #: thread are free: half the appenders seen waiting when a batch was last done, so that they split
    #: into two cohorts (module docstring)
    _start_at: int = attrs.field(default=1, init=False)
    #: the segment the helper has open for us, and its handle there
    _helper_segment: SegmentState | None = attrs.field(default=None, init=False)
    _helper_handle: int = attrs.field(default=-1, init=False)
    #: records of the batches started and not yet done
    _inflight_records: int = attrs.field(default=0, init=False)
    _token: trio.lowlevel.TrioToken | None = attrs.field(default=None, init=False)
    #: set by the worker thread once the last started job's write returned (orders the next write)
    _last_write: threading.Event | None = attrs.field(default=None, init=False)
    _jobs: int = attrs.field(default=0, init=False)
    _jobs_idle: trio.Event = attrs.field(factory=trio.Event, init=False)
    #: finite while the pending batch holds nothing but lazy acks (nobody waits on it): then it is written
    #: with the next batch somebody waits on, or at this time (Trio's clock)
    _lazy_deadline: float = attrs.field(default=math.inf, init=False)
    #: the writer's wait for work, whose deadline is the lazy acks' (``None`` while it is not waiting)
    _writer_wait: trio.CancelScope | None = attrs.field(default=None, init=False)
    #: batches with enqueue records that were written without early delivery and are not yet durable:
    #: while there are any, later batches wait for durability too (order of delivery)
    _late_batches: int = attrs.field(default=0, init=False)

    def __attrs_post_init__(self) -> None:
        self.tail = self.segments[max(self.segments)]
        if self.helper is None:
            self._start_at = sys.maxsize
        self.live_bytes = sum(s.live_bytes for s in self.segments.values())

    @classmethod
    def from_recovered(
        cls,
        *,
        name: str,
        directory: str,
        recovered: RecoveredLog,
        config: LogConfig,
        limiter: trio.CapacityLimiter,
        io_limiter: trio.CapacityLimiter,
        on_ready: Callable[[list[int]], None],
        helper: CommitHelper | None = None,
        on_failure: Callable[[BaseException], None] | None = None,
    ) -> DurableLog:
        """Build the log of a queue that :func:`~._recovery.recover_queue` just rebuilt."""
        return cls(
            name=name,
            directory=directory,
            config=config,
            limiter=limiter,
            io_limiter=io_limiter,
            on_ready=on_ready,
            segments={s.number: s for s in recovered.segments},
            live=recovered.live,
            next_id=recovered.next_id,
            next_seq=recovered.next_seq,
            helper=helper,
            on_failure=on_failure,
        )

    # ------------------------------------------------------------------ appending

    def check_usable(self) -> None:
        """Raise if the log failed or is closed."""
        if self.failure is not None:
            raise StoreFailedError(f"queue {self.name} failed earlier: {self.failure}") from self.failure
        if self.closing:
            raise StoreClosedError(f"queue {self.name} is closed")

    def add_enqueue(
        self, payload: bytes, headers: bytes, timestamp_ms: int, start: bool = True
    ) -> tuple[int, Batch]:
        """Encode one enqueue record into the pending batch; returns its id and the batch to await.

        This runs once per enqueue, so it does the least it can: one codec call that also yields the
        record's batch-relative location, three list appends. Sizes and statistics are derived per batch.
        With ``start=False`` the batch is not started here (``enqueue_many`` keeps its records in one
        batch, then calls :meth:`start_pending`).
        """
        if self.failure is not None or self.closing:
            self.check_usable()
        batch = self.pending
        mid = self.next_id
        buf = batch.buf
        if not buf or self._lazy_deadline != math.inf:
            self._wake_for_waiter()  # the writer has something to take that somebody waits for
        batch.locs.append(append_enqueue_located(buf, mid, timestamp_ms, headers, payload, self.next_seq))
        self.next_seq += 1
        self.next_id = mid + 1
        ids = batch.ids
        ids.append(mid)
        batch.bodies.append((headers, payload))
        if start and len(ids) >= self._start_at and self._jobs < self.config.pipeline_depth:
            # Not for a caller that is already cancelled: ``Queue.enqueue`` takes its record back as it
            # parks, which it can only do while the record is still pending.
            if _current_effective_deadline() != _NEG_INF:
                self._try_start()
        return mid, batch

    def start_pending(self) -> None:
        """Start the pending batch now if it holds a cohort and a job slot is free (else the writer
        takes it)."""
        pending = self.pending
        if _waited(pending) >= self._start_at and self._jobs < self.config.pipeline_depth:
            self._try_start()

    def retract_enqueue(self, batch: Batch, message_id: int) -> bool:
        """Take back the enqueue record ``message_id`` if nothing can have seen it yet: it is still the
        last record of the pending batch (not taken by the writer, nothing appended after it). Returns
        whether it was taken back (then it is as if it had never been added, id included).

        ``Queue.enqueue`` calls this when it is cancelled while parked; when the call was already
        cancelled on entry, the record is always the last one, so a cancelled call stores nothing.
        """
        if batch is not self.pending or not batch.ids or batch.ids[-1] != message_id:
            return False
        _seg, offset, length, _meta, _ts = unpack_location(batch.locs[-1])
        buf = batch.buf
        if offset + length != len(buf):  # an ack record was appended after it
            return False
        del buf[offset:]
        batch.ids.pop()
        batch.locs.pop()
        batch.bodies.pop()
        self.next_id = message_id
        self.next_seq -= 1
        return True

    def add_ack(self, message_id: int, *, lazy: bool = False) -> Batch:
        """Forget ``message_id`` (it must be live) and encode its ack record into the pending batch.

        ``lazy``: nobody will wait for the record: it rides with the next batch somebody waits for, or
        is written once :data:`LAZY_ACK_SECONDS` have passed, whichever comes first (never on a batch
        of its own while others come). Until it is written, a crash brings the message back.
        """
        self.check_usable()
        loc = self.live.pop(message_id)
        seg, _off, length, _meta, _ts = unpack_location(loc)
        state = self.segments.get(seg)
        if state is not None:
            state.live_bytes -= length
            state.live_count -= 1
            self._maybe_want_compaction(state)
        self.live_bytes -= length
        cached = self.cache.pop(message_id, None)
        if cached is not None:
            self.cache_bytes -= len(cached[0]) + len(cached[1])
        batch = self.pending
        if lazy:
            batch.lazy_acks += 1
            if not batch.buf:
                self._lazy_deadline = trio.current_time() + LAZY_ACK_SECONDS
                if self._writer_wait is not None:
                    self._writer_wait.deadline = self._lazy_deadline
        elif not batch.buf or self._lazy_deadline != math.inf:
            self._wake_for_waiter()
        append_ack(batch.buf, message_id, self.next_seq)
        self.next_seq += 1
        batch.acks += 1
        if not lazy and _waited(batch) >= self._start_at and self._jobs < self.config.pipeline_depth:
            self._try_start()
        return batch

    def _wake_for_waiter(self) -> None:
        """The pending batch gets a record somebody waits for: the writer has work now (and the lazy acks in
        it go with it, so their deadline is off: the writer must not wake for it again)."""
        self._lazy_deadline = math.inf
        self._work.set()

    # ------------------------------------------------------------------ writer task

    @trio.lowlevel.enable_ki_protection  # the group-commit books never half-updated
    async def run_writer(self) -> None:
        """The group-commit loop (one task per queue, in the broker's nursery). Returns after ``close``
        once everything pending is written and every job it started has finished.

        Each batch is one *job* on a worker thread: wait until the previous job's ``write`` returned,
        ``write`` the batch, ``fdatasync``. Writes are therefore strictly ordered, while up to
        ``pipeline_depth`` jobs (and their syncs) overlap. A sync that returns covers every byte written
        to the file before it started, so batches are published strictly in order: batch *n* when the
        sync of *n* or of any later batch in the same segment has returned.
        """
        self._token = trio.lowlevel.current_trio_token()
        try:
            while True:
                # Work, or the lazy acks' deadline (then the pending batch is taken as if woken).
                with trio.CancelScope(deadline=self._lazy_deadline) as self._writer_wait:
                    await self._work.wait()
                self._writer_wait = None
                self._work = trio.Event()
                if trio.current_time() >= self._lazy_deadline:
                    self._lazy_deadline = math.inf  # the lazy acks' time has come: an ordinary batch now
                if self._seal_requests:
                    await self._drain()
                    while self._seal_requests:
                        if self.failure is None and self.tail.size > SEGMENT_HEADER_BYTES:
                            try:
                                await self._rotate(self._first_pending_id())
                            except OSError as exc:
                                self._fail(exc)
                        self._seal_requests.pop(0).set()
                if self.failure is not None:
                    return
                if not self.pending.buf:  # woken for a seal request or close: nobody waits on it
                    if self.closing:
                        break
                    continue
                if self._jobs >= self.config.pipeline_depth:
                    continue  # every slot busy: _job_done starts the pending batch when one frees
                if _waited(self.pending) < self._start_at:
                    # Less than a cohort: let the tasks that run in this scheduler round add theirs
                    # first (at a cohort, add_enqueue starts the batch itself), then take what is there.
                    await trio.lowlevel.checkpoint()
                    if not self.pending.buf or self._jobs >= self.config.pipeline_depth:
                        continue
                if self._try_start():
                    continue
                # The slow path: the tail must be sealed first, or no thread is free.
                self._writer_busy = True
                try:
                    if self._needs_rotation():
                        # A new segment only once everything in the old one is durable: then only the
                        # last segment can ever end in a torn write.
                        await self._drain()
                        if self.failure is not None:
                            return
                        try:
                            await self._rotate(self._first_pending_id())
                        except OSError as exc:
                            self._fail(exc)
                            return
                    # Nobody else takes the pending batch while we are busy: borrow a thread for it.
                    batch = self.pending
                    if self.helper is None:
                        await self.limiter.acquire_on_behalf_of(batch)
                    if self.failure is not None:  # (it may have failed while we waited)
                        if self.helper is None:
                            self.limiter.release_on_behalf_of(batch)
                        return
                    self._launch(batch)  # records that arrived while we waited ride along
                finally:
                    self._writer_busy = False
        finally:
            # A job outlives no writer: the broker closes the descriptors once we return.
            with trio.CancelScope(shield=True):
                while self._jobs:
                    self._jobs_idle = trio.Event()
                    await self._jobs_idle.wait()
            # Nobody may stay parked on a batch that will never be written (a cancelled writer): such
            # batches fail; what was published above has already woken its appenders with success.
            leftovers = [*self._written, self.pending]
            self._written.clear()
            for batch in leftovers:
                if not batch.finished and (batch.waiters or batch.buf):
                    batch.error = StoreClosedError(f"queue {self.name} closed before this batch was written")
                    batch.finish()
            self._writer_done.set()

    def _needs_rotation(self) -> bool:
        """Whether the pending batch would take a non-empty tail segment past ``segment_bytes``."""
        size = self.tail.size
        return size > SEGMENT_HEADER_BYTES and size + len(self.pending.buf) > self.config.segment_bytes

    def _try_start(self) -> bool:
        """Start the pending batch's job now, if that needs no waiting: a job slot and a thread are free,
        the writer is not busy with it, and the tail has room. Returns whether it was started.

        Called synchronously where a batch becomes ready: by ``add_enqueue`` / ``add_ack`` once the batch
        holds ``_start_at`` records, by :meth:`_job_done` when a slot frees, and by the writer task.
        """
        batch = self.pending
        if (
            not batch.buf
            or self._jobs >= self.config.pipeline_depth
            or self._writer_busy
            or self._seal_requests
            or self.failure is not None
            or self._token is None
            or self._needs_rotation()
        ):
            return False
        if self.helper is None:
            try:
                self.limiter.acquire_on_behalf_of_nowait(batch)
            except trio.WouldBlock:
                self._work.set()  # the writer waits for a thread
                return False
        self._launch(batch)
        return True

    def _launch(self, batch: Batch) -> None:
        """Take ``batch`` (the pending one, holding a thread of ``limiter`` unless a helper process
        commits) and start its job."""
        assert batch is self.pending
        tail = self.tail
        self.pending = Batch()
        self._lazy_deadline = math.inf
        batch.launched_at = time.monotonic()
        batch.segment = tail
        batch.base = tail.size
        batch.seq = self._next_seq
        self._next_seq += 1
        tail.size += len(batch.buf)
        records = len(batch.ids) + batch.acks
        self._inflight_records += _waited(batch)
        self.batches += 1
        self.records_written += records
        self.bytes_written += len(batch.buf)
        self._written.append(batch)
        helper = self.helper
        if helper is None:
            self._start_job(batch, tail.fd)
        else:
            if tail is not self._helper_segment:
                if self._helper_handle >= 0:
                    helper.close(self._helper_handle)
                self._helper_handle = helper.open(tail.path)
                self._helper_segment = tail
            self._jobs += 1
            helper.submit(self._helper_handle, batch.buf, sync=self.config.sync,
                          done=lambda error: self._job_done(batch, error))  # fmt: skip
        if batch.ids:  # (the job's completion comes later, on the Trio thread: never before this)
            if self.early_delivery and not self._late_batches and self.cache_bytes < self.config.cache_bytes:
                # Early delivery (module docstring): consumable now, read from the cache until acked.
                self._index(batch)
                batch.indexed = True
                self.on_ready(batch.ids)
            else:
                self._late_batches += 1

    def _start_job(self, batch: Batch, fd: int) -> None:
        """Write and sync ``batch`` on a worker thread, after the previous job's write returned.

        This is ``trio.to_thread.run_sync`` without its per-call task, cancel scope and context copy
        (the writer already holds a thread of ``limiter`` for the batch): the thread cache runs the job
        and the result comes back through ``run_sync_soon`` to :meth:`_job_done`, one wake-up of the
        event loop per batch. The job never raises: it returns the exception that stopped it.
        """
        previous = self._last_write
        wrote = threading.Event()
        self._last_write = wrote
        sync = self.config.sync
        buf = batch.buf

        def job() -> BaseException | None:
            try:
                try:
                    if previous is not None:
                        previous.wait()
                    if self._write_error is not None:  # an earlier write failed: write nothing after it
                        return self._write_error
                    write_all(fd, buf, sync=False)
                except BaseException as exc:
                    self._write_error = exc
                    return exc
                finally:
                    wrote.set()
                if sync:
                    sync_file(fd)
            except BaseException as exc:
                return exc
            return None

        token = self._token
        done = self._job_done

        def deliver(result: Any) -> None:  # on the worker thread
            token.run_sync_soon(done, batch, result.unwrap())  # (job never raises)

        self._jobs += 1
        trio.lowlevel.start_thread_soon(job, deliver, name=f"store-wal:{self.name}")

    def _job_done(self, batch: Batch, error: BaseException | None) -> None:
        """On the Trio thread: the job of ``batch`` is done (``error``: what stopped it, if anything)."""
        self._jobs -= 1
        if not self._jobs:
            self._jobs_idle.set()
        # Appenders waiting now: this batch's (about to be woken), those of batches in flight, and
        # those of the pending batch. Half of them is a cohort (module docstring).
        pending = self.pending
        pending_records = _waited(pending)
        if self.helper is not None:  # on threads batches are taken whole (module docstring)
            self._start_at = max(1, (self._inflight_records + pending_records) // 2)
        self._inflight_records -= _waited(batch)
        if self.helper is None:
            self.limiter.release_on_behalf_of(batch)
        if error is not None:
            assert batch.segment is not None  # (set when it was launched)
            files.name_file(error, batch.segment.path)  # (an error of the descriptor names no file)
            self._fail(error)
            return
        if self.failure is not None:
            return  # after a failed fsync nothing later may be trusted either (see _fail)
        if self.config.sync:
            self.fsyncs += 1
        self.commit_seconds += time.monotonic() - batch.launched_at
        if batch.seq > self._durable_seq:
            self._durable_seq = batch.seq
        # The next batch first (its write and sync start while we wake this one's appenders), if it
        # holds a cohort: the appenders about to be woken then refill the pending batch while the
        # other cohort's sync runs. (Lazy acks alone wait for their deadline or for company.)
        lazy_only = self._lazy_deadline != math.inf
        started = lazy_only or (pending_records >= self._start_at and self._try_start())
        if pending.buf and not started:
            self._work.set()
        if self.closing:
            self._work.set()
        written = self._written
        while written and written[0].seq <= self._durable_seq:
            self._publish(written.popleft())
        if not written:
            self._drained.set()

    async def _drain(self) -> None:
        """Wait until every written batch is durable (or the log failed)."""
        while self._written and self.failure is None:
            self._drained = trio.Event()
            await self._drained.wait()

    def _publish(self, batch: Batch) -> None:
        """A batch is durable: index its records (unless that was done when it was written), wake its
        appenders, hand its ids to the queue."""
        if batch.indexed:
            batch.finish()
            return
        self._index(batch)
        batch.finish()
        if batch.ids:
            self._late_batches -= 1
            self.on_ready(batch.ids)

    def _index(self, batch: Batch) -> None:
        """Add the records of ``batch`` (written, at ``batch.base`` of ``batch.segment``) to the index, the
        segment's counts and, while it has room, the payload cache."""
        tail = batch.segment
        assert tail is not None
        base = batch.base
        tail.ack_count += batch.acks
        tail.records += len(batch.ids) + batch.acks
        ids = batch.ids
        if ids:
            # Locations were packed for segment 0 at offset 0 of the batch: shift them in one pass.
            shift = pack_location(tail.number, base, 0, 0, 0)
            self.live.update(zip(ids, [loc + shift for loc in batch.locs], strict=True))
            added = len(batch.buf) - ACK_RECORD_BYTES * batch.acks  # bytes of the enqueue records
            if self.cache_bytes < self.config.cache_bytes:
                self.cache.update(zip(ids, batch.bodies, strict=True))
                self.cache_bytes += added - RECORD_HEADER_BYTES * len(ids)
            tail.live_bytes += added
            tail.live_count += len(ids)
            self.live_bytes += added
            if tail.min_id < 0:
                tail.min_id = ids[0]
            tail.max_id = ids[-1]

    async def _rotate(self, first_id: int) -> None:
        """Seal the tail and start the next segment (every written batch is durable); ``first_id`` is
        the smallest id it will hold (its ``base_id``: no earlier segment holds an id that large)."""
        old = self.tail
        number = old.number + 1
        pending = self.pending
        first_seq = self.next_seq - len(pending.ids) - pending.acks  # the pending records are numbered
        seal = bytearray()
        append_seal(seal, Seal(first_seq, old.records, first_id))
        async with self.manifest_lock:
            fd = await trio.to_thread.run_sync(
                rotate_segment, self.directory, old.fd, bytes(seal), number, first_id, first_seq,
                min(self.segments), limiter=self.limiter,
            )  # fmt: skip
        old.size += len(seal)
        old.sealed = True
        new = SegmentState(
            number=number, path=segment_path(self.directory, number), base_id=first_id,
            size=SEGMENT_HEADER_BYTES, live_bytes=0, live_count=0, min_id=-1, max_id=-1, ack_count=0, fd=fd,
            first_seq=first_seq,
        )  # fmt: skip
        self.segments[number] = new
        self.tail = new
        old.dirty = True
        self._maybe_want_compaction(old)

    def _first_pending_id(self) -> int:
        return self.pending.ids[0] if self.pending.ids else self.next_id

    def _fail(self, exc: BaseException) -> None:
        """Stop the log for good after a write or fsync error.

        After a failed ``fsync`` the kernel may have dropped the dirty pages and a later ``fsync`` may
        succeed without them, so no batch that was not yet published can be trusted: all of them, and
        everything pending, fail. A restart recovers whatever is really on disk.
        """
        if self.failure is None:
            # The log file only: the failure reaches the operator through the broker's owner (the node
            # stops on it and says so in its last line).
            logger.critical(
                "queue %s: write-ahead log write failed, queue stopped: %s",
                self.name, write_failure_text(exc), extra={logs.FILE_ONLY: True},
            )  # fmt: skip
            self.failure = exc
            if self.on_failure is not None:
                self.on_failure(exc)
        for failed in [*self._written, self.pending]:
            failed.error = self.failure
            failed.finish()
        self._written.clear()
        self._late_batches = 0
        self._drained.set()
        for waiter in self._seal_requests:
            waiter.set()
        self.compact_wanted.set()
        self._work.set()

    def close(self) -> None:
        """Stop accepting records; the writer drains what is pending, then returns."""
        self.closing = True
        self._work.set()
        self.compact_wanted.set()

    async def wait_closed(self) -> None:
        """Wait for the writer to finish (after :meth:`close`)."""
        await self._writer_done.wait()

    def release_resources(self) -> None:
        """Close every descriptor (after the writer and compactor stopped)."""
        if self.helper is not None and self._helper_handle >= 0:
            self.helper.close(self._helper_handle)
            self._helper_handle = -1
        for state in self.segments.values():
            if state.fd >= 0:
                close_quietly(state.fd)
                state.fd = -1

    # ------------------------------------------------------------------ reading

    def read_cached(self, mid: int) -> StoredMessage | None:
        """The live message ``mid`` if its record is in the cache (no disk read), else ``None``."""
        cached = self.cache.get(mid)
        if cached is None:
            return None
        return StoredMessage(message_id=mid, timestamp_ms=unpack_location(self.live[mid])[4],
                             headers=cached[0], payload=cached[1])  # fmt: skip

    async def read(self, ids: Sequence[int]) -> list[StoredMessage]:
        """The stored messages ``ids`` (all live), from the cache or, in one worker-thread call, from disk.

        Raises:
            StoreFailedError: a record could not be read or failed its checksum.
        """
        out: list[StoredMessage | None] = [None] * len(ids)
        todo: list[tuple[int, int, SegmentState, int, int]] = []
        for i, mid in enumerate(ids):
            loc = self.live[mid]
            cached = self.cache.get(mid)
            seg, off, length, _meta, ts = unpack_location(loc)
            if cached is not None:
                out[i] = StoredMessage(message_id=mid, timestamp_ms=ts, headers=cached[0], payload=cached[1])
            else:
                todo.append((i, mid, self.segments[seg], off, length))
        if todo:
            pinned = {id(state): state for _i, _m, state, _o, _l in todo}
            for state in pinned.values():
                state.readers += 1
            try:
                requests = [(state.fd, off, length) for _i, _m, state, off, length in todo]
                try:
                    records = await trio.to_thread.run_sync(_read_records, requests, limiter=self.io_limiter)
                except (OSError, ValueError) as exc:
                    raise StoreFailedError(f"queue {self.name}: cannot read a stored message: {exc}") from exc
            finally:
                for state in pinned.values():
                    state.readers -= 1
                    if state.retired and state.readers == 0:
                        # the last descriptor of a file compaction replaced: freed a step at a time, off
                        # the event loop and without holding up this read (see release_file)
                        trio.lowlevel.start_thread_soon(
                            functools.partial(release_file, state.fd), _ignore, name="store-release"
                        )
            for (i, mid, _s, _o, _l), (rid, ts, meta, payload) in zip(todo, records, strict=True):
                if rid != mid:
                    raise StoreFailedError(f"queue {self.name}: record at the location of {mid} holds {rid}")
                out[i] = StoredMessage(message_id=mid, timestamp_ms=ts, headers=meta, payload=payload)
        return [m for m in out if m is not None]

    # ------------------------------------------------------------------ compaction

    def _maybe_want_compaction(self, state: SegmentState) -> None:
        state.dirty = True
        if state is not self.tail and self.worth_compacting(state):
            self.compact_wanted.set()

    def worth_compacting(self, state: SegmentState) -> bool:
        """Whether ``state``'s live bytes fell to ``compact_live_ratio`` of its records or less (a stub,
        a segment holding nothing but its seal, is worth it when it is the first: it can then go)."""
        data = state.record_bytes()
        if data == 0:
            return state.sealed and state.number == min(self.segments)
        return state.live_bytes <= self.config.compact_live_ratio * data

    async def seal_tail(self) -> None:
        """Have the writer start a new segment (if the tail holds anything), so that the current one can
        be compacted too.

        Raises:
            StoreFailedError: the log failed (now or earlier).
            StoreClosedError: the log is closed.
        """
        if self.tail.size > SEGMENT_HEADER_BYTES:
            self.check_usable()
            done = trio.Event()
            self._seal_requests.append(done)
            self._work.set()
            await done.wait()
            self.check_usable()


def _ignore(result: outcome.Outcome[Any]) -> None:
    """``start_thread_soon``'s delivery for a job nobody waits on (``release_file`` never raises)."""


def _waited(batch: Batch) -> int:
    """The records of ``batch`` somebody waits for (a cohort counts those, not lazy acks)."""
    return len(batch.ids) + batch.acks - batch.lazy_acks


def _read_records(requests: list[tuple[int, int, int]]) -> list[tuple[int, int, bytes, bytes]]:
    return [decode_enqueue_body(pread_exact(fd, off, length)) for fd, off, length in requests]


def now_ms() -> int:
    """Wall-clock milliseconds since the Unix epoch (the enqueue timestamp)."""
    return time.time_ns() // 1_000_000
