"""Ctrl-C with 10,000 commits in flight: the process exits promptly (status 130), every waiter is woken,
the commit helper is reaped, and every enqueue that reported success is on disk.

``CORDA_TRIO_SIGINT_RUNS`` sets the number of runs (default 25, each interrupted at a random moment).
"""

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

from .sigint_child import QUEUE

RUNS = int(os.environ.get("CORDA_TRIO_SIGINT_RUNS", "25"))
CHILD = Path(__file__).with_name("sigint_child.py")
REPO = Path(__file__).resolve().parents[2]
EXIT_SECONDS = 5.0


def _interrupt_child(directory: Path, log: Path, delay: float) -> tuple[int, float]:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with open(log, "wb") as out, open(log.with_suffix(".err"), "wb") as err:
        child = subprocess.Popen(
            [sys.executable, str(CHILD), str(directory)], stdout=out, stderr=err, env=env
        )
    try:
        deadline = time.monotonic() + 60
        while b"E " not in log.read_bytes():  # commits are flowing
            assert child.poll() is None, f"child exited early with {child.returncode}"
            assert time.monotonic() < deadline, "child did not start committing"
            time.sleep(0.01)
        time.sleep(delay)
        child.send_signal(signal.SIGINT)
        sent = time.monotonic()
        try:
            status = child.wait(timeout=60)
        except subprocess.TimeoutExpired:
            status = None
        return (-1 if status is None else status), time.monotonic() - sent
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


async def _stored(directory: Path) -> dict[int, bytes]:
    async with store.open_broker(directory) as broker:
        return {m.message_id: m.payload async for m in broker.get_queue(QUEUE).browse()}


@pytest.mark.slow
async def test_sigint_with_10000_commits_in_flight_exits_promptly_and_keeps_what_succeeded(
    tmp_path: Path,
) -> None:
    rng = random.Random(os.environ.get("CRASH_SEED", "corda-trio-sigint"))
    slow = []
    for run in range(RUNS):
        directory = tmp_path / f"broker-{run}"
        log = tmp_path / f"run-{run}.log"
        status, seconds = await trio.to_thread.run_sync(
            _interrupt_child, directory, log, rng.uniform(0.0, 0.3)
        )
        lines = log.read_bytes().decode().splitlines()
        errors = log.with_suffix(".err").read_text(errors="replace")[-3000:]
        assert status == 130, f"run {run}: exit status {status} after {seconds:.1f} s:\n{errors}"
        assert lines[-1] == "interrupted", f"run {run}: last line {lines[-1]!r}"
        if seconds > EXIT_SECONDS:
            slow.append((run, seconds))
        acknowledged = {}
        for line in lines:
            if line.startswith("E "):
                _e, mid, n = line.split()
                acknowledged[int(mid)] = n.encode()
        assert acknowledged, f"run {run}: nothing was committed"
        stored = await _stored(directory)
        lost = [mid for mid in acknowledged if stored.get(mid) != acknowledged[mid]]
        assert not lost, f"run {run}: {len(lost)} acknowledged enqueues not on disk, e.g. {lost[:5]}"
    assert not slow, f"runs that took longer than {EXIT_SECONDS} s to exit: {slow}"
