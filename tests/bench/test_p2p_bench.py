"""bench/p2p.py end to end, small: two real node processes, every message checked, one JSON last line, and
records that ``corda-trio report`` reads."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from corda_trio.records import read_records

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("rate", [None, 300.0], ids=["half-of-max", "fixed-rate"])
def test_p2p_bench_runs_small_and_prints_one_json_line(tmp_path: Path, rate: float | None) -> None:
    records = tmp_path / "records"
    small = ["--messages", "600", "--senders", "8", "--half-seconds", "0.5", "--records", str(records)]
    if rate is not None:  # phase 2 at a given offered load
        small += ["--rate", str(rate)]
    out = subprocess.run(
        [sys.executable, "-m", "bench.p2p", *small],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["scenario"] == "p2p" and summary["messages"] == 600
    if rate is not None:
        assert summary["half_rate_msgs_per_s"] == rate and summary["half_messages"] == 150
    assert summary["msgs_per_s"] > 0 and 0 < summary["p50_ms"] <= summary["p99_ms"] <= summary["max_ms"]
    for key in ("cpu_us_per_msg_sender_phase1", "cpu_us_per_msg_sender_half", "cpu_us_per_msg_receiver_half"):
        assert summary[key] > 0, key
    # how much of the machine the run had: the mean cores stolen by a hypervisor, busy at half load
    cpus = summary["cpus"]
    assert 0 <= summary["steal_cores_phase1"] <= cpus and 0 <= summary["steal_cores_half"] <= cpus
    assert 0 < summary["busy_cores_half"] <= cpus
    # and how fast the CPU ran Python, before and after
    assert len(summary["reference_cpu_ms"]) == 2 and all(ms > 0 for ms in summary["reference_cpu_ms"])
    (path,) = records.glob("*.records.jsonl")
    written = list(read_records(path))
    assert len(written) == summary["half_messages"] > 0
    # (B may have a message before A's send_many returned: the outbound queue delivers early)
    assert all(r.outcome == "ok" and r.created_ns <= min(r.enqueued_ns, r.delivered_ns) for r in written)


def test_p2p_bench_repeat_reports_the_medians_of_whole_rounds(tmp_path: Path) -> None:
    """``--repeat 3``: three whole runs; the figures are the medians of the rounds', each round's are listed,
    and each round's records are a run of their own."""
    records = tmp_path / "records"
    small = ["--messages", "300", "--senders", "8", "--half-seconds", "0.4", "--repeat", "3"]
    out = subprocess.run(
        [sys.executable, "-m", "bench.p2p", *small, "--records", str(records)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-2].startswith("medians of 3 rounds: ")
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["rounds"] == 3 and len(summary["per_round"]) == 3
    for key in ("msgs_per_s", "half_rate_msgs_per_s", "p50_ms", "p99_ms", "cpu_us_per_msg_sender_half"):
        assert summary[key] == pytest.approx(statistics.median(r[key] for r in summary["per_round"])), key
    assert all(0 < r["p50_ms"] <= r["p99_ms"] <= r["max_ms"] for r in summary["per_round"])
    paths = [Path(p) for p in summary["records"]]
    assert sorted(paths) == sorted(records.glob("*.records.jsonl")) and len(set(paths)) == 3
    assert sum(len(list(read_records(p))) for p in paths) == summary["half_messages"] > 0


@pytest.mark.parametrize("rate", ["0", "-5", "inf", "nan"])
def test_a_rate_that_is_not_a_positive_number_is_refused_in_one_line(rate: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench.p2p", "--rate", rate],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and out.stdout == ""
    assert (
        out.stderr.strip()
        .splitlines()[-1]
        .endswith(f"--rate must be a positive number of messages per second, got {float(rate)}")
    )


def test_p2p_bench_via_float_compares_both_paths_at_one_offered_load() -> None:
    """``--via-float``: B behind a real ``corda-trio float start`` process, then directly, twice; the last
    line carries the paired figures (medians of the rounds), both summaries, the float's CPU per message and
    each round's pair. Both paths' phase 2 ran at one offered load; every message was checked end to end."""
    small = ["--messages", "400", "--senders", "8", "--half-seconds", "0.4", "--via-float", "--repeat", "2"]
    out = subprocess.run(
        [sys.executable, "-m", "bench.p2p", *small], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["scenario"] == "p2p-via-float" and result["rounds"] == 2 and len(result["per_round"]) == 2
    via, direct = result["via_float"], result["direct"]
    assert via["scenario"] == "p2p-via-float" and "float" in via["path"] and direct["path"] == "A -> B"
    assert via["half_rate_msgs_per_s"] == direct["half_rate_msgs_per_s"] == result["half_rate_msgs_per_s"]
    assert via["half_messages"] == direct["half_messages"] > 0
    assert via["cpu_us_per_msg_float_all"] > 0
    for key in ("throughput_ratio", "p99_delta_ms", "p50_delta_ms"):
        median = statistics.median(r[key] for r in result["per_round"])
        assert abs(result[key] - median) < 0.002, (key, result[key], result["per_round"])
    assert result["throughput_ratio"] > 0
