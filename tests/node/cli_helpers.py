"""Running the ``corda-trio`` console script as a real process in tests."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable

import trio

# The console script's entry point (pyproject.toml): its early SIGTERM handler, then the command line.
CLI = [sys.executable, "-c", "import sys; from corda_trio.__main__ import main; sys.exit(main())"]


def run_cli(*args: str, timeout: float = 120, cwd: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``corda-trio ARGS`` to completion."""
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd)


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, start time) of ``pid``, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return fields[0], int(fields[1]), int(fields[19])


def descendants(pid: int) -> dict[int, int]:
    """Live descendants of ``pid`` (any session: the store's commit helper has its own), pid -> start time."""
    stats = {int(e): st for e in os.listdir("/proc") if e.isdigit() and (st := _stat(int(e))) is not None}
    found: dict[int, int] = {}
    frontier = [pid]
    while frontier:
        parent = frontier.pop()
        for child, (state, ppid, started) in stats.items():
            if ppid == parent and state != "Z" and child not in found:
                found[child] = started
                frontier.append(child)
    return found


def still_running(snapshot: dict[int, int]) -> set[int]:
    """Which processes of a :func:`descendants` snapshot still run (same pid and start time)."""
    left = set()
    for pid, started in snapshot.items():
        st = _stat(pid)
        if st is not None and st[0] != "Z" and st[2] == started:
            left.add(pid)
    return left


def still_running_after(snapshot: dict[int, int], timeout: float) -> set[int]:
    """:func:`still_running`, once none is left or ``timeout`` seconds have passed: a process sent SIGKILL
    is not gone at once (the kernel still frees its memory: a JVM's takes a while on a busy machine)."""
    deadline = time.monotonic() + timeout
    while (left := still_running(snapshot)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def wait_for(
    condition: Callable[[], bool], proc: subprocess.Popen[str], *, what: str, timeout: float = 60
) -> None:
    """Wait until ``condition()`` holds while ``proc`` runs (a real process: real time, bounded)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            _, err = proc.communicate()
            raise AssertionError(f"the command exited ({proc.returncode}) before {what}: {err}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} after {timeout} s")
        time.sleep(0.05)


async def read_past(stream: trio.abc.ReceiveStream, text: str, *, then: float = 1) -> str:
    """What ``stream`` (a process's stderr, say) says until ``text`` appears, and for ``then`` seconds more
    (to see a line said once and not again); fails if it ends first or 30 s pass."""
    said = b""
    with trio.fail_after(30):
        while text.encode() not in said:
            chunk = await stream.receive_some(4096)
            assert chunk, said
            said += chunk
    with trio.move_on_after(then):
        while chunk := await stream.receive_some(4096):
            said += chunk
    return said.decode()
