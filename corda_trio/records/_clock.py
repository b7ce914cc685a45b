"""Record timestamps: Unix-epoch nanoseconds with monotonic resolution.

:class:`Clock` reads ``time.perf_counter_ns()`` shifted by an anchor taken once from ``time.time_ns()``.
Within a process it is monotonic; across processes on one machine the clocks agree to within the wall
clock's error (they are epoch nanoseconds), which a run with sender and receiver in two processes needs.
:class:`TrioClock` reads Trio's clock instead, so tests can run a benchmark under ``MockClock``.
"""

from __future__ import annotations

import time
from typing import final

import trio

__all__ = ["BenchClock", "Clock", "TrioClock"]


@final
class Clock:
    """Epoch nanoseconds with monotonic resolution: ``perf_counter_ns()`` shifted by a wall-clock anchor."""

    __slots__ = ("_offset_ns",)

    def __init__(self) -> None:
        self._offset_ns = time.time_ns() - time.perf_counter_ns()

    def now_ns(self) -> int:
        """Current time in Unix-epoch nanoseconds (monotonic within this clock)."""
        return time.perf_counter_ns() + self._offset_ns

    def to_trio_time(self, epoch_ns: int) -> float:
        """The ``trio.current_time()`` value at which this clock reads ``epoch_ns`` (for ``sleep_until``)."""
        return trio.current_time() + (epoch_ns - self.now_ns()) / 1e9


@final
class TrioClock:
    """Epoch nanoseconds read from Trio's clock (create it inside ``trio.run``; float-second resolution)."""

    __slots__ = ("_anchor_ns",)

    def __init__(self) -> None:
        self._anchor_ns = time.time_ns() - round(trio.current_time() * 1e9)

    def now_ns(self) -> int:
        """Current Trio time as Unix-epoch nanoseconds."""
        return self._anchor_ns + round(trio.current_time() * 1e9)

    def to_trio_time(self, epoch_ns: int) -> float:
        """The Trio time at which this clock reads ``epoch_ns``."""
        return (epoch_ns - self._anchor_ns) / 1e9


BenchClock = Clock | TrioClock
