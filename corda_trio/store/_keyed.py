"""A durable keyed log (checkpoints): the latest value per key, written through the queues' group commit.

Theory of operation
-------------------
*Records.* A keyed log is a :class:`~._wal.DurableLog` of its own (directory ``keyed/<name>/`` in the
broker directory), so it shares the group commit, the commit helper process, recovery and compaction
with the queues: thousands of concurrent ``put`` calls share one ``fdatasync``. Each call of
:meth:`KeyedLog.write` (``put`` and ``delete`` are one-item writes) is **one** enqueue record whose
payload lists its puts and deletes. A record's checksum covers all of it, so a write is atomic: after a
crash it is there whole or not at all.

*Latest wins.* Replaying the unacked records in id order (which is write order) and applying each one's
puts and deletes gives the live entries. That stays true as records are retired, under two rules:

1. A record is *needed* while it holds the latest operation on some key, and that operation is a put,
   or a delete while some unacked (older) record still puts that key: dropping the delete would bring
   that put back. (An overwritten put needs no such care: the newer put is replayed after it.)
2. A record that is no longer needed is acked (an ack record, appended to the next batch); records are
   acked in the order they become unneeded, so the record holding an old put is always acked before (or
   in the same batch as) the delete that shadows it. A crash can only lose a suffix of those acks, and a
   replay of a record whose ack was lost gives the same entries.

Acked records are then reclaimed by the ordinary segment compaction. Recovery replays the unacked
records (reading their payloads once, at open) and acks whatever turns out to be unneeded.

*Durability.* ``put``/``delete``/``write`` return once their record is durable; the entries they change
are applied when it is (in id order, from the log's ``on_ready`` callback; a keyed log never delivers
early), so ``get`` and ``items`` only ever show durable state. A cancelled call may or may not have been
stored (as with ``Queue.enqueue``); if it was, it is applied like any other.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Final, final

import attrs
import trio

from ._compaction import Compactor
from ._errors import StoreClosedError
from ._wal import READ_BATCH_RECORDS, DurableLog, now_ms

__all__ = ["KeyedLog", "KeyedLogStatistics", "decode_ops", "encode_ops"]

_COUNTS: Final = struct.Struct("<II")
_PUT: Final = struct.Struct("<II")
_LEN: Final = struct.Struct("<I")

Puts = Sequence[tuple[bytes, bytes]]


def encode_ops(puts: Puts, deletes: Sequence[bytes]) -> bytes:
    """The payload of one keyed-log record: ``<u32 puts><u32 deletes>``, then each put as
    ``<u32 key length><u32 value length> key value``, then each delete as ``<u32 key length> key``."""
    parts = [_COUNTS.pack(len(puts), len(deletes))]
    for key, value in puts:
        parts += (_PUT.pack(len(key), len(value)), key, value)
    for key in deletes:
        parts += (_LEN.pack(len(key)), key)
    return b"".join(parts)


def decode_ops(data: bytes) -> tuple[list[tuple[bytes, bytes]], list[bytes]]:
    """Inverse of :func:`encode_ops`.

    Raises:
        ValueError: the payload is not a well-formed list of operations.
    """
    view = memoryview(data)
    n_puts, n_deletes = _COUNTS.unpack_from(view, 0)
    pos = _COUNTS.size
    puts = []
    for _ in range(n_puts):
        klen, vlen = _PUT.unpack_from(view, pos)
        pos += _PUT.size
        puts.append((bytes(view[pos : pos + klen]), bytes(view[pos + klen : pos + klen + vlen])))
        pos += klen + vlen
    deletes = []
    for _ in range(n_deletes):
        (klen,) = _LEN.unpack_from(view, pos)
        pos += _LEN.size
        deletes.append(bytes(view[pos : pos + klen]))
        pos += klen
    if pos != len(data):
        raise ValueError(f"keyed-log record: {len(data) - pos} bytes after its operations")
    return puts, deletes


@attrs.frozen(kw_only=True)
class KeyedLogStatistics:
    """A snapshot of one keyed log."""

    name: str
    keys: int
    #: records still needed (not acked)
    records: int
    group_commits: int
    fsyncs: int
    records_per_fsync: float
    segments: int
    disk_bytes: int
    compactions: int


def _check_bytes(value: object, what: str) -> bytes:
    if type(value) is not bytes:
        raise TypeError(f"{what} must be bytes, not {type(value).__name__}")
    return value


@final
@attrs.define(eq=False, repr=False)
class KeyedLog:
    """A durable map from ``bytes`` keys to ``bytes`` values. Get one from ``Broker.open_keyed_log``."""

    name: str
    _log: DurableLog | None = None
    _compactor: Compactor | None = None
    #: key -> (value, id of the record that holds its latest put)
    _entries: dict[bytes, tuple[bytes, int]] = attrs.field(factory=dict)
    #: record id -> number of keys whose latest operation is a put in it
    _holds: dict[int, int] = attrs.field(factory=dict)
    #: key -> the record of its latest operation (a put, or a delete that must stay: rule 1)
    _last_op: dict[bytes, int] = attrs.field(factory=dict)
    #: record id -> keys whose latest operation is a delete in it, with a put still on disk
    _last_deletes: dict[int, set[bytes]] = attrs.field(factory=dict)
    #: key -> number of unacked records that put it
    _live_puts: dict[bytes, int] = attrs.field(factory=dict)
    #: record id -> the keys it puts (while it is unacked)
    _put_keys: dict[int, list[bytes]] = attrs.field(factory=dict)
    #: operations of records written and not yet durable
    _pending: dict[int, tuple[list[tuple[bytes, bytes]], list[bytes]]] = attrs.field(factory=dict)
    _closed: bool = False

    def __repr__(self) -> str:
        return f"<KeyedLog {self.name} keys={len(self._entries)}>"

    # ------------------------------------------------------------------ reading

    def get(self, key: bytes) -> bytes | None:
        """The latest durable value of ``key``, or ``None``."""
        entry = self._entries.get(key)
        return None if entry is None else entry[0]

    def items(self) -> list[tuple[bytes, bytes]]:
        """Every live entry (recovered at open, and written since), in no particular order."""
        return [(key, value) for key, (value, _mid) in self._entries.items()]

    def __len__(self) -> int:
        return len(self._entries)

    def statistics(self) -> KeyedLogStatistics:
        log = self._log
        assert log is not None
        return KeyedLogStatistics(
            name=self.name, keys=len(self._entries), records=len(log.live), group_commits=log.batches,
            fsyncs=log.fsyncs, records_per_fsync=log.records_written / log.fsyncs if log.fsyncs else 0.0,
            segments=len(log.segments), disk_bytes=sum(s.size for s in log.segments.values()),
            compactions=log.compactions,
        )  # fmt: skip

    # ------------------------------------------------------------------ writing

    @trio.lowlevel.enable_ki_protection  # store internals: a Ctrl-C lands at a checkpoint, never half-way
    async def put(self, key: bytes, value: bytes) -> None:
        """Store ``value`` under ``key``; returns once it is durable.

        Raises:
            StoreFailedError: the write or fsync failed (the log stopped).
            StoreClosedError: the log or broker is closed.
        """
        await self.write([(key, value)], [])

    @trio.lowlevel.enable_ki_protection  # store internals: a Ctrl-C lands at a checkpoint, never half-way
    async def delete(self, key: bytes) -> None:
        """Remove ``key`` (durably; a key that is not there is fine)."""
        await self.write([], [key])

    @trio.lowlevel.enable_ki_protection  # a Ctrl-C lands at the checkpoint, never half-way
    async def write(self, puts: Sequence[tuple[bytes, bytes]], deletes: Sequence[bytes]) -> None:
        """Apply ``puts`` and ``deletes`` in one atomic commit (one record): after a crash all of them are
        there or none. Returns once it is durable.

        Raises:
            ValueError: a key is both put and deleted, or put twice.
            TypeError: a key or value is not ``bytes``.
            StoreFailedError: the write or fsync failed (the log stopped).
            StoreClosedError: the log or broker is closed.
        """
        if self._closed or self._log is None:
            raise StoreClosedError(f"keyed log {self.name} is closed")
        put_list = [(_check_bytes(k, "key"), _check_bytes(v, "value")) for k, v in puts]
        delete_list = [_check_bytes(k, "key") for k in deletes]
        keys = [k for k, _v in put_list] + delete_list
        if len(set(keys)) != len(keys):
            raise ValueError("a key may appear only once in one write (put or delete)")
        await trio.lowlevel.checkpoint_if_cancelled()
        if not keys:
            return
        log = self._log
        mid, batch = log.add_enqueue(encode_ops(put_list, delete_list), b"", now_ms())
        self._pending[mid] = (put_list, delete_list)
        try:
            await batch.wait()
        finally:
            if batch.error is not None:
                self._pending.pop(mid, None)

    @trio.lowlevel.enable_ki_protection  # store internals: a Ctrl-C lands at a checkpoint, never half-way
    async def compact(self) -> int:
        """Compact the log now (the current segment included); returns the bytes reclaimed.

        Raises:
            StoreClosedError: the log was closed.
            StoreFailedError: the log failed, or a segment could not be rewritten (it is left intact).
        """
        if self._closed or self._compactor is None:
            raise StoreClosedError(f"keyed log {self.name} is closed")
        return await self._compactor.compact(seal_tail=True)

    # ------------------------------------------------------------------ bookkeeping

    def _on_durable(self, ids: list[int]) -> None:
        for mid in ids:
            ops = self._pending.pop(mid, None)
            if ops is not None:
                self._apply(mid, *ops)

    def _needed(self, mid: int) -> bool:
        if self._holds.get(mid, 0) > 0:
            return True
        return any(self._live_puts.get(key, 0) > 0 for key in self._last_deletes.get(mid, ()))

    def _apply(self, mid: int, puts: list[tuple[bytes, bytes]], deletes: list[bytes]) -> None:
        """Apply the durable record ``mid`` and ack every record that is no longer needed (rule 2)."""
        entries, holds, last_op, live_puts = self._entries, self._holds, self._last_op, self._live_puts
        unneeded: list[int] = []
        holds[mid] = len(puts)
        for key, value in puts:
            self._supersede(key, unneeded)
            entries[key] = (value, mid)
            last_op[key] = mid
            live_puts[key] = live_puts.get(key, 0) + 1
        self._put_keys[mid] = [key for key, _value in puts]
        for key in deletes:
            self._supersede(key, unneeded)
            entries.pop(key, None)
            if live_puts.get(key, 0) > 0:  # an older put of it is still on disk: this delete must stay
                last_op[key] = mid
                self._last_deletes.setdefault(mid, set()).add(key)
            else:
                last_op.pop(key, None)
        if not self._needed(mid):
            unneeded.append(mid)
        self._retire(unneeded)

    def _supersede(self, key: bytes, unneeded: list[int]) -> None:
        """``key`` gets a newer operation: its previous latest one (a put or a delete) no longer counts."""
        previous = self._last_op.pop(key, None)
        if previous is None:
            return
        deleted = self._last_deletes.get(previous)
        if deleted is not None and key in deleted:
            deleted.discard(key)
        else:
            self._holds[previous] -= 1
        if not self._needed(previous):
            unneeded.append(previous)

    def _retire(self, unneeded: list[int]) -> None:
        """Ack the records of ``unneeded`` in order, and those that this makes unneeded, after them."""
        log = self._log
        assert log is not None
        if log.closing or log.failure is not None:
            return  # the acks only save space: the next open works them out again
        live_puts, last_op = self._live_puts, self._last_op
        while unneeded:
            mid = unneeded.pop(0)
            if mid not in log.live or self._needed(mid):
                continue
            self._holds.pop(mid, None)
            self._last_deletes.pop(mid, None)
            log.add_ack(mid)
            for key in self._put_keys.pop(mid, ()):
                left = live_puts[key] - 1
                if left:
                    live_puts[key] = left
                    continue
                del live_puts[key]
                # No put of it is left on disk: a delete that kept it out is not needed for it any more.
                latest = last_op.get(key)
                if latest is not None and key in self._last_deletes.get(latest, ()):
                    self._last_deletes[latest].discard(key)
                    del last_op[key]
                    unneeded.append(latest)

    async def _recover(self) -> None:
        """Replay the unacked records (at open), then ack whatever is no longer needed."""
        log = self._log
        assert log is not None
        ids = list(log.live)
        for start in range(0, len(ids), READ_BATCH_RECORDS):
            for message in await log.read(ids[start : start + READ_BATCH_RECORDS]):
                puts, deletes = decode_ops(message.payload)
                self._apply(message.message_id, puts, deletes)

    def _close(self) -> None:
        self._closed = True
        if self._log is not None:
            self._log.close()
