"""The record schema (one table, read by the writer and the report), the writer and the reader."""

from __future__ import annotations

import ast
import errno
import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corda_trio import records


def _data(**changes: Any) -> dict[str, Any]:
    rec = records.make_record(
        run_id="r1", scenario="s", link="l", size_bytes=10, seq=0, intended_ns=100,
        stages={"created": 100, "enqueued": 150, "delivered": 400},
    )  # fmt: skip
    data = json.loads(records.json_line(rec.values()))
    data.update(changes)
    return data


def test_the_table_lists_every_field_once_in_line_order() -> None:
    assert records.RECORD_FIELDS == (
        "run_id", "scenario", "link", "size_bytes", "seq", "intended_ns", *records.STAGE_FIELDS,
        "outcome", "error",
    )  # fmt: skip
    assert len(set(records.RECORD_FIELDS)) == len(records.FIELDS)
    assert set(records.REQUIRED_FIELDS) == {"run_id", "scenario", "link", "size_bytes", "seq", "intended_ns",
                                            "outcome"}  # fmt: skip
    assert set(records.DUPLICATE_KEY) <= set(records.REQUIRED_FIELDS)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"run_id": ""}, "field run_id must not be empty"),
        ({"run_id": None}, "required field run_id is missing or null"),
        ({"size_bytes": -1}, "field size_bytes must be >= 0, not -1"),
        ({"size_bytes": records.MAX_SIZE_BYTES + 1}, "size_bytes must be <="),
        ({"intended_ns": -5}, "intended_ns must be >= 0"),
        ({"delivered_ns": -1}, "delivered_ns must be >= 0"),
        ({"seq": True}, "field seq must be an integer, not a boolean"),
        ({"seq": 1.5}, "field seq must be an integer, not a floating-point number (1.5)"),
        ({"sent_ns": "12"}, "sent_ns must be an integer, not a string"),
        ({"sent_ns": 2**64}, "does not fit in 64 bits"),
        ({"outcome": "maybe"}, "outcome must be one of ok, error"),
        ({"outcome": "error"}, "error text iff"),
        ({"error": "boom"}, "error text iff"),
        ({"schema_version": 7}, "unknown schema_version 7"),
        ({"link": 3}, "link must be a string, not an integer"),
        # the spec's run id pattern, on the field (it was applied to file names only) and on all of the id
        ({"run_id": "a/b c"}, f"field run_id must match {records.RUN_ID_PATTERN}, not 'a/b c'"),
        ({"run_id": "run-1\n"}, f"field run_id must match {records.RUN_ID_PATTERN}, not 'run-1\\n'"),
        ({"run_id": "-run"}, "field run_id must match"),
        ({"run_id": "r" * 81}, "field run_id must match"),
        # "at most 200 characters" (it was not checked: 303 were read)
        (
            {"outcome": "error", "error": "E: " + "x" * 300},
            "field error must be at most 200 characters, not 303",
        ),
        ({"outcome": "error", "error": "é" * 201}, "field error must be at most 200 characters, not 201"),
    ],
)
def test_record_problem_names_the_field_and_rule(changes: dict[str, Any], message: str) -> None:
    assert message in (records.record_problem(_data(**changes)) or "")
    with pytest.raises(records.RecordError) as info:
        records.Record.from_mapping(_data(**changes))
    assert message in str(info.value)


#: Spec-valid values at the edge of each rule: every one is accepted.
EDGE_VALID = [
    {"run_id": "r"},
    {"run_id": "R" + "a_.-9" * 15 + "zzzz"},  # 80 characters
    {"outcome": "error", "error": "E: " + "é" * 197},  # 200 characters (more bytes)
    {"size_bytes": 0},
    {"size_bytes": records.MAX_SIZE_BYTES},
    {"seq": 0, "intended_ns": 0, "created_ns": 0},
    {"seq": 2**63 - 1, "intended_ns": 2**63 - 1, "flow_finished_ns": 2**63 - 1},
    {"schema_version": 1},
    {"scenario": "a/b c", "link": "O=A, L=London -> O=B"},  # only run_id has a pattern
]


@pytest.mark.parametrize("changes", EDGE_VALID)
def test_spec_valid_values_at_each_rules_edge_are_accepted(changes: dict[str, Any]) -> None:
    assert records.record_problem(_data(**changes)) is None
    assert records.record_problem(records.parse_line(json.dumps(_data(**changes)))) is None


@pytest.mark.parametrize("literal", ["1e2", "100.0", "1E+2", "-0.0"])
def test_a_float_literal_is_named_as_one_with_its_text(literal: str) -> None:
    """``size_bytes: 1e2`` was refused as "not a number with a fraction": it has none; it is a float."""
    line = json.dumps(_data()).replace('"size_bytes": 10,', f'"size_bytes": {literal},')
    assert records.record_problem(records.parse_line(line)) == (
        f"field size_bytes must be an integer, not a floating-point number ({literal})"
    )


def test_the_run_id_rule_is_the_writers_and_the_meta_files() -> None:
    # the writer's check let a trailing newline through (re.match with $): a file name with a newline in it
    with pytest.raises(records.RecordError, match="must match"):
        records.check_run_id("run-1\n")
    assert records.check_run_id("R" + "a_.-9" * 15 + "zzzz")
    assert records.meta_problem({"run_id": "a/b c"}) == (
        f"field run_id must match {records.RUN_ID_PATTERN}, not 'a/b c'"
    )


def test_absent_optional_fields_are_null_for_readers_but_not_for_the_writer_form() -> None:
    data = _data()
    del data["flow_finished_ns"]
    assert records.record_problem(data) is None
    assert "lacks field(s) flow_finished_ns" in (records.record_problem(data, all_present=True) or "")
    assert records.record_problem(_data(schema_version=1)) is None
    assert "JSON object" in (records.record_problem([1, 2]) or "")


def test_a_key_that_is_not_a_field_is_named() -> None:
    # a misspelt stage was ignored: its real field read as null
    data = _data(deliverd_ns=5, a=1)
    assert records.record_problem(data) == "unknown field(s) a, deliverd_ns"
    with pytest.raises(records.RecordError, match=r"^unknown field\(s\) a, deliverd_ns$"):
        records.Record.from_mapping(data)
    assert records.record_problem(_data(schema_version=1)) is None


def test_read_records_collapses_exact_duplicates_and_refuses_ones_that_differ(tmp_path: Path) -> None:
    # which of two records of one operation (one ok, one error) was the measurement cannot be told
    path = tmp_path / "dup.jsonl"
    same = [json.dumps(_data(seq=1)), json.dumps(_data(seq=2)), json.dumps(_data(seq=1))]
    path.write_text("\n".join(same) + "\n")
    assert [r.seq for r in records.read_records(path)] == [1, 2]
    other = json.dumps(_data(seq=1, outcome="error", error="E: x", delivered_ns=None))
    path.write_text("\n".join([*same, other]) + "\n")
    with pytest.raises(records.RecordError) as info:
        list(records.read_records(path))
    assert str(info.value) == (
        f"{path}:4: the same operation (run 'r1', scenario 's', link 'l', seq 1) as {path}:1 "
        "with other values"
    )


LONG_LINK = "O=Alice, L=London, C=GB -> O=Bob, L=Paris, C=FR"


def test_a_long_value_is_quoted_whole_cut_inside_its_quotes() -> None:
    """The duplicate's link was cut in its repr (``link 'O=Alice, ... O=Bob, L=..., seq 2``): no closing
    quote, so the reader could not tell the name from the message around it."""
    key = ("r1", "s", LONG_LINK, 2)
    assert records.duplicate_problem(key, ["f:1"]) == (
        "the same operation (run 'r1', scenario 's', link 'O=Alice, L=London, C=GB -> O=Bob, L...', seq 2) "
        "as f:1 with other values"
    )
    outcome = records.record_problem(_data(outcome="x" * 39)) or ""
    assert outcome.endswith(f"not '{'x' * 35}...'")
    assert (records.record_problem(_data(outcome="x" * 38)) or "").endswith(f"not '{'x' * 38}'")  # fits
    value = "it's \"\n" * 10  # escapes take more room: still whole escapes, the quotes kept
    shown = (records.record_problem(_data(outcome=value)) or "").split(", not ", 1)[1]
    assert len(shown) <= records.SHOWN_VALUE_CHARS and shown.endswith("...'")
    assert value.startswith(ast.literal_eval(shown[:-4] + shown[-1]))
    run = "r" * 50
    named = records.meta_problem({"run_id": run}, f"run-{'x' * 50}.meta.json") or ""
    assert named == f"field run_id is '{'r' * 35}...', but the file is named for run '{'x' * 35}...'"
    assert records.meta_problem({"run_id": "a", "schema_version": list(range(30))}) == (
        "unknown schema_version an array of 30 item(s) (this reader knows 1)"
    )


def test_meta_problem() -> None:
    assert records.meta_problem({"run_id": "a", "schema_version": 1}) is None
    assert records.meta_problem({"run_id": "a"}) is None  # files from before the field was checked
    assert "unknown schema_version 2" in (records.meta_problem({"run_id": "a", "schema_version": 2}) or "")
    assert "no run_id" in (records.meta_problem({"run_id": ""}) or "")


def test_writer_round_trip_and_bad_line_named(tmp_path: Path) -> None:
    writer = records.RecordWriter(tmp_path, "run-a")
    for i in range(9000):  # crosses a flush batch
        writer.add_sync(records.Record(**_data(seq=i, run_id="run-a")))
    assert not writer.records_path.exists()
    writer.finish({"run_id": "run-a", "schema_version": records.SCHEMA_VERSION})
    assert [r.seq for r in records.read_records(writer.records_path)] == list(range(9000))
    with pytest.raises(records.RecordError, match="already exists"):
        records.RecordWriter(tmp_path, "run-a")
    with pytest.raises(records.RecordError, match="run id"):
        records.RecordWriter(tmp_path, "../x")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(_data()) + "\n" + json.dumps(_data(seq=-3)) + "\n")
    with pytest.raises(records.RecordError, match=r"bad.jsonl:2: field seq must be >= 0, not -3"):
        list(records.read_records(bad))


def test_the_writer_cuts_an_error_text_to_the_limit_however_the_record_came(tmp_path: Path) -> None:
    """``make_record`` cut the text, but a :class:`Record` built directly or the harness's ``add_values``
    wrote it whole: a line every reader refuses."""
    long = "RuntimeError: " + "é" * 400
    writer = records.RecordWriter(tmp_path, "run-a")
    writer.add_sync(records.Record(**_data(seq=0, run_id="run-a", outcome="error", error=long)))
    values = records.Record(**_data(seq=1, run_id="run-a")).values()
    writer.add_values((*values[:-2], "error", long))
    writer.finish({"run_id": "run-a"})
    read = list(records.read_records(writer.records_path))
    assert [r.error for r in read] == [long[: records.MAX_ERROR_CHARS]] * 2


def test_a_run_the_disk_cannot_take_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk fills up as the run is published (the sync fails): the error comes out, and neither the
    records nor a ``.part`` file stays in the output directory (a reader would skip it, but it takes space
    and looks like a run)."""
    writer = records.RecordWriter(tmp_path, "run-a")
    for i in range(10):
        writer.add_sync(records.Record(**_data(seq=i, run_id="run-a")))

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match="No space left"):
        writer.finish({"run_id": "run-a", "schema_version": records.SCHEMA_VERSION})
    assert list(tmp_path.iterdir()) == []


_text = st.text(min_size=1, max_size=20)
_ns = st.integers(min_value=0, max_value=2**63 - 1)


@given(
    run=st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,20}", fullmatch=True), scenario=_text, link=_text,
    size=st.integers(0, records.MAX_SIZE_BYTES), seq=_ns, intended=_ns,
    stages=st.dictionaries(st.sampled_from(records.STAGES), _ns), error=st.none() | st.text(max_size=300),
)  # fmt: skip
def test_every_written_record_is_valid_and_reads_back(
    run: str, scenario: str, link: str, size: int, seq: int, intended: int, stages: dict[str, int],
    error: str | None,
) -> None:  # fmt: skip
    rec = records.make_record(
        run_id=run, scenario=scenario, link=link, size_bytes=size, seq=seq, intended_ns=intended,
        stages=stages, error=error,
    )  # fmt: skip
    data = json.loads(records.json_line(rec.values()))
    assert list(data) == list(records.RECORD_FIELDS)
    assert records.record_problem(data, all_present=True) is None
    assert records.Record.from_mapping(data) == rec


def test_an_output_directory_that_is_a_file_is_named_so(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x")
    with pytest.raises(records.RecordError) as info:
        records.RecordWriter(tmp_path / "afile", "run-a")
    assert str(info.value) == f"cannot create output directory {tmp_path / 'afile'}: it is a file"
    with pytest.raises(records.RecordError) as info:
        records.RecordWriter(tmp_path / "afile" / "deeper", "run-a")
    deeper = tmp_path / "afile" / "deeper"
    assert str(info.value) == f"cannot create output directory {deeper}: Not a directory"


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ('{"a": 1} {"a": 2}', "not valid JSON: text after the end of the record at column 10: '{\"a\": 2}'"),
        ('{"a": 1},', "not valid JSON: text after the end of the record at column 9: ','"),
        ('{"a": 1} // note', "not valid JSON: text after the end of the record at column 10: '// note'"),
        ('{"a": 1, "b": {"c": 2, "c": 3}}', "key 'c' appears twice in one object"),
        ('{"a": NaN}', "NaN is not a JSON number"),
        ('{"a": -Infinity}', "-Infinity is not a JSON number"),
        ("[" * 100_000, "the line is nested too deeply to read"),
    ],
)
def test_parse_line_refuses_what_json_loads_lets_through(line: str, problem: str) -> None:
    with pytest.raises(records.RecordError) as info:
        records.parse_line(line)
    assert str(info.value) == problem


def test_parse_line_ignores_a_byte_order_mark_and_surrounding_whitespace() -> None:
    assert records.parse_line('\ufeff {"a": 1}\r\n') == {"a": 1}


def test_read_records_names_each_kind_of_bad_line(tmp_path: Path) -> None:
    good = records.json_line(records.Record(run_id="r", scenario="s", link="l", size_bytes=1, seq=0,
                                            intended_ns=5).values())  # fmt: skip
    bad_lines = [
        (good.rstrip("\n").encode() + b" garbage\n", "text after the end of the record"),
        (good.replace('"seq":0', '"seq":0,"seq":1').encode(), "key 'seq' appears twice in one object"),
        (good.replace('"r"', "1").encode(), "field run_id must be a string, not an integer"),
        (good.replace('"l"', '"\xff"').encode("latin-1"), "the line is not valid UTF-8"),
    ]
    for i, (raw, problem) in enumerate(bad_lines):
        path = tmp_path / f"{i}.jsonl"
        path.write_bytes(b"\xef\xbb\xbf" + good.encode() + b"\r\n\r\n" + raw)
        with pytest.raises(records.RecordError, match=f"^{path}:4: .*{problem}"):
            list(records.read_records(path))
