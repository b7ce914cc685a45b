"""The Spark report job against independently computed exact values, the HTML report, and end to end.

All tests here share one local Spark session (start-up costs 5-15 s) and are marked ``spark``.
"""

from __future__ import annotations

import csv
import json
import math
import os
import random
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import spark_reports
from corda_trio import records as rf
from corda_trio.node._cli import main
from spark_reports._compare import resolve_runs
from spark_reports._job import LATENCY_STAGES, compute
from spark_reports._schema import discover_inputs, load_records

pytestmark = pytest.mark.spark

STAGE_NAMES = ("created", "enqueued", "sent", "accepted", "delivered")


# ----------------------------------------------------------------------------------------- generated data


def _generate(out: Path, run_id: str, *, slowdown: float, seed: int, t0_ns: int) -> list[rf.Record]:
    """3,000 records over 2 links x 2 size classes, open-loop schedule at 1,000/s, heavy-tailed stage
    delays, every 50th operation failing after `sent`; written with the real harness writer."""
    rng = random.Random(seed)
    writer = rf.RecordWriter(out, run_id)
    records = []
    for seq in range(3000):
        intended = t0_ns + seq * 1_000_000
        link = f"O=Bank{seq % 2}->O=Notary"
        size = (100, 5000)[(seq // 2) % 2]
        stages: dict[str, int | None] = {}
        t = intended
        for i, stage in enumerate(STAGE_NAMES):
            delay = int(rng.paretovariate(1.5) * (i + 1) * 20_000 * slowdown)
            t += delay
            stages[stage] = t
        error = None
        if seq % 50 == 7:
            stages["accepted"] = stages["delivered"] = None
            error = "ConnectionError: peer went away"
        rec = rf.make_record(
            run_id=run_id, scenario="gen", link=link, size_bytes=size, seq=seq, intended_ns=intended,
            stages=stages, error=error,
        )  # fmt: skip
        writer.add_sync(rec)
        records.append(rec)
    writer.finish(
        {
            "schema_version": 1,
            "run_id": run_id,
            "scenario": "gen",
            "description": "generated test data",
            "started_at": "2026-11-23T00:00:00+00:00",
            "config": {
                "scenario": "gen",
                "load": {"mode": "open", "rate_per_second": 1000.0},
                "sizes": "100,5000",
            },
            "environment": {
                "cpu_count": 2,
                "python": "3.11.7",
                "git_commit": "abc123def",
                "platform": "test-os",
            },
        }
    )
    return records


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, list[rf.Record]]]:
    out = tmp_path_factory.mktemp("records")
    runs = {
        "gen-a": _generate(out, "gen-a", slowdown=1.0, seed=1, t0_ns=1_800_000_000_000_000_000),
        "gen-b": _generate(out, "gen-b", slowdown=2.0, seed=1, t0_ns=1_800_000_100_000_000_000),
    }
    return out, runs


def _exact_groups(records: list[rf.Record]) -> dict[tuple[str, str, str, int], list[rf.Record]]:
    groups: dict[tuple[str, str, str, int], list[rf.Record]] = {}
    for r in records:
        key = (r.run_id, r.scenario, r.link, spark_reports.size_class(r.size_bytes))
        groups.setdefault(key, []).append(r)
    return groups


def _latencies(records: list[rf.Record], stage: str) -> list[int]:
    out = []
    for r in records:
        if r.outcome != "ok":
            continue
        values = [getattr(r, f"{s}_ns") for s in rf.STAGES if getattr(r, f"{s}_ns") is not None]
        if stage == "end":
            out.append(max(values) - r.intended_ns)
        elif getattr(r, f"{stage}_ns") is not None:
            out.append(getattr(r, f"{stage}_ns") - r.intended_ns)
    return sorted(out)


def _within_rank_error(value: int, ordered: list[int], p: float, epsilon: float) -> bool:
    """The documented guarantee: ``value``'s rank is within epsilon * n of the exact rank p * n."""
    n = len(ordered)
    slack = math.ceil(n * epsilon) + 1  # +1: rank conventions (nearest-rank vs interpolation) differ by one
    exact = max(0, math.ceil(p * n) - 1)
    lo, hi = ordered[max(0, exact - slack)], ordered[min(n - 1, exact + slack)]
    return lo <= value <= hi


# ----------------------------------------------------------------------------------------- the job


@pytest.mark.parametrize("sketch", ["kll", "kll:64", "gk:40"])
def test_percentiles_counts_and_rates_match_exact_values(
    spark: Any, generated: tuple[Path, dict[str, list[rf.Record]]], sketch: str
) -> None:
    out, runs = generated
    chosen = spark_reports.Sketch.parse(sketch)
    # kll:64 and gk:40 are small enough that the 750 values of a group are really approximated
    epsilon = chosen.rank_error
    result = compute(load_records(spark, discover_inputs([out])), sketch=chosen)
    expected = _exact_groups([r for rs in runs.values() for r in rs])
    assert {g.key for g in result.groups} == set(expected)
    assert result.run_ids == ["gen-a", "gen-b"]
    for g in result.groups:
        recs = expected[g.key]
        assert g.count == len(recs)
        assert g.errors == sum(r.outcome == "error" for r in recs)
        assert g.ok == g.count - g.errors
        assert g.bytes_total == sum(r.size_bytes for r in recs)
        first = min(r.intended_ns for r in recs)
        last = max(max(v for s in rf.STAGES if (v := getattr(r, f"{s}_ns")) is not None) for r in recs)
        assert (g.first_intended_ns, g.last_done_ns) == (first, last)
        assert g.throughput_per_second == pytest.approx(g.ok / ((last - first) / 1e9), rel=1e-12)
        assert {s.stage for s in g.stages} == {*STAGE_NAMES, "end"}
        for s in g.stages:
            ordered = _latencies(recs, s.stage)
            assert s.count == len(ordered)
            assert s.max_ns == ordered[-1]
            assert s.mean_ns == pytest.approx(sum(ordered) / len(ordered), rel=1e-9)
            for label, p in spark_reports.PERCENTILES.items():
                value = s.percentiles_ns[label]
                assert _within_rank_error(value, ordered, p, epsilon), (g.key, s.stage, label)
        end_ordered = _latencies(recs, "end")
        for p, value in g.cdf_ns:
            if p < 1.0:
                assert _within_rank_error(value, end_ordered, p, epsilon)
            else:
                assert value == end_ordered[-1]
        if sketch == "kll":  # n * epsilon < 1 here: the estimate is the exact nearest-rank value
            stage = g.stage("end")
            assert stage is not None
            assert stage.percentiles_ns["p50"] == end_ordered[math.ceil(0.5 * len(end_ordered)) - 1]

    # throughput series: exact counts per one-second bin from the run's first due time
    all_records = [r for rs in runs.values() for r in rs]
    starts = {run: min(r.intended_ns for r in rs) for run, rs in runs.items()}
    exact_ok: Counter[tuple[Any, ...]] = Counter()
    exact_err: Counter[tuple[Any, ...]] = Counter()
    for r in all_records:
        done = max(v for s in rf.STAGES if (v := getattr(r, f"{s}_ns")) is not None)
        second = (done - starts[r.run_id]) // 1_000_000_000
        key = (r.run_id, r.link, spark_reports.size_class(r.size_bytes), second)
        (exact_ok if r.outcome == "ok" else exact_err)[key] += 1
    got_ok = {(p.run_id, p.link, p.size_class, p.second): p.ok for p in result.series if p.ok}
    got_err = {(p.run_id, p.link, p.size_class, p.second): p.errors for p in result.series if p.errors}
    assert got_ok == dict(exact_ok)
    assert got_err == dict(exact_err)
    link = "O=Bank1->O=Notary"
    assert {(e.run_id, e.error, e.count) for e in result.errors if e.link == link} == {
        (run, "ConnectionError: peer went away", sum(1 for r in rs if r.error and r.link == link))
        for run, rs in runs.items()
    }


def test_json_lines_are_parsed_once_and_the_cache_is_released(
    spark: Any,
    generated: tuple[Path, dict[str, list[rf.Record]]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The follow-up over JSON lines reads the cache the main aggregate filled (every partition of it), and
    the cache is gone when the job returns; Parquet input is read again instead (no cache)."""
    from spark_reports import _job

    def cached() -> list[tuple[int, int]]:
        return [
            (i.numCachedPartitions(), i.numPartitions())
            for i in spark.sparkContext._jsc.sc().getRDDStorageInfo()
        ]

    seen: list[list[tuple[int, int]]] = []
    real = _job._followup

    def followup(*args: Any, **kwargs: Any) -> Any:
        seen.append(cached())
        return real(*args, **kwargs)

    monkeypatch.setattr(_job, "_followup", followup)
    out, runs = generated
    result = compute(load_records(spark, discover_inputs([out])))
    assert sum(g.count for g in result.groups) == sum(len(rs) for rs in runs.values())
    assert len(seen) == 1 and len(seen[0]) == 1, seen
    ((in_cache, partitions),) = seen[0]
    assert in_cache == partitions > 0
    assert cached() == []

    seen.clear()
    spark_reports.write_synthetic(spark, tmp_path / "syn", 5_000, run_id="syn-1", rate_per_second=5000.0)
    compute(load_records(spark, discover_inputs([tmp_path / "syn"])))
    assert seen == [[]]
    assert cached() == []


def test_report_html_tables_and_comparison(
    spark: Any, generated: tuple[Path, dict[str, list[rf.Record]]], tmp_path: Path
) -> None:
    out, _ = generated
    html_path = tmp_path / "out" / "report.html"
    result = spark_reports.build_report([out], html_path, spark=spark)
    assert result.compared == ("gen-a", "gen-b")  # exactly two runs: earlier vs later
    html = html_path.read_text(encoding="utf-8")
    # charts: per run one CDF, one throughput and one errors chart, plus one comparison chart
    assert html.count("<svg") == 7
    assert html.count('class="chart-title">gen: throughput over time: errors') == 2
    assert html.count('class="chart-title">gen: end-to-end latency distribution') == 2
    assert html.count('class="chart-title">gen: throughput over time<') == 2
    assert "baseline (dashed) and compared runs" in html
    expected_texts = (
        "What was measured", "2 CPUs", "3.11.7", "abc123def", "rate_per_second", "generated test data",
        "kll_sketch_agg_bigint", "Per link", "Latency per stage", "ConnectionError: peer went away",
        "O=Bank0-&gt;O=Notary", "8 KiB", "128 B", "job time",
        "<b>Latency CDF</b>", "<b>Throughput</b>",  # each chart says what it measures
    )  # fmt: skip
    for text in expected_texts:
        assert text in html, text
    # offline: no external references
    assert "http://" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "<script" not in html

    tables = result.tables_dir
    names = {p.name for p in tables.iterdir()}
    for t in ("groups", "stages", "throughput", "errors", "comparison"):
        assert f"{t}.csv" in names and f"{t}.parquet" in names
    with (tables / "groups.csv").open() as f:
        groups = list(csv.DictReader(f))
    assert len(groups) == 8 and sum(int(g["count"]) for g in groups) == 6000
    # in key order, not in the order of Spark's shuffle partitions (another master or core count: another)
    keys = [(g["run_id"], g["scenario"], g["link"], int(g["size_class_bytes"])) for g in groups]
    assert keys == sorted(keys)
    with (tables / "comparison.csv").open() as f:
        comparison = list(csv.DictReader(f))
    assert len(comparison) == 4 * len(LATENCY_STAGES[:-1])  # 4 groups x (5 stages + end)
    # run b has every delay doubled (same random draws): latency ratios ~2 within the rank error
    for row in comparison:
        for m in ("p50", "p90", "p99", "max"):
            assert 1.8 < float(row[f"{m}_ratio"]) < 2.2, row
    assert spark.read.parquet(str(tables / "stages.parquet")).count() == 8 * 6
    assert spark.read.parquet(str(tables / "comparison.parquet")).count() == len(comparison)


def test_compare_option_and_errors(
    spark: Any, generated: tuple[Path, dict[str, list[rf.Record]]], tmp_path: Path
) -> None:
    out, _ = generated
    res = spark_reports.build_report([out], tmp_path / "r.html", compare=("gen-b", "gen-a"), spark=spark)
    assert res.compared == ("gen-b", "gen-a")
    with pytest.raises(spark_reports.ReportInputError, match="2 runs match"):
        spark_reports.build_report([out], tmp_path / "r.html", compare=("gen", "gen-a"), spark=spark)
    with pytest.raises(spark_reports.ReportInputError, match="at least two runs"):
        spark_reports.build_report([out], tmp_path / "r.html", compare=("gen-a",))  # before Spark starts
    bad = {
        ("zzz", "gen-a"): "no run match",
        ("gen-a", "gen-b", "gen-a"): "names run gen-a more than once",
    }
    for compare, message in bad.items():
        with pytest.raises(spark_reports.ReportInputError, match=message):
            resolve_runs(res.job, compare)


def test_any_number_of_like_runs_are_compared_with_the_baseline(
    spark: Any, generated: tuple[Path, dict[str, list[rf.Record]]], tmp_path: Path
) -> None:
    out, _ = generated
    more = tmp_path / "more"
    _generate(more, "gen-c", slowdown=3.0, seed=1, t0_ns=1_800_000_200_000_000_000)
    html_path = tmp_path / "three.html"
    res = spark_reports.build_report([out, more], html_path, spark=spark)
    assert res.compared == ("gen-a", "gen-b", "gen-c")  # all alike: each against the earliest
    with (res.tables_dir / "comparison.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert Counter((r["before_run"], r["after_run"]) for r in rows) == {
        ("gen-a", "gen-b"): 4 * len(LATENCY_STAGES[:-1]),
        ("gen-a", "gen-c"): 4 * len(LATENCY_STAGES[:-1]),
    }
    # the same random draws scaled by 2 and 3: every latency ratio within the rank error of 2 or 3
    for row in rows:
        factor = {"gen-b": 2.0, "gen-c": 3.0}[row["after_run"]]
        for m in ("p50", "p90", "p99", "max"):
            assert 0.9 * factor < float(row[f"{m}_ratio"]) < 1.1 * factor, row
    html = html_path.read_text(encoding="utf-8")
    assert "gen-a (baseline)" in html and html.count("(baseline)") >= 4  # 4 groups in the table
    # pivoted: one row per run, so the table has the same columns however many runs are compared
    table = html[html.index('id="comparison"') :]
    table = table[: table.index("</table>")]
    assert table.count("<tr>") == 1 + 4 * 3  # header + (baseline, gen-b, gen-c) per group
    assert table.count("<th") == 4 + len(spark_reports.PERCENTILES) + 3

    res = spark_reports.build_report(
        [out, more], tmp_path / "c.html", compare=("gen-c", "gen-a", "gen-b"), spark=spark
    )
    assert res.compared == ("gen-c", "gen-a", "gen-b")
    with (res.tables_dir / "comparison.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert {r["before_run"] for r in rows} == {"gen-c"}
    for row in rows:
        factor = {"gen-a": 1 / 3, "gen-b": 2 / 3}[row["after_run"]]
        assert 0.9 * factor < float(row["p50_ratio"]) < 1.1 * factor, row


def _tiny_record() -> rf.Record:
    return rf.make_record(run_id="r", scenario="s", link="l", size_bytes=1, seq=0, intended_ns=5, stages={})


def test_malformed_json_fails_clearly(spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "in"
    d.mkdir()
    good = _tiny_record()
    (d / "run-r.records.jsonl").write_text(good.to_json_line() + "\n{this is not json\n")
    code = main(["report", "--in", str(d), "--out", str(tmp_path / "r.html")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"{d / 'run-r.records.jsonl'}:2: not valid JSON: Expecting property name" in err
    assert "1 bad record(s) in the input" in err and "Traceback" not in err and "java" not in err.lower()
    assert not (tmp_path / "r.html").exists()


def test_wrong_types_and_missing_fields_fail_clearly(spark: Any, tmp_path: Path) -> None:
    d = tmp_path / "types"
    d.mkdir()
    data = json.loads(_tiny_record().to_json_line())
    (d / "a.jsonl").write_text(json.dumps({**data, "intended_ns": "soon"}) + "\n")
    with pytest.raises(spark_reports.BadRecordsError) as info:
        spark_reports.build_report([d], tmp_path / "r.html", spark=spark)
    assert info.value.lines == [f"{d / 'a.jsonl'}:1: field intended_ns must be an integer, not a string"]
    d2 = tmp_path / "missing"
    d2.mkdir()
    del data["run_id"]
    (d2 / "a.jsonl").write_text(json.dumps(data) + "\n")
    with pytest.raises(spark_reports.BadRecordsError) as info:
        spark_reports.build_report([d2], tmp_path / "r.html", spark=spark)
    assert info.value.lines == [f"{d2 / 'a.jsonl'}:1: required field run_id is missing or null"]
    # Parquet: a column that is not a field (a misspelt stage read as nothing, its real column absent or null)
    d3 = tmp_path / "pq"
    frame = spark_reports.synthetic_records(spark, 10, run_id="p")
    frame = frame.withColumnRenamed("delivered_ns", "deliverd_ns")
    frame.withColumn("delivered_ns", frame["seq"]).write.parquet(str(d3 / "run-p.records.parquet"))
    with pytest.raises(spark_reports.ReportInputError, match=r"parquet: unknown field\(s\) deliverd_ns$"):
        spark_reports.build_report([d3], tmp_path / "r.html", spark=spark)


def test_parquet_input_from_the_synthetic_generator(spark: Any, tmp_path: Path) -> None:
    spark_reports.write_synthetic(spark, tmp_path / "syn", 20_000, run_id="syn-1", rate_per_second=5000.0)
    res = spark_reports.build_report([tmp_path / "syn"], tmp_path / "syn.html", spark=spark)
    assert res.records == 20_000 and res.runs == ("syn-1",)
    html = (tmp_path / "syn.html").read_text(encoding="utf-8")
    assert "Synthetic data" in html
    # 5,000/s for 4 s: every full one-second bin holds ~5,000 completions over all groups
    per_second = Counter()
    for p in res.job.series:
        per_second[p.second] += p.ok + p.errors
    assert per_second[1] == pytest.approx(5000, rel=0.01)


# ----------------------------------------------------------------------------------------- end to end


def test_end_to_end_real_benchmark_then_report(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Short real runs of four scenarios (sockets, AMQP codec, durable store, AMQP over TLS) -> report."""
    out = tmp_path / "bench-out"
    runs = {
        "e2e-loopback": ["loopback", "--rate", "500", "--peers", "2", "--sizes", "64,2k"],
        "e2e-codec": ["codec", "--closed", "--ops", "300", "--sizes", "1k,16k"],
        "e2e-wal": ["wal", "--closed", "--concurrency", "16", "--sizes", "1k"],
        "e2e-amqp": ["amqp-link", "--rate", "300", "--sizes", "1k"],
    }
    for run_id, args in runs.items():
        common = ["--out", str(out), "--duration", "0.5", "--warmup", "0.1", "--no-progress"]
        common += ["--run-id", run_id]
        assert main(["bench", "run", *args, *common]) == 0
        assert f"run {run_id} ({args[0]})" in capsys.readouterr().out
    written = {r: list(rf.read_records(out / f"run-{r}.records.jsonl")) for r in runs}
    counts = {r: len(recs) for r, recs in written.items()}
    with_errors = {r for r, recs in written.items() if any(x.outcome == "error" for x in recs)}
    html_path = tmp_path / "report.html"
    assert main(["report", "--in", str(out), "--out", str(html_path), "--master", "local[2]"]) == 0
    assert "report " in capsys.readouterr().out
    html = html_path.read_text(encoding="utf-8")
    for text in (*runs, "loopback-0", "loopback-1", "transfer-frame", "bench.wal.0", "corda_trio.store",
                 "p2p.inbound.bench-0"):  # fmt: skip
        assert text in html, text
    assert html.count("<svg") == 2 * len(runs) + len(with_errors)
    with (html_path.with_name("report_tables") / "groups.csv").open() as f:
        groups = list(csv.DictReader(f))
    for run_id, n in counts.items():
        assert sum(int(g["count"]) for g in groups if g["run_id"] == run_id) == n
    assert {g["size_class_bytes"] for g in groups if g["run_id"] == "e2e-codec"} == {"1024", "16384"}


#: The console script's entry point, run in a fresh interpreter.
CLI = "import sys; from corda_trio.node._cli import main; sys.exit(main())"


@pytest.mark.slow
def test_cli_in_a_fresh_process_is_quiet(tmp_path: Path) -> None:
    """A real `corda-trio report` process: its own Spark, errors-only logging, clear exit code. Run twice
    with an empty cache: the first run's JVM writes the class-data-sharing archive as it exits (the process
    waits for it, nothing is left running), the second starts from it; both are equally quiet."""
    _generate(tmp_path / "in", "proc", slowdown=1.0, seed=3, t0_ns=1_800_000_000_000_000_000)
    cache = tmp_path / "cache"
    env = {**os.environ, "XDG_CACHE_HOME": str(cache)}
    archives: list[tuple[Path, int]] = []
    for run in range(2):
        proc = subprocess.run(
            [sys.executable, "-c", CLI, "report", "--in", str(tmp_path / "in"),
             "--out", str(tmp_path / f"r{run}.html"), "--master", "local[1]", "--driver-memory", "1g"],
            capture_output=True, text=True, timeout=300, env=env,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert (tmp_path / f"r{run}.html").exists()
        # nothing at all on stderr: log4j keeps to errors, and the two lines the JVM prints on every start
        # outside its reach are dropped (spark_reports/README.md)
        assert proc.stderr == ""
        assert proc.stdout.startswith("report ") and "time: spark start" in proc.stdout
        assert "cds" not in proc.stdout, proc.stdout
        # the JVM's CPU time (the benchmark's steadier figure on a shared machine): it did the work, so > 0
        cpu = re.search(r"^  cpu: Spark JVM ([0-9.]+) s$", proc.stdout, re.MULTILINE)
        assert cpu is not None and float(cpu.group(1)) > 0, proc.stdout
        files = sorted((cache / "corda-trio" / "spark-cds").iterdir())
        assert len(files) == 1 and files[0].suffix == ".jsa", files  # no temporary file left
        archives.append((files[0], files[0].stat().st_mtime_ns))
        assert files[0].stat().st_size > 1_000_000
        # nothing of the report's JVM outlives the report (it ran with the archive's path in its options)
        left = subprocess.run(["pgrep", "-f", str(cache)], capture_output=True, text=True)
        assert left.stdout.strip() == "", left.stdout
    assert archives[0] == archives[1]  # the second run read the archive and left it as it was


@pytest.mark.slow
def test_cli_says_in_one_line_why_spark_did_not_start(tmp_path: Path) -> None:
    """A master URL Spark does not know ends its JVM during its start: one error line with the JVM's reason
    (not its stack trace and PySpark's), exit 1; a heap size the JVM cannot parse is refused before any
    JVM starts."""
    _generate(tmp_path / "in", "proc", slowdown=1.0, seed=3, t0_ns=1_800_000_000_000_000_000)
    common = [sys.executable, "-c", CLI, "report", "--in", str(tmp_path / "in")]
    common += ["--out", str(tmp_path / "r.html")]
    proc = subprocess.run([*common, "--master", "foo"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        "corda-trio: error: Spark's JVM did not start: Master must either be yarn or start with spark, k8s, "
        "or local (master foo, driver memory 4g)"
    ]
    for size in ("abc", "1gb", "0", "1.5g"):
        proc = subprocess.run([*common, "--driver-memory", size], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and proc.stdout == ""
        assert proc.stderr.splitlines() == [
            f"corda-trio: error: --driver-memory must be a JVM heap size such as 512m or 4g, not {size!r}"
        ]
    assert not (tmp_path / "r.html").exists()


@pytest.mark.slow
def test_cli_says_in_one_line_why_a_started_jvm_could_not_start_spark(tmp_path: Path) -> None:
    """A master URL the JVM's launcher accepts but Spark refuses when its context starts is one error line
    naming Spark's reason, exit 1, and no JVM left behind: it was a Py4JJavaError traceback ("<exception
    str() failed>") after Spark's log lines. (Cluster masters that accept no connection, or give no
    executor: ``test_cluster.py``.)"""
    _generate(tmp_path / "in", "proc", slowdown=1.0, seed=3, t0_ns=1_800_000_000_000_000_000)
    common = [sys.executable, "-c", CLI, "report", "--in", str(tmp_path / "in")]
    common += ["--out", str(tmp_path / "r.html")]
    refused = (
        ("local[0]", "Asked to run locally with 0 threads"),
        ("spark://", "Invalid master URL: spark://"),
    )
    for master, reason in refused:
        proc = subprocess.run([*common, "--master", master], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 1 and proc.stdout == ""
        assert proc.stderr.splitlines() == [
            f"corda-trio: error: Spark did not start: {reason} (master {master}, driver memory 4g)"
        ]
    assert not (tmp_path / "r.html").exists()


@pytest.mark.parametrize(
    ("said", "reason"),
    [
        (["Error occurred during initialization of VM",
          "Could not reserve enough space for 104857600000KB object heap"],
         "Could not reserve enough space for 104857600000KB object heap"),
        (["Invalid maximum heap size: -Xmxabc", "Error: Could not create the Java Virtual Machine.",
          "Error: A fatal exception has occurred. Program will exit."],
         "Invalid maximum heap size: -Xmxabc"),
        (['Exception in thread "main" org.apache.spark.SparkException: Master must either be yarn or start '
          "with spark, k8s, or local",
          "\tat org.apache.spark.deploy.SparkSubmit.error(SparkSubmit.scala:1068)"],
         "Master must either be yarn or start with spark, k8s, or local"),
        (["", "\tat x.y(Z.java:1)"], "it printed no reason"),
    ],
)  # fmt: skip
def test_the_reason_a_jvm_gave_for_not_starting(said: list[str], reason: str) -> None:
    from spark_reports._session import jvm_failure_reason

    assert jvm_failure_reason([line + "\n" for line in said]) == reason


def test_size_class_expression_matches_python_at_every_power_of_two_edge(spark: Any) -> None:
    from pyspark.sql import functions as F

    from spark_reports._job import _SIZE_CLASS_SQL

    values = sorted({0, 1, 2, 3} | {v for e in range(2, 41) for v in (2**e - 1, 2**e, 2**e + 1)})
    df = spark.createDataFrame([(v,) for v in values], "size_bytes long")
    rows = df.select("size_bytes", F.expr(_SIZE_CLASS_SQL).alias("c")).collect()
    got = {r["size_bytes"]: r["c"] for r in rows}
    assert got == {v: spark_reports.size_class(v) for v in values}
