"""The local broker: a registry of queues, consumers with credit, ack / release, browse and statistics.

Theory of operation
-------------------
A :class:`Queue` keeps three in-memory structures over its log's live set: ``ready`` (a deque of ids never
delivered, in id order), ``redeliver`` (a heap of released ids) and ``in_flight`` (id -> consumer). Every
released id is smaller than every id still in ``ready`` (it was delivered, so it was taken from the
front), so "heap first, then deque" hands out the smallest available id: delivery is FIFO per queue,
redeliveries included. A message becomes *ready* only once its enqueue record is durable (the writer
calls ``_on_ready``), so no consumer ever sees a message a crash could take back; except on a queue
declared with ``early_delivery``, where it is ready once its group commit's write has started (see
:mod:`._wal`: for consumers that forward to a receiver which drops duplicates).

:class:`Consumer` credit follows AMQP link credit: each delivery consumes one unit. In *window* mode
(default) a unit comes back when the delivery is acked or released, so ``credit`` bounds the unsettled
deliveries the consumer holds (a prefetch window, like Artemis' consumer window); in explicit mode
(``window=False``) only :meth:`Consumer.add_credit` grants more, which lets a bridge pass its peer's link
credit straight through. :meth:`Consumer.take_back_credit` withdraws units granted (a lender taking back
what it lent; the credit may go below zero). ``ack`` removes the message (durably: it returns once the ack
record is synced; on a consumer opened with ``lazy_acks`` at once, the record riding with the queue's next
group commit, so a crash may bring the message back); ``release`` puts it back for redelivery with
``delivery_count + 1``; closing a consumer releases what it still holds. Delivery counts live in memory:
after a restart every unacked message is delivered again with a count of 1 (the receiving side deduplicates
by message id, so a redelivery is harmless).

Non-durable queues (bridge control) use the same structures with payloads in memory and no log.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import heapq
import itertools
import logging
import os
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import Final, final

import attrs
import trio

from corda_trio import logs

from ._committer import CommitHelper
from ._compaction import Compactor, QueueGeneration
from ._directory import KEYED_DIR, create_queue_dir, open_root, retire_queue_dir
from ._errors import (
    QueueExistsError,
    QueueNotFoundError,
    StoreClosedError,
    StoreFailedError,
    UnknownDeliveryError,
    write_failure_text,
)
from ._keyed import KeyedLog
from ._parts import PartList, write_part_list
from ._record import unpack_location
from ._recovery import RecoveredLog, RecoveryMode, RecoveryReport, recover_queue
from ._segment import fsync_dir, remove_tree_gently, validate_queue_name
from ._wal import READ_BATCH_RECORDS, Batch, DurableLog, LogConfig, StoredMessage, now_ms

__all__ = [
    "Broker",
    "BrokerConfig",
    "Consumer",
    "Delivery",
    "FsyncPolicy",
    "Queue",
    "QueueStatistics",
    "open_broker",
]

logger = logging.getLogger("corda_trio.store")

#: Read-ahead: when a delivery must read from disk, the next ready messages come along (same thread call).
READ_AHEAD_RECORDS: Final = READ_BATCH_RECORDS
# Bound once: the enqueue hot path calls them per record.
_time_ns = time.time_ns
_current_task = trio.lowlevel.current_task
_wait_task_rescheduled = trio.lowlevel.wait_task_rescheduled
_ABORT_SUCCEEDED: Final = trio.lowlevel.Abort.SUCCEEDED
#: ... and at most this many bytes of them.
READ_AHEAD_BYTES: Final = 4 * 1024 * 1024


class FsyncPolicy(enum.Enum):
    """When a durable queue's group commit calls ``fdatasync``."""

    #: Every group commit is synced before any of its appenders returns (the default).
    ALWAYS = "always"
    #: Never sync: writes reach the page cache only. A machine crash loses acknowledged messages.
    #: For benchmarks only; logged as a warning and shown in :class:`QueueStatistics`.
    NONE = "none"


@attrs.frozen(kw_only=True)
class BrokerConfig:
    """Tuning of a broker (all queues)."""

    #: A segment is sealed once the next batch would take it past this size. 64 MiB keeps a 1 GiB queue
    #: at 16 files and a compaction's copy short.
    segment_bytes: int = attrs.field(default=64 * 1024 * 1024, validator=attrs.validators.ge(1024))
    #: Background compaction rewrites a sealed segment once its live bytes are at most this fraction.
    compact_live_ratio: float = attrs.field(
        default=0.5, validator=[attrs.validators.ge(0.0), attrs.validators.le(1.0)]
    )
    #: Payloads of recently enqueued messages kept in memory per queue (older ones are read on delivery).
    cache_bytes_per_queue: int = attrs.field(default=16 * 1024 * 1024, validator=attrs.validators.ge(0))
    #: Worker threads the broker may use at once for group commits (all queues together), and as many
    #: again for payload reads and compactions.
    io_threads: int = attrs.field(default=4, validator=attrs.validators.ge(1))
    #: Write and sync batches in a commit helper process (the default) rather than on worker threads.
    #: A thread must take the GIL back after each write and sync, and a busy event loop lets go of it
    #: only between scheduler rounds: measured here, up to a millisecond per group commit under load.
    #: The helper is started with the broker and holds the directory lock too while it lives.
    commit_process: bool = True
    #: Group commits of one queue in flight at once; ``None``: 2 with the commit process, 1 on threads.
    #: With 2, one cohort of appenders fills the next batch while the previous batch is synced (on
    #: threads the GIL spoils that, so there batches are taken whole). With the commit process, batches
    #: of one queue are still written one after the other and each write starts only after the previous
    #: sync returned (what arrived meanwhile goes out in one write), so only the last write can ever be
    #: torn, which recovery relies on. On worker threads with a depth above 1 the fsyncs of batches in
    #: flight overlap; after a power loss a missing earlier batch would then be reported as corruption
    #: (no acknowledged message is at risk: nothing is acknowledged before a sync covering it returned).
    flush_pipeline_depth: int | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.ge(1))
    )
    #: How long opening waits for the directory lock (a commit helper of a process that just died keeps
    #: it until it has seen its parent go, normally within milliseconds).
    lock_wait_seconds: float = attrs.field(default=2.0, validator=attrs.validators.ge(0.0))
    #: Refuse to open a directory without a part list (``parts.json``) instead of giving it one that lists
    #: what is there: for an owner that knows the store had one (the node, from its ``store.json``), so that
    #: the list deleted together with parts of the store does not hide them.
    require_part_list: bool = False
    #: How long closing waits for the commit helper process to confirm the pending group commits. A helper
    #: that answers nothing for this long (stopped with SIGSTOP, in a paused VM, stuck in the kernel) is
    #: killed: what it had not confirmed was never acknowledged, and leaving :func:`open_broker` raises
    #: :class:`StoreFailedError` saying so. A healthy helper answers within one ``fdatasync``.
    close_timeout_seconds: float = attrs.field(default=10.0, validator=attrs.validators.gt(0.0))


@attrs.frozen(kw_only=True)
class Delivery:
    """A message handed to a consumer (or shown by :meth:`Queue.browse`).

    Attributes:
        queue: the queue's name.
        message_id: the store's id: unique in the queue, increasing in enqueue order (FIFO).
        payload: the opaque payload.
        headers: the opaque application blob given at enqueue (``b""`` if none).
        delivery_count: 1 on the first delivery, +1 on each redelivery since the queue was opened
            (0 in :meth:`Queue.browse` for a message never delivered).
        enqueued_at_ms: enqueue time, milliseconds since the Unix epoch.
    """

    queue: str
    message_id: int
    payload: bytes
    headers: bytes
    delivery_count: int
    enqueued_at_ms: int


@attrs.frozen(kw_only=True)
class QueueStatistics:
    """A snapshot of one queue.

    ``depth`` counts messages stored and not acked (``ready + in_flight``); ``bytes`` their record bytes
    (headers and payloads plus 32 bytes each). ``records_per_fsync`` is the mean group-commit size.
    ``warning`` is set when the queue is not durable in the usual sense (``fsync="none"``).
    """

    name: str
    durable: bool
    fsync: str
    depth: int
    ready: int
    in_flight: int
    bytes: int
    oldest_age_seconds: float | None
    consumers: int
    enqueued: int
    acked: int
    released: int
    delivered: int
    group_commits: int
    fsyncs: int
    records_per_fsync: float
    segments: int
    disk_bytes: int
    compactions: int
    warning: str | None
    #: Seconds the group commits took (write and fsync, from starting the write to its return), summed:
    #: divided by ``group_commits`` it is the mean commit latency.
    commit_seconds_total: float = 0.0


def _as_bytes(value: object, what: str) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, bytearray | memoryview):
        return bytes(value)  # copy: the caller may reuse its buffer before the write happens
    raise TypeError(f"{what} must be bytes, not {type(value).__name__}")


@final
@attrs.define(eq=False, repr=False)
class Queue:
    """A FIFO queue: durable (a write-ahead log in its own directory) or in memory. Get one from
    :meth:`Broker.declare_queue`; do not construct it directly."""

    def __repr__(self) -> str:
        return f"<Queue {self.name} durable={self.durable} depth={self.statistics().depth}>"

    name: str
    durable: bool
    fsync: FsyncPolicy
    _log: DurableLog | None
    _compactor: Compactor | None = None
    _next_id: int = 0
    _mem: dict[int, tuple[int, bytes, bytes]] = attrs.field(factory=dict)
    _mem_bytes: int = 0
    _ready: deque[int] = attrs.field(factory=deque)
    _redeliver: list[int] = attrs.field(factory=list)
    _in_flight: dict[int, Consumer] = attrs.field(factory=dict)
    _delivery_counts: dict[int, int] = attrs.field(factory=dict)
    _read_ahead: dict[int, StoredMessage] = attrs.field(factory=dict)
    _lot: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot)
    _consumers: set[Consumer] = attrs.field(factory=set)
    _closed: bool = False
    _enqueued: int = 0
    _acked: int = 0
    _released: int = 0
    _delivered: int = 0

    # ------------------------------------------------------------------ producing

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"queue {self.name} is closed")

    @trio.lowlevel.enable_ki_protection  # a Ctrl-C lands at a checkpoint, never half-way
    async def enqueue(self, payload: bytes, *, headers: bytes = b"") -> int:
        """Store one message and return its id once it is durable.

        Args:
            payload: opaque bytes.
            headers: an optional opaque application blob (message id, properties...) kept with it.

        Returns:
            The message id (increasing per queue).

        Raises:
            StoreFailedError: the disk write or fsync failed (the queue stopped).
            StoreClosedError: the queue or broker is closed.

        If the call is cancelled before it starts, nothing is stored. If it is cancelled while waiting for
        the group commit, the message may or may not be stored (as with a cancelled ``send_all``); the id
        is then unknown to the caller.
        """
        log = self._log
        if log is None or self._closed or type(payload) is not bytes or type(headers) is not bytes:
            (mid,) = await self.enqueue_many([(payload, headers)])
            return mid
        # The hot path (one record): no lists, no event; park until the writer reschedules this task
        # (``_wal.park``, inlined: one coroutine frame less per record). Parking is the checkpoint: a
        # call cancelled on entry is aborted as it parks, while its record is still the last one of the
        # pending batch, and takes it back (so no ``checkpoint_if_cancelled`` is needed first).
        mid, batch = log.add_enqueue(payload, headers, _time_ns() // 1_000_000)
        self._enqueued += 1
        task = _current_task()
        waiters = batch.waiters
        waiters.append(task)

        def abort(_raise_cancel: object) -> trio.lowlevel.Abort:
            waiters.remove(task)
            if log.retract_enqueue(batch, mid):  # else the record may or may not be stored (see above)
                self._enqueued -= 1
            return _ABORT_SUCCEEDED

        await _wait_task_rescheduled(abort)
        if batch.error is not None:
            batch.raise_if_failed()
        return mid

    @trio.lowlevel.enable_ki_protection  # a Ctrl-C lands at a checkpoint, never half-way
    async def enqueue_many(self, items: Iterable[bytes | tuple[bytes, bytes]]) -> list[int]:
        """Store several messages in one group commit; returns their ids (in order) once all are durable.

        The records go into one batch: one write and one ``fdatasync``, so they become durable together
        and nothing is acknowledged before all of them are. This is not a transaction across a crash: if
        the process or the machine dies during that write, a prefix of the items (each one whole, in
        order) may be found after the restart, and the rest not. Callers that need all-or-nothing must
        deduplicate or mark completion themselves.

        Args:
            items: payloads, or ``(payload, headers)`` pairs.
        """
        self._check_open()
        await trio.lowlevel.checkpoint_if_cancelled()
        pairs = [(_as_bytes(i, "payload"), b"") if not isinstance(i, tuple) else
                 (_as_bytes(i[0], "payload"), _as_bytes(i[1], "headers")) for i in items]  # fmt: skip
        log = self._log
        if log is None:
            await trio.lowlevel.checkpoint()
            ids = []
            ts = now_ms()
            for payload, headers in pairs:
                mid = self._next_id
                self._next_id += 1
                self._mem[mid] = (ts, headers, payload)
                self._mem_bytes += len(headers) + len(payload) + 32
                ids.append(mid)
            self._enqueued += len(ids)
            self._on_ready(ids)
            return ids
        ts = now_ms()
        ids = []
        batch = None
        for payload, headers in pairs:
            mid, batch = log.add_enqueue(payload, headers, ts, False)
            ids.append(mid)
        log.start_pending()
        self._enqueued += len(ids)
        if batch is None:
            await trio.lowlevel.checkpoint()
        else:
            await batch.wait()
        return ids

    def _on_ready(self, ids: list[int]) -> None:
        self._ready.extend(ids)
        self._lot.unpark(count=len(ids))

    # ------------------------------------------------------------------ consuming

    def consumer(self, *, credit: int = 64, window: bool = True, lazy_acks: bool = False) -> Consumer:
        """A new consumer (use it as ``async with``; closing releases what it still holds).

        Args:
            credit: initial credit (deliveries it may receive before more credit is granted).
            window: give a unit of credit back on each ack / release (prefetch window). With
                ``window=False`` only :meth:`Consumer.add_credit` grants more (AMQP link credit).
            lazy_acks: :meth:`Consumer.ack_many` does not wait for its ack records to be written: they
                go with the queue's next group commit that somebody waits for, or on their own within
                ``LAZY_ACK_SECONDS`` (50 ms). Until then a crash (even ``kill -9``) brings the messages
                back after the restart, as if they had not been acked; closing the broker writes them.
                For consumers whose downstream drops duplicates (the bridges: the peer deduplicates;
                the inbox: the node's deduplicator), which then save a group commit, and its wait, per
                batch of acks.
        """
        self._check_open()
        if credit < 0:
            raise ValueError("credit must be >= 0")
        consumer = Consumer(queue=self, credit=credit, window=window, lazy_acks=lazy_acks)
        self._consumers.add(consumer)
        return consumer

    def _take(self) -> int | None:
        if self._redeliver:
            return heapq.heappop(self._redeliver)
        if self._ready:
            return self._ready.popleft()
        return None

    def _put_back(self, mid: int) -> None:
        heapq.heappush(self._redeliver, mid)
        self._lot.unpark()

    async def _load(self, mid: int) -> StoredMessage:
        found = self._load_nowait(mid)  # a memory queue's, read ahead, or in the log's cache
        if found is not None:
            return found
        log = self._log
        assert log is not None
        # From disk: bring the next ready messages along in the same worker-thread call (bounded in
        # records, in bytes, and in how far down the queue we look).
        ids = [mid]
        budget = READ_AHEAD_BYTES
        for nxt in itertools.islice(self._ready, 4 * READ_AHEAD_RECORDS):
            if len(ids) >= READ_AHEAD_RECORDS:
                break
            if nxt not in log.cache and nxt not in self._read_ahead:
                budget -= unpack_location(log.live[nxt])[2]  # the record's length
                if budget < 0:
                    break
                ids.append(nxt)
        messages = await log.read(ids)
        for message in messages[1:]:
            if message.message_id in log.live:
                self._read_ahead[message.message_id] = message
        return messages[0]

    def _load_nowait(self, mid: int) -> StoredMessage | None:
        """The message ``mid`` if it is in memory (see :meth:`_load`), else ``None``."""
        if self._log is None:
            ts, headers, payload = self._mem[mid]
            return StoredMessage(message_id=mid, timestamp_ms=ts, headers=headers, payload=payload)
        ahead = self._read_ahead.pop(mid, None)
        if ahead is not None:
            return ahead
        return self._log.read_cached(mid)

    def _forget(self, mid: int) -> None:
        self._delivery_counts.pop(mid, None)
        self._read_ahead.pop(mid, None)

    @trio.lowlevel.enable_ki_protection  # store internals: a Ctrl-C lands at a checkpoint, never half-way
    async def ack(self, message_id: int) -> None:
        """Acknowledge (remove) an in-flight message, whichever consumer holds it; returns once durable.

        Raises:
            UnknownDeliveryError: the message is not in flight.
            StoreFailedError: the ack record could not be written.
        """
        consumer = self._in_flight.get(message_id)
        if consumer is None:
            raise UnknownDeliveryError(f"message {message_id} is not in flight on queue {self.name}")
        await consumer.ack(message_id)

    # ------------------------------------------------------------------ inspection

    async def browse(self, *, limit: int | None = None) -> AsyncIterator[Delivery]:
        """Iterate over stored messages in id order without consuming them (ready and in flight).

        A snapshot of the ids is taken first; messages acked meanwhile are skipped.
        """
        self._check_open()
        ids = list(self._log.live) if self._log is not None else list(self._mem)
        if limit is not None:
            ids = ids[:limit]
        for start in range(0, len(ids), READ_BATCH_RECORDS):
            chunk = [mid for mid in ids[start : start + READ_BATCH_RECORDS] if self._is_live(mid)]
            if self._log is not None:
                messages = await self._log.read(chunk)
            else:
                await trio.lowlevel.checkpoint()
                messages = [await self._load(mid) for mid in chunk]
            for m in messages:
                yield Delivery(
                    queue=self.name, message_id=m.message_id, payload=m.payload, headers=m.headers,
                    delivery_count=self._delivery_counts.get(m.message_id, 0), enqueued_at_ms=m.timestamp_ms,
                )  # fmt: skip

    def _is_live(self, mid: int) -> bool:
        return mid in self._log.live if self._log is not None else mid in self._mem

    def statistics(self) -> QueueStatistics:
        """A snapshot of this queue's counters (see :class:`QueueStatistics`)."""
        log = self._log
        candidates = []
        if self._ready:
            candidates.append(self._ready[0])
        if self._redeliver:
            candidates.append(self._redeliver[0])
        if self._in_flight:
            candidates.append(min(self._in_flight))
        oldest_ms: int | None = None
        if candidates:
            first = min(candidates)
            if log is not None:
                oldest_ms = unpack_location(log.live[first])[4]
            else:
                oldest_ms = self._mem[first][0]
        age = max(0.0, (now_ms() - oldest_ms) / 1000.0) if oldest_ms is not None else None
        depth = len(log.live) if log is not None else len(self._mem)
        return QueueStatistics(
            name=self.name,
            durable=self.durable,
            fsync=self.fsync.value if self.durable else "n/a",
            depth=depth,
            ready=len(self._ready) + len(self._redeliver),
            in_flight=len(self._in_flight),
            bytes=log.live_bytes if log is not None else self._mem_bytes,
            oldest_age_seconds=age,
            consumers=len(self._consumers),
            enqueued=self._enqueued,
            acked=self._acked,
            released=self._released,
            delivered=self._delivered,
            group_commits=log.batches if log is not None else 0,
            fsyncs=log.fsyncs if log is not None else 0,
            records_per_fsync=(log.records_written / log.fsyncs) if log is not None and log.fsyncs else 0.0,
            segments=len(log.segments) if log is not None else 0,
            disk_bytes=sum(s.size for s in log.segments.values()) if log is not None else 0,
            compactions=log.compactions if log is not None else 0,
            commit_seconds_total=log.commit_seconds if log is not None else 0.0,
            warning=(
                "fsync disabled: enqueues are NOT durable against a machine crash (benchmark mode)"
                if self.durable and self.fsync is FsyncPolicy.NONE
                else None
            ),
        )

    @trio.lowlevel.enable_ki_protection  # store internals: a Ctrl-C lands at a checkpoint, never half-way
    async def compact(self) -> int:
        """Compact this queue now, the current segment included; returns the bytes reclaimed (0 for an
        in-memory queue).

        Raises:
            StoreClosedError: the queue was closed or deleted (before or while it was compacted).
            StoreFailedError: the queue failed, or a segment could not be rewritten (it is left intact).
        """
        self._check_open()
        if self._log is None:
            await trio.lowlevel.checkpoint()
            return 0
        assert self._compactor is not None
        return await self._compactor.compact(seal_tail=True)

    def _close(self) -> None:
        self._closed = True
        for consumer in list(self._consumers):
            consumer._closed = True
            consumer._credit_changed.set()
        self._lot.unpark_all()
        if self._log is not None:
            self._log.close()


@final
@attrs.define(eq=False, repr=False)
class Consumer:
    """Receives messages of one queue (see the module docstring for credit, ack and release).

    Use ``async with queue.consumer() as c: async for delivery in c: ...``.
    """

    def __repr__(self) -> str:
        return f"<Consumer of {self._queue.name} credit={self._credit} held={len(self._held)}>"

    _queue: Queue = attrs.field(alias="queue")
    _credit: int = attrs.field(alias="credit")
    _window: bool = attrs.field(alias="window")
    _lazy_acks: bool = attrs.field(alias="lazy_acks", default=False)
    _held: dict[int, None] = attrs.field(factory=dict, init=False)
    _credit_changed: trio.Event = attrs.field(factory=trio.Event, init=False)
    _closed: bool = attrs.field(default=False, init=False)

    @property
    def credit(self) -> int:
        """Deliveries this consumer may still receive before it needs more credit."""
        return self._credit

    @property
    def held(self) -> tuple[int, ...]:
        """Ids delivered to this consumer and not yet acked or released, in delivery order."""
        return tuple(self._held)

    @trio.lowlevel.enable_ki_protection  # store internals: a Ctrl-C lands at a checkpoint, never half-way
    def add_credit(self, n: int) -> None:
        """Grant ``n`` more deliveries."""
        if n < 0:
            raise ValueError("credit increments must be >= 0")
        self._credit += n
        if n:
            self._credit_changed.set()

    @trio.lowlevel.enable_ki_protection  # store internals: a Ctrl-C lands at a checkpoint, never half-way
    def take_back_credit(self, n: int) -> None:
        """Withdraw ``n`` units granted with :meth:`add_credit`. The credit may go below zero: then that many
        settlements (in window mode) pass before the next delivery, so what is held never exceeds the
        credit granted overall."""
        if n < 0:
            raise ValueError("credit withdrawals must be >= 0")
        self._credit -= n

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"consumer of queue {self._queue.name} is closed")

    @trio.lowlevel.enable_ki_protection  # a Ctrl-C lands at a checkpoint, never half-way
    async def receive(self) -> Delivery:
        """Wait for the next message (and for credit), mark it in flight and return it.

        Raises:
            StoreClosedError: the consumer, queue or broker was closed.
            StoreFailedError: the stored message could not be read.
        """
        await trio.lowlevel.checkpoint()
        queue = self._queue
        while True:
            self._check_open()
            if self._credit <= 0:
                self._credit_changed = trio.Event()
                await self._credit_changed.wait()
                continue
            mid = queue._take()
            if mid is not None:
                break
            await queue._lot.park()
        count = self._mark_in_flight(mid)
        try:
            message = await queue._load(mid)
        except BaseException:
            # Not delivered after all: undo, keep its place at the head of the queue.
            self._credit += 1
            del self._held[mid]
            del queue._in_flight[mid]
            queue._delivery_counts[mid] = count - 1
            if not queue._closed:
                queue._put_back(mid)
            raise
        return self._delivery(mid, count, message)

    def _mark_in_flight(self, mid: int) -> int:
        """Take one credit and hold ``mid``; returns its delivery count."""
        queue = self._queue
        self._credit -= 1
        self._held[mid] = None
        queue._in_flight[mid] = self
        count = queue._delivery_counts.get(mid, 0) + 1
        queue._delivery_counts[mid] = count
        return count

    def _delivery(self, mid: int, count: int, message: StoredMessage) -> Delivery:
        queue = self._queue
        queue._delivered += 1
        return Delivery(
            queue=queue.name, message_id=mid, payload=message.payload, headers=message.headers,
            delivery_count=count, enqueued_at_ms=message.timestamp_ms,
        )  # fmt: skip

    @trio.lowlevel.enable_ki_protection  # a Ctrl-C never lands between taking a message and holding it
    def receive_nowait(self) -> Delivery:
        """Like :meth:`receive`, but only if that would not wait: credit is left, a message is ready and it
        is in memory (no disk read). Not a checkpoint: a consumer that has just received can take what else
        is ready without a trip through the scheduler per message.

        Raises:
            trio.WouldBlock: no credit, no ready message, or the next one must be read from disk first.
            StoreClosedError: the consumer, queue or broker was closed.
        """
        self._check_open()
        queue = self._queue
        if self._credit <= 0:
            raise trio.WouldBlock
        if queue._redeliver:
            mid = queue._redeliver[0]
        elif queue._ready:
            mid = queue._ready[0]
        else:
            raise trio.WouldBlock
        message = queue._load_nowait(mid)
        if message is None:
            raise trio.WouldBlock
        queue._take()  # that head, `mid`
        return self._delivery(mid, self._mark_in_flight(mid), message)

    def __aiter__(self) -> Consumer:
        return self

    async def __anext__(self) -> Delivery:
        try:
            return await self.receive()
        except StoreClosedError:
            raise StopAsyncIteration from None

    def _settle(self, message_id: int) -> None:
        if message_id not in self._held:
            raise UnknownDeliveryError(
                f"message {message_id} is not held by this consumer of queue {self._queue.name}"
            )
        del self._held[message_id]
        del self._queue._in_flight[message_id]
        if self._window:
            self._credit += 1
            self._credit_changed.set()

    async def ack(self, message_id: int) -> None:
        """Remove a message this consumer holds; returns once the removal is durable (unless the consumer
        was made with ``lazy_acks``).

        Raises:
            UnknownDeliveryError: this consumer does not hold ``message_id`` (a caller bug).
            StoreFailedError: the ack record could not be written (the message may be redelivered after
                a restart).
        """
        await self.ack_many([message_id])

    @trio.lowlevel.enable_ki_protection  # a Ctrl-C lands at a checkpoint, never half-way
    async def ack_many(self, message_ids: Sequence[int]) -> None:
        """Acknowledge several held messages in one group commit (returns once durable, unless the
        consumer was made with ``lazy_acks``: then at once)."""
        batch = self.ack_many_nowait(message_ids)
        if batch is None or self._lazy_acks:
            await trio.lowlevel.checkpoint()
        else:
            await batch.wait()

    @trio.lowlevel.enable_ki_protection  # store internals: a Ctrl-C lands at a checkpoint, never half-way
    def ack_many_nowait(self, message_ids: Sequence[int]) -> Batch | None:
        """:meth:`ack_many` without waiting and without a checkpoint: the acks are durable with the queue's
        next group commit (what ``lazy_acks`` means; a message acked but not yet durable comes back after
        a crash). For a caller that has just passed a checkpoint. Returns the commit batch that makes them
        durable (``await batch.wait()``), or ``None`` for an in-memory queue."""
        for mid in message_ids:
            if mid not in self._held:
                raise UnknownDeliveryError(
                    f"message {mid} is not held by this consumer of queue {self._queue.name}"
                )
        if len(set(message_ids)) != len(message_ids):
            raise UnknownDeliveryError(f"duplicate message ids in one ack of queue {self._queue.name}")
        queue = self._queue
        if queue._log is not None:
            queue._log.check_usable()  # fail before settling anything
        batch = None
        lazy = self._lazy_acks
        for mid in message_ids:
            self._settle(mid)
            queue._forget(mid)
            queue._acked += 1
            if queue._log is not None:
                batch = queue._log.add_ack(mid, lazy=lazy)
            else:
                _ts, headers, payload = queue._mem.pop(mid)
                queue._mem_bytes -= len(headers) + len(payload) + 32
        return batch

    @trio.lowlevel.enable_ki_protection  # store internals: a Ctrl-C lands at a checkpoint, never half-way
    def release(self, message_id: int) -> None:
        """Give a held message back: it is delivered again (first in line) with ``delivery_count + 1``.

        Raises:
            UnknownDeliveryError: this consumer does not hold ``message_id``.
        """
        self._settle(message_id)
        self._queue._released += 1
        if not self._queue._closed:
            self._queue._put_back(message_id)

    @trio.lowlevel.enable_ki_protection  # store internals: a Ctrl-C lands at a checkpoint, never half-way
    async def aclose(self) -> None:
        """Release every held message and stop receiving."""
        self._close()
        await trio.lowlevel.checkpoint()

    def _close(self) -> None:
        if self._closed and self not in self._queue._consumers:
            return
        self._closed = True
        for mid in list(self._held):
            self.release(mid)
        self._queue._consumers.discard(self)
        self._credit_changed.set()

    async def __aenter__(self) -> Consumer:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._close()


@final
@attrs.define(eq=False, repr=False)
class Broker:
    """A registry of queues under one directory. Get one from :func:`open_broker`."""

    def __repr__(self) -> str:
        return f"<Broker {self.directory} queues={len(self._queues)}>"

    directory: str
    config: BrokerConfig
    _nursery: trio.Nursery
    _limiter: trio.CapacityLimiter
    _io_limiter: trio.CapacityLimiter
    _helper: CommitHelper | None = None
    _queues: dict[str, Queue] = attrs.field(factory=dict)
    _keyed: dict[str, KeyedLog] = attrs.field(factory=dict)
    #: the durable queues and keyed logs the store created, as its part list (``parts.json``) says
    _parts: PartList = attrs.field(factory=PartList)
    _registry_lock: trio.Lock = attrs.field(factory=trio.Lock)
    _closed: bool = False
    _failure: StoreFailedError | None = None
    _failed: trio.Event = attrs.field(factory=trio.Event)
    #: What recovery found in each durable queue when the broker opened.
    recovery_reports: dict[str, RecoveryReport] = attrs.field(factory=dict)

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError("broker is closed")

    async def wait_failed(self) -> StoreFailedError:
        """Wait until the store can no longer write, and return why: the commit helper process exited
        when it was not asked to, or a queue's or keyed log's write or fsync failed (that log stopped).
        Never returns while the store is healthy; closing the broker is not a failure. Owners that cannot
        run without their store (the node) stop on it."""
        await self._failed.wait()
        assert self._failure is not None
        return self._failure

    def _note_failure(self, what: str, exc: BaseException) -> None:
        if self._failure is None:
            if not isinstance(exc, StoreFailedError):
                exc = StoreFailedError(f"{what}: {write_failure_text(exc)}")
            self._failure = exc
            self._failed.set()

    @trio.lowlevel.enable_ki_protection  # store internals: a Ctrl-C lands at a checkpoint, never half-way
    async def declare_queue(
        self,
        name: str,
        *,
        durable: bool = True,
        fsync: FsyncPolicy | str | None = None,
        early_delivery: bool | None = None,
    ) -> Queue:
        """Return queue ``name``, creating it if needed (idempotent).

        Args:
            name: see :func:`validate_queue_name` (the directory is named exactly like the queue).
            durable: a durable queue lives in its own directory and survives restarts; a non-durable one
                lives in memory only.
            fsync: :class:`FsyncPolicy` for a durable queue (default ``always``). Passing it for an
                existing queue changes the policy from now on.
            early_delivery: a durable queue hands each message to its consumers as soon as the write of
                its group commit has started, while the sync runs, instead of once it is durable (default
                off; ``enqueue`` still returns once durable). A crash before the sync may then take back a
                message that a consumer already had, and its id may then be given to another message after
                the restart: only for consumers that forward the payload to a receiver which drops
                duplicates by an id of its own (the node's outbound queues: the dedup id). Passing it for an
                existing queue changes it from now on; a non-durable queue ignores it (its messages are
                ready at once anyway).

        Raises:
            InvalidQueueNameError: bad name.
            QueueExistsError: it exists with the other durability, or a directory of that name holds
                files the store did not write (it is never written to).
            StoreFailedError: its directory or first segment could not be created (no inode left, no
                descriptor, ...): the store failed (``wait_failed``).
        """
        self._check_open()
        validate_queue_name(name)
        policy = FsyncPolicy(fsync) if fsync is not None else None
        async with self._registry_lock:
            queue = self._queues.get(name)
            if queue is not None:
                if queue.durable != durable:
                    kind = "durable" if queue.durable else "non-durable"
                    raise QueueExistsError(f"queue {name} already exists as a {kind} queue")
                if policy is not None and durable:
                    self._set_fsync(queue, policy)
                if early_delivery is not None and queue._log is not None:
                    queue._log.early_delivery = early_delivery
                await trio.lowlevel.checkpoint()
                return queue
            if not durable:
                await trio.lowlevel.checkpoint()
                queue = Queue(name=name, durable=False, fsync=FsyncPolicy.ALWAYS, log=None)
                self._queues[name] = queue
                return queue
            path = os.path.join(self.directory, name)
            parts = attrs.evolve(self._parts, queues=self._parts.queues | {name})
            recovered = await self._create_part_in_thread(f"queue {name}", create_queue_dir, path, parts)
            self._parts = parts
            queue = self._start_durable(name, recovered, policy or FsyncPolicy.ALWAYS)
            if queue._log is not None and early_delivery:
                queue._log.early_delivery = True
            logger.info("created durable queue %s", name)
            return queue

    async def _create_part_in_thread(
        self, what: str, create: Callable[[str, str], RecoveredLog], path: str, parts: PartList
    ) -> RecoveredLog:
        """:meth:`_create_part` in a worker thread. A file it cannot create or write (``ENOSPC`` with the
        inodes used up, ``EMFILE``, ``EACCES``) fails the store like a failed write: its owner (the node)
        stops with ``fatal store error ... queue <name>: cannot create it: <why>``, said in its log too,
        instead of a bare ``OSError`` from whichever task wanted the queue (which the node reported without
        saying it was the store, and only on stderr). Whatever was created is left for the next open."""
        try:
            return await trio.to_thread.run_sync(
                self._create_part,
                create,
                self.directory,
                path,
                _changed(parts, self._parts),
                limiter=self._limiter,
            )
        except OSError as exc:
            failure = StoreFailedError(f"{what}: cannot create it: {write_failure_text(exc)}")
            self._note_failure(what, failure)
            raise failure from exc

    @staticmethod
    def _create_part(
        create: Callable[[str, str], RecoveredLog], root: str, path: str, record: PartList | None
    ) -> RecoveredLog:
        """Run ``create(root, path)`` (a new part's directory, made durable, or an existing one recovered),
        then write the part list ``record`` of ``root`` unless it is ``None`` (a worker thread's job)."""
        recovered = create(root, path)
        if record is not None:
            try:
                write_part_list(root, record)
            except BaseException:
                for state in recovered.segments:  # (the part stays on disk, unrecorded: the next open
                    if state.fd >= 0:  # records it)
                        os.close(state.fd)
                raise
        return recovered

    def _set_fsync(self, queue: Queue, policy: FsyncPolicy) -> None:
        assert queue._log is not None
        if policy is FsyncPolicy.NONE and queue.fsync is not FsyncPolicy.NONE:
            logger.warning(
                "queue %s: fsync disabled (fsync=none): enqueues are NOT durable; benchmarks only", queue.name
            )
        queue.fsync = policy
        queue._log.config = attrs.evolve(queue._log.config, sync=policy is FsyncPolicy.ALWAYS)

    def _start_log(
        self, name: str, path: str, recovered: RecoveredLog, on_ready: Callable[[list[int]], None]
    ) -> tuple[DurableLog, Compactor]:
        """Build a durable log (a queue's or a keyed log's) and start its writer and compactor."""
        log = DurableLog.from_recovered(
            name=name,
            directory=path,
            recovered=recovered,
            config=LogConfig(
                segment_bytes=self.config.segment_bytes,
                compact_live_ratio=self.config.compact_live_ratio,
                cache_bytes=self.config.cache_bytes_per_queue,
                sync=True,
                pipeline_depth=self.config.flush_pipeline_depth or (2 if self._helper is not None else 1),
            ),
            limiter=self._limiter,
            io_limiter=self._io_limiter,
            on_ready=on_ready,
            helper=self._helper,
            on_failure=functools.partial(self._note_failure, f"queue {name}: write-ahead log write failed"),
        )
        compactor = Compactor(log=log, generation=QueueGeneration.open(name, path))
        self._nursery.start_soon(log.run_writer, name=f"store-writer:{name}")
        self._nursery.start_soon(compactor.run, name=f"store-compactor:{name}")
        return log, compactor

    def _start_durable(self, name: str, recovered: RecoveredLog, policy: FsyncPolicy) -> Queue:
        queue = Queue(name=name, durable=True, fsync=FsyncPolicy.ALWAYS, log=None)
        path = os.path.join(self.directory, name)
        log, compactor = self._start_log(name, path, recovered, queue._on_ready)
        queue._log = log
        queue._compactor = compactor
        queue._ready.extend(log.live)
        if policy is not FsyncPolicy.ALWAYS:
            self._set_fsync(queue, policy)
        self._queues[name] = queue
        self.recovery_reports[name] = recovered.report
        return queue

    @trio.lowlevel.enable_ki_protection  # store internals: a Ctrl-C lands at a checkpoint, never half-way
    async def open_keyed_log(self, name: str) -> KeyedLog:
        """Open (creating if needed) the durable keyed log ``name`` and recover its live entries.

        Keyed logs live in ``keyed/<name>/`` under the broker directory and share the queues' group
        commit and commit helper process. Opening an open log returns the same object.

        Args:
            name: validated like a queue name (:func:`validate_queue_name`).

        Raises:
            InvalidQueueNameError: bad name.
            CorruptSegmentError: the log holds a corrupt record.
            StoreFailedError: its files could not be created or read (the store failed).
        """
        self._check_open()
        validate_queue_name(name)
        async with self._registry_lock:
            keyed = self._keyed.get(name)
            if keyed is not None:
                await trio.lowlevel.checkpoint()
                return keyed
            path = os.path.join(self.directory, KEYED_DIR, name)
            parts = attrs.evolve(self._parts, keyed=self._parts.keyed | {name})
            recovered = await self._create_part_in_thread(f"keyed log {name}", _open_keyed_dir, path, parts)
            self._parts = parts
            _log_recovery(f"keyed log {name}", recovered.report)
            keyed = KeyedLog(name=name)
            started = self._start_log(f"keyed:{name}", path, recovered, keyed._on_durable)
            keyed._log, keyed._compactor = started
            try:
                await keyed._recover()
            except BaseException:
                # Cancelled or failed half-way: never leave a partly recovered log registered.
                keyed._close()
                with trio.CancelScope(shield=True):
                    await started[1].stop()
                    await started[0].wait_closed()
                started[0].release_resources()
                started[1].generation.close()
                raise
            self._keyed[name] = keyed
            return keyed

    def get_queue(self, name: str) -> Queue:
        """The existing queue ``name``.

        Raises:
            QueueNotFoundError: no such queue.
        """
        self._check_open()
        try:
            return self._queues[name]
        except KeyError:
            raise QueueNotFoundError(f"no queue named {name!r}") from None

    def list_queues(self, prefix: str = "") -> list[str]:
        """Names of the queues starting with ``prefix``, sorted."""
        return sorted(n for n in self._queues if n.startswith(prefix))

    async def open_keyed_logs(self) -> dict[str, KeyedLog]:
        """Open every keyed log the store holds (its part list), recovering each: an owner that needs its
        whole store sound before it goes on (the node, before anything network-facing; ``store compact``)
        calls it right after :func:`open_broker`, so that a damaged keyed log is refused then, as a damaged
        queue is.
        Later :meth:`open_keyed_log` calls return the same objects.

        Returns:
            name -> keyed log, sorted by name.

        Raises:
            CorruptSegmentError: a keyed log holds a corrupt record (or its manifest is damaged or gone).
        """
        return {name: await self.open_keyed_log(name) for name in self.list_keyed_logs()}

    def list_keyed_logs(self) -> list[str]:
        """Names of the keyed logs the store holds (its part list: opened or not), sorted."""
        return sorted(self._parts.keyed)

    def statistics(self, prefix: str = "") -> list[QueueStatistics]:
        """Statistics of every queue whose name starts with ``prefix``, sorted by name."""
        return [self._queues[n].statistics() for n in self.list_queues(prefix)]

    @trio.lowlevel.enable_ki_protection  # store internals: a Ctrl-C lands at a checkpoint, never half-way
    async def delete_queue(self, name: str) -> None:
        """Delete a queue and everything in it (consumers see :class:`StoreClosedError`).

        Raises:
            QueueNotFoundError: no such queue.
        """
        self._check_open()
        async with self._registry_lock:
            queue = self.get_queue(name)
            del self._queues[name]
            queue._close()
            log = queue._log
            if log is None:
                await trio.lowlevel.checkpoint()
                return
            # No compaction outlives its queue: stop it (waiting for a rewrite in progress), then the
            # writer; only then does the directory go (a re-declare gets a new generation).
            assert queue._compactor is not None
            await queue._compactor.stop()
            await log.wait_closed()
            log.release_resources()
            queue._compactor.generation.close()
            retired = await trio.to_thread.run_sync(
                retire_queue_dir, self.directory, os.path.join(self.directory, name), limiter=self._limiter
            )
            self.recovery_reports.pop(name, None)
            # Off the part list only now: a crash before this leaves it listed with its retired directory
            # there, which the next open takes for the interrupted delete it is. (Should this write fail,
            # the retired directory stays for that open to see, and the error is raised.)
            parts = attrs.evolve(self._parts, queues=self._parts.queues - {name})
            await trio.to_thread.run_sync(write_part_list, self.directory, parts, limiter=self._limiter)
            self._parts = parts
        # Gone for good already; its files are freed a step at a time (remove_tree_gently), outside the
        # lock: declaring and deleting other queues need not wait for that (if this is cancelled first,
        # the next open removes what is left).
        await trio.to_thread.run_sync(remove_tree_gently, retired)
        logger.info("deleted queue %s", name)

    async def _aclose(self) -> None:
        self._closed = True
        queues = list(self._queues.values())
        for queue in queues:
            queue._close()
        for keyed in self._keyed.values():
            keyed._close()
        for owner in [*queues, *self._keyed.values()]:
            if owner._compactor is not None:
                await owner._compactor.stop()
            if owner._log is not None:
                await owner._log.wait_closed()


@contextlib.asynccontextmanager
@trio.lowlevel.enable_ki_protection  # its clean-up runs whole: a Ctrl-C lands at a checkpoint
async def open_broker(
    directory: str | os.PathLike[str], *, config: BrokerConfig | None = None
) -> AsyncIterator[Broker]:
    """Open (creating if needed) the broker rooted at ``directory`` and recover every durable queue.

    The broker owns a nursery with one group-commit writer and one compactor task per durable queue.
    Leaving the block closes every queue, lets the writers finish what is pending, and closes files.
    Only one process may open a directory at a time (an ``flock`` on the directory itself, held by the
    broker and its commit helper for their lifetime).

    The directory's part list (``parts.json``) names every durable queue and keyed log the store created; it
    is checked first, and a part it names that is gone stops the open before anything is changed.

    Raises:
        BrokerLockedError: another process has the directory open.
        MissingPartError: a queue or keyed log the store created is gone or emptied.
        PartListError: the part list is damaged (or missing, with ``config.require_part_list``).
        CorruptSegmentError: a queue holds a corrupt record (run ``corda-trio store check --repair``).
        OSError: the directory cannot be created or read.
    """
    config = config or BrokerConfig()
    root = os.fspath(directory)
    # Two dedicated limiters: group commits (write + fsync) never queue behind reads or compactions.
    limiter = trio.CapacityLimiter(config.io_threads)
    io_limiter = trio.CapacityLimiter(config.io_threads)
    listing = await trio.to_thread.run_sync(
        functools.partial(
            open_root, root, config.lock_wait_seconds, require_part_list=config.require_part_list
        ),
        limiter=limiter,
        abandon_on_cancel=True,
    )
    lock_fd, names = listing.lock_fd, listing.queues
    for entry in listing.strays:
        logger.warning("broker directory %s: ignoring %s (not written by the store)", root, entry)
    recovered_logs: list[tuple[str, RecoveredLog]] = []
    broker: Broker | None = None
    helper: CommitHelper | None = None
    try:
        # Recover everything before the nursery exists, so that a corrupt queue raises plainly.
        for name in names:
            path = os.path.join(root, name)
            recovered = await trio.to_thread.run_sync(recover_queue, path, RecoveryMode.OPEN, limiter=limiter)
            recovered_logs.append((name, recovered))
            _log_recovery(f"queue {name}", recovered.report)
        if config.commit_process:
            # It inherits the lock: nobody else opens the directory while it may still write.
            helper = await CommitHelper.start(inherit=(lock_fd,))
        try:
            async with trio.open_nursery() as nursery:
                if helper is not None:
                    await nursery.start(helper.run)
                broker = Broker(
                    directory=root, config=config, nursery=nursery, limiter=limiter, io_limiter=io_limiter,
                    helper=helper, parts=listing.parts,
                )  # fmt: skip
                if helper is not None:
                    helper.on_failure = functools.partial(broker._note_failure, "commit helper")
                for name, recovered in recovered_logs:
                    broker._start_durable(name, recovered, FsyncPolicy.ALWAYS)
                recovered_logs.clear()
                hung: StoreFailedError | None = None
                try:
                    yield broker
                finally:
                    with trio.CancelScope(shield=True):
                        hung = await _close_broker(broker, helper)
                    nursery.cancel_scope.cancel()
            if hung is not None:  # (only when the block itself ended normally: its own error comes first)
                raise hung
        except BaseExceptionGroup as group:
            # The nursery is an implementation detail: one error (from the body or from a writer) is
            # raised as itself, as if the block had no nursery.
            if len(group.exceptions) == 1 and not isinstance(group.exceptions[0], BaseExceptionGroup):
                raise group.exceptions[0] from None
            raise
    finally:
        for _name, recovered in recovered_logs:
            for state in recovered.segments:
                if state.fd >= 0:
                    os.close(state.fd)
        owners = [*broker._queues.values(), *broker._keyed.values()] if broker is not None else []
        for queue in owners:
            if queue._log is not None:
                queue._log.release_resources()
            if queue._compactor is not None:
                queue._compactor.generation.close()
        if helper is not None:
            with trio.CancelScope(shield=True):
                await helper.kill()  # a no-op once it has exited
        os.close(lock_fd)


async def _close_broker(broker: Broker, helper: CommitHelper | None) -> StoreFailedError | None:
    """Close every queue and keyed log (their writers finish the pending group commits), then the helper.

    A commit helper that confirms nothing within ``close_timeout_seconds`` is killed
    (:meth:`CommitHelper.kill_unanswering`): a frozen process must not keep the node from stopping, nor
    keep the directory locked. Its unconfirmed commits then fail, so the writers return. Returns that
    failure (``None``: a clean close). On worker threads (no helper) nothing can be killed, and the close
    waits for them.
    """
    if helper is None:
        await broker._aclose()
        return None
    timeout = broker.config.close_timeout_seconds
    with trio.move_on_after(timeout) as waiting:
        await broker._aclose()
    hung = None
    if waiting.cancelled_caught:
        hung = helper.kill_unanswering(timeout)
        # (the owner reports the raised error in its own last line: the node's `fatal store error`)
        logger.critical("closing the store: %s", hung, extra={logs.FILE_ONLY: True})
        await broker._aclose()
    await helper.aclose()
    return hung


def _log_recovery(what: str, report: RecoveryReport) -> None:
    """Log what recovery of a queue or keyed log found: a torn tail it cut (a warning: records were
    dropped), then how much it recovered."""
    if report.torn_tail is not None:
        t = report.torn_tail
        logger.warning(
            "%s: torn tail in %s at offset %d: dropped %d bytes (%s)",
            what, t.path, t.offset, t.dropped_bytes, t.reason,
        )  # fmt: skip
    logger.info(
        "recovered %s: %d messages in %d segments (%.3f s)",
        what, report.live_messages, report.segments, report.duration_seconds,
    )  # fmt: skip


def _changed(parts: PartList, was: PartList) -> PartList | None:
    return None if parts == was else parts


def _open_keyed_dir(root: str, path: str) -> RecoveredLog:
    keyed_root = os.path.dirname(path)
    if not os.path.isdir(keyed_root):
        os.mkdir(keyed_root)
        fsync_dir(root)
    return create_queue_dir(keyed_root, path)
