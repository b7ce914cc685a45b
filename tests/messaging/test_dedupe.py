"""The deduplicator: claims, durable ids across restarts, and the retirement bound."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from corda_trio import messaging, store


async def test_duplicates_are_refused_while_processing_and_after_commit_across_restarts(
    tmp_path: Path,
) -> None:
    async with store.open_broker(tmp_path) as broker:
        dedup = await messaging.Deduplicator.open(broker, retain=100)
        assert dedup.begin("a")
        assert not dedup.begin("a")  # being processed
        await dedup.commit("a", b"receipt-a")
        assert not dedup.begin("a")  # processed
        assert dedup.begin("b")
        dedup.abandon("b")  # its handler failed: it may come again
        assert dedup.begin("b")
        # "b" is claimed but not committed when the process stops
    async with store.open_broker(tmp_path) as broker:
        dedup = await messaging.Deduplicator.open(broker, retain=100)
        assert "a" in dedup and dedup.receipt("a") == b"receipt-a"
        assert dedup.begin("b")  # never committed: processed again after a restart
        with pytest.raises(ValueError, match="not claimed"):
            await dedup.commit("c")


async def test_retirement_keeps_between_retain_and_twice_retain_ids(tmp_path: Path) -> None:
    retain = 50
    async with store.open_broker(tmp_path) as broker:
        dedup = await messaging.Deduplicator.open(broker, retain=retain)
        for i in range(7 * retain + 13):
            assert dedup.begin(f"id-{i}")
            await dedup.commit(f"id-{i}")
            assert retain <= len(dedup) <= 2 * retain or len(dedup) == i + 1
            # the newest `retain` ids are always remembered
            assert all(f"id-{j}" in dedup for j in range(max(0, i - retain + 1), i + 1))
        remembered = {i for i in range(7 * retain + 13) if f"id-{i}" in dedup}
        assert len(broker.list_queues(messaging.GENERATION_PREFIX)) <= 2
        assert "id-0" not in dedup and dedup.begin("id-0")  # retired: a very late copy is no longer caught
        dedup.abandon("id-0")
    async with store.open_broker(tmp_path) as broker:
        dedup = await messaging.Deduplicator.open(broker, retain=retain)
        assert {i for i in range(7 * retain + 13) if f"id-{i}" in dedup} == remembered


async def test_concurrent_commits_rotate_safely(tmp_path: Path) -> None:
    retain = 20
    async with store.open_broker(tmp_path) as broker:
        dedup = await messaging.Deduplicator.open(broker, retain=retain)

        async def one(i: int) -> None:
            assert dedup.begin(f"c-{i}")
            await dedup.commit(f"c-{i}")

        async with trio.open_nursery() as nursery:
            for i in range(200):
                nursery.start_soon(one, i)
        assert retain <= len(dedup) <= 2 * retain
        assert len(broker.list_queues("internal.p2p.dedup.")) <= 2


async def test_a_commit_is_one_batch_record_and_reloads_with_any_id(tmp_path: Path) -> None:
    """One ``commit_many`` is one record (headers ``BATCH_HEADER``); ids of any text and receipts of any
    bytes come back after a restart, in order."""
    from corda_trio.messaging._dedupe import BATCH_HEADER

    items = [("plain", b""), ("\x00batch", b"\xff\x01"), ("\xff-ÿ-日本", b"r" * 1000), ("", b"empty id")]
    async with store.open_broker(tmp_path) as broker:
        dedup = await messaging.Deduplicator.open(broker, retain=100)
        for dedup_id, _ in items:
            assert dedup.begin(dedup_id)
        await dedup.commit_many(items)
        records = [r async for r in broker.get_queue(f"{messaging.GENERATION_PREFIX}0").browse()]
        assert [r.headers for r in records] == [BATCH_HEADER]
    async with store.open_broker(tmp_path) as broker:
        dedup = await messaging.Deduplicator.open(broker, retain=100)
        assert dedup.receipts() == items


async def test_a_large_commit_is_split_into_records_that_all_reload(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from corda_trio.messaging import _dedupe

    monkeypatch.setattr(_dedupe, "BATCH_RECORD_BYTES", 200)
    items = [(f"id-{i}", bytes([i]) * 30) for i in range(40)]
    async with store.open_broker(tmp_path) as broker:
        dedup = await messaging.Deduplicator.open(broker, retain=1000)
        for dedup_id, _ in items:
            dedup.begin(dedup_id)
        await dedup.commit_many(items)
        records = [r async for r in broker.get_queue(f"{messaging.GENERATION_PREFIX}0").browse()]
        assert 5 <= len(records) <= 40 and all(len(r.payload) <= 400 for r in records)
    async with store.open_broker(tmp_path) as broker:
        dedup = await messaging.Deduplicator.open(broker, retain=1000)
        assert dedup.receipts() == items


async def test_records_of_the_first_format_are_still_read(tmp_path: Path) -> None:
    """A node that stored one id per record (headers the id, payload the receipt) keeps its ids."""
    async with store.open_broker(tmp_path) as broker:
        queue = await broker.declare_queue(f"{messaging.GENERATION_PREFIX}3")
        await queue.enqueue_many([(b"receipt-a", b"old-a"), (b"", "old-é".encode())])
    async with store.open_broker(tmp_path) as broker:
        dedup = await messaging.Deduplicator.open(broker, retain=100)
        assert dedup.receipts() == [("old-a", b"receipt-a"), ("old-é", b"")]
        assert not dedup.begin("old-a")
        assert dedup.begin("new")
        await dedup.commit("new", b"n")  # a batch record after the old ones, in the same generation
    async with store.open_broker(tmp_path) as broker:
        dedup = await messaging.Deduplicator.open(broker, retain=100)
        assert dedup.receipts() == [("old-a", b"receipt-a"), ("old-é", b""), ("new", b"n")]


@pytest.mark.parametrize(
    ("headers", "payload", "problem"),
    [
        (b"\xff\x01", b"\xc1", "malformed"),  # not msgpack
        (b"\xff\x01", b"\x92\xa1a\xa1b", "malformed"),  # not pairs
        (b"\xff\x01", b"\x91\x92\x01\xc4\x00", "malformed"),  # an id that is not text
        (b"\xff\x07", b"\x90", "unknown batch format 07"),
    ],
)
async def test_a_malformed_record_stops_the_load_with_the_queue_named(
    tmp_path: Path, headers: bytes, payload: bytes, problem: str
) -> None:
    name = f"{messaging.GENERATION_PREFIX}0"
    async with store.open_broker(tmp_path) as broker:
        queue = await broker.declare_queue(name)
        await queue.enqueue_many([(payload, headers)])
    async with store.open_broker(tmp_path) as broker:
        with pytest.raises(messaging.MalformedDedupRecordError, match=problem) as info:
            await messaging.Deduplicator.open(broker, retain=100)
        assert name in str(info.value)
        assert isinstance(info.value, store.StoreError)
