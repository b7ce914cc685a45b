"""Early delivery: a queue declared with ``early_delivery`` hands a message to its consumers while its group
commit is being written and synced; the appender still returns only once it is durable, order is kept, and
an ack is never durable without its message.

The queues here commit through a stand-in for the commit helper process that writes and syncs each batch
only when the test says so (``_HandHelper.complete``): a batch can be held "written to the helper, not yet
durable" for as long as a test needs, deterministically.
"""

from __future__ import annotations

import errno
import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import trio
import trio.testing

from corda_trio import store


class _HandHelper:
    """The commit helper's interface (``open`` / ``submit`` / ``close``); each submitted batch waits until
    :meth:`complete` appends and syncs it (or fails it) and reports it done, in submission order. Once
    ``auto`` is set, batches are completed as they come (soon after, on the Trio thread)."""

    def __init__(self) -> None:
        self.fds: dict[int, int] = {}
        self.jobs: list[tuple[int, bytes, Callable[[BaseException | None], None]]] = []
        self.auto = False
        self._next = 0

    def open(self, path: str) -> int:
        handle = self._next
        self._next += 1
        self.fds[handle] = os.open(path, os.O_WRONLY | os.O_APPEND)
        return handle

    def close(self, handle: int) -> None:
        os.close(self.fds.pop(handle))

    def submit(
        self,
        handle: int,
        data: bytes | bytearray,
        *,
        sync: bool,
        done: Callable[[BaseException | None], None],
    ) -> None:
        self.jobs.append((self.fds[handle], bytes(data), done))
        if self.auto:
            trio.lowlevel.current_trio_token().run_sync_soon(self.complete)

    def complete(self, *, fail: bool = False) -> None:
        fd, data, done = self.jobs.pop(0)
        if fail:
            done(OSError(errno.EIO, "Input/output error"))
            return
        os.write(fd, data)
        os.fdatasync(fd)
        done(None)

    def finish_all(self) -> None:
        self.auto = True
        while self.jobs:
            self.complete()


@asynccontextmanager
async def _broker_with_hand_helper(
    directory: Path, **config: int
) -> AsyncIterator[tuple[store.Broker, _HandHelper]]:
    """A broker whose queues declared inside commit through a :class:`_HandHelper`."""
    async with store.open_broker(directory, config=store.BrokerConfig(**config)) as broker:
        real = broker._helper
        assert real is not None
        hand = _HandHelper()
        broker._helper = hand  # type: ignore[assignment]
        try:
            yield broker, hand
        finally:
            hand.finish_all()  # closing drains the queues through it
            broker._helper = real


async def _soon(consumer: store.Consumer) -> bytes | None:
    """The payload of the next delivery if there is one once every task is blocked, else ``None``."""
    await trio.testing.wait_all_tasks_blocked()
    try:
        return consumer.receive_nowait().payload
    except trio.WouldBlock:
        return None


async def test_a_consumer_gets_the_message_while_its_commit_runs_and_may_ack_it(tmp_path: Path) -> None:
    returned: dict[str, int] = {}

    async def produce(queue: store.Queue, payload: bytes) -> None:
        returned[queue.name] = await queue.enqueue(payload)

    with trio.fail_after(10):
        async with _broker_with_hand_helper(tmp_path) as (broker, hand):
            early = await broker.declare_queue("early", early_delivery=True)
            plain = await broker.declare_queue("plain")
            async with (
                early.consumer(lazy_acks=True) as early_consumer,
                plain.consumer() as plain_consumer,
                trio.open_nursery() as nursery,
            ):
                nursery.start_soon(produce, early, b"early")
                nursery.start_soon(produce, plain, b"plain")
                assert await _soon(early_consumer) == b"early"
                assert await _soon(plain_consumer) is None  # an ordinary queue waits for durability
                assert len(hand.jobs) == 2 and returned == {}  # neither append returned
                await early_consumer.ack_many([0])  # lazy: its record follows the enqueue's
                hand.complete()
                hand.complete()
                assert await _soon(plain_consumer) == b"plain"
            assert returned == {"early": 0, "plain": 0}
            assert early.statistics().depth == 0
    async with store.open_broker(tmp_path) as broker:
        # the message and its ack are both durable: nothing comes back
        assert [m async for m in broker.get_queue("early").browse()] == []
        assert [m.payload async for m in broker.get_queue("plain").browse()] == [b"plain"]


async def test_order_is_kept_behind_a_batch_that_was_not_delivered_early(tmp_path: Path) -> None:
    """A batch written while the payload cache is full waits for its sync; a batch written after it waits
    too, although it could go early: delivery stays in id order."""
    with trio.fail_after(10):
        async with _broker_with_hand_helper(tmp_path, cache_bytes_per_queue=100) as (broker, hand):
            queue = await broker.declare_queue("q", early_delivery=True)
            async with queue.consumer(lazy_acks=True) as consumer, trio.open_nursery() as nursery:
                nursery.start_soon(queue.enqueue, b"a" * 200)
                assert await _soon(consumer) == b"a" * 200  # early; the cache is full now
                nursery.start_soon(queue.enqueue, b"b")
                assert await _soon(consumer) is None  # written, but not early: the cache is full
                await consumer.ack_many([0])  # the cache has room again
                nursery.start_soon(queue.enqueue, b"c")
                await trio.testing.wait_all_tasks_blocked()
                hand.complete()  # "a" durable; "c" is written now, after "b", which is not durable yet
                assert len(hand.jobs) == 2
                assert await _soon(consumer) is None  # "c" could go early, but not before "b"
                hand.complete()
                assert await _soon(consumer) == b"b"
                assert await _soon(consumer) is None
                hand.complete()
                assert await _soon(consumer) == b"c"


async def test_a_failed_commit_fails_its_appenders_after_early_delivery(tmp_path: Path) -> None:
    """The consumer had the message; the write fails: the append raises, the queue stops, the broker reports
    it to its owner (a node stops on it)."""
    failures: list[BaseException] = []

    async def produce(queue: store.Queue) -> None:
        try:
            await queue.enqueue(b"x")
        except store.StoreFailedError as exc:
            failures.append(exc)

    with trio.fail_after(10):
        async with _broker_with_hand_helper(tmp_path) as (broker, hand):
            queue = await broker.declare_queue("q", early_delivery=True)
            async with queue.consumer() as consumer, trio.open_nursery() as nursery:
                nursery.start_soon(produce, queue)
                assert await _soon(consumer) == b"x"
                hand.complete(fail=True)
            assert len(failures) == 1 and "Input/output error" in str(failures[0])
            assert "queue q: write-ahead log write failed" in str(await broker.wait_failed())
