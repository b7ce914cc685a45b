"""Disk errors, cancellation, and the "async means checkpoint" contract."""

from __future__ import annotations

import errno
import threading
from pathlib import Path

import pytest
import trio
import trio.testing

from corda_trio import store
from corda_trio.store import _wal

#: Writes and syncs on worker threads: these tests replace ``_wal.write_all`` / ``_wal.sync_file``, which
#: only that mode calls (the commit helper process has tests of its own in test_commit_helper.py).
THREADS = store.BrokerConfig(commit_process=False)


async def test_a_failed_write_stops_the_queue_and_recovery_keeps_the_durable_prefix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_write_all = _wal.write_all
    calls = {"n": 0}

    def failing_write_all(fd: int, data: bytes, sync: bool) -> None:
        calls["n"] += 1
        if calls["n"] > 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_write_all(fd, data, sync)

    monkeypatch.setattr(_wal, "write_all", failing_write_all)
    async with store.open_broker(tmp_path, config=THREADS) as broker:
        queue = await broker.declare_queue("q")
        durable = [await queue.enqueue(b"ok-%d" % i) for i in range(3)]
        with pytest.raises(store.StoreFailedError, match="No space left"):
            await queue.enqueue(b"lost")
        with pytest.raises(store.StoreFailedError):
            await queue.enqueue(b"refused")
        with trio.fail_after(5):  # the broker reports it to its owner (the node stops on it)
            failure = await broker.wait_failed()
        assert "queue q: write-ahead log write failed" in str(failure) and "No space left" in str(failure)
        other = await broker.declare_queue("other")  # other queues are not affected
        monkeypatch.setattr(_wal, "write_all", real_write_all)
        await other.enqueue(b"fine")
    async with store.open_broker(tmp_path) as broker:
        assert [m.message_id async for m in broker.get_queue("q").browse()] == durable
        assert [m.payload async for m in broker.get_queue("other").browse()] == [b"fine"]


async def test_a_failed_sync_fails_every_unpublished_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing_sync(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    async with store.open_broker(tmp_path, config=THREADS) as broker:
        queue = await broker.declare_queue("q")
        kept = await queue.enqueue(b"before")
        monkeypatch.setattr(_wal, "sync_file", failing_sync)
        results: list[BaseException | int] = []

        async def produce(i: int) -> None:
            try:
                results.append(await queue.enqueue(b"x%d" % i))
            except store.StoreFailedError as exc:
                results.append(exc)

        async with trio.open_nursery() as nursery:
            for i in range(20):
                nursery.start_soon(produce, i)
        assert len(results) == 20 and all(isinstance(r, store.StoreFailedError) for r in results)
        assert queue.statistics().depth == 1
    async with store.open_broker(tmp_path) as broker:
        # The failed batches were written (only the sync failed): a restart may find them, never lose `kept`.
        ids = [m.message_id async for m in broker.get_queue("q").browse()]
        assert ids[0] == kept


async def test_cancelled_enqueue_leaves_the_queue_usable(tmp_path: Path) -> None:
    async with store.open_broker(tmp_path) as broker:
        queue = await broker.declare_queue("q")
        with trio.CancelScope() as scope:
            scope.cancel()
            await queue.enqueue(b"never")  # cancelled before it started: nothing is stored
        assert queue.statistics().enqueued == 0

        async def enqueue_then_get_cancelled(task_status: trio.TaskStatus[trio.CancelScope]) -> None:
            with trio.CancelScope() as inner:
                task_status.started(inner)
                await queue.enqueue(b"maybe")

        async with trio.open_nursery() as nursery:
            inner = await nursery.start(enqueue_then_get_cancelled)
            inner.cancel()  # while it waits for the group commit
        mid = await queue.enqueue(b"sure")
        stored = [m.payload async for m in queue.browse()]
        assert stored in ([b"sure"], [b"maybe", b"sure"])
        async with queue.consumer() as consumer:
            got = [await consumer.receive() for _ in stored]
            assert got[-1].message_id == mid


async def test_a_cancelled_waiter_does_not_hold_up_the_rest_of_its_batch(tmp_path: Path) -> None:
    async with store.open_broker(tmp_path) as broker:
        queue = await broker.declare_queue("q")
        ids: dict[int, int] = {}

        async def enqueue(i: int, task_status: trio.TaskStatus[trio.CancelScope]) -> None:
            with trio.CancelScope() as scope:
                task_status.started(scope)
                ids[i] = await queue.enqueue(b"%d" % i)

        async with trio.open_nursery() as nursery:
            scopes = [await nursery.start(enqueue, i) for i in range(8)]
            scopes[3].cancel()  # parked in the same batch as the others
            scopes[6].cancel()
            with trio.CancelScope() as scope:
                scope.cancel()
                await queue.enqueue(b"never")  # cancelled on entry, amid the others: stores nothing
        assert {0, 1, 2, 4, 5, 7} <= set(ids)  # 3 and 6 only if their batch was durable before the cancel
        stored = {m.message_id: m.payload async for m in queue.browse()}
        assert all(stored[mid] == b"%d" % i for i, mid in ids.items())
        assert set(stored.values()) - {b"%d" % i for i in ids} <= {b"3", b"6"}  # may or may not be stored
        assert queue.statistics().enqueued == len(stored)
        assert await queue.enqueue(b"next") == max(stored) + 1  # ids stay dense


async def test_public_async_methods_checkpoint(tmp_path: Path) -> None:
    async with store.open_broker(tmp_path) as broker:
        durable = await broker.declare_queue("q")
        memory = await broker.declare_queue("m", durable=False)
        for queue in (durable, memory):
            with trio.testing.assert_checkpoints():
                await queue.enqueue(b"a")
            with trio.testing.assert_checkpoints():
                await queue.enqueue_many([b"b", b"c"])
            async with queue.consumer() as consumer:
                with trio.testing.assert_checkpoints():
                    d = await consumer.receive()
                with trio.testing.assert_checkpoints():
                    await consumer.ack(d.message_id)
            with trio.testing.assert_checkpoints():
                await queue.compact()
        with trio.testing.assert_checkpoints():
            await broker.declare_queue("q")


async def test_non_durable_queue_behaves_like_a_queue(tmp_path: Path) -> None:
    async with store.open_broker(tmp_path) as broker:
        control = await broker.declare_queue("internal.bridge.control", durable=False)
        ids = await control.enqueue_many([b"a", (b"b", b"h")])
        async with control.consumer(credit=5) as consumer:
            first = await consumer.receive()
            consumer.release(first.message_id)
            again = await consumer.receive()
            assert (again.message_id, again.delivery_count) == (ids[0], 2)
            await consumer.ack(again.message_id)
            second = await consumer.receive()
            assert (second.payload, second.headers) == (b"b", b"h")
        stats = control.statistics()
        assert not stats.durable and stats.depth == 1 and stats.fsync == "n/a"
        await broker.delete_queue("internal.bridge.control")
        with pytest.raises(store.QueueNotFoundError):
            broker.get_queue("internal.bridge.control")


class _GatedWrites:
    """``write_all`` stand-in: records every write and holds the first one until ``gate`` is set
    (it runs on the worker threads of the commit jobs)."""

    def __init__(self, real: object, fail_first: bool) -> None:
        self.real = real
        self.fail_first = fail_first
        self.gate = threading.Event()
        self.writes: list[bytes] = []
        self.early = 0  # writes other than the first that began while the first was held
        self.lock = threading.Lock()
        self.entered = trio.Event()  # set (on the Trio thread) once the first write is held
        self.token = trio.lowlevel.current_trio_token()

    def __call__(self, fd: int, data: bytes, sync: bool) -> None:
        with self.lock:
            first = not self.writes
            self.writes.append(bytes(data))
            if not first and not self.gate.is_set():
                self.early += 1
        if first:
            self.token.run_sync_soon(self.entered.set)
            assert self.gate.wait(10)
            if self.fail_first:
                raise OSError(errno.EIO, "Input/output error")
        self.real(fd, data, sync)  # type: ignore[operator]


#: Two group commits of one queue in flight at once, on worker threads.
PIPELINED = store.BrokerConfig(commit_process=False, flush_pipeline_depth=2)


async def _two_jobs_in_flight(
    queue: store.Queue, gated: _GatedWrites, nursery: trio.Nursery
) -> dict[bytes, int | BaseException]:
    results: dict[bytes, int | BaseException] = {}

    async def produce(payload: bytes) -> None:
        try:
            results[payload] = await queue.enqueue(payload)
        except store.StoreFailedError as exc:
            results[payload] = exc

    log = queue._log
    assert log is not None
    with trio.fail_after(10):
        nursery.start_soon(produce, b"first")
        await gated.entered.wait()
        nursery.start_soon(produce, b"second")
        await trio.testing.wait_all_tasks_blocked()
        assert log._jobs == 2  # the second batch's job started while the first one's write is held
    gated.gate.set()
    return results  # filled in when the caller's nursery has finished


async def test_overlapping_commit_jobs_write_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gated = _GatedWrites(_wal.write_all, fail_first=False)
    monkeypatch.setattr(_wal, "write_all", gated)
    async with store.open_broker(tmp_path, config=PIPELINED) as broker:
        queue = await broker.declare_queue("q")
        async with trio.open_nursery() as nursery:
            results = await _two_jobs_in_flight(queue, gated, nursery)
        # ids in write order (the two appenders may wake in either order)
        assert [results[b"first"], results[b"second"]] == [0, 1]
        # the second job waited for the held write: no write began before the gate opened (counted when
        # it happens, on the worker thread, instead of sampled after a real-time sleep)
        assert gated.early == 0 and len(gated.writes) == 2
        assert queue.statistics().group_commits == 2
    assert [w[40:] for w in gated.writes] == [b"first", b"second"]
    async with store.open_broker(tmp_path) as broker:
        assert [m.payload async for m in broker.get_queue("q").browse()] == [b"first", b"second"]


async def test_a_job_after_a_failed_write_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gated = _GatedWrites(_wal.write_all, fail_first=True)
    monkeypatch.setattr(_wal, "write_all", gated)
    async with store.open_broker(tmp_path, config=PIPELINED) as broker:
        queue = await broker.declare_queue("q")
        async with trio.open_nursery() as nursery:
            results = await _two_jobs_in_flight(queue, gated, nursery)
        assert len(results) == 2 and all(isinstance(r, store.StoreFailedError) for r in results.values())
        assert len(gated.writes) == 1  # the second job saw the failure and wrote nothing
    async with store.open_broker(tmp_path) as broker:
        assert [m async for m in broker.get_queue("q").browse()] == []


async def test_a_segment_that_cannot_be_created_for_a_full_disk_is_named_in_the_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node restarted on a full disk (recovery starts a new segment after a torn tail) stopped with
    'No space left on device' and no file: the error of the header's write or sync names the segment."""
    from corda_trio.node._cli import error_text
    from corda_trio.store import _segment

    def full(fd: int, data: object, sync: bool) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(_segment, "write_all", full)
    with pytest.raises(store.StoreFailedError) as info:  # (a queue that cannot be created fails the store)
        async with store.open_broker(tmp_path, config=THREADS) as broker:
            await broker.declare_queue("q")
    segment = tmp_path / "q" / "00000000000000000001.seg"
    assert error_text(info.value) == f"queue q: cannot create it: No space left on device: {segment}"
