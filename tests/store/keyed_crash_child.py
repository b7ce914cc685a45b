"""Child process of ``test_keyed_crash.py``: atomic multi-key writes to a keyed log until killed.

Usage: ``python keyed_crash_child.py DIRECTORY ROUND``. Writer ``t`` owns keys ``t:0`` .. ``t:4``; its
step ``s`` is one ``write`` that leaves exactly :func:`state_after` ``(t, s)`` in them (puts and deletes
together). ``S <t> <s>`` is printed before the write starts and ``W <t> <s>`` after it returned (durable).
A compaction task compacts the log meanwhile.
"""

from __future__ import annotations

import os
import random
import sys

import trio

from corda_trio import store

LOG = "checkpoints"
WRITERS = 8
KEYS = 5


def key(t: int, i: int) -> bytes:
    return b"%d:%d" % (t, i)


def state_after(t: int, s: int) -> dict[bytes, bytes]:
    """What writer ``t``'s keys hold after its step ``s``: some keys, each with a value naming ``s``."""
    return {
        key(t, i): b"%d/%d/" % (t, s) + b"v" * ((s * 31 + i * 7) % 900)
        for i in range(KEYS)
        if (t * 7 + s * 13 + i * 5) % 3 != 0
    }


async def main(directory: str, round_no: int) -> None:
    def report(line: str) -> None:
        os.write(1, line.encode())

    config = store.BrokerConfig(segment_bytes=32 * 1024, compact_live_ratio=0.5)
    async with store.open_broker(directory, config=config) as broker:
        log = await broker.open_keyed_log(LOG)
        report("ready\n")

        async def writer(t: int) -> None:
            for s in range(round_no * 1_000_000, (round_no + 1) * 1_000_000):
                state = state_after(t, s)
                deletes = [key(t, i) for i in range(KEYS) if key(t, i) not in state]
                report(f"S {t} {s}\n")
                await log.write(list(state.items()), deletes)
                report(f"W {t} {s}\n")

        async def compact() -> None:
            while True:
                await trio.sleep(random.uniform(0.0, 0.05))
                await log.compact()

        async with trio.open_nursery() as nursery:
            for t in range(WRITERS):
                nursery.start_soon(writer, t)
            nursery.start_soon(compact)


if __name__ == "__main__":
    trio.run(main, sys.argv[1], int(sys.argv[2]))
