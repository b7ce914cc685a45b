"""Hypothesis stateful test: enqueue / receive / ack / release / compact / crash-and-reopen against a model.

The broker runs in a Trio loop on a helper thread (each rule calls into it with ``trio.from_thread.run``),
so one broker lives across many rules, as in a real node. "Crash" abandons the broker without any
shutdown step of its own and optionally leaves a torn write (random bytes) at the end of the last segment;
the model then expects every unacked message back, in-flight ones ready again, delivery counts reset.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import trio
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from corda_trio import store
from corda_trio.store._record import append_enqueue
from corda_trio.store._segment import list_segment_numbers, segment_path

T = TypeVar("T")
QUEUE = "internal.peers.DLmodel"
CONFIG = store.BrokerConfig(segment_bytes=1024, compact_live_ratio=0.5, cache_bytes_per_queue=300)


def _torn_record(payload: bytes, keep: int) -> bytes:
    record = bytearray()
    append_enqueue(record, 2**40, 0, b"", payload)
    return bytes(record[: min(keep, len(record) - 1)])


class _TrioThread:
    """A Trio loop on a thread, hosting one broker at a time."""

    def __init__(self) -> None:
        self._ready = threading.Event()
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self._thread = threading.Thread(target=trio.run, args=(self._main,), daemon=True)
        self._thread.start()
        self._ready.wait()

    async def _main(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._stop = trio.Event()
        async with trio.open_nursery() as nursery:
            self.nursery = nursery
            self._ready.set()
            await self._stop.wait()
            nursery.cancel_scope.cancel()

    def run(self, afn: Callable[..., Awaitable[T]], *args: Any) -> T:
        return trio.from_thread.run(afn, *args, trio_token=self._token)

    def close(self) -> None:
        assert self._stop is not None
        trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
        self._thread.join()


class BrokerHost:
    """Opens the broker in a task of the Trio thread and keeps it open until ``stop``."""

    def __init__(self, loop: _TrioThread, directory: str) -> None:
        self.loop = loop
        self.directory = directory
        self.broker: store.Broker | None = None
        self.scope: trio.CancelScope | None = None
        self.stopped: trio.Event | None = None

    async def start(self) -> None:
        opened = trio.Event()
        self.stopped = trio.Event()

        async def host() -> None:
            assert self.stopped is not None
            try:
                with trio.CancelScope() as self.scope:
                    async with store.open_broker(self.directory, config=CONFIG) as broker:
                        self.broker = broker
                        opened.set()
                        await trio.sleep_forever()
            finally:
                self.stopped.set()

        self.loop.nursery.start_soon(host)
        await opened.wait()

    async def stop(self) -> None:
        assert self.scope is not None and self.stopped is not None
        self.scope.cancel()
        await self.stopped.wait()


class QueueModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = _TrioThread()
        self.directory = tempfile.mkdtemp(prefix="store-model-")
        self.host = BrokerHost(self.loop, self.directory)
        self.live: dict[int, bytes] = {}
        self.in_flight: dict[int, int] = {}  # id -> consumer index
        self.counts: dict[int, int] = {}
        self.last_id = -1
        self.consumers: list[store.Consumer] = []

    @initialize(early=st.booleans())
    def open(self, early: bool) -> None:
        self.early = early  # early delivery (the outbound queues' mode): the same model must hold
        self._open()

    def _open(self) -> None:
        async def go() -> None:
            await self.host.start()
            assert self.host.broker is not None
            self.queue = await self.host.broker.declare_queue(QUEUE, early_delivery=self.early)
            self.consumers = [self.queue.consumer(credit=1000) for _ in range(2)]

        self.loop.run(go)

    def teardown(self) -> None:
        try:
            self.loop.run(self.host.stop)
        finally:
            self.loop.close()
            shutil.rmtree(self.directory, ignore_errors=True)

    def _ready_ids(self) -> list[int]:
        return sorted(i for i in self.live if i not in self.in_flight)

    @rule(payloads=st.lists(st.binary(max_size=300), min_size=1, max_size=4), many=st.booleans())
    def enqueue(self, payloads: list[bytes], many: bool) -> None:
        async def go() -> list[int]:
            if many:
                return await self.queue.enqueue_many(payloads)
            return [await self.queue.enqueue(p) for p in payloads]

        ids = self.loop.run(go)
        assert ids == sorted(ids) and ids[0] > self.last_id
        self.last_id = ids[-1]
        self.live.update(zip(ids, payloads, strict=True))

    @precondition(lambda self: bool(self._ready_ids()))
    @rule(which=st.integers(0, 1))
    def receive(self, which: int) -> None:
        async def go() -> store.Delivery:
            with trio.fail_after(10):
                return await self.consumers[which].receive()

        delivery = self.loop.run(go)
        expected = self._ready_ids()[0]
        assert delivery.message_id == expected, "FIFO: the smallest ready id comes first"
        assert delivery.payload == self.live[expected]
        self.counts[expected] = self.counts.get(expected, 0) + 1
        assert delivery.delivery_count == self.counts[expected]
        self.in_flight[expected] = which

    @precondition(lambda self: bool(self.in_flight))
    @rule(data=st.data())
    def ack(self, data: st.DataObject) -> None:
        mid = data.draw(st.sampled_from(sorted(self.in_flight)))
        consumer = self.consumers[self.in_flight[mid]]
        self.loop.run(consumer.ack, mid)
        del self.in_flight[mid], self.live[mid]
        self.counts.pop(mid, None)

    @precondition(lambda self: bool(self.in_flight))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        mid = data.draw(st.sampled_from(sorted(self.in_flight)))
        consumer = self.consumers[self.in_flight.pop(mid)]

        async def go() -> None:
            consumer.release(mid)
            await trio.lowlevel.checkpoint()

        self.loop.run(go)

    @rule()
    def compact(self) -> None:
        self.loop.run(self.queue.compact)

    @rule(
        torn=st.one_of(
            st.just(b""),
            # an append cut short: a prefix of a real record (what kill -9 leaves behind)
            st.builds(_torn_record, st.binary(max_size=100), st.integers(1, 131)),
            # zero-filled blocks (power loss on some file systems)
            st.integers(1, 200).map(bytes),
        )
    )
    def crash_and_reopen(self, torn: bytes) -> None:
        self.loop.run(self.host.stop)
        if torn:
            qdir = os.path.join(self.directory, QUEUE)
            last = segment_path(qdir, list_segment_numbers(qdir)[-1])
            with open(last, "ab") as f:
                f.write(torn)
        self.in_flight.clear()
        self.counts.clear()
        self._open()
        report = self.host.broker.recovery_reports[QUEUE]  # type: ignore[union-attr]
        assert report.live_messages == len(self.live)

        async def browse() -> list[tuple[int, bytes]]:
            return [(m.message_id, m.payload) async for m in self.queue.browse()]

        assert self.loop.run(browse) == sorted(self.live.items())

    @invariant()
    def statistics_match(self) -> None:
        if not self.consumers:
            return
        stats = self.queue.statistics()
        assert stats.depth == len(self.live)
        assert stats.in_flight == len(self.in_flight)
        assert stats.ready == len(self.live) - len(self.in_flight)


QueueModel.TestCase.settings = settings(max_examples=100, stateful_step_count=50, deadline=None)
TestQueueModel = QueueModel.TestCase
