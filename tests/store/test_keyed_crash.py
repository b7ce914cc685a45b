"""``kill -9`` against a keyed log with atomic multi-key writes and compaction: after each restart every
writer's keys hold exactly the state of its last acknowledged write, or of the one it had in flight
(never a mix: writes are atomic; never older: they are durable; never a removed key back).

``CORDA_TRIO_KEYED_CRASH_ROUNDS`` sets the number of rounds (default 30); ``CRASH_SEED`` the seed."""

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

from .keyed_crash_child import KEYS, LOG, WRITERS, key, state_after
from .ledger import whole_lines

ROUNDS = int(os.environ.get("CORDA_TRIO_KEYED_CRASH_ROUNDS", "30"))
CHILD = Path(__file__).with_name("keyed_crash_child.py")
REPO = Path(__file__).resolve().parents[2]


def _run_child(directory: Path, round_no: int, log: Path, rng: random.Random) -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with open(log, "wb") as out:
        child = subprocess.Popen(
            [sys.executable, str(CHILD), str(directory), str(round_no)], stdout=out, env=env
        )
    try:
        if rng.random() < 0.15:
            time.sleep(rng.uniform(0.0, 0.4))  # during start-up and recovery too
        else:
            deadline = time.monotonic() + 30
            while b"ready" not in log.read_bytes():
                assert child.poll() is None, f"child exited early with {child.returncode}"
                assert time.monotonic() < deadline, "child did not start"
                time.sleep(0.005)
            time.sleep(rng.uniform(0.005, 0.4))
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()


async def _recovered(directory: Path) -> dict[bytes, bytes]:
    async with store.open_broker(directory) as broker:
        return dict((await broker.open_keyed_log(LOG)).items())


@pytest.mark.crash
@pytest.mark.slow
async def test_kill_9_keyed_log_keeps_every_acknowledged_write_whole(tmp_path: Path) -> None:
    rng = random.Random(os.environ.get("CRASH_SEED", "corda-trio-keyed"))
    directory = tmp_path / "broker"
    current: dict[int, dict[bytes, bytes]] = {t: {} for t in range(WRITERS)}
    acknowledged = 0
    for round_no in range(ROUNDS):
        log = tmp_path / f"round-{round_no}.log"
        await trio.to_thread.run_sync(_run_child, directory, round_no, log, rng)
        last_done: dict[int, int] = {}
        started: dict[int, int] = {}
        for line in whole_lines(log):
            parts = line.split()
            if parts[0] == "W":
                last_done[int(parts[1])] = int(parts[2])
                acknowledged += 1
            elif parts[0] == "S":
                started[int(parts[1])] = int(parts[2])
        recovered = await _recovered(directory)
        for t in range(WRITERS):
            mine = {k: v for k, v in recovered.items() if k in {key(t, i) for i in range(KEYS)}}
            allowed = [state_after(t, last_done[t])] if t in last_done else [current[t]]
            if t in started and started[t] != last_done.get(t):
                allowed.append(state_after(t, started[t]))  # the write in flight: all or nothing
            assert mine in allowed, f"round {round_no}, writer {t}: {sorted(mine)} is not an allowed state"
            current[t] = mine
        assert set(recovered) <= {key(t, i) for t in range(WRITERS) for i in range(KEYS)}
    assert acknowledged > 200, acknowledged
