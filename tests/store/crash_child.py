"""Child process of ``test_crash.py``: enqueue and consume as fast as possible until killed.

Usage: ``python crash_child.py DIRECTORY ROUND``. Every line written to stdout is one fact that was
true before the line was written: ``E <id> <round> <producer> <seq>`` after ``enqueue`` returned (the
message is durable), ``D <id>`` before ``ack`` is called and ``A <id>`` after it returned (the removal is
durable).

Beside that, a churn task deletes and re-declares queue ``CHURN`` over and over while a compaction task
compacts both queues: ``N <generation>`` after ``declare_queue`` returned, ``C <generation> <id> <seq>``
after an enqueue to it returned, ``X <generation>`` before ``delete_queue`` and ``Y <generation>`` after
it returned. A generation is ``<round>.<k>``, unique over the whole test.
"""

from __future__ import annotations

import os
import random
import sys

import trio

from corda_trio import store

QUEUE = "p2p.inbound.DLcrash"
CHURN = "p2p.inbound.DLchurn"
PRODUCERS = 16


def payload_for(round_no: int, producer: int, seq: int) -> bytes:
    """Deterministic payload, so that the parent can check content as well as ids."""
    head = f"{round_no}:{producer}:{seq}:".encode()
    return head + bytes((round_no * 31 + producer * 7 + seq) % 251 for _ in range(seq % 300))


def churn_payload(generation: str, seq: int) -> bytes:
    return f"{generation}:{seq}:".encode() + b"c" * (seq * 37 % 500)


async def main(directory: str, round_no: int) -> None:
    out = sys.stdout.buffer.raw if hasattr(sys.stdout.buffer, "raw") else sys.stdout.buffer

    def report(line: str) -> None:
        os.write(out.fileno(), line.encode())  # one write per fact: whole lines survive kill -9

    config = store.BrokerConfig(segment_bytes=64 * 1024, compact_live_ratio=0.5)
    async with store.open_broker(directory, config=config) as broker:
        queue = await broker.declare_queue(QUEUE)
        report("ready\n")

        async def produce(p: int) -> None:
            seq = 0
            while True:
                mid = await queue.enqueue(payload_for(round_no, p, seq))
                report(f"E {mid} {round_no} {p} {seq}\n")
                seq += 1

        async def consume() -> None:
            async with queue.consumer(credit=32) as consumer:
                while True:
                    delivery = await consumer.receive()
                    if random.random() < 0.6:
                        report(f"D {delivery.message_id}\n")  # about to ack
                        await consumer.ack(delivery.message_id)
                        report(f"A {delivery.message_id}\n")
                    else:
                        consumer.release(delivery.message_id)

        async def churn() -> None:
            for k in range(1_000_000):
                generation = f"{round_no}.{k}"
                queue = await broker.declare_queue(CHURN)
                report(f"N {generation}\n")
                for seq in range(random.randrange(1, 40)):
                    mid = await queue.enqueue(churn_payload(generation, seq))
                    report(f"C {generation} {mid} {seq}\n")
                report(f"X {generation}\n")
                await broker.delete_queue(CHURN)
                report(f"Y {generation}\n")

        async def compact() -> None:
            while True:
                await trio.sleep(random.uniform(0.0, 0.03))
                for name in (QUEUE, CHURN):
                    try:
                        await broker.get_queue(name).compact()
                    except (store.QueueNotFoundError, store.StoreClosedError):
                        pass  # the churn queue is being deleted: the documented outcome

        async with trio.open_nursery() as nursery:
            for p in range(PRODUCERS):
                nursery.start_soon(produce, p)
            nursery.start_soon(consume)
            nursery.start_soon(churn)
            nursery.start_soon(compact)


if __name__ == "__main__":
    trio.run(main, sys.argv[1], int(sys.argv[2]))
