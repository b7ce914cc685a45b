"""CPU seconds of a process and its children, from /proc (Linux): what the benchmarks charge a node; how
busy the whole machine was meanwhile; and how fast its CPU ran Python that day."""

from __future__ import annotations

import os
import struct
import time
from pathlib import Path

__all__ = ["MachineCpu", "cpu_with_helpers", "load_average", "reference_cpu_ms"]


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_with_helpers(pid: int) -> float:
    """CPU seconds of process ``pid`` and its children (the store's commit helper), from /proc (Linux)."""
    total = _cpu_seconds(pid)
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            children = [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
        for child in children:
            try:
                total += _cpu_seconds(child)
            except OSError:
                pass
    return total


class MachineCpu:
    """The whole machine's CPU time since boot, by state (``/proc/stat``, Linux), to tell how much of a
    benchmark's window the machine really had: on a virtual machine the hypervisor *steals* time for other
    guests, and a figure measured while a core's worth is stolen is not comparable with one measured on a
    quiet host.

    ``MachineCpu()`` takes a snapshot; ``later.since(earlier)`` gives the mean number of cores busy, idle
    and stolen in between."""

    __slots__ = ("busy", "idle", "steal")

    def __init__(self) -> None:
        with open("/proc/stat") as f:
            # cpu  user nice system idle iowait irq softirq steal guest guest_nice (USER_HZ ticks)
            ticks = [int(x) for x in f.readline().split()[1:9]]
        user, nice, system, idle, iowait, irq, softirq, steal = ticks
        self.busy = user + nice + system + irq + softirq
        self.idle = idle + iowait
        self.steal = steal

    def since(self, earlier: MachineCpu) -> dict[str, float]:
        """``busy_cores``, ``idle_cores`` and ``steal_cores``: means over the time since ``earlier``."""
        deltas = (self.busy - earlier.busy, self.idle - earlier.idle, self.steal - earlier.steal)
        total = sum(deltas)
        cpus = os.cpu_count() or 1
        if total <= 0:
            return {"busy_cores": 0.0, "idle_cores": float(cpus), "steal_cores": 0.0}
        busy, idle, steal = (round(d / total * cpus, 2) for d in deltas)
        return {"busy_cores": busy, "idle_cores": idle, "steal_cores": steal}


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages, rounded to hundredths."""
    return [round(x, 2) for x in os.getloadavg()]


class _Slot:
    __slots__ = ("n",)

    def __init__(self, n: int) -> None:
        self.n = n


def _reference_workload() -> int:
    """A fixed mix of what the node's hot paths do in Python: calls, attribute and dict access, small bytes
    joins, struct packing. The same work on every machine and every day."""
    pack = struct.Struct(">IBBH").pack
    table: dict[str, int] = {}
    total = 0
    for i in range(100_000):
        obj = _Slot(i)
        key = f"k{i & 1023}"
        table[key] = table.get(key, 0) + obj.n
        frame = b"".join((pack(i, 2, 0, i & 0xFFFF), key.encode(), b"\x00S"))
        total += len(frame)
    return total


def reference_cpu_ms(repeats: int = 3) -> float:
    """CPU milliseconds this process takes for a fixed pure-Python workload (best of ``repeats``).

    A hypervisor can run a virtual CPU slower on one day than on another without reporting it as stolen
    time (a busy sibling hyper-thread, a lower clock): the benchmarks print this figure beside theirs, so that
    throughputs and CPU per message from different days are compared for what they are. Lower is faster.
    """
    best = float("inf")
    for _ in range(max(1, repeats)):
        start = time.process_time()
        _reference_workload()
        best = min(best, time.process_time() - start)
    return round(best * 1e3, 1)
