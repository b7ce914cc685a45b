"""Receive-side deduplication by ``_AMQ_DUPL_ID``: "being processed" in memory plus persisted ids.

Theory of operation
-------------------
Bridges deliver at least once: a message whose ``accepted`` got lost, or that was in flight when a link or
process died, arrives again. The :class:`Deduplicator` makes the handler side exactly once:

* :meth:`Deduplicator.begin` claims an id: ``False`` if it is being processed right now or was processed
  before (a duplicate: the caller acks it from the inbox and drops it);
* :meth:`Deduplicator.commit` records the id durably, together with an optional *receipt* (bytes the handler
  returned: its durable outcome, written in the same record, so outcome and id commit together); only then
  does the caller ack the inbox message. A crash before the commit redelivers the message and the handler
  runs again, its earlier, uncommitted run having left no receipt; a crash after it finds the id.
* :meth:`Deduplicator.abandon` drops a claim whose handler failed (the message is redelivered).

Persistence and retirement. Ids are appended to durable store queues called *generations*,
``internal.p2p.dedup.<n>``. A generation holds at most ``retain`` ids; when the current one is full a new one
is started and every generation but the newest two is deleted. So the node always remembers at least the
last ``retain`` processed ids and never more than ``2 * retain`` (plus the ids being processed). An id is
retired once at least ``retain`` newer ids were processed after it. The rule is safe as long as a duplicate
arrives within ``retain`` messages of the original, which holds for bridge redeliveries (a bridge only
re-sends what it had in flight, at most its link credit per peer) when ``retain`` is well above the total
in-flight window of all peers; replays by a restarted sender must also come back within that many messages.

Records. One :meth:`Deduplicator.commit_many` writes its ids as *batch records*: headers :data:`BATCH_HEADER`
(``0xff`` then a format byte; ``0xff`` never occurs in UTF-8, so no id can look like it), payload a msgpack
array of ``[id, receipt]`` pairs, about :data:`BATCH_RECORD_BYTES` of them per record at most (a larger
commit writes several, in one group commit). A record is written whole or not at all (the store's CRC), so
a batch's ids commit together. Measured on the build machine (45-character ids, empty receipts, commits of
50): 16 us of CPU per id with a record each against 4-6 us with one record per commit (the record's
framing, index entry and checksum were per id). Records of the first format, headers the id's UTF-8 and
payload its receipt, are still read.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final

import attrs
import msgpack
import trio

from corda_trio import store

__all__ = ["BATCH_HEADER", "DEFAULT_RETAIN", "GENERATION_PREFIX", "Deduplicator", "MalformedDedupRecordError"]

#: Ids remembered at least (see the module docstring). Each takes about 210 bytes of memory (measured with
#: tracemalloc: a flow message's id scoped by its sender, ~70 characters, in the set, the map and its
#: generation's list), so the ``2 * retain`` ids remembered at most take some 40 MB: a node's memory grows
#: by that much over its first 200,000 messages from peers, then stays.
DEFAULT_RETAIN: Final = 100_000
GENERATION_PREFIX: Final = "internal.p2p.dedup."
_GEN_RE: Final = re.compile(re.escape(GENERATION_PREFIX) + r"(\d+)$")
#: The headers of a batch record (module docstring).
BATCH_HEADER: Final = b"\xff\x01"
#: The payload of one batch record stays about this size (a commit larger than that writes several).
BATCH_RECORD_BYTES: Final = 1 << 20


class MalformedDedupRecordError(store.StoreError):
    """A record of a dedup generation is not in a format this version writes or reads."""


def _batches(items: Sequence[tuple[str, bytes]]) -> list[tuple[bytes, bytes]]:
    """``items`` as (payload, headers) batch records of about :data:`BATCH_RECORD_BYTES` at most each."""
    records: list[tuple[bytes, bytes]] = []
    start, size = 0, 0
    for i, (dedup_id, receipt) in enumerate(items):
        size += len(dedup_id) + len(receipt) + 16
        if size > BATCH_RECORD_BYTES and i > start:
            records.append((msgpack.packb(items[start:i]), BATCH_HEADER))
            start, size = i, len(dedup_id) + len(receipt) + 16
    records.append((msgpack.packb(items[start:]), BATCH_HEADER))
    return records


def _read_record(queue: str, headers: bytes, payload: bytes) -> list[tuple[str, bytes]]:
    """The (id, receipt) pairs of one stored record, either format."""
    if not headers.startswith(b"\xff"):
        return [(headers.decode(), payload)]  # the first format: one id per record
    try:
        if headers != BATCH_HEADER:
            raise ValueError(f"unknown batch format {headers[1:].hex()}")
        pairs = msgpack.unpackb(payload)
        out = [(dedup_id, receipt) for dedup_id, receipt in pairs]
        if not all(type(i) is str and type(r) is bytes for i, r in out):
            raise ValueError("a pair is not [str, bytes]")
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        reason = str(exc) or f"not msgpack ({type(exc).__name__})"
        problem = f"{queue}: a batch record of dedup ids is malformed: {reason}"
        raise MalformedDedupRecordError(problem) from exc
    return out


@attrs.define(eq=False)
class _Generation:
    number: int
    queue: store.Queue
    ids: list[str] = attrs.field(factory=list)
    pending: int = 0
    idle: trio.Event = attrs.field(factory=trio.Event)


@attrs.define(eq=False)
class Deduplicator:
    """See the module docstring. Build it with :meth:`open`."""

    _broker: store.Broker
    _retain: int
    _generations: list[_Generation]
    _processed: dict[str, bytes] = attrs.field(factory=dict)
    _processing: set[str] = attrs.field(factory=set)
    _rotate_lock: trio.Lock = attrs.field(factory=trio.Lock)

    @classmethod
    async def open(cls, broker: store.Broker, *, retain: int = DEFAULT_RETAIN) -> Deduplicator:
        """Load the persisted ids of ``broker`` (creating the first generation if there is none).

        Raises:
            MalformedDedupRecordError: a stored record is in no format this version knows.
        """
        if retain < 1:
            raise ValueError(f"retain must be at least 1, got {retain}")
        numbers = sorted(
            int(m.group(1)) for n in broker.list_queues(GENERATION_PREFIX) if (m := _GEN_RE.match(n))
        )
        for old in numbers[:-2]:  # left over by a crash in the middle of a rotation
            await broker.delete_queue(f"{GENERATION_PREFIX}{old}")
        numbers = numbers[-2:] or [0]
        generations = []
        processed: dict[str, bytes] = {}
        for n in numbers:
            queue = await broker.declare_queue(f"{GENERATION_PREFIX}{n}")
            gen = _Generation(number=n, queue=queue)
            async for record in queue.browse():
                for dedup_id, receipt in _read_record(queue.name, record.headers, record.payload):
                    gen.ids.append(dedup_id)
                    processed[dedup_id] = receipt
            generations.append(gen)
        return cls(broker, retain, generations, processed)

    @property
    def retain(self) -> int:
        return self._retain

    def __len__(self) -> int:
        """Persisted ids currently remembered."""
        return len(self._processed)

    def __contains__(self, dedup_id: object) -> bool:
        return dedup_id in self._processed or dedup_id in self._processing

    def receipt(self, dedup_id: str) -> bytes | None:
        """The receipt committed with ``dedup_id`` (``None`` if not remembered)."""
        return self._processed.get(dedup_id)

    def receipts(self) -> list[tuple[str, bytes]]:
        """Every remembered (id, receipt), oldest first."""
        return [(i, self._processed[i]) for g in self._generations for i in g.ids if i in self._processed]

    def begin(self, dedup_id: str) -> bool:
        """Claim ``dedup_id`` for processing; ``False`` if it is a duplicate (being processed or done)."""
        if dedup_id in self._processing or dedup_id in self._processed:
            return False
        self._processing.add(dedup_id)
        return True

    def abandon(self, dedup_id: str) -> None:
        """Give up a claim (the handler failed; the message will be delivered again)."""
        self._processing.discard(dedup_id)

    async def commit(self, dedup_id: str, receipt: bytes = b"") -> None:
        """Record ``dedup_id`` (and ``receipt``) durably; returns once it is on disk.

        If cancelled, the record may or may not be stored and the claim stays in place, so that the message
        is neither processed twice nor acked by this process.
        """
        await self.commit_many([(dedup_id, receipt)])

    async def commit_many(self, items: Sequence[tuple[str, bytes]]) -> None:
        """Like :meth:`commit` for several ``(id, receipt)`` pairs, in one group commit per generation."""
        for dedup_id, _ in items:
            if dedup_id not in self._processing:
                raise ValueError(f"{dedup_id!r} was not claimed with begin()")
        start = 0
        while start < len(items):
            gen = self._generations[-1]
            while len(gen.ids) >= self._retain:
                gen = await self._rotate(gen)
            chunk = items[start : start + self._retain - len(gen.ids)]
            start += len(chunk)
            ids = [dedup_id for dedup_id, _ in chunk]
            gen.ids.extend(ids)  # reserve the slots now so that concurrent commits rotate in time
            gen.pending += 1
            try:
                await gen.queue.enqueue_many(_batches(chunk))
            except BaseException:
                for dedup_id in ids:
                    gen.ids.remove(dedup_id)
                raise
            finally:
                gen.pending -= 1
                if gen.pending == 0:
                    gen.idle.set()
                    gen.idle = trio.Event()
            for dedup_id, receipt in chunk:
                self._processed[dedup_id] = receipt
                self._processing.discard(dedup_id)

    async def _rotate(self, full: _Generation) -> _Generation:
        async with self._rotate_lock:
            current = self._generations[-1]
            if current is not full:  # someone else rotated meanwhile
                return current
            queue = await self._broker.declare_queue(f"{GENERATION_PREFIX}{full.number + 1}")
            new = _Generation(number=full.number + 1, queue=queue)
            self._generations.append(new)
            while len(self._generations) > 2:
                old = self._generations[0]
                while old.pending:
                    await old.idle.wait()
                await self._broker.delete_queue(old.queue.name)
                self._generations.pop(0)
                for i in old.ids:
                    self._processed.pop(i, None)
            return new
