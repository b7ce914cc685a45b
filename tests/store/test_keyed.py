"""The durable keyed log: latest value per key, removals, atomic multi-key writes, recovery after
restarts and compaction, against a plain dict as the model."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import trio
import trio.testing

from corda_trio import store
from corda_trio.store._record import ACK_RECORD_BYTES, SEAL_RECORD_BYTES, SEGMENT_HEADER_BYTES

CONFIG = store.BrokerConfig(segment_bytes=8192, compact_live_ratio=0.5)


async def test_put_get_delete_write_and_recovery(tmp_path: Path) -> None:
    async with store.open_broker(tmp_path) as broker:
        log = await broker.open_keyed_log("checkpoints")
        assert await broker.open_keyed_log("checkpoints") is log
        assert log.items() == [] and log.get(b"a") is None
        await log.put(b"a", b"1")
        await log.write([(b"b", b"2"), (b"c", b"3")], [])
        await log.delete(b"b")
        await log.delete(b"missing")
        await log.put(b"a", b"4")
        assert sorted(log.items()) == [(b"a", b"4"), (b"c", b"3")]
        with pytest.raises(ValueError, match="only once"):
            await log.write([(b"x", b"1")], [b"x"])
        with pytest.raises(TypeError):
            await log.put("str", b"v")  # type: ignore[arg-type]
        queue = await broker.declare_queue("q")  # queues and keyed logs side by side
        await queue.enqueue(b"m")
    async with store.open_broker(tmp_path) as broker:
        log = await broker.open_keyed_log("checkpoints")
        assert sorted(log.items()) == [(b"a", b"4"), (b"c", b"3")]
        assert log.get(b"b") is None
        assert broker.list_queues() == ["q"]
        with pytest.raises(store.InvalidQueueNameError):
            await broker.open_keyed_log("../x")
    with pytest.raises(store.InvalidQueueNameError):
        store.validate_queue_name("keyed")  # the keyed logs' directory


@pytest.mark.parametrize("seed", [7, 8, 9])
async def test_random_operations_restarts_and_compaction_match_a_dict(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    model: dict[bytes, bytes] = {}
    keys = [b"flow-%d" % i for i in range(40)]
    for session in range(6):
        async with store.open_broker(tmp_path, config=CONFIG) as broker:
            log = await broker.open_keyed_log("checkpoints")
            assert dict(log.items()) == model, f"session {session}: recovered state differs"
            for step in range(300):
                roll = rng.random()
                if roll < 0.5:
                    key, value = rng.choice(keys), b"v%d-%d" % (session, step) + b"." * rng.randrange(300)
                    await log.put(key, value)
                    model[key] = value
                elif roll < 0.75:
                    key = rng.choice(keys)
                    await log.delete(key)
                    model.pop(key, None)
                elif roll < 0.97:
                    chosen = rng.sample(keys, rng.randrange(1, 6))
                    puts = [(k, b"w%d-%d" % (session, step)) for k in chosen[: len(chosen) // 2 + 1]]
                    deletes = chosen[len(chosen) // 2 + 1 :]
                    await log.write(puts, deletes)
                    model.update(puts)
                    for k in deletes:
                        model.pop(k, None)
                else:
                    await log.compact()
                assert dict(log.items()) == model
            stats = log.statistics()
            assert stats.keys == len(model)
            assert stats.records <= len(model) + 40  # unneeded records are acked (then compacted)


async def test_concurrent_puts_share_fsyncs(tmp_path: Path) -> None:
    async with store.open_broker(tmp_path) as broker:
        log = await broker.open_keyed_log("checkpoints")

        async def writer(n: int) -> None:
            for i in range(20):
                await log.put(b"k%d" % n, b"%d" % i)

        async with trio.open_nursery() as nursery:
            for n in range(100):
                nursery.start_soon(writer, n)
        assert len(log.items()) == 100 and all(v == b"19" for _k, v in log.items())
        stats = log.statistics()
        assert stats.fsyncs < 2000 and stats.records_per_fsync > 1  # group commit


async def test_cancelled_writes_are_whole_or_absent_and_acknowledged_ones_stay(tmp_path: Path) -> None:
    acknowledged: dict[bytes, bytes] = {}
    attempted: dict[bytes, bytes] = {}
    async with store.open_broker(tmp_path) as broker:
        log = await broker.open_keyed_log("checkpoints")
        enough = trio.Event()

        async def writer(n: int) -> None:
            for j in range(10):
                puts = [(b"k%d.%d-a" % (n, j), b"v%d" % n), (b"k%d.%d-b" % (n, j), b"w%d" % n)]
                attempted.update(puts)
                await log.write(puts, [])
                acknowledged.update(puts)
                if len(acknowledged) >= 1000:
                    enough.set()

        async with trio.open_nursery() as nursery:
            for n in range(100):
                nursery.start_soon(writer, n)
            await enough.wait()
            nursery.cancel_scope.cancel()  # the rest are cancelled wherever they are
    async with store.open_broker(tmp_path) as broker:
        recovered = dict((await broker.open_keyed_log("checkpoints")).items())
    assert acknowledged.items() <= recovered.items()
    assert recovered.items() <= attempted.items()
    for n in range(100):  # a write is atomic: both of its keys or neither
        for j in range(10):
            assert (b"k%d.%d-a" % (n, j) in recovered) == (b"k%d.%d-b" % (n, j) in recovered), (n, j)
    assert len(acknowledged) < len(attempted)  # some really were cancelled


async def test_open_cancelled_during_recovery_leaves_nothing_half_open(tmp_path: Path) -> None:
    async with store.open_broker(tmp_path) as broker:
        log = await broker.open_keyed_log("checkpoints")
        for i in range(600):  # more than one read batch to recover
            await log.write([(b"k%d" % i, b"v" * 100)], [])
    async with store.open_broker(tmp_path) as broker:
        outcome: list[str] = []

        async def open_it() -> None:
            await broker.open_keyed_log("checkpoints")
            outcome.append("opened")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(open_it)
            await trio.testing.wait_all_tasks_blocked()  # it is in its first thread call
            nursery.cancel_scope.cancel()
        assert outcome == []  # cancelled before it finished recovering
        log = await broker.open_keyed_log("checkpoints")
        assert len(log.items()) == 600


def _unneeded(history: dict[int, tuple[list[bytes], list[bytes]]], unacked: list[int]) -> list[int]:
    """The records of ``unacked`` (ids in write order) that the rule of protocol_spec/store-format.md
    §6a does not need: none of their puts is the latest operation on its key, and none of their deletes
    is the latest operation on a key that an older unacked record still puts."""
    latest: dict[bytes, tuple[int, str]] = {}
    for mid in unacked:
        puts, deletes = history[mid]
        for key in puts:
            latest[key] = (mid, "put")
        for key in deletes:
            latest[key] = (mid, "delete")
    out = []
    for mid in unacked:
        puts, deletes = history[mid]
        holds = any(latest[k] == (mid, "put") for k in puts)
        hides = any(
            latest[k] == (mid, "delete") and any(k in history[o][0] for o in unacked if o < mid)
            for k in deletes
        )
        if not (holds or hides):
            out.append(mid)
    return out


@pytest.mark.parametrize("seed", [1, 2])
async def test_multi_key_records_are_acked_and_compacted_away_once_every_key_in_them_is_superseded(
    tmp_path: Path, seed: int
) -> None:
    """A model of which records must stay: after every write (and after each restart) the unacked
    records are exactly those still needed, and a full compaction leaves nothing else on disk."""
    rng = random.Random(seed)
    keys = [b"k%d" % i for i in range(12)]
    history: dict[int, tuple[list[bytes], list[bytes]]] = {}
    model: dict[bytes, bytes] = {}
    for session in range(3):
        async with store.open_broker(tmp_path, config=CONFIG) as broker:
            log = await broker.open_keyed_log("checkpoints")
            inner = log._log
            assert inner is not None
            for step in range(150):
                chosen = rng.sample(keys, rng.randrange(1, 7))
                split = rng.randrange(0, len(chosen) + 1)
                puts = [(k, b"s%d-%d" % (session, step) + b"." * rng.randrange(200)) for k in chosen[:split]]
                deletes = chosen[split:]
                mid = inner.next_id  # (acks take no id: this write's record gets it)
                await log.write(puts, deletes)
                history[mid] = ([k for k, _v in puts], deletes)
                model.update(puts)
                for k in deletes:
                    model.pop(k, None)
                unacked = sorted(inner.live)
                assert _unneeded(history, unacked) == [], (session, step)
                for k in model:  # the latest put of every key is kept
                    assert any(k in history[m][0] for m in unacked)
                assert dict(log.items()) == model
            await log.compact()
            unacked = sorted(inner.live)
        path = tmp_path / "keyed" / "checkpoints"
        on_disk = store.recover_queue(str(path), store.RecoveryMode.CHECK)
        # nothing but the needed records is left in the files (acked ones were compacted away), but in the
        # current segment when they take no more room than sealing it adds: compacting never grows a log
        *sealed, tail = on_disk.segments
        for segment in sealed:
            assert segment.record_bytes() == segment.live_bytes + segment.ack_count * ACK_RECORD_BYTES
        acked_left = tail.record_bytes() - tail.live_bytes - tail.ack_count * ACK_RECORD_BYTES
        assert 0 <= acked_left <= SEAL_RECORD_BYTES + SEGMENT_HEADER_BYTES
        assert on_disk.report.enqueue_records >= len(on_disk.live) == len(unacked)
        assert sorted(on_disk.live) == unacked


async def test_a_torn_tail_cut_from_a_keyed_log_is_reported_like_a_queues(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Records cut from a keyed log (the flows' checkpoints) are dropped: recovery must say so, with the
    file, the offset and how much, as it does for a queue (it used to say nothing at all)."""
    async with store.open_broker(tmp_path) as broker:
        log = await broker.open_keyed_log("checkpoints")
        for i in range(3):
            await log.put(b"k%d" % i, b"v" * 100)
    (segment,) = (tmp_path / "keyed" / "checkpoints").glob("*.seg")
    size = segment.stat().st_size
    with segment.open("r+b") as f:
        f.truncate(size - 50)  # inside the last record: the shape an interrupted append leaves
    with caplog.at_level("INFO", logger="corda_trio.store"):
        async with store.open_broker(tmp_path) as broker:
            log = await broker.open_keyed_log("checkpoints")
            assert sorted(k for k, _ in log.items()) == [b"k0", b"k1"]
    torn = [r for r in caplog.records if "torn tail" in r.getMessage()]
    assert len(torn) == 1 and torn[0].levelname == "WARNING", caplog.text
    message = torn[0].getMessage()
    assert message.startswith(f"keyed log checkpoints: torn tail in {segment} at offset ")
    assert "dropped " in message
    assert "recovered keyed log checkpoints: 2 messages in " in caplog.text
