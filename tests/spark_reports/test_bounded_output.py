"""Output stays bounded whatever the input: far-future timestamps, huge text fields, long runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import spark_reports
from corda_trio import records as rf
from spark_reports._html import MAX_RUNS_SHOWN
from spark_reports._job import MAX_ERROR_TEXTS, MAX_GROUPS, MAX_TIMELINE_POINTS, LeftOut, bin_width_seconds

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
    assert "The runs were not compared: b measured other scenarios or payload size classes than a" in html
    assert "2 more link(s) not drawn here" in html and "link-10, link-11" in html
    assert "2 more link / size group(s) not drawn in the latency chart" in html
    forced = spark_reports.build_report([d], out, spark=spark, compare=("a", "b"))
    assert forced.compared == ("a", "b")


def test_the_driver_holds_a_bounded_number_of_groups_runs_and_error_texts(spark: Any, tmp_path: Path) -> None:
    """More groups than MAX_GROUPS: the busiest are shown, the rest counted; error texts capped per link."""
    d = tmp_path / "many"
    written: list[rf.Record] = []

    def run(run_id: str, per_link: list[int], t0: int, error: str | None = None) -> None:
        writer = rf.RecordWriter(d, run_id)
        seq = 0
        for link, n in enumerate(per_link):
            for _ in range(n):
                due = t0 + seq * 1_000_000
                rec = rf.make_record(
                    run_id=run_id, scenario="s", link=f"link-{link:02d}", size_bytes=64, seq=seq,
                    intended_ns=due, stages={"created": due + 10, "delivered": due + 50_000},
                    error=None if error is None else f"{error} #{seq}",  # every text distinct
                )  # fmt: skip
                writer.add_sync(rec)
                written.append(rec)
                seq += 1
        writer.finish({"run_id": run_id, "scenario": "s"})

    runs = 30
    for r in range(runs):  # 30 runs x 12 links; link k holds 13 - k records
        run(f"run-{r:02d}", [13 - k for k in range(12)], T0 + r * 10**12)
    run("errors", [30], T0 - 10**12, error="boom")  # the busiest group: 30 distinct error texts
    for r in range(5):  # runs too small to be shown at all, with errors of their own
        run(f"tiny-{r}", [1], T0 + (runs + r) * 10**12, error="tiny")

    counts: dict[tuple[str, str, str, int], int] = {}
    for rec in written:
        key = (rec.run_id, rec.scenario, rec.link, 64)
        counts[key] = counts.get(key, 0) + 1
    ranked = sorted(counts, key=lambda k: (-counts[k], k))  # busiest first, then by key
    shown, hidden = set(ranked[:MAX_GROUPS]), ranked[MAX_GROUPS:]

    out = tmp_path / "many.html"
    res = spark_reports.build_report([d], out, spark=spark)
    job = res.job
    assert {g.key for g in job.groups} == shown
    assert job.left_out == LeftOut(
        groups=len(hidden),
        records=sum(counts[k] for k in hidden),
        ok=sum(counts[k] for k in hidden if not k[0].startswith("tiny")),
        errors=sum(counts[k] for k in hidden if k[0].startswith("tiny")),
        runs=5,
    )
    assert res.records == job.records == len(written)
    assert job.error_count == 30 + 5
    # series and error texts only for shown groups, error texts capped per link
    assert {(p.run_id, p.scenario, p.link, p.size_class) for p in job.series} <= shown
    assert [e.run_id for e in job.errors] == ["errors"] * MAX_ERROR_TEXTS
    assert sum(e.count for e in job.errors) == MAX_ERROR_TEXTS
    html = out.read_text(encoding="utf-8")
    assert f"{len(hidden)} of {len(counts)} groups</b>" in html
    assert f"{len(written):,} records" in html and f"{runs + 1 + 5} run(s)" in html
    assert html.count("<svg") <= 3 * MAX_RUNS_SHOWN + 1
    assert "more run(s) are in the tables" in html
    assert len(html) < 2_000_000


def test_a_disk_that_fills_up_is_one_error_naming_what_was_not_written(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk under --out gave a traceback from the tables' CSV writer (exit 1, a partial r_tables)."""
    import spark_reports._report as report_module

    d = tmp_path / "in"
    _write(d, "r", [], n=50)
    out = tmp_path / "out" / "r.html"

    def full(*_args: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(report_module, "write_tables", full)
    with pytest.raises(spark_reports.ReportOutputError) as info:
        spark_reports.build_report([d], out, spark=spark)
    assert str(info.value) == (
        f"cannot write the report's tables into {tmp_path / 'out' / 'r_tables'}: No space left on device "
        "(they may be incomplete; the report was not written)"
    )
    assert not out.exists()
    monkeypatch.undo()
    monkeypatch.setattr(report_module, "write_file_atomically", full)
    with pytest.raises(spark_reports.ReportOutputError, match=r"cannot write the report .*r.html: No space"):
        spark_reports.build_report([d], out, spark=spark)
    assert sorted(p.name for p in out.parent.iterdir()) == ["r_tables"]  # no r.html, nothing written aside


@pytest.mark.parametrize(
    ("out", "message"),
    [
        ("afile/r.html", "--out {d}/afile/r.html: {d}/afile is a file"),
        ("afile/deeper/r.html", "--out {d}/afile/deeper/r.html: {d}/afile is a file"),
    ],
)
def test_an_out_path_under_a_file_is_an_input_error(tmp_path: Path, out: str, message: str) -> None:
    """It was a FileExistsError / NotADirectoryError traceback from creating the report's directory."""
    d = tmp_path / "in"
    _write(d, "r", [], n=5)
    (tmp_path / "afile").write_text("x")
    with pytest.raises(spark_reports.ReportInputError) as info:
        spark_reports.build_report([d], tmp_path / out)  # (refused before Spark starts)
    assert str(info.value) == message.format(d=tmp_path)
