"""Child process of ``test_crash.py``: enqueue and consume as fast as possible until killed.

Usage: ``python crash_child.py DIRECTORY ROUND``. Every line written to stdout is one fact that was
true before the line was written: ``E <id> <round> <producer> <seq>`` after ``enqueue`` returned (the
message is durable), ``D <id>`` before ``ack`` is called and ``A <id>`` after it returned (the removal is
durable).
"""

from __future__ import annotations

import os
import random
import sys

import trio

from corda_trio import store

QUEUE = "p2p.inbound.DLcrash"
PRODUCERS = 16


def payload_for(round_no: int, producer: int, seq: int) -> bytes:
    """Deterministic payload, so that the parent can check content as well as ids."""
    head = f"{round_no}:{producer}:{seq}:".encode()
    return head + bytes((round_no * 31 + producer * 7 + seq) % 251 for _ in range(seq % 300))


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

        async with trio.open_nursery() as nursery:
            for p in range(PRODUCERS):
                nursery.start_soon(produce, p)
            nursery.start_soon(consume)


if __name__ == "__main__":
    trio.run(main, sys.argv[1], int(sys.argv[2]))
