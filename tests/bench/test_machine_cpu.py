"""corda_trio.testing.MachineCpu and reference_cpu_ms: the machine's CPU time by state and how fast its CPU
runs Python, as the benchmarks report them."""

from __future__ import annotations

import os
import time

from corda_trio.testing import MachineCpu, load_average, reference_cpu_ms
from corda_trio.testing._cpu import _reference_workload


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


def test_the_reference_workload_is_the_same_work_every_time() -> None:
    assert _reference_workload() == _reference_workload() > 0


def test_reference_cpu_ms_is_the_best_of_its_repeats_in_cpu_milliseconds() -> None:
    start = time.process_time()
    ms = reference_cpu_ms(repeats=3)
    spent_ms = (time.process_time() - start) * 1e3
    assert ms > 0 and round(ms, 1) == ms
    # three runs of the workload took at least three times the best one (give or take the rounding)
    assert spent_ms >= 3 * ms - 1
