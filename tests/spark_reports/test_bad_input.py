"""Bad input: every broken record named as FILE:LINE (across Spark input splits), --skip-bad, duplicates."""

from __future__ import annotations

import bisect
import json
import math
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import spark_reports
from corda_trio import records as rf
from corda_trio.node._cli import main
from spark_reports._job import compute
from spark_reports._schema import discover_inputs, load_records

pytestmark = pytest.mark.spark


def _line(n: int, /, **changes: Any) -> str:
    rec = rf.make_record(
        run_id="run-1", scenario="s", link="l", size_bytes=100, seq=n, intended_ns=1_000_000 + n,
        stages={"created": 1_000_100 + n, "delivered": 1_005_000 + n},
    )  # fmt: skip
    data = json.loads(rec.to_json_line())
    data.update(changes)
    return json.dumps(data)


#: (a bad line, the problem the report must name)
BAD_LINES = [
    (
        "{this is not json",
        "not valid JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)",
    ),
    ("[1, 2]", "a record must be a JSON object, not an array"),
    (_line(0, size_bytes=-3), "field size_bytes must be >= 0, not -3"),
    (_line(0, intended_ns=-1), "field intended_ns must be >= 0, not -1"),
    (_line(0, delivered_ns=-7), "field delivered_ns must be >= 0, not -7"),
    (_line(0, intended_ns="soon"), "field intended_ns must be an integer, not a string"),
    (_line(0, seq=1.5), "field seq must be an integer, not a floating-point number (1.5)"),
    (_line(0, run_id=""), "field run_id must not be empty"),
    (_line(0, run_id=None), "required field run_id is missing or null"),
    (_line(0, schema_version=9), "unknown schema_version 9 (this reader knows 1)"),
    (_line(0, outcome="maybe"), "field outcome must be one of ok, error, not 'maybe'"),
    # a long value is cut inside its quotes, by Spark's check as by Python's
    (_line(0, outcome="m" * 38), f"field outcome must be one of ok, error, not '{'m' * 38}'"),
    (_line(0, outcome="m" * 39), f"field outcome must be one of ok, error, not '{'m' * 35}...'"),
    (_line(0, outcome="error"), "a record has an error text iff its outcome is error"),
    # what Spark's JSON reader hid: text fields read as text whatever their JSON type, the first object of
    # a line read and the rest ignored, one of two equal keys kept, single quotes and NaN accepted
    (_line(0, run_id=123), "field run_id must be a string, not an integer"),
    (_line(0, link={"a": 1}), "field link must be a string, not an object"),
    (_line(0, scenario=["s"]), "field scenario must be a string, not an array"),
    (_line(0, outcome="error", error=42), "field error must be a string, not an integer"),
    (
        _line(0) + " " + _line(1),
        'not valid JSON: text after the end of the record at column 269: \'{"run_id": "run-1", "scen...\'',
    ),
    (_line(0) + ",", "not valid JSON: text after the end of the record at column 268: ','"),
    (_line(0)[:-1] + ', "seq": 7}', "key 'seq' appears twice in one object"),
    (_line(0).replace('"s"', "'s'"), "not valid JSON: Expecting value: line 1 column 33 (char 32)"),
    (_line(0).replace('"s"', "NaN"), "NaN is not a JSON number"),
    (_line(0, outcome=1), "field outcome must be a string, not an integer"),
    # a key that is not a field: a misspelt stage was read as nothing, its real field left null
    (_line(0, deliverd_ns=1_005_000, zz=1, a_b=None), "unknown field(s) a_b, deliverd_ns, zz"),
    # what the spec forbids and the report read: a run id off its pattern (applied to file names only), an
    # error text over 200 characters; and a float literal named for what it is
    (_line(0, run_id="a/b c"), f"field run_id must match {rf.RUN_ID_PATTERN}, not 'a/b c'"),
    (_line(0, run_id="run-1\n"), f"field run_id must match {rf.RUN_ID_PATTERN}, not 'run-1\\n'"),
    (_line(0, run_id="r" * 81), f"field run_id must match {rf.RUN_ID_PATTERN}, not '{'r' * 35}...'"),
    (
        _line(0, outcome="error", error="E: " + "x" * 300),
        "field error must be at most 200 characters, not 303",
    ),
    (
        _line(0).replace('"size_bytes": 100,', '"size_bytes": 1e2,'),
        "field size_bytes must be an integer, not a floating-point number (1e2)",
    ),
]

#: Spec-valid records at the edge of each rule (``tests/records``' ``EDGE_VALID``): all accepted.
EDGE_VALID_LINES = [
    _line(10, run_id="R" + "a_.-9" * 15 + "zzzz"),  # 80 characters
    _line(11, outcome="error", error="E: " + "é" * 197, delivered_ns=None),  # 200 characters
    _line(12, size_bytes=rf.MAX_SIZE_BYTES, intended_ns=0, created_ns=0),
    _line(13, scenario="a/b c", link="O=A, L=London -> O=B", schema_version=1),
]
#: Bad lines named per report run (at most 20 are listed).
EACH_RULE_CHUNK = 15


@pytest.fixture
def small_splits(spark: Any) -> Iterator[None]:
    """Input splits of 64 KiB, so that a small file is read as many splits (line numbers must survive)."""
    old = spark.conf.get("spark.sql.files.maxPartitionBytes")
    spark.conf.set("spark.sql.files.maxPartitionBytes", "64k")
    try:
        yield
    finally:
        spark.conf.set("spark.sql.files.maxPartitionBytes", old)


def _write_with_bad_lines(d: Path, name: str, n: int, seed: int, bad_every: int) -> list[str]:
    """``n`` lines (some blank), a bad one at random places; returns the expected FILE:LINE messages."""
    rng = random.Random(seed)
    lines, expected = [], []
    for i in range(n):
        if i and i % bad_every == 0:
            text, problem = rng.choice(BAD_LINES)
            lines.append(text)
            expected.append(f"{d / name}:{i + 1}: {problem}")
        elif rng.random() < 0.01:
            lines.append("")  # blank lines are skipped but still counted as lines
        else:
            lines.append(_line(seed * 1_000_000 + i))
    (d / name).write_text("\n".join(lines) + "\n")
    return expected


def test_every_rule_and_line_number_across_splits_and_files(
    spark: Any, tmp_path: Path, small_splits: None
) -> None:
    d = tmp_path / "in"
    d.mkdir()
    expected = _write_with_bad_lines(d, "a.jsonl", 3000, 1, 157)  # ~600 KB: ~10 splits of 64 KiB
    expected += _write_with_bad_lines(d, "b.jsonl", 400, 2, 131)
    with pytest.raises(spark_reports.BadRecordsError) as info:
        compute(load_records(spark, discover_inputs([d])))
    err = info.value
    assert err.total == len(expected) == 22
    assert err.lines[:20] == expected[:20]
    assert err.lines[20] == "... and 2 more bad record(s)"
    # every rule of the table is exercised and explained the same way the Python validator explains it
    for text, problem in BAD_LINES:
        try:
            assert rf.record_problem(rf.parse_line(text)) == problem
        except rf.RecordError as exc:
            assert str(exc) == problem


@pytest.mark.parametrize("part", range(math.ceil(len(BAD_LINES) / EACH_RULE_CHUNK)))
def test_each_rule_is_named(spark: Any, tmp_path: Path, part: int) -> None:
    d = tmp_path / "each"
    d.mkdir()
    bad = BAD_LINES[part * EACH_RULE_CHUNK : (part + 1) * EACH_RULE_CHUNK]
    good = [_line(1), *EDGE_VALID_LINES]  # (named only if refused)
    (d / "x.jsonl").write_text("\n".join([*good, *(t for t, _ in bad), _line(2)]) + "\n")
    with pytest.raises(spark_reports.BadRecordsError) as info:
        compute(load_records(spark, discover_inputs([d])))
    first = len(good) + 1
    assert info.value.lines == [f"{d / 'x.jsonl'}:{i + first}: {p}" for i, (_, p) in enumerate(bad)]
    assert [rf.record_problem(rf.parse_line(t)) for t in good] == [None] * len(good)


def test_the_spec_rules_on_parquet_rows_are_named_as_the_python_reader_names_them(
    spark: Any, tmp_path: Path
) -> None:
    """Parquet rows are checked by Spark alone (no line to re-read in Python): each rule of the table, in
    Spark's words, is what ``records.record_problem`` says of the same record; spec-valid edges pass."""
    from spark_reports._schema import record_schema

    base = json.loads(_line(0))
    rows: list[dict[str, Any]] = [
        {**base, "seq": 100 + i, **json.loads(t)} for i, t in enumerate(EDGE_VALID_LINES)
    ]
    bad = [
        {"run_id": "a/b c"},
        {"run_id": "x" * 81},
        {"run_id": "run-1\n"},
        {"run_id": "it's"},
        {"outcome": 'say "ok"\t\\'},
        {"run_id": ""},
        {"run_id": None},
        {"outcome": "error", "error": "E: " + "x" * 300},
        {"outcome": "error", "error": None},
        {"error": "E: x"},
        {"outcome": "m" * 39},
        {"size_bytes": -3},
        {"size_bytes": rf.MAX_SIZE_BYTES + 1},
        {"seq": -1},
        {"intended_ns": None},
        {"delivered_ns": -7},
        {"schema_version": 9},
    ]
    rows += [{**base, "seq": i, **change} for i, change in enumerate(bad)]
    schema = record_schema()
    names = [f.name for f in schema.fields]
    frame = spark.createDataFrame([tuple(r.get(n) for n in names) for r in rows], schema)
    d = tmp_path / "pq"
    frame.coalesce(1).write.parquet(str(d / "run-p.records.parquet"))
    (part,) = (d / "run-p.records.parquet").glob("part-*.parquet")
    with pytest.raises(spark_reports.BadRecordsError) as info:
        compute(load_records(spark, discover_inputs([d])))
    expected = [
        f"{part}: row {len(EDGE_VALID_LINES) + i + 1}: {rf.record_problem({**base, **change})}"
        for i, change in enumerate(bad)
    ]
    assert info.value.lines == expected
    assert all(" None" not in line for line in expected)
    # the optional version column of a type a version is not (it was cast: a text read as NULL, accepted)
    d2 = tmp_path / "pq-version"
    frame.where("seq >= 100").withColumn("schema_version", frame["run_id"]).write.parquet(
        str(d2 / "run-v.records.parquet")
    )
    with pytest.raises(
        spark_reports.ReportInputError, match="column schema_version has type string, expected long"
    ):
        load_records(spark, discover_inputs([d2]))


def test_the_report_cli_refuses_what_the_spec_forbids_one_line_each_exit_2(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The independent check's hand-written records: ``error`` of 303 characters and ``run_id`` "a/b c" were
    accepted, ``size_bytes: 1e2`` refused as "not a number with a fraction"."""
    d = tmp_path / "spec"
    d.mkdir()
    p = d / "run-1.records.jsonl"
    lines = [
        _line(0),
        _line(1, outcome="error", error="E: " + "x" * 300),
        _line(2, run_id="a/b c"),
        _line(3).replace('"size_bytes": 100,', '"size_bytes": 1e2,'),
        _line(4),
    ]
    p.write_text("\n".join(lines) + "\n")
    assert main(["report", "--in", str(d), "--out", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[:3] == [
        f"{p}:2: field error must be at most 200 characters, not 303",
        f"{p}:3: field run_id must match {rf.RUN_ID_PATTERN}, not 'a/b c'",
        f"{p}:4: field size_bytes must be an integer, not a floating-point number (1e2)",
    ]
    assert err.splitlines()[3].startswith("corda-trio: error: 3 bad record(s) in the input")
    assert "Traceback" not in err and not (tmp_path / "r.html").exists()


def test_lines_in_the_writers_form_are_trusted_and_other_valid_lines_are_checked_and_kept(
    spark: Any, tmp_path: Path
) -> None:
    # the writer's lines (escapes and non-ASCII in the error text too) match their records' checksum: the
    # JSON reader's reading stands; valid lines in another form (spaces, a byte order mark, CRLF, blank
    # lines, keys in another order, absent null fields) are each checked, and counted the same
    written = tmp_path / "writer"
    writer = rf.RecordWriter(written, rf.new_run_id("s"))
    recs = [
        rf.make_record(
            run_id="r", scenario="s", link="l", size_bytes=10, seq=i, intended_ns=1_000 + i,
            stages={"delivered": 5_000 + i}, error='KeyError: "é\\x"\n' if i % 3 == 0 else None,
        )
        for i in range(30)
    ]  # fmt: skip
    for r in recs:
        writer.add_sync(r)
    writer.finish({"run_id": writer.run_id, "scenario": "s"})
    trusted = compute(load_records(spark, discover_inputs([written])))
    assert "line checksum" in trusted.timings and "aggregate, every line checked" not in trusted.timings

    other = tmp_path / "other"
    other.mkdir()
    lines = []
    for r in recs:
        data = {k: v for k, v in reversed(json.loads(r.to_json_line()).items()) if v is not None}
        lines.append(json.dumps(data, ensure_ascii=True))
    text = "\ufeff" + "\r\n".join(lines[:15]) + "\r\n\r\n \t \n" + "\n".join(lines[15:]) + "\n"
    (other / "run-r.records.jsonl").write_text(text, encoding="utf-8")
    checked = compute(load_records(spark, discover_inputs([other])))
    assert "aggregate, every line checked" in checked.timings
    assert (checked.records, checked.error_count) == (trusted.records, trusted.error_count) == (30, 10)
    assert [(e.error, e.count) for e in checked.errors] == [(e.error, e.count) for e in trusted.errors]


def test_a_long_link_of_conflicting_duplicates_is_quoted_whole_up_to_an_ellipsis(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``corda-trio report`` cut the link name in its repr: ``link 'O=Alice, ... O=Bob, L=..., seq 2)``,
    no closing quote (found running the report on records with the same operation twice)."""
    d = tmp_path / "dup"
    d.mkdir()
    link = "O=Alice, L=London, C=GB -> O=Bob, L=Paris, C=FR"
    lines = [_line(i, link=link) for i in range(3)] + [_line(1, link=link, size_bytes=1)]
    (d / "run-1.records.jsonl").write_text("\n".join(lines) + "\n")
    assert main(["report", "--in", str(d), "--out", str(tmp_path / "r.html")]) == 2
    p = d / "run-1.records.jsonl"
    same = "the same operation (run 'run-1', scenario 's', link 'O=Alice, L=London, C=GB -> O=Bob, L...', "
    same += "seq 1)"
    assert capsys.readouterr().err.splitlines()[:2] == [
        f"{p}:2: {same} as {p}:4 with other values",
        f"{p}:4: {same} as {p}:2 with other values",
    ]


def test_skip_bad_reports_the_rest_with_a_counted_warning(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = tmp_path / "skip"
    d.mkdir()
    (d / "run-1.records.jsonl").write_text("\n".join([_line(1), "{oops", _line(2), _line(3, seq=-1)]) + "\n")
    out = tmp_path / "r.html"
    assert main(["report", "--in", str(d), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[:2] == [
        f"{d / 'run-1.records.jsonl'}:2: not valid JSON: Expecting property name enclosed in double quotes: "
        "line 1 column 2 (char 1)",
        f"{d / 'run-1.records.jsonl'}:4: field seq must be >= 0, not -1",
    ]
    assert err.splitlines()[2].startswith("corda-trio: error: 2 bad record(s) in the input")
    assert not out.exists()
    assert main(["report", "--in", str(d), "--out", str(out), "--skip-bad"]) == 0
    printed = capsys.readouterr().out
    assert "2 records" in printed and "warning: 2 bad record(s) left out" in printed
    html = out.read_text(encoding="utf-8")
    assert "2 bad record(s) were left out" in html
    assert "run-1.records.jsonl:4: field seq must be &gt;= 0" in html


def test_exact_duplicates_are_dropped_and_counted_ones_that_differ_are_bad_the_same_file_twice_refused(
    spark: Any, tmp_path: Path
) -> None:
    d = tmp_path / "dup"
    d.mkdir()
    lines = [_line(i) for i in range(50)]
    (d / "run-1.records.jsonl").write_text("\n".join(lines) + "\n")
    (d / "copy.jsonl").write_text("\n".join(lines[10:20]) + "\n")  # the same operations again
    result = compute(load_records(spark, discover_inputs([d])))
    assert result.duplicates == 10
    assert sum(g.count for g in result.groups) == 50
    assert sum(p.ok for p in result.series) == 50
    assert "duplicates that differ" in result.timings and result.bad_count == 0
    # the same operation once ok and once failed (and seq 30 three times, two copies equal): which record
    # is the measurement cannot be told, so all of them are bad, each named with the others' places
    differ = [_line(12, outcome="error", error="E: x", delivered_ns=None), _line(30), _line(30, size_bytes=1)]
    (d / "other.jsonl").write_text("\n".join([_line(100), *differ]) + "\n")
    with pytest.raises(spark_reports.BadRecordsError) as info:
        compute(load_records(spark, discover_inputs([d])))
    copy, other, main_file = d / "copy.jsonl", d / "other.jsonl", d / "run-1.records.jsonl"
    same = "the same operation (run 'run-1', scenario 's', link 'l', seq {}) as {} with other values"
    assert info.value.total == 6
    assert info.value.lines == [
        f"{copy}:3: " + same.format(12, f"{other}:2, {main_file}:13"),
        f"{other}:2: " + same.format(12, f"{copy}:3, {main_file}:13"),
        f"{other}:3: " + same.format(30, f"{other}:4, {main_file}:31"),
        f"{other}:4: " + same.format(30, f"{other}:3, {main_file}:31"),
        f"{main_file}:13: " + same.format(12, f"{copy}:3, {other}:2"),
        f"{main_file}:31: " + same.format(30, f"{other}:3, {other}:4"),
    ]
    # lines in the writer's form (the JSON reader's reading is trusted: no line check) alike
    w = tmp_path / "writer-form"
    w.mkdir()
    recs = [rf.Record(**json.loads(_line(i))) for i in range(3)]
    recs.append(rf.Record(**json.loads(_line(1, outcome="error", error="E: x"))))
    (w / "run-1.records.jsonl").write_text("".join(rf.json_line(r.values()) for r in recs))
    with pytest.raises(spark_reports.BadRecordsError) as info:
        compute(load_records(spark, discover_inputs([w])))
    p = w / "run-1.records.jsonl"
    assert info.value.lines == [f"{p}:2: " + same.format(1, f"{p}:4"), f"{p}:4: " + same.format(1, f"{p}:2")]
    skipped = compute(load_records(spark, discover_inputs([d])), skip_bad=True)
    assert (skipped.bad_count, len(skipped.bad_records), skipped.duplicates) == (6, 6, 9)
    assert sum(g.count for g in skipped.groups) == sum(p.ok for p in skipped.series) == 51 - 2
    with pytest.raises(spark_reports.ReportInputError, match="the same records are given twice"):
        discover_inputs([d, d])
    with pytest.raises(spark_reports.ReportInputError, match="given twice"):
        discover_inputs([d, tmp_path / "dup" / ".." / "dup"])


# ----------------------------------------------------------------------------------------- sketch bound


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    values=st.lists(st.integers(0, 10**9), min_size=1, max_size=400)
    | st.lists(st.integers(0, 5), min_size=1, max_size=400),
    accuracy=st.sampled_from([5, 10, 40, 100]),
)
def test_gk_sketch_stays_within_its_stated_bound(spark: Any, values: list[int], accuracy: int) -> None:
    from pyspark.sql import functions as F

    sketch = spark_reports.Sketch(kind="gk", size=accuracy)
    grid = [0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 0.999]
    df = spark.createDataFrame([(v,) for v in values], "v long")
    estimates = df.agg(F.percentile_approx("v", grid, accuracy).alias("q")).collect()[0]["q"]
    ordered = sorted(values)
    n = len(ordered)
    for p, est in zip(grid, estimates, strict=True):
        exact = max(0, math.ceil(p * n) - 1)
        lo, hi = bisect.bisect_left(ordered, est), bisect.bisect_right(ordered, est) - 1
        assert lo <= hi, "the estimate is one of the values"
        distance = 0 if lo <= exact <= hi else min(abs(lo - exact), abs(hi - exact))
        assert distance <= sketch.max_rank_distance(n), (p, est, n, distance)


def test_timestamps_near_the_largest_long_are_reported_not_a_py4j_error(spark: Any, tmp_path: Path) -> None:
    # a run's window (twice its p99 completion time + 10 s) went past 64 bits: Spark's lit() failed
    d = tmp_path / "huge"
    d.mkdir()
    top = 2**63 - 1
    lines = [_line(1), _line(2, intended_ns=0, created_ns=None, delivered_ns=top)]
    lines.append(_line(3, intended_ns=top, created_ns=None, delivered_ns=None))
    (d / "run-1.records.jsonl").write_text("\n".join(lines) + "\n")
    result = compute(load_records(spark, discover_inputs([d])))
    (group,) = result.groups
    assert (group.count, group.ok, group.first_intended_ns, group.last_done_ns) == (3, 3, 0, top)
    end = group.stage("end")
    assert end is not None and end.max_ns == top
    assert result.windows["run-1"].end_ns == top and result.windows["run-1"].outliers == 0
    assert sum(p.ok for p in result.series) == 3


def test_lines_that_are_not_utf8_or_nested_too_deeply_are_listed_by_line(spark: Any, tmp_path: Path) -> None:
    # not UTF-8: counted as bad by Spark's JSON reader but read by from_json, so it was never listed
    # ("the first 0 are listed"); nested deeper than json.loads can go: a RecursionError traceback
    d = tmp_path / "odd"
    d.mkdir()
    deep = _line(3)[:-1] + ', "extra": ' + "[" * 1500 + "]" * 1500 + "}"
    text = "\n".join([_line(1), _line(2, link="l~"), deep, _line(4)]) + "\n"
    (d / "run-1.records.jsonl").write_bytes(text.encode().replace(b"~", b"\xff"))
    with pytest.raises(spark_reports.BadRecordsError) as info:
        compute(load_records(spark, discover_inputs([d])))
    assert info.value.total == 2
    assert info.value.lines == [
        f"{d / 'run-1.records.jsonl'}:2: the line is not valid UTF-8",
        f"{d / 'run-1.records.jsonl'}:3: the line is nested too deeply to read",
    ]
