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
        assert (
            len(
                broker.list_queues(
                    messaging.GENERATION_PREFIX
                    if hasattr(messaging, "GENERATION_PREFIX")
                    else "internal.p2p.dedup."
                )
            )
            <= 2
        )
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
