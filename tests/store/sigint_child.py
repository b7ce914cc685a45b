"""Child process of ``test_sigint.py``: 10,000 enqueues in flight at once until SIGINT.

Usage: ``python sigint_child.py DIRECTORY``. Prints ``ready`` once the queue is declared, then one line
``E <id> <n>`` after each ``enqueue`` of message ``n`` returned (it is durable). On Ctrl-C it prints
``interrupted`` and exits with status 130.
"""

from __future__ import annotations

import os
import sys

import trio

from corda_trio import store

QUEUE = "sigint"
IN_FLIGHT = 10_000


def _report(line: str) -> None:
    os.write(1, line.encode())  # one write per fact: whole lines survive the exit


async def main(directory: str) -> None:
    async with store.open_broker(directory) as broker:
        queue = await broker.declare_queue(QUEUE)
        _report("ready\n")

        async def produce(n: int) -> None:
            while True:
                mid = await queue.enqueue(f"{n}".encode())
                _report(f"E {mid} {n}\n")

        async with trio.open_nursery() as nursery:
            for n in range(IN_FLIGHT):
                nursery.start_soon(produce, n)


if __name__ == "__main__":
    try:
        trio.run(main, sys.argv[1])
    except BaseException as exc:  # KeyboardInterrupt, maybe inside the nursery's group
        interrupted = isinstance(exc, KeyboardInterrupt) or (
            isinstance(exc, BaseExceptionGroup) and exc.split(KeyboardInterrupt)[0] is not None
        )
        if not interrupted:
            raise
        _report("interrupted\n")
        sys.exit(130)
