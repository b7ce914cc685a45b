"""Report pieces that need no Spark: input discovery, CLI errors, SVG charts, size classes."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import spark_reports
from corda_trio import records
from corda_trio.node._cli import main
from spark_reports import _svg
from spark_reports._schema import discover_inputs


def test_size_class_is_the_next_power_of_two() -> None:
    assert [spark_reports.size_class(n) for n in (0, 1, 2, 3, 4, 5, 4096, 4097, 65536)] == [
        0, 1, 2, 4, 4, 8, 4096, 8192, 65536,
    ]  # fmt: skip


def test_missing_and_empty_directories_fail_before_spark(tmp_path: Path) -> None:
    with pytest.raises(spark_reports.ReportInputError, match="does not exist"):
        discover_inputs([tmp_path / "nope"])
    with pytest.raises(spark_reports.ReportInputError, match="no benchmark records"):
        discover_inputs([tmp_path])
    (tmp_path / "run-x.records.jsonl").write_text("")
    with pytest.raises(spark_reports.ReportInputError, match="all empty"):
        discover_inputs([tmp_path])


def test_partial_runs_are_ignored(tmp_path: Path) -> None:
    (tmp_path / "run-x.records.jsonl.part").write_text("{}\n")
    with pytest.raises(spark_reports.ReportInputError, match="no benchmark records"):
        discover_inputs([tmp_path])


def test_bad_meta_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "run-x.records.jsonl").write_text("{}\n")
    (tmp_path / "run-x.meta.json").write_text("{oops")
    with pytest.raises(spark_reports.ReportInputError, match=r"run-x.meta.json is not valid JSON"):
        discover_inputs([tmp_path])
    (tmp_path / "run-x.meta.json").write_text(json.dumps({"run_id": "x", "scenario": "s"}))
    assert set(discover_inputs([tmp_path]).metas) == {"x"}
    # a meta file that names another run than its file name (found with hand-made files: accepted silently)
    (tmp_path / "run-x.meta.json").write_text(json.dumps({"run_id": "other", "scenario": "s"}))
    with pytest.raises(
        spark_reports.ReportInputError,
        match=r"run-x.meta.json: field run_id is 'other', but the file is named for run 'x'",
    ):
        discover_inputs([tmp_path])
    # a meta file of a run id off the spec's pattern (only file names were checked against it)
    (tmp_path / "run-x.meta.json").unlink()
    (tmp_path / "odd.meta.json").write_text(json.dumps({"run_id": "a/b c", "scenario": "s"}))
    with pytest.raises(spark_reports.ReportInputError) as info:
        discover_inputs([tmp_path])
    assert (
        str(info.value)
        == f"{tmp_path / 'odd.meta.json'}: field run_id must match {records.RUN_ID_PATTERN}, not 'a/b c'"
    )
    (tmp_path / "odd.meta.json").unlink()
    # two meta files for one run: one would silently win
    (tmp_path / "run-x.meta.json").write_text(json.dumps({"run_id": "x", "scenario": "s"}))
    (tmp_path / "x-copy.meta.json").write_text(json.dumps({"run_id": "x", "scenario": "t"}))
    with pytest.raises(spark_reports.ReportInputError, match=r"run_id 'x' is also the run of meta file"):
        discover_inputs([tmp_path])


def test_a_directory_of_runs_given_twice_is_said_so(tmp_path: Path) -> None:
    """`report --in out --in out` on bench's output (a meta file beside each run's records) said that the
    meta file 'is also the run of meta file' itself, not that the directory was given twice."""
    (tmp_path / "run-x.records.jsonl").write_text("{}\n")
    (tmp_path / "run-x.meta.json").write_text(json.dumps({"run_id": "x", "scenario": "s"}))
    with pytest.raises(spark_reports.ReportInputError) as info:
        discover_inputs([tmp_path, tmp_path])
    assert str(info.value) == (
        f"{tmp_path / 'run-x.meta.json'}: the same records are given twice (also as "
        f"{tmp_path / 'run-x.meta.json'}); counts would double. Give each input directory once"
    )


def test_cli_fails_clearly_on_empty_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["report", "--in", str(tmp_path), "--out", str(tmp_path / "r.html")])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("corda-trio: error: no benchmark records in ")
    assert not (tmp_path / "r.html").exists()
    code = main(["report", "--in", str(tmp_path / "missing"), "--out", str(tmp_path / "r.html")])
    assert code == 2 and "does not exist" in capsys.readouterr().err


def test_cli_rejects_non_html_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "run-x.records.jsonl").write_text("{}\n")
    assert main(["report", "--in", str(tmp_path), "--out", str(tmp_path / "r.pdf")]) == 2
    assert "*.html" in capsys.readouterr().err


def test_java_is_found_on_this_machine() -> None:
    assert Path(spark_reports.find_java()).name == "java"


def test_java_missing_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(spark_reports.ReportEnvironmentError, match="openjdk-17-jre-headless"):
        spark_reports.find_java()
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    with pytest.raises(spark_reports.ReportEnvironmentError, match="JAVA_HOME"):
        spark_reports.find_java()


# ----------------------------------------------------------------------------------------- charts


def test_nines_scale_spaces_the_tail_evenly() -> None:
    t = [_svg._transform(p, "nines") for p in (0.9, 0.99, 0.999, 0.9999)]
    assert t == pytest.approx([1, 2, 3, 4])
    assert _svg._transform(1.0, "nines") > _svg._transform(0.99999, "nines")  # type: ignore[operator]
    assert _svg._transform(0, "log") is None


def test_latency_format() -> None:
    assert [_svg.format_latency_ms(v) for v in (0.0000005, 0.0123, 4.5, 2500)] == [
        "0.5ns", "12.3µs", "4.5ms", "2.5s",
    ]  # fmt: skip


def test_line_chart_draws_every_series_with_legend_and_axes() -> None:
    svg = _svg.line_chart(
        title="t <&>",
        series=[
            _svg.Series(name="a", points=((0.5, 1.0), (0.99, 10.0), (1.0, 100.0))),
            _svg.Series(name="b", points=((0.5, 2.0), (0.9, 3.0)), dashed=True),
            _svg.Series(name="one point", points=((0.5, 2.0),)),
        ],
        x_axis=_svg.Axis(label="percentile", scale="nines"),
        y_axis=_svg.Axis(label="latency", scale="log", unit_format="latency_ms"),
    )
    assert svg.startswith("<svg") and svg.endswith("</svg>")
    assert svg.count("<polyline") == 2 and svg.count("<circle") == 1
    assert "stroke-dasharray" in svg and "t &lt;&amp;&gt;" in svg
    for label in ("99.9%", "max", "1ms", "10ms", "100ms", "percentile", "latency", "one point"):
        assert label in svg
    # every polyline point lies inside the plot area
    import re

    for pts in re.findall(r'points="([^"]+)"', svg):
        for pair in pts.split():
            x, y = map(float, pair.split(","))
            assert 74 - 0.01 <= x <= 570 - 16 + 0.01 and 30 - 0.01 <= y <= 320 - 46 + 0.01


def test_line_chart_without_data_says_so() -> None:
    svg = _svg.line_chart(title="x", series=[], x_axis=_svg.Axis(label="x"), y_axis=_svg.Axis(label="y"))
    assert "no data" in svg


def test_linear_ticks_are_round_numbers() -> None:
    ticks = _svg._ticks(0, 1234, _svg.Axis(label="y"))
    values = [t for t, _ in ticks]
    step = values[1] - values[0]
    assert step in (200, 250)
    assert all(math.isclose(v % step, 0) or math.isclose(v % step, step) for v in values)


def test_cdf_stops_at_the_data() -> None:
    from spark_reports._html import cdf_points
    from spark_reports._job import CDF_GRID

    def group(n: int) -> spark_reports.GroupStats:
        cdf = (*((p, 1_000_000 + int(p * 1000)) for p in CDF_GRID), (1.0, 9_000_000))
        end = spark_reports.StageLatency(
            stage="end", count=n, percentiles_ns={}, max_ns=9_000_000, mean_ns=1.0
        )
        return spark_reports.GroupStats(
            run_id="r", scenario="s", link="l", size_class=1, count=n, ok=n, errors=0, bytes_total=n,
            first_intended_ns=0, last_done_ns=1, stages=(end,), cdf_ns=cdf,
        )  # fmt: skip

    ten = cdf_points(group(10))
    assert [p for p, _ in ten] == [p for p in CDF_GRID if p <= 0.9] + [1.0]
    assert ten[-1] == (1.0, 9.0)
    big = cdf_points(group(10**6))
    assert [p for p, _ in big] == [*CDF_GRID, 1.0]


def test_a_huge_meta_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "run-x.records.jsonl").write_text("{}\n")
    (tmp_path / "run-x.meta.json").write_text(json.dumps({"run_id": "x", "description": "d" * 2_000_000}))
    with pytest.raises(spark_reports.ReportInputError, match=r"meta.json is larger than 1,048,576 bytes"):
        discover_inputs([tmp_path])
    (tmp_path / "run-x.meta.json").write_text(json.dumps({"run_id": "x", "schema_version": 3}))
    with pytest.raises(spark_reports.ReportInputError, match=r"unknown schema_version 3"):
        discover_inputs([tmp_path])


def test_input_splits_are_one_per_core(tmp_path: Path) -> None:
    from spark_reports._schema import (
        MAX_SPLIT_BYTES,
        MIN_SPLIT_BYTES,
        OPEN_COST_BYTES,
        input_bytes,
        split_bytes,
    )

    d = tmp_path / "in"
    d.mkdir()
    (d / "run-a.records.jsonl").write_bytes(b"x" * 1000)
    parquet = d / "run-b.records.parquet"
    parquet.mkdir()
    for i in range(3):
        (parquet / f"part-{i}.parquet").write_bytes(b"p" * 500)
    (parquet / "_SUCCESS").write_bytes(b"")
    inputs = discover_inputs([d])
    assert input_bytes(inputs) == 1000 + 3 * 500 + 4 * OPEN_COST_BYTES
    assert split_bytes(6 << 30, 2) == 3 << 30 and split_bytes(3 << 30, 0) == 3 << 30
    assert split_bytes(1000, 2) == MIN_SPLIT_BYTES and split_bytes(1 << 40, 100) == MAX_SPLIT_BYTES


def test_a_symlink_loop_or_a_deeply_nested_meta_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "run-x.records.jsonl").write_text("{}\n")
    (tmp_path / "loop.jsonl").symlink_to("loop.jsonl")
    with pytest.raises(spark_reports.ReportInputError, match=r"loop.jsonl cannot be resolved"):
        discover_inputs([tmp_path])
    (tmp_path / "loop.jsonl").unlink()
    deep = '{"run_id": "x", "n": ' + "[" * 100_000 + "]" * 100_000 + "}"
    (tmp_path / "run-x.meta.json").write_text(deep)
    with pytest.raises(spark_reports.ReportInputError, match=r"run-x.meta.json is nested too deeply"):
        discover_inputs([tmp_path])


@pytest.mark.parametrize(
    ("meta", "shown"),
    [
        ({"environment": 5, "config": [1], "started_at": 123}, "? CPUs"),
        ({"config": {"load": 5}}, "? CPUs"),
        ({"config": {"load": {"mode": "open", "rate_per_second": None}}}, "open loop, None ops/s"),
        ({"config": {"load": {"mode": "open", "rate_per_second": "fast"}}}, "open loop, fast ops/s"),
        ({"config": {"load": {"mode": "open", "rate_per_second": 2000.0}}}, "open loop, 2,000.0 ops/s"),
    ],
)
def test_a_meta_file_with_sections_of_the_wrong_type_is_shown_not_a_traceback(
    meta: dict[str, object], shown: str
) -> None:
    from spark_reports._html import _run_section
    from spark_reports._job import JobResult, Sketch

    result = JobResult(groups=(), series=(), errors=(), run_start_ns={}, sketch=Sketch())
    assert shown in _run_section("x", {"run_id": "x", **meta}, result)
