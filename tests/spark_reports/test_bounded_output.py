"""Output stays bounded whatever the input: far-future timestamps, huge text fields, long runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import spark_reports
from corda_trio import records as rf
from spark_reports._job import MAX_TIMELINE_POINTS, bin_width_seconds

pytestmark = pytest.mark.spark

T0 = 1_800_000_000_000_000_000


def _write(d: Path, run_id: str, extra: list[rf.Record], n: int = 1000, every_ns: int = 10**7) -> None:
    writer = rf.RecordWriter(d, run_id)
    for i in range(n):
        due = T0 + i * every_ns
        rec = rf.make_record(
            run_id=run_id, scenario="s", link=f"l{i % 2}", size_bytes=64, seq=i, intended_ns=due,
            stages={"created": due + 1000, "delivered": due + 2_000_000},
        )  # fmt: skip
        writer.add_sync(rec)
    for rec in extra:
        writer.add_sync(rec)
    writer.finish({"run_id": run_id, "scenario": "s"})


def test_bin_width_keeps_every_run_within_the_point_limit() -> None:
    assert bin_width_seconds(10 * 10**9) == 1
    for span_s in (1, 1999, 2001, 10**5, 10**7, 2**62 // 10**9):
        width = bin_width_seconds(span_s * 10**9)
        assert span_s / width <= MAX_TIMELINE_POINTS
        assert width == 1 or span_s / width > MAX_TIMELINE_POINTS / 5  # and not needlessly coarse


def test_a_far_future_timestamp_is_flagged_not_drawn(spark: Any, tmp_path: Path) -> None:
    d = tmp_path / "in"
    far = rf.make_record(
        run_id="r", scenario="s", link="l0", size_bytes=64, seq=5000, intended_ns=T0,
        stages={"created": T0, "delivered": 2**62},
    )  # fmt: skip
    _write(d, "r", [far])
    out = tmp_path / "r.html"
    res = spark_reports.build_report([d], out, spark=spark)
    w = res.job.windows["r"]
    assert w.outliers == 1 and w.outlier_last_ns == 2**62 and w.width_seconds == 1
    assert res.records == 1001  # the outlier still counts
    assert max(p.second for p in res.job.series) <= 11  # 10 s of data, not 1.3e11 s
    assert len(res.job.series) <= 2 * 12
    ok_rate = sum(g.throughput_per_second for g in res.job.groups)
    assert ok_rate == pytest.approx(100, rel=0.05)  # measured over the window, not to the far future
    html = out.read_text(encoding="utf-8")
    assert len(html) < 400_000
    assert "1 operation(s) of run <code>r</code> completed outside the run's window" in html


def test_a_long_run_is_binned_coarser(spark: Any, tmp_path: Path) -> None:
    d = tmp_path / "long"
    _write(d, "long", [], n=300, every_ns=20 * 10**9)  # one operation every 20 s: ~6,000 s
    res = spark_reports.build_report([d], tmp_path / "l.html", spark=spark)
    w = res.job.windows["long"]
    assert w.width_seconds == 5 and w.outliers == 0
    assert all(p.second % 5 == 0 and p.width_seconds == 5 for p in res.job.series)
    assert sum(p.ok for p in res.job.series) == 300
    assert max(p.ok_per_second for p in res.job.series) == pytest.approx(1 / 5)


def test_huge_text_fields_are_cut_in_the_report(spark: Any, tmp_path: Path) -> None:
    d = tmp_path / "huge"
    big_link = "L" * 2_000_000
    big_error = "E" * 3_000_000
    extra = [
        rf.Record(run_id="h", scenario="s", link=big_link, size_bytes=1, seq=9000, intended_ns=T0,
                  created_ns=T0 + 5),
        rf.Record(run_id="h", scenario="s", link="l0", size_bytes=1, seq=9001, intended_ns=T0,
                  outcome="error", error=big_error),
    ]  # fmt: skip
    _write(d, "h", extra, n=100)
    out = tmp_path / "h.html"
    res = spark_reports.build_report([d], out, spark=spark)
    assert res.records == 102
    html = out.read_text(encoding="utf-8")
    assert len(html) < 400_000
    assert "L" * 120 in html and "L" * 200 not in html
    assert "E" * 100 in html and "E" * 200 not in html
    assert all(len(g.link) <= 160 for g in res.job.groups)
    assert len({g.link for g in res.job.groups}) == 3


def _runs(d: Path, run_id: str, scenario: str, links: int, t0: int) -> None:
    writer = rf.RecordWriter(d, run_id)
    for i in range(600):
        due = t0 + i * 5_000_000
        rec = rf.make_record(
            run_id=run_id, scenario=scenario, link=f"link-{i % links:02d}", size_bytes=64, seq=i,
            intended_ns=due,
            stages={"created": due + 1000, "delivered": due + 1_000_000 + i % 7 * 1000},
        )  # fmt: skip
        writer.add_sync(rec)
    writer.finish({"run_id": run_id, "scenario": scenario})


def test_unlike_runs_are_not_compared_and_no_series_is_dropped_silently(spark: Any, tmp_path: Path) -> None:
    d = tmp_path / "unlike"
    _runs(d, "a", "wal", 12, T0)
    _runs(d, "b", "codec", 2, T0 + 10**12)
    out = tmp_path / "u.html"
    res = spark_reports.build_report([d], out, spark=spark)
    assert res.compared is None
    html = out.read_text(encoding="utf-8")
    assert "Runs a and b were not compared: they differ in scenario or payload size classes" in html
    assert "2 more link(s) not drawn here" in html and "link-10, link-11" in html
    assert "2 more link / size group(s) not drawn in the latency chart" in html
    forced = spark_reports.build_report([d], out, spark=spark, compare=("a", "b"))
    assert forced.compared == ("a", "b")
