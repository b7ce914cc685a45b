"""The broker API: queues, consumers with credit, ack / release, browse, statistics, restart."""

from __future__ import annotations

import math
import os
import random
import tempfile
import threading
from pathlib import Path

import pytest
import trio
import trio.lowlevel
import trio.testing
from hypothesis import example, given, settings
from hypothesis import strategies as st

from corda_trio import store


async def test_enqueue_receive_ack_fifo(tmp_path: Path) -> None:
    async with store.open_broker(tmp_path) as broker:
        queue = await broker.declare_queue("p2p.inbound.DLBz7aAbc")
        ids = [await queue.enqueue(f"m{i}".encode(), headers=f"h{i}".encode()) for i in range(10)]
        assert ids == sorted(ids) and len(set(ids)) == 10
        async with queue.consumer(credit=100) as consumer:
            got = [await consumer.receive() for _ in range(10)]
            assert [d.message_id for d in got] == ids
            assert [d.payload for d in got] == [f"m{i}".encode() for i in range(10)]
            assert [d.headers for d in got] == [f"h{i}".encode() for i in range(10)]
            assert all(d.delivery_count == 1 and d.queue == "p2p.inbound.DLBz7aAbc" for d in got)
            for d in got:
                await consumer.ack(d.message_id)
        stats = queue.statistics()
        assert (stats.depth, stats.ready, stats.in_flight, stats.acked, stats.enqueued) == (0, 0, 0, 10, 10)


async def test_release_redelivers_first_with_delivery_count(tmp_path: Path) -> None:
    async with store.open_broker(tmp_path) as broker:
        queue = await broker.declare_queue("q")
        a, b, c = [await queue.enqueue(x) for x in (b"a", b"b", b"c")]
        async with queue.consumer(credit=10) as consumer:
            da = await consumer.receive()
            db = await consumer.receive()
            consumer.release(da.message_id)
            again = await consumer.receive()
            assert (again.message_id, again.delivery_count, again.payload) == (a, 2, b"a")
            consumer.release(again.message_id)
            consumer.release(db.message_id)
            order = [await consumer.receive() for _ in range(3)]
            assert [(d.message_id, d.delivery_count) for d in order] == [(a, 3), (b, 2), (c, 1)]
            with pytest.raises(store.UnknownDeliveryError):
                consumer.release(12345)
            await consumer.ack(a)
            with pytest.raises(store.UnknownDeliveryError):
                await consumer.ack(a)
        assert queue.statistics().released == 5  # 3 explicit + 2 still held when the consumer closed


async def test_closing_a_consumer_releases_what_it_holds(tmp_path: Path) -> None:
    async with store.open_broker(tmp_path) as broker:
        queue = await broker.declare_queue("q")
        mid = await queue.enqueue(b"x")
        async with queue.consumer() as first:
            assert (await first.receive()).message_id == mid
            assert queue.statistics().in_flight == 1
        async with queue.consumer() as second:
            d = await second.receive()
            assert (d.message_id, d.delivery_count) == (mid, 2)


async def test_window_credit_bounds_unacked_deliveries(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with store.open_broker(tmp_path) as broker:
        queue = await broker.declare_queue("q")
        await queue.enqueue_many([b"%d" % i for i in range(5)])
        async with queue.consumer(credit=2) as consumer:
            d1 = await consumer.receive()
            await consumer.receive()
            assert consumer.credit == 0
            with trio.move_on_after(5) as scope:
                await consumer.receive()
            assert scope.cancelled_caught  # no credit: blocks
            await consumer.ack(d1.message_id)
            assert consumer.credit == 1
            assert (await consumer.receive()).payload == b"2"


@pytest.mark.parametrize("durable", [True, False])
async def test_receive_nowait_takes_what_is_at_hand_in_order(tmp_path: Path, durable: bool) -> None:
    """``receive_nowait`` hands out what ``receive`` would, in the same order and with the same bookkeeping
    (credit, redelivery first, delivery counts), without waiting: no credit or nothing ready is WouldBlock."""
    async with store.open_broker(tmp_path) as broker:
        queue = await broker.declare_queue("q", durable=durable)
        ids = await queue.enqueue_many([b"%d" % i for i in range(5)])
        async with queue.consumer(credit=3) as consumer:
            got = [consumer.receive_nowait() for _ in range(3)]
            assert [(d.message_id, d.payload, d.delivery_count) for d in got] == [
                (ids[i], b"%d" % i, 1) for i in range(3)
            ]
            assert consumer.credit == 0 and consumer.held == tuple(ids[:3])
            with pytest.raises(trio.WouldBlock):
                consumer.receive_nowait()
            await consumer.ack(ids[1])
            consumer.release(ids[0])  # redelivered before the rest
            assert [(d.message_id, d.delivery_count) for d in (consumer.receive_nowait(),)] == [(ids[0], 2)]
            assert consumer.receive_nowait().message_id == ids[3]
            with pytest.raises(trio.WouldBlock):
                consumer.receive_nowait()  # no credit again
            await consumer.ack_many([ids[0], ids[2], ids[3]])
            assert consumer.receive_nowait().message_id == ids[4]
            with pytest.raises(trio.WouldBlock):
                consumer.receive_nowait()  # credit, but nothing ready
        stats = queue.statistics()
        assert (stats.in_flight, stats.ready, stats.acked) == (0, 1, 4)  # the last one went back on close
        async with queue.consumer(credit=1) as consumer:
            pass
        with pytest.raises(store.StoreClosedError):
            consumer.receive_nowait()


async def test_receive_nowait_never_reads_the_disk(tmp_path: Path) -> None:
    """A message whose record is not in memory (after a restart) is WouldBlock for ``receive_nowait``:
    ``receive`` reads it (and the next ones along), then those are at hand."""
    async with store.open_broker(tmp_path) as broker:
        queue = await broker.declare_queue("q")
        ids = await queue.enqueue_many([b"a", b"b", b"c"])
    async with store.open_broker(tmp_path) as broker:
        queue = await broker.declare_queue("q")
        async with queue.consumer(credit=10) as consumer:
            with pytest.raises(trio.WouldBlock):
                consumer.receive_nowait()
            assert consumer.held == () and consumer.credit == 10
            first = await consumer.receive()
            rest = [consumer.receive_nowait() for _ in range(2)]  # read ahead with the first
            assert [d.message_id for d in (first, *rest)] == ids
            assert [d.payload for d in (first, *rest)] == [b"a", b"b", b"c"]


async def test_explicit_credit_mode(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    async with store.open_broker(tmp_path) as broker:
        queue = await broker.declare_queue("q")
        await queue.enqueue_many([b"a", b"b", b"c"])
        async with queue.consumer(credit=1, window=False) as consumer:
            d = await consumer.receive()
            await consumer.ack(d.message_id)
            assert consumer.credit == 0  # an ack does not give credit back in explicit mode
            with trio.move_on_after(5) as scope:
                await consumer.receive()
            assert scope.cancelled_caught
            consumer.add_credit(2)
            assert [(await consumer.receive()).payload for _ in range(2)] == [b"b", b"c"]


async def test_receive_waits_for_durable_enqueue(tmp_path: Path) -> None:
    async with store.open_broker(tmp_path) as broker, trio.open_nursery() as nursery:
        queue = await broker.declare_queue("q")
        got: list[bytes] = []

        async def consume() -> None:
            async with queue.consumer() as consumer:
                got.append((await consumer.receive()).payload)

        nursery.start_soon(consume)
        await trio.testing.wait_all_tasks_blocked()
        await queue.enqueue(b"late")
    assert got == [b"late"]


async def test_cancelled_receive_keeps_message_first(tmp_path: Path) -> None:
    async with store.open_broker(tmp_path) as broker:
        queue = await broker.declare_queue("q")
        first = await queue.enqueue(b"1")
        await queue.enqueue(b"2")
        async with queue.consumer() as consumer:
            with trio.CancelScope() as scope:
                scope.cancel()
                await consumer.receive()
            assert (await consumer.receive()).message_id == first


async def test_queue_ack_by_id_and_browse(tmp_path: Path) -> None:
    async with store.open_broker(tmp_path) as broker:
        queue = await broker.declare_queue("q")
        ids = await queue.enqueue_many([b"a", (b"b", b"hb"), bytearray(b"c")])
        async with queue.consumer() as consumer:
            d = await consumer.receive()
            browsed = [m async for m in queue.browse()]
            assert [(m.message_id, m.payload, m.headers, m.delivery_count) for m in browsed] == [
                (ids[0], b"a", b"", 1),
                (ids[1], b"b", b"hb", 0),
                (ids[2], b"c", b"", 0),
            ]
            await queue.ack(d.message_id)
            with pytest.raises(store.UnknownDeliveryError):
                await queue.ack(d.message_id)
        assert [m.message_id async for m in queue.browse(limit=1)] == [ids[1]]


async def test_bad_payload_types_are_rejected(tmp_path: Path) -> None:
    async with store.open_broker(tmp_path) as broker:
        queue = await broker.declare_queue("q")
        with pytest.raises(TypeError, match="payload must be bytes"):
            await queue.enqueue("text")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="headers must be bytes"):
            await queue.enqueue(b"x", headers=3)  # type: ignore[arg-type]
        assert queue.statistics().depth == 0


@pytest.mark.parametrize(
    ("name", "match"),
    [
        ("", "empty"),
        ("a/b", "path separator"),
        ("a\\b", "path separator"),
        ("..", "'..'"),
        ("a..b", "'..'"),
        (".hidden", "must start with"),
        ("x" * 201, "maximum is 200"),
        ("p2p inbound", "must start with"),
        ("caf\u00e9", "must start with"),
        ("broker.lock", "reserved"),
        ("a\0b", "NUL"),
    ],
)
async def test_invalid_queue_names(tmp_path: Path, name: str, match: str) -> None:
    async with store.open_broker(tmp_path) as broker:
        with pytest.raises(store.InvalidQueueNameError, match=match):
            await broker.declare_queue(name)
    assert sorted(os.listdir(tmp_path)) == ["broker.lock", store.PARTS_FILE]  # no queue directory


async def test_registry_prefix_listing_durability_and_restart(tmp_path: Path) -> None:
    async with store.open_broker(tmp_path) as broker:
        a = await broker.declare_queue("p2p.inbound.DLaaa")
        await broker.declare_queue("internal.peers.DLbbb")
        await broker.declare_queue("internal.peers.DLccc")
        control = await broker.declare_queue("internal.bridge.control", durable=False)
        assert await broker.declare_queue("p2p.inbound.DLaaa") is a
        with pytest.raises(store.QueueExistsError):
            await broker.declare_queue("internal.bridge.control")
        await a.enqueue(b"kept")
        await control.enqueue(b"gone")
        assert broker.list_queues("internal.peers.") == ["internal.peers.DLbbb", "internal.peers.DLccc"]
        assert [s.name for s in broker.statistics("internal.")] == [
            "internal.bridge.control", "internal.peers.DLbbb", "internal.peers.DLccc",
        ]  # fmt: skip
        with pytest.raises(store.QueueNotFoundError):
            broker.get_queue("nope")
    async with store.open_broker(tmp_path) as broker:
        assert broker.list_queues() == ["internal.peers.DLbbb", "internal.peers.DLccc", "p2p.inbound.DLaaa"]
        assert [m.payload async for m in broker.get_queue("p2p.inbound.DLaaa").browse()] == [b"kept"]
        await broker.delete_queue("internal.peers.DLbbb")
        assert "internal.peers.DLbbb" not in os.listdir(tmp_path)
    async with store.open_broker(tmp_path) as broker:
        assert broker.list_queues() == ["internal.peers.DLccc", "p2p.inbound.DLaaa"]


async def test_ids_keep_increasing_after_everything_is_compacted_away(tmp_path: Path) -> None:
    async with store.open_broker(tmp_path) as broker:
        queue = await broker.declare_queue("q")
        ids = await queue.enqueue_many([b"x"] * 5)
        async with queue.consumer() as consumer:
            await consumer.ack_many([(await consumer.receive()).message_id for _ in range(5)])
        assert await queue.compact() > 0
    async with store.open_broker(tmp_path) as broker:
        queue = broker.get_queue("q")
        assert queue.statistics().depth == 0
        assert await queue.enqueue(b"y") > ids[-1]


async def test_second_process_cannot_open_the_directory(tmp_path: Path) -> None:
    async with store.open_broker(tmp_path):
        with pytest.raises(store.BrokerLockedError, match="in use"):
            async with store.open_broker(tmp_path, config=store.BrokerConfig(lock_wait_seconds=0.2)):
                pass


async def test_statistics_oldest_age_and_fsync_none_warning(tmp_path: Path) -> None:
    async with store.open_broker(tmp_path) as broker:
        queue = await broker.declare_queue("bench", fsync="none")
        assert queue.statistics().oldest_age_seconds is None
        await queue.enqueue(b"x" * 100)
        stats = queue.statistics()
        assert stats.fsync == "none" and stats.warning and "NOT durable" in stats.warning
        assert stats.oldest_age_seconds is not None and 0 <= stats.oldest_age_seconds < 60
        assert stats.bytes == 100 + 40 and stats.fsyncs == 0 and stats.group_commits == 1
        durable = await broker.declare_queue("durable")
        await durable.enqueue(b"y")
        assert durable.statistics().warning is None and durable.statistics().fsyncs == 1


async def test_closed_broker_rejects_work(tmp_path: Path) -> None:
    async with store.open_broker(tmp_path) as broker:
        queue = await broker.declare_queue("q")
        consumer = queue.consumer()
    with pytest.raises(store.StoreClosedError):
        await queue.enqueue(b"x")
    with pytest.raises(store.StoreClosedError):
        await consumer.receive()
    with pytest.raises(store.StoreClosedError):
        await broker.declare_queue("other")


async def test_payloads_are_read_lazily_after_restart(tmp_path: Path) -> None:
    config = store.BrokerConfig(cache_bytes_per_queue=0, segment_bytes=8192)
    payloads = [random.randbytes(random.randrange(0, 3000)) for _ in range(40)]
    async with store.open_broker(tmp_path, config=config) as broker:
        queue = await broker.declare_queue("q")
        await queue.enqueue_many(payloads)
        assert queue.statistics().segments == 1  # one batch never splits across segments
        for p in payloads:
            await queue.enqueue(p)
        assert queue.statistics().segments > 3
    async with store.open_broker(tmp_path, config=config) as broker:
        queue = broker.get_queue("q")
        async with queue.consumer(credit=100) as consumer:
            got = [(await consumer.receive()).payload for _ in range(80)]
    assert got == payloads + payloads


@pytest.mark.parametrize("commit_process", [True, False], ids=["commit-process", "commit-threads"])
async def test_many_producers_and_consumers_lose_and_duplicate_nothing(
    tmp_path: Path, commit_process: bool
) -> None:
    producers, per_producer, consumers = 100, 30, 10
    config = store.BrokerConfig(segment_bytes=16384, commit_process=commit_process)
    async with store.open_broker(tmp_path, config=config) as broker:
        queue = await broker.declare_queue("shared")
        sent: set[bytes] = set()
        received: list[bytes] = []
        done_producing = trio.Event()

        async def produce(p: int) -> None:
            for i in range(per_producer):
                payload = f"{p}:{i}".encode()
                await queue.enqueue(payload)
                sent.add(payload)
                if random.random() < 0.3:
                    await trio.lowlevel.checkpoint()

        async def consume() -> None:
            async with queue.consumer(credit=8) as consumer:
                while True:
                    with trio.move_on_after(0.5 if done_producing.is_set() else 10):
                        d = await consumer.receive()
                        if random.random() < 0.1:
                            consumer.release(d.message_id)  # redelivered to someone later
                            continue
                        received.append(d.payload)
                        await consumer.ack(d.message_id)
                        continue
                    return

        async with trio.open_nursery() as nursery:
            for _c in range(consumers):
                nursery.start_soon(consume)
            async with trio.open_nursery() as producing:
                for p in range(producers):
                    producing.start_soon(produce, p)
            done_producing.set()
        assert len(received) == len(set(received)) == producers * per_producer
        assert set(received) == sent
        stats = queue.statistics()
        assert (stats.depth, stats.in_flight) == (0, 0)
        assert stats.records_per_fsync > 1  # group commit happened


async def test_compaction_reads_no_more_than_it_keeps_and_never_on_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A queue that keeps up compacts its first segment: an acked one goes unread, one with messages still
    live has only those read back (the index says where they are). Only a later segment, whose acks may
    stand for older enqueues, is read and scanned whole; all reading happens on worker threads (a full
    64 MiB segment costs hundreds of milliseconds of CPU)."""
    from corda_trio.store import _compaction

    reads: list[tuple[str, int, bool]] = []  # (how, records or segment number, on the Trio thread?)
    trio_thread = threading.get_ident()
    read_kept, read_and_scan = _compaction._read_kept, _compaction._read_and_scan

    def spy_kept(fd: int, size: int, keep: list[tuple[int, int]], ids: list[int]) -> object:
        reads.append(("kept", len(ids), threading.get_ident() == trio_thread))
        return read_kept(fd, size, keep, ids)

    def spy_scan(fd: int, number: int) -> object:
        reads.append(("scan", number, threading.get_ident() == trio_thread))
        return read_and_scan(fd, number)

    monkeypatch.setattr(_compaction, "_read_kept", spy_kept)
    monkeypatch.setattr(_compaction, "_read_and_scan", spy_scan)
    config = store.BrokerConfig(segment_bytes=4096, compact_live_ratio=0.0)

    async def ack(queue: store.Queue, count: int, *, skip: int = 0) -> list[int]:
        skipped = []
        async with queue.consumer(credit=200) as consumer:
            for i in range(count):
                delivery = await consumer.receive()
                if i < skip:
                    skipped.append(delivery.message_id)
                else:
                    await consumer.ack(delivery.message_id)
        return skipped

    async with store.open_broker(tmp_path, config=config) as broker:
        queue = await broker.declare_queue("q")
        ids = [await queue.enqueue(b"%03d" % i * 100) for i in range(60)]
        await ack(queue, 60)
        assert await queue.compact() > 0
        assert reads == []  # each segment was an acked first one in turn
        # (the background compactor may have taken some segments already: measure against what was written)
        assert queue.statistics().disk_bytes < 60 * 300 // 4
        ids = [await queue.enqueue(b"%03d" % i * 100) for i in range(60)]
        await ack(queue, 30)
        assert await queue.compact() > 0
        # the first segment still holding live messages: those, and only those, were read back; later
        # segments hold acks that may stand for its enqueues, so they are scanned whole
        assert reads[0][0] == "kept" and 0 < reads[0][1] < 15, reads
        assert {how for how, _n, _ in reads[1:]} <= {"scan"}
        # one message of the first segment stays live, every later one is acked
        assert await ack(queue, 30, skip=1) == [ids[30]]
        assert await queue.compact() > 0
        assert not any(on_loop for _how, _n, on_loop in reads)
        assert [m.message_id async for m in queue.browse()] == [ids[30]]
    async with store.open_broker(tmp_path, config=config) as broker:
        queue = broker.get_queue("q")
        assert [m.payload async for m in queue.browse()] == [b"%03d" % 30 * 100]
        assert await queue.enqueue(b"next") > ids[-1]


async def test_compaction_refuses_a_damaged_live_record_and_leaves_the_segment_as_it_was(
    tmp_path: Path,
) -> None:
    from corda_trio.store._segment import list_segment_numbers, segment_path

    config = store.BrokerConfig(segment_bytes=4096, compact_live_ratio=0.0)
    async with store.open_broker(tmp_path, config=config) as broker:
        queue = await broker.declare_queue("q")
        for i in range(30):
            await queue.enqueue(b"%03d" % i * 100)
        async with queue.consumer(credit=10) as consumer:
            for _ in range(3):
                await consumer.ack((await consumer.receive()).message_id)
        first = segment_path(str(tmp_path / "q"), list_segment_numbers(str(tmp_path / "q"))[0])
        damaged = bytearray(await trio.Path(first).read_bytes())
        damaged[-65] ^= 0xFF  # the last record's payload (the seal is the last 64 bytes): live, not acked
        await trio.Path(first).write_bytes(damaged)
        with pytest.raises(store.StoreFailedError, match=r"changed or is unreadable \(offset \d+: checksum"):
            await queue.compact()
        assert await trio.Path(first).read_bytes() == damaged  # not rewritten, not dropped


async def test_lazy_acks_ride_with_the_next_commit_or_go_on_their_own_within_the_bound(
    tmp_path: Path,
) -> None:
    from corda_trio.store._wal import LAZY_ACK_SECONDS

    async with store.open_broker(tmp_path) as broker:
        queue = await broker.declare_queue("q")
        ids = await queue.enqueue_many([b"m%d" % i for i in range(6)])
        log = queue._log
        assert log is not None
        async with queue.consumer(credit=10, lazy_acks=True) as consumer:
            held = [(await consumer.receive()).message_id for _ in range(6)]
            batches = log.batches
            await consumer.ack_many(held[:2])  # returns at once: nothing written yet
            assert (log.batches, queue.statistics().depth) == (batches, 4)
            assert log._lazy_deadline < math.inf
            await queue.enqueue(b"next")  # somebody waits for this batch: the acks go with it
            assert log.batches == batches + 1 and log.records_written >= 3
            await consumer.ack_many(held[2:4])
            with trio.fail_after(5):  # (only a hang fails this)
                while log.batches == batches + 1:  # noqa: ASYNC110 (the writer's own deadline is tested)
                    await trio.sleep(LAZY_ACK_SECONDS / 5)
            assert log.batches == batches + 2  # on their own, once: not one batch per ack
            await consumer.ack(held[4])  # lazy too; the last one stays unacked
            assert log._lazy_deadline < math.inf
            # a record somebody waits for joins them: their deadline is off (a writer woken for it
            # while every job slot is busy would spin until one frees)
            _mid, batch = log.add_enqueue(b"direct", b"", 0, start=False)
            assert log._lazy_deadline == math.inf
            await batch.wait()
    async with store.open_broker(tmp_path) as broker:  # closing wrote what was pending
        assert [m.payload async for m in broker.get_queue("q").browse()] == [b"m5", b"next", b"direct"]
    assert held == ids


async def test_ack_many_nowait_acks_without_a_checkpoint_and_is_durable_with_the_next_commit(
    tmp_path: Path,
) -> None:
    """``ack_many_nowait``: the held messages are acked at once (no checkpoint, no write of their own),
    their records ride with the next group commit, and what it refuses it refuses before acking any."""
    async with store.open_broker(tmp_path) as broker:
        queue = await broker.declare_queue("q")
        await queue.enqueue_many([b"m%d" % i for i in range(4)])
        log = queue._log
        assert log is not None
        async with queue.consumer(credit=10, lazy_acks=True) as consumer:
            held = [(await consumer.receive()).message_id for _ in range(4)]
            batches = log.batches
            with trio.testing.assert_no_checkpoints():
                batch = consumer.ack_many_nowait(held[:3])
            assert batch is not None
            assert (log.batches, queue.statistics().depth) == (batches, 1)
            with pytest.raises(store.UnknownDeliveryError):
                consumer.ack_many_nowait([held[3], held[0]])  # held[0] is acked already
            assert queue.statistics().depth == 1  # held[3] is still held, not acked
            await queue.enqueue(b"next")  # the acks go with this commit
            assert log.batches == batches + 1
            await batch.wait()
    async with store.open_broker(tmp_path) as broker:
        assert [m.payload async for m in broker.get_queue("q").browse()] == [b"m3", b"next"]


async def test_lazy_acks_do_not_count_as_appenders_of_a_cohort(tmp_path: Path) -> None:
    """A batch starts at once when it holds half the appenders last seen waiting (the cohort rule); lazy
    acks wait for nobody, so they must not make a lone enqueue wait for a cohort that never comes."""
    async with store.open_broker(tmp_path) as broker:
        queue = await broker.declare_queue("q")
        await queue.enqueue_many([b"m"] * 60)
        log = queue._log
        assert log is not None
        async with queue.consumer(credit=100, lazy_acks=True) as consumer:
            held = [(await consumer.receive()).message_id for _ in range(60)]
            _mid, batch = log.add_enqueue(b"one", b"", 0)  # started at once: a job in flight
            await consumer.ack_many(held[:50])  # 50 lazy acks in the next pending batch
            await batch.wait()  # the job is done with them pending
            assert log._start_at == 1


async def test_a_segment_compacted_under_a_reader_is_released_once_the_read_is_done(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from corda_trio.store import _segment, _wal

    monkeypatch.setattr(_segment, "RELEASE_PAUSE_SECONDS", 0.0)
    config = store.BrokerConfig(segment_bytes=4096, compact_live_ratio=0.0, cache_bytes_per_queue=0)
    async with store.open_broker(tmp_path, config=config) as broker:
        queue = await broker.declare_queue("q")
        ids = [await queue.enqueue(b"%03d" % i * 100) for i in range(30)]
        async with queue.consumer(credit=30) as consumer:
            held = [(await consumer.receive()).message_id for _ in ids]
            await consumer.ack_many(held[1:])  # the first message stays, in the first segment
            log = queue._log
            assert log is not None
            old_fd = log.segments[min(log.segments)].fd
            old_inode = os.fstat(old_fd).st_ino
            reading, go_on = threading.Event(), threading.Event()
            real = _wal._read_records

            def slow(requests: list[tuple[int, int, int]]) -> object:
                reading.set()
                go_on.wait(10)
                return real(requests)

            monkeypatch.setattr(_wal, "_read_records", slow)
            trio_thread, released_on = threading.get_ident(), []

            def release(fd: int) -> None:
                released_on.append(threading.get_ident() != trio_thread)
                _segment.release_file(fd)

            monkeypatch.setattr(_wal, "release_file", release)
            payloads: list[bytes] = []

            async def browse() -> None:
                payloads.extend([m.payload async for m in queue.browse()])

            async with trio.open_nursery() as nursery:
                nursery.start_soon(browse)
                await trio.to_thread.run_sync(reading.wait)  # the read holds the first segment
                assert await queue.compact() > 0  # it is replaced meanwhile
                assert os.fstat(old_fd).st_ino == old_inode  # still open for the reader
                go_on.set()
            assert payloads == [b"000" * 100]

            def released() -> bool:
                try:
                    return os.fstat(old_fd).st_ino != old_inode  # (the number may be reused)
                except OSError:
                    return True

            with trio.fail_after(10):  # released once the read was done
                while not released():  # noqa: ASYNC110
                    await trio.sleep(0.01)
            assert released_on == [True]  # on a worker thread, a step at a time


async def test_background_compaction_reclaims_acked_segments(tmp_path: Path) -> None:
    config = store.BrokerConfig(segment_bytes=4096, compact_live_ratio=0.5)
    async with store.open_broker(tmp_path, config=config) as broker:
        queue = await broker.declare_queue("q")
        keep = await queue.enqueue(b"k" * 500)
        for _ in range(40):
            await queue.enqueue(b"x" * 500)
        peak = queue.statistics().disk_bytes
        async with queue.consumer(credit=100) as consumer:
            for _ in range(41):
                d = await consumer.receive()
                if d.message_id != keep:
                    await consumer.ack(d.message_id)
        compactor = queue._compactor
        assert compactor is not None
        with trio.fail_after(60):  # generous: only a hang fails this
            while not (queue.statistics().compactions and queue.statistics().disk_bytes <= peak // 2):
                await compactor.wait_for_pass()  # the compactor runs in the background
        assert queue.statistics().depth == 1
    async with store.open_broker(tmp_path, config=config) as broker:
        assert [m.message_id async for m in broker.get_queue("q").browse()] == [keep]


@settings(max_examples=100, deadline=None)
@example(
    base=0, ops=[("lend", 2), ("receive", 0), ("receive", 0), ("take_back", 2), ("ack", 0), ("receive", 0)]
)
@given(
    base=st.integers(min_value=0, max_value=4),
    ops=st.lists(
        st.tuples(st.sampled_from(["lend", "take_back", "receive", "ack", "release"]), st.integers(0, 3)),
        max_size=40,
    ),
)
def test_credit_taken_back_bounds_what_a_window_consumer_holds(base: int, ops: list[tuple[str, int]]) -> None:
    """Credit lent with ``add_credit`` and withdrawn with ``take_back_credit`` (the messaging service lends
    its inbox consumer credit for the messages parked flows hold): the consumer never holds more than the
    credit granted overall, and receives again exactly when an ack or release brings it below that."""

    async def main() -> None:
        with tempfile.TemporaryDirectory() as directory:
            async with store.open_broker(Path(directory)) as broker:
                queue = await broker.declare_queue("q", durable=False)
                await queue.enqueue_many([b"m%d" % i for i in range(200)])
                granted = base
                async with queue.consumer(credit=base) as consumer:
                    for op, n in ops:
                        if op == "lend":
                            consumer.add_credit(n)
                            granted += n
                        elif op == "take_back":
                            n = min(n, granted - base)  # (a lender takes back only what it lent)
                            consumer.take_back_credit(n)
                            granted -= n
                        elif op == "receive":
                            try:
                                consumer.receive_nowait()
                            except trio.WouldBlock:
                                assert len(consumer.held) >= granted
                            else:
                                assert len(consumer.held) <= granted
                        elif consumer.held:
                            mid = consumer.held[n % len(consumer.held)]
                            if op == "ack":
                                consumer.ack_many_nowait([mid])
                            else:
                                consumer.release(mid)
                        assert consumer.credit == granted - len(consumer.held)

    trio.run(main)
