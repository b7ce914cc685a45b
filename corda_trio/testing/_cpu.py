"""CPU seconds of a process and its children, from /proc (Linux): what the benchmarks charge a node."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cpu_with_helpers"]


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
