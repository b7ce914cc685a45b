"""Compaction racing ``delete_queue`` / ``declare_queue`` of the same name: the new queue keeps exactly
its own messages, the deleted queue's never come back, and the only error a racing ``compact`` raises
is the documented :class:`StoreClosedError`."""

from __future__ import annotations

import random
from pathlib import Path

import trio

from corda_trio import store
from corda_trio.store._compaction import QueueGeneration, rewrite_segment

QUEUE = "race"
CONFIG = store.BrokerConfig(segment_bytes=4096, compact_live_ratio=0.5)


async def _fill_and_ack_most(queue: store.Queue, tag: bytes, count: int) -> list[int]:
    """Enqueue ``count`` messages over several segments, ack all but every fifth; return the kept ids."""
    ids: list[int] = []
    for start in range(0, count, 15):  # one batch per call: several segments
        ids += await queue.enqueue_many([tag + b"-%d" % i + b"." * 200 for i in range(start, start + 15)])
    keep = ids[::5]
    async with queue.consumer(credit=count) as consumer:
        held = [(await consumer.receive()).message_id for _ in range(count)]
        await consumer.ack_many([mid for mid in held if mid not in keep])
        for mid in keep:
            consumer.release(mid)
    return keep


async def test_delete_and_redeclare_while_compacting_never_mixes_generations(tmp_path: Path) -> None:
    rng = random.Random(12)
    outcomes: dict[str, int] = {"compacted": 0, "closed": 0, "segments_rewritten": 0}
    for trial in range(12):
        directory = tmp_path / f"broker-{trial}"
        async with store.open_broker(directory, config=CONFIG) as broker:
            old = await broker.declare_queue(QUEUE)
            await _fill_and_ack_most(old, b"old", 150)

            async def compact_old(queue: store.Queue = old) -> None:
                try:
                    await queue.compact()
                    outcomes["compacted"] += 1
                except store.StoreClosedError:
                    outcomes["closed"] += 1
                outcomes["segments_rewritten"] += queue._log.compactions if queue._log else 0

            async with trio.open_nursery() as nursery:
                nursery.start_soon(compact_old)
                # Let it get anywhere, a rewrite on its thread included (the outcome is checked the
                # same whatever the timing; the varied delay only spreads the interleavings).
                await trio.sleep(rng.uniform(0.0, 0.01))
                await broker.delete_queue(QUEUE)
                new = await broker.declare_queue(QUEUE)
                new_ids = await new.enqueue_many([b"new-%d" % i for i in range(30)])
                await new.compact()
            assert {m.message_id: m.payload async for m in new.browse()} == {
                mid: b"new-%d" % i for i, mid in enumerate(new_ids)
            }
        async with store.open_broker(directory, config=CONFIG) as broker:
            payloads = [m.payload async for m in broker.get_queue(QUEUE).browse()]
            assert payloads == [b"new-%d" % i for i in range(30)], f"trial {trial}"
    assert outcomes["segments_rewritten"] > 0  # the compactions really ran beside the deletes
    assert outcomes["compacted"] + outcomes["closed"] == 12


async def test_compacting_a_deleted_queue_raises_store_closed(tmp_path: Path) -> None:
    async with store.open_broker(tmp_path, config=CONFIG) as broker:
        queue = await broker.declare_queue(QUEUE)
        await _fill_and_ack_most(queue, b"x", 60)
        await broker.delete_queue(QUEUE)
        try:
            await queue.compact()
        except store.StoreClosedError as exc:
            assert QUEUE in str(exc)
        else:
            raise AssertionError("compact() on a deleted queue succeeded")


def test_a_rewrite_reaches_its_own_generation_even_after_the_path_was_reused(tmp_path: Path) -> None:
    """The structural guarantee behind the race: compaction file operations are relative to the
    generation's directory descriptor, so a directory re-created under the same path is never touched."""
    path = tmp_path / QUEUE
    path.mkdir()
    segment = "00000000000000000001.seg"
    (path / segment).write_bytes(b"H" * 64 + b"old-record")
    generation = QueueGeneration.open(QUEUE, str(path))
    try:
        path.rename(tmp_path / "deleted")  # what delete_queue does, then a re-declare makes a new one
        path.mkdir()
        (path / segment).write_bytes(b"H" * 64 + b"new-record")
        data = (tmp_path / "deleted" / segment).read_bytes()
        fd, size, offsets = rewrite_segment(generation.dir_fd, segment, data, [])
        assert (fd, size, offsets) == (-1, 0, [])
        assert (path / segment).read_bytes() == b"H" * 64 + b"new-record"  # the new generation: intact
        assert not (tmp_path / "deleted" / segment).exists()
    finally:
        generation.close()
