"""Every piece of the store's commit machinery runs with Ctrl-C protection.

Trio raises ``KeyboardInterrupt`` wherever unprotected code happens to run when SIGINT arrives. Inside the
store's books (the commit helper's reply dispatch, the group-commit writer, settlement, compaction) that
would leave them half-updated: a job counted but never settled, a batch published but its waiters never
woken, and the broker's clean-up would then wait forever for it. Protected code lets Trio deliver the
interrupt to the main task at its next checkpoint instead.

This test watches every call into the store's internal modules while a broker (with its commit helper
process) enqueues, receives, acks, compacts, deletes and closes, and checks that each call ran protected.
``test_sigint.py`` is the end-to-end check with real signals.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import FrameType

import trio

from corda_trio import store

STORE = Path(store.__file__).parent
# The modules whose code only the store itself calls (the public methods that lead there are protected).
INTERNAL = {str(STORE / name) for name in ("_committer.py", "_wal.py", "_compaction.py", "_keyed.py")}


async def test_commit_machinery_runs_protected_from_keyboard_interrupt(tmp_path: Path) -> None:
    unprotected: set[str] = set()
    calls = 0

    def watch(frame: FrameType, event: str, _arg: object) -> None:
        nonlocal calls
        if event == "call" and frame.f_code.co_filename in INTERNAL:
            calls += 1
            if not trio.lowlevel.currently_ki_protected():
                unprotected.add(f"{Path(frame.f_code.co_filename).name}:{frame.f_code.co_qualname}")

    config = store.BrokerConfig(segment_bytes=64 * 1024)
    sys.setprofile(watch)
    try:
        async with store.open_broker(tmp_path / "broker", config=config) as broker:
            queue = await broker.declare_queue("q")
            async with trio.open_nursery() as nursery:
                for n in range(50):
                    nursery.start_soon(queue.enqueue, bytes(2000) + str(n).encode())
            async with queue.consumer(credit=100) as consumer:
                for _ in range(50):
                    try:
                        delivery = consumer.receive_nowait()  # in memory: taken without a checkpoint
                    except trio.WouldBlock:
                        delivery = await consumer.receive()
                    await consumer.ack(delivery.message_id)
            await queue.compact()
            keyed = await broker.open_keyed_log("k")
            await keyed.put(b"a", b"1")
            await keyed.delete(b"a")
            await keyed.compact()
            await broker.delete_queue("q")
    finally:
        sys.setprofile(None)
    assert calls > 100  # the watch saw the machinery run
    assert not unprotected, f"store internals that a Ctrl-C could interrupt half-way: {sorted(unprotected)}"
