"""The WAL benchmark runs end to end and reports comparable records (a smoke test: no timing asserted)."""

from __future__ import annotations

from pathlib import Path

from bench import wal


def test_wal_benchmark_reports_paired_runs_and_summaries(tmp_path: Path) -> None:
    records = wal.run_wal_benchmark(directory=str(tmp_path), total=wal.PRODUCERS * wal.SLICES * 2,
                                    repeats=1, recovery_messages=500)  # fmt: skip
    by_variant = {(r["variant"], r["run"]): r for r in records}
    queue = by_variant[("queue-256", 0)]
    encoded = by_variant[("raw-loop-encoded", 0)]
    bare = by_variant[("raw-loop", 0)]
    # (a) ran between the slices of (b), the same number of records, at (b)'s records per fsync
    assert encoded["slices"] == bare["slices"] == queue["slices"] == wal.SLICES
    assert encoded["records"] == bare["records"] == queue["records"] == wal.PRODUCERS * wal.SLICES * 2
    assert encoded["records_per_fsync"] >= 1 and queue["fsyncs"] >= 1
    assert queue["ratio_to_raw_encoded"] == queue["records_per_second"] / encoded["records_per_second"]
    assert 0.0 <= queue["serial_bound"] <= 1.0
    # the 1 KiB run against its reference on threads, in the same run; the helper's CPU is accounted
    one_k, threads = by_variant[("queue-1k", 0)], by_variant[("queue-1k-threads", 0)]
    assert one_k["ratio_to_threads"] == one_k["records_per_second"] / threads["records_per_second"]
    assert one_k["helper_cpu_microseconds_per_record"] is not None
    assert threads["helper_cpu_microseconds_per_record"] is None
    assert one_k["records"] == threads["records"] == wal.PRODUCERS * wal.SLICES * 2
    summary = by_variant[("queue-256", "median")]
    assert summary["meets_target"] == (summary["ratio_to_raw_encoded"] >= 0.5)
    recovery = by_variant[("recovery-500", 0)]
    assert recovery["messages"] == 500 and recovery["seconds"] > 0
    assert not list(tmp_path.iterdir())  # everything it wrote is gone


def test_producer_sweep_pairs_the_commit_process_with_threads(tmp_path: Path) -> None:
    records = wal.run_producer_sweep(directory=str(tmp_path), producers=(1, 3), repeats=1)
    runs = {(r["producers"], r["commit"]): r for r in records if r["run"] == 0}
    assert set(runs) == {(1, "process"), (1, "threads"), (3, "process"), (3, "threads")}
    assert all(r["records"] == min(64_000, 2_000 * p) // p * p for (p, _c), r in runs.items())
    assert runs[(1, "process")]["records_per_fsync"] == 1.0  # one producer: a batch per enqueue
    medians = [r for r in records if r["run"] == "median"]
    assert len(medians) == 4 and all(r["records_per_second"] > 0 for r in medians)
    assert not list(tmp_path.iterdir())
