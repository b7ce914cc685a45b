"""corda_trio.testing.MachineCpu: the machine's CPU time by state, as the benchmarks report it."""

from __future__ import annotations

import os
import time

from corda_trio.testing import MachineCpu, load_average


def test_a_busy_interval_shows_busy_cores_and_the_states_add_up_to_the_cpus() -> None:
    start, before = time.monotonic(), MachineCpu()
    deadline = time.thread_time() + 0.3
    while time.thread_time() < deadline:  # this thread alone is busy for 0.3 s of CPU
        pass
    means = MachineCpu().since(before)
    wall = time.monotonic() - start
    cpus = os.cpu_count() or 1
    assert set(means) == {"busy_cores", "idle_cores", "steal_cores"}
    # at least this thread's 0.3 s of CPU, give or take the kernel's clock ticks (whatever else ran adds)
    assert 0.2 <= means["busy_cores"] * wall and means["busy_cores"] <= cpus
    assert 0 <= means["steal_cores"] <= cpus and 0 <= means["idle_cores"] <= cpus
    assert abs(sum(means.values()) - cpus) <= 0.05  # (each is rounded to hundredths)


def test_no_time_between_two_snapshots_is_all_idle_not_a_division_by_zero() -> None:
    snap = MachineCpu()
    idle = float(os.cpu_count() or 1)
    assert snap.since(snap) == {"busy_cores": 0.0, "idle_cores": idle, "steal_cores": 0.0}


def test_load_average_is_three_rounded_figures() -> None:
    load = load_average()
    assert len(load) == 3 and all(x >= 0 and round(x, 2) == x for x in load)
