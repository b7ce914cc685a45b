"""The ``wal`` scenario: durable enqueues into real ``corda_trio.store`` queues, and their delivery.

Each operation enqueues one message of ``size_bytes`` into one of the broker's durable queues (links
``bench.wal.0`` ...) through the public API, ``Queue.enqueue``, which returns once the message is on disk
(group commit + ``fdatasync`` with ``fsync=always``). A consumer per queue receives and acks.

Stages: *enqueued* = ``enqueue`` returned (the message is durable); *delivered* = the queue's consumer
received it (acks are batched, one group commit per batch, by a second task; their cost is part of the
load, not of the latency). With ``consume=false``
there is no consumer and an operation ends when it is durable.

Parameters: ``queues`` (default: ``peers`` or 1), ``fsync`` (``always`` | ``none``; default always),
``consume`` (default true), ``credit`` (consumer prefetch, default 256). Use a closed loop with high
concurrency (``--closed --concurrency 64``) to see group commit batch many appenders per fsync.
"""

from __future__ import annotations

import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Final, final

import attrs
import trio

from corda_trio import store

from ._harness import BenchError, Operation, ScenarioContext

__all__ = ["WalScenario"]

_SEQ: Final = struct.Struct(">Q")


@attrs.define(eq=False)
class _WalSession:
    queues: dict[str, store.Queue]
    payload: bytes
    consume: bool
    waiting: dict[int, tuple[Operation, trio.Event]] = attrs.field(factory=dict)

    @property
    def links(self) -> list[str]:
        return list(self.queues)

    async def run(self, op: Operation) -> None:
        if op.size_bytes > len(self.payload):
            raise BenchError(f"size {op.size_bytes} exceeds the scenario's largest size")
        done = trio.Event()
        if self.consume:
            self.waiting[op.seq] = (op, done)
        try:
            await self.queues[op.link].enqueue(self.payload[: op.size_bytes], headers=_SEQ.pack(op.seq))
            op.mark("enqueued")
            if self.consume:
                await done.wait()
        finally:
            self.waiting.pop(op.seq, None)


async def _consume(queue: store.Queue, session: _WalSession, credit: int) -> None:
    """Receive and stamp deliveries; a second task acks what arrived meanwhile in one group commit."""
    to_ack: list[int] = []
    wake = trio.Event()
    async with queue.consumer(credit=credit) as consumer:

        async def acker() -> None:
            nonlocal wake
            while True:
                await wake.wait()
                wake = trio.Event()
                batch = to_ack[:]
                del to_ack[:]
                await consumer.ack_many(batch)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(acker)
            while True:
                delivery = await consumer.receive()
                entry = session.waiting.get(_SEQ.unpack(delivery.headers)[0])
                if entry is not None:
                    entry[0].mark("delivered")
                    entry[1].set()
                to_ack.append(delivery.message_id)
                wake.set()


@final
class WalScenario:
    """Durable enqueue (and delivery) through ``corda_trio.store`` (see the module docstring)."""

    name = "wal"
    description = (
        "durable enqueue into corda_trio.store WAL queues (group commit + fdatasync), delivery to a consumer"
    )
    parameters: Final = {
        "queues": "number of durable queues, one link each (default: peers, or 1)",
        "peers": "same as queues",
        "fsync": "always (durable, default) | none (page cache only; benchmarks only)",
        "consume": "true (default): a consumer receives and acks; false: measure enqueue only",
        "credit": "consumer prefetch (default 256)",
    }
    choices: Final = {"fsync": ("always", "none")}  # checked by the harness before the run

    @asynccontextmanager
    async def open(self, ctx: ScenarioContext) -> AsyncIterator[_WalSession]:
        count = ctx.param("queues", ctx.param("peers", 1))
        fsync = ctx.param("fsync", "always")
        consume = ctx.param("consume", True)
        credit = ctx.param("credit", 256)
        if count < 1 or credit < 1:
            raise BenchError("wal: queues and credit must be at least 1")
        payload = bytes(range(256)) * (max(ctx.config.sizes.sizes) // 256 + 1)
        async with store.open_broker(ctx.scratch_dir / "broker") as broker:
            queues = {}
            for i in range(count):
                name = f"bench.wal.{i}"
                queues[name] = await broker.declare_queue(name, fsync=fsync)
            session = _WalSession(queues=queues, payload=payload, consume=consume)
            async with trio.open_nursery() as nursery:
                if consume:
                    for queue in queues.values():
                        nursery.start_soon(_consume, queue, session, credit)
                try:
                    yield session
                finally:
                    nursery.cancel_scope.cancel()
