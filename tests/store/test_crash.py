"""A real crash test: a child process enqueues, acks, compacts, deletes and re-declares a queue as fast as
it can and is ``kill -9``-ed at random moments; after each kill, every acknowledged enqueue is recovered
with its exact payload, no acknowledged ack is undone, nothing unknown appears (at most the one
in-flight enqueue of each producer, with the payload it was trying to store), ids keep increasing, and
no message of a deleted queue generation ever comes back.

``CORDA_TRIO_CRASH_ROUNDS`` sets the number of rounds (default 50); ``CRASH_SEED`` the random seed."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio

from corda_trio import store

from .crash_child import CHURN, PRODUCERS, QUEUE, churn_payload, payload_for
from .ledger import whole_lines

ROUNDS = int(os.environ.get("CORDA_TRIO_CRASH_ROUNDS", "50"))
CHILD = Path(__file__).with_name("crash_child.py")
REPO = Path(__file__).resolve().parents[2]


def _run_child(directory: Path, round_no: int, log: Path, rng: random.Random) -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with open(log, "wb") as out:
        child = subprocess.Popen(
            [sys.executable, str(CHILD), str(directory), str(round_no)], stdout=out, env=env
        )
    try:
        if rng.random() < 0.15:
            time.sleep(rng.uniform(0.0, 0.4))  # kill during start-up / recovery too
        else:
            deadline = time.monotonic() + 20
            while b"ready" not in log.read_bytes():
                assert child.poll() is None, f"child exited early with {child.returncode}"
                assert time.monotonic() < deadline, "child did not start"
                time.sleep(0.005)
            time.sleep(rng.uniform(0.005, 0.35))
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()


async def _recovered(directory: Path) -> tuple[dict[int, bytes], dict[int, bytes] | None]:
    """The messages of ``QUEUE``, and of ``CHURN`` (``None``: no such queue)."""
    async with store.open_broker(directory) as broker:
        names = broker.list_queues()
        main: dict[int, bytes] = {}
        if QUEUE in names:
            main = {m.message_id: m.payload async for m in broker.get_queue(QUEUE).browse()}
        if CHURN not in names:
            return main, None
        return main, {m.message_id: m.payload async for m in broker.get_queue(CHURN).browse()}


def _check_churn(
    round_no: int, lines: list[list[str]], churn: dict[int, bytes] | None, deleted: set[str]
) -> None:
    """The churn queue after a kill: only its last generation's messages, all of them if that generation
    was declared and not being deleted; never a message of a generation whose delete returned (over all
    rounds: ``deleted`` accumulates)."""
    current: str | None = None
    deleting = False
    acknowledged: dict[str, dict[int, bytes]] = {}
    for parts in lines:
        if parts[0] == "N":
            current, deleting = parts[1], False
            acknowledged[current] = {}
        elif parts[0] == "C":
            acknowledged[parts[1]][int(parts[2])] = churn_payload(parts[1], int(parts[3]))
        elif parts[0] == "X":
            deleting = True
        elif parts[0] == "Y":
            deleted.add(parts[1])
            current = None
    if churn is None:
        assert current is None or deleting or not acknowledged[current], (
            f"round {round_no}: queue {CHURN} (generation {current}) vanished with acknowledged messages"
        )
        return
    for mid, payload in churn.items():
        generation = payload.split(b":", 2)[0].decode()
        assert generation not in deleted, f"round {round_no}: message {mid} of deleted {generation} is back"
    if current is not None:  # (a delete cut short either happened whole, or not at all)
        missing = {mid for mid, payload in acknowledged[current].items() if churn.get(mid) != payload}
        assert not missing, f"round {round_no}: generation {current} lost {sorted(missing)[:10]}"
    ids = sorted(churn)
    assert ids == sorted(set(ids))


@pytest.mark.crash
@pytest.mark.slow
async def test_kill_9_at_random_moments_loses_nothing_acknowledged(tmp_path: Path) -> None:
    rng = random.Random(os.environ.get("CRASH_SEED", "corda-trio"))
    directory = tmp_path / "broker"
    known: dict[int, bytes] = {}  # every id known to exist at some point, with its payload
    acked: set[int] = set()
    max_id = -1
    total_enqueued = total_acked = churn_rounds = 0
    deleted_generations: set[str] = set()
    for round_no in range(ROUNDS):
        log = tmp_path / f"round-{round_no}.log"
        await trio.to_thread.run_sync(_run_child, directory, round_no, log, rng)
        last_seq: dict[int, int] = {}
        acking: int | None = None  # the ack the consumer was making when killed (its result unknown)
        for line in whole_lines(log):
            parts = line.split()
            if parts[0] not in "EDA":
                continue  # the churn queue's lines: checked by _check_churn
            if parts[0] == "E":
                mid, r, p, seq = map(int, parts[1:])
                assert r == round_no and mid not in known, line
                known[mid] = payload_for(r, p, seq)
                last_seq[p] = seq
                total_enqueued += 1
            elif parts[0] == "D":
                acking = int(parts[1])
            elif parts[0] == "A":
                acked.add(int(parts[1]))
                total_acked += 1
                acking = None
        recovered, churn = await _recovered(directory)
        lines = [line.split() for line in whole_lines(log)]
        _check_churn(round_no, lines, churn, deleted_generations)
        churn_rounds += churn is not None
        for mid in acked:
            assert mid not in recovered, f"round {round_no}: acked message {mid} came back"
        if acking is not None and acking not in recovered:
            acked.add(acking)  # the ack reached the disk, its report did not
        expected_live = {mid for mid in known if mid not in acked}
        missing = expected_live - recovered.keys()
        assert not missing, f"round {round_no}: acknowledged enqueues lost: {sorted(missing)[:10]}"
        for mid in expected_live:
            assert recovered[mid] == known[mid], f"round {round_no}: payload of {mid} differs"
        # Anything else must be the single in-flight enqueue of some producer in this round.
        extra = {mid: payload for mid, payload in recovered.items() if mid not in known}
        seen_producers = set()
        for mid, payload in extra.items():
            r, p, seq = (int(x) for x in payload.split(b":", 3)[:3])
            assert r == round_no and 0 <= p < PRODUCERS, f"unknown message {mid}: {payload[:40]!r}"
            assert seq == last_seq.get(p, -1) + 1 and p not in seen_producers, f"unknown message {mid}"
            assert payload == payload_for(r, p, seq)
            seen_producers.add(p)
            known[mid] = payload
        assert all(mid > max_id for mid in extra), "ids must keep increasing"
        if known:
            max_id = max(max_id, max(known))
    assert total_enqueued > 1000 and total_acked > 100, (total_enqueued, total_acked)
    assert deleted_generations and churn_rounds, (len(deleted_generations), churn_rounds)
