"""Checking every record in Spark against the one schema table, and naming bad lines as ``FILE:LINE``.

Theory of operation
===================

The rules come from ``corda_trio.records.FIELDS`` (the same table the record writer and ``read_records``
obey). :func:`reason_column` turns them into one Spark ``CASE`` expression that is ``NULL`` for a valid
record and otherwise says what is wrong, in the words ``records.record_problem`` uses. The main aggregation
groups by "is valid" as well, so counting bad records costs no extra pass; records that are bad never reach
a statistic.

Only when there are bad records does :func:`locate_bad` run: one more pass counts the lines of every input
split (``_metadata.file_path``, ``_metadata.file_block_start``) and their first
``monotonically_increasing_id`` (consecutive within a split), which turns a row's id into its line number:
``lines in earlier splits of the file + (id - first id of its split) + 1``. Parquet inputs carry
``_metadata.row_index``. The first :data:`MAX_LISTED` bad rows (ordered by file and line) are collected with
at most :data:`MAX_LINE_CHARS` characters of their text; a line no longer than that is re-checked in
Python on it, which names the exact problem in ``read_records``' words (Spark only knows "malformed" for some
faults). Parquet rows and longer lines are named by Spark's reason. The driver holds nothing else.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final
from urllib.parse import unquote, urlparse

import attrs

from corda_trio import records

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

__all__ = [
    "MAX_LINE_CHARS",
    "MAX_LISTED",
    "BadRecord",
    "canonical_line",
    "line_reason",
    "locate_bad",
    "locate_conflicts",
    "reason_column",
]

#: Bad records named one by one (then a count).
MAX_LISTED: Final = 20
#: Characters of a bad line fetched to the driver to explain it.
MAX_LINE_CHARS: Final = 4096


@attrs.frozen(kw_only=True)
class BadRecord:
    """One bad record: where it is and what is wrong."""

    path: str
    line: int
    problem: str
    kind: str = "line"  # "line" (JSON lines) or "row" (Parquet)

    @property
    def place(self) -> str:
        """``FILE:LINE`` (Parquet: ``FILE: row N``)."""
        return f"{self.path}: row {self.line}" if self.kind == "row" else f"{self.path}:{self.line}"

    def format(self) -> str:
        """``FILE:LINE: what is wrong`` (Parquet: ``FILE: row N: ...``)."""
        return f"{self.place}: {self.problem}"


def reason_column(*, parsed: Column | None = None, corrupt: Column | None = None) -> Column:
    """``NULL`` for a valid record, else what is wrong (the first broken rule, in ``record_problem``'s order).

    Args:
        parsed: JSON only: the parsed struct (``NULL`` when the line is not a JSON object).
        corrupt: JSON only: Spark's corrupt-record column (set for malformed JSON or a wrongly typed field).
    """
    from pyspark.sql import functions as F

    branches: list[tuple[Column, Column]] = []
    if parsed is not None:
        branches.append((parsed.isNull(), F.lit("a record must be a JSON object")))
    if corrupt is not None:
        branches.append((corrupt.isNotNull(), F.lit("not valid JSON, or a field has the wrong type")))
    known = sorted(records.KNOWN_SCHEMA_VERSIONS)
    version = F.col(records.VERSION_FIELD)
    branches.append(
        (
            version.isNotNull() & ~version.isin(*known),
            F.concat(
                F.lit(f"unknown {records.VERSION_FIELD} "), version.cast("string"),
                F.lit(f" (this reader knows {', '.join(map(str, known))})"),
            ),
        )
    )  # fmt: skip
    for rule in records.FIELDS:
        c = F.col(rule.name)
        name = rule.name
        if rule.required:
            branches.append((c.isNull(), F.lit(f"required field {name} is missing or null")))
        if rule.min_value is not None:
            text = F.concat(F.lit(f"field {name} must be >= {rule.min_value}, not "), c.cast("string"))
            branches.append((c < rule.min_value, text))
        if rule.max_value is not None:
            text = F.concat(F.lit(f"field {name} must be <= {rule.max_value}, not "), c.cast("string"))
            branches.append((c > rule.max_value, text))
        if rule.non_empty:
            branches.append((c == "", F.lit(f"field {name} must not be empty")))
        if rule.max_chars is not None:
            # (Spark's length counts characters, code points, as Python's len does)
            text = F.concat(
                F.lit(f"field {name} must be at most {rule.max_chars} characters, not "),
                F.format_number(F.length(c), 0),
            )
            branches.append((F.length(c) > rule.max_chars, text))
        if rule.pattern is not None:
            # the whole value, as re.fullmatch: Java's $ (like Python's) matches before a final line break
            whole = f"\\A(?:{rule.pattern})\\z"
            text = F.concat(F.lit(f"field {name} must match {rule.pattern}, not "), _shown(c))
            branches.append((~c.rlike(whole), text))
        if rule.choices is not None:
            text = F.concat(F.lit(f"field {name} must be one of {', '.join(rule.choices)}, not "), _shown(c))
            branches.append((~c.isin(*rule.choices), text))
    branches.append(
        (
            (F.col("outcome") == "error") != F.col("error").isNotNull(),
            F.lit("a record has an error text iff its outcome is error"),
        )
    )
    expr = F.when(branches[0][0], branches[0][1])
    for cond, text in branches[1:]:
        expr = expr.when(cond, text)
    return expr


def _shown(c: Column) -> Column:
    """A text value quoted as ``records`` quotes a text (its ``repr``): a backslash, line break or tab
    escaped (a problem stays on one line), in double quotes if it holds a single quote and no double one;
    whole, or cut with the ellipsis inside the quotes. (``repr`` also escapes other control characters,
    which this leaves as they are; a JSON line's problem is worded by ``records`` itself, see
    :func:`_explain`.)"""
    from pyspark.sql import functions as F

    text = c
    for raw, escaped in _ESCAPES:
        text = F.replace(text, F.lit(raw), F.lit(escaped))
    double = F.contains(c, F.lit("'")) & ~F.contains(c, F.lit('"'))
    quote = F.when(double, F.lit('"')).otherwise(F.lit("'"))
    text = F.when(double, text).otherwise(F.replace(text, F.lit("'"), F.lit("\\'")))
    room = records.SHOWN_VALUE_CHARS - 2
    cut = room - len(records.SHOWN_ELLIPSIS)
    return F.when(F.length(text) <= room, F.concat(quote, text, quote)).otherwise(
        F.concat(quote, F.left(text, F.lit(cut)), F.lit(records.SHOWN_ELLIPSIS), quote)
    )


#: What ``repr`` escapes in a text that :func:`_shown` escapes too (the backslash first).
_ESCAPES: Final = (("\\", "\\\\"), ("\n", "\\n"), ("\r", "\\r"), ("\t", "\\t"))


def canonical_line() -> Column:
    """The record of the typed columns as its writer writes it (``records.json_line``, Spark's ``to_json``:
    every field in record order, nulls too, no spaces; ``schema_version`` last when it is set).

    A line equal to it is one JSON object with nothing after it, no key twice and every field of its JSON
    type, so the typed columns' checks (:func:`reason_column`) are all it needs. Spark's JSON reader cannot
    see the line, and hides exactly those faults: it reads the first object of a line and ignores the rest,
    keeps one of two equal keys, and turns any value of a text field into text (``123``, ``true``,
    ``{"a": 1}``). Lines written by another program (spaces, escapes, other key order) are not equal to it
    and are checked in full instead (:func:`line_reason`).
    """
    from pyspark.sql import functions as F

    names = list(records.RECORD_FIELDS)
    options = {"ignoreNullFields": "false"}
    plain = F.to_json(F.struct(*names), options)
    tagged = F.to_json(F.struct(*names, records.VERSION_FIELD), options)
    return F.when(F.col(records.VERSION_FIELD).isNull(), plain).otherwise(tagged)


#: The reason of a line whose text the typed columns do not fully describe; ``_explain`` names the fault.
_NOT_ONE_RECORD: Final = "not valid JSON, or a field has the wrong type"


def line_reason(text: Column, checked: Column) -> Column:
    """What is wrong with one JSON line (``NULL``: nothing), given the reason of its parsed typed columns.

    A line equal to :func:`canonical_line` has only ``checked`` to answer for. Any other line is parsed again
    as a variant twice, wrapped as ``[line]`` and as ``{"x": line}``: Spark's variant parser refuses a key
    twice, and although each parse ignores what follows a complete value, no text after the record is valid
    in both (after ``[r`` it must start ``,`` and then a value, or ``]``; after ``{"x": r`` it must start
    ``,`` and then a key with ``:``, or ``}``). The text fields' JSON types and the keys that are not fields
    (``records.KNOWN_FIELDS``) are read from the first parse.
    Only such lines pay for the extra parses (``CASE`` evaluates its branches lazily).

    Args:
        text: the line (without a leading byte order mark).
        checked: :func:`reason_column` of the line's typed columns.
    """
    from pyspark.sql import functions as F

    as_array = F.try_parse_json(F.concat(F.lit("["), text, F.lit("]")))
    as_member = F.try_parse_json(F.concat(F.lit('{"x":'), text, F.lit("}")))
    wrong_type = F.lit(False)
    for rule in records.FIELDS:
        if rule.kind == "string":  # (absent: NULL; JSON null: VOID)
            kind = F.schema_of_variant(F.variant_get(as_array, f"$[0].{rule.name}", "variant"))
            wrong_type = wrong_type | ~F.coalesce(kind.isin("STRING", "VOID"), F.lit(True))
    strict = as_array.isNotNull() & as_member.isNotNull() & ~wrong_type
    # keys that are not fields (a variant object's keys come sorted, as ``unknown_fields_problem`` names them)
    keys = F.map_keys(F.try_variant_get(as_array, "$[0]", "map<string,variant>"))
    unknown = F.array_except(keys, F.array(*map(F.lit, records.KNOWN_FIELDS)))
    # (the problem's text with no names is its prefix)
    unknown_text = F.concat(F.lit(records.unknown_fields_problem(())), F.array_join(unknown, ", "))
    return (
        F.when(text == canonical_line(), checked)
        .when(~strict, F.lit(_NOT_ONE_RECORD))
        .when(F.size(unknown) > 0, unknown_text)
        .otherwise(checked)
    )


def locate_bad(df: DataFrame, lines: DataFrame | None, limit: int = MAX_LISTED) -> list[BadRecord]:
    """The first ``limit`` bad records of ``df`` (as built by ``_schema.load_records``), by file and line.

    Args:
        df: ``LoadedRecords.frame`` (``_reason``, ``_source``, ``_block``, ``_pos``, ``_kind``, ``_text_*``).
        lines: JSON only: every input line (blank ones too) with ``_source``, ``_block``, ``_pos``.
    """
    from pyspark.sql import functions as F

    first = (
        df.where(F.col("_reason").isNotNull())
        .select("_source", "_block", "_pos", "_kind", "_reason", "_text_head", "_text_len")
        .orderBy("_source", "_block", "_pos")
        .limit(limit)
        .collect()
    )
    out: list[BadRecord] = []
    for r, line in zip(first, _line_numbers(first, lines), strict=True):
        if r["_kind"] == "line":
            problem = _explain(r["_reason"], r["_text_head"], int(r["_text_len"] or 0))
        else:
            problem = r["_reason"]
        out.append(BadRecord(path=_local_path(r["_source"]), line=line, problem=problem, kind=r["_kind"]))
    return out


#: Other places named for one record of an operation recorded with other values (then a count).
MAX_OTHER_PLACES: Final = 3


def locate_conflicts(
    df: DataFrame, lines: DataFrame | None, conflicts: DataFrame, keys: list[str], limit: int = MAX_LISTED
) -> list[BadRecord]:
    """The first ``limit`` records of ``df`` whose operation is one of ``conflicts`` (recorded more than once
    with other values, ``records.DUPLICATE_KEY``), by file and line, each naming where the others are.

    Args:
        df: the located records (as :func:`locate_bad` takes them), valid ones only.
        lines: as for :func:`locate_bad`.
        conflicts: the operations: ``keys`` and ``n`` (how many records each has).
        keys: the key columns, as ``df`` and ``conflicts`` both have them.
    """
    from pyspark.sql import functions as F

    cols = ["_source", "_block", "_pos", "_kind", *keys, *(f"_raw_{k}" for k in records.DUPLICATE_KEY)]
    rows = df.join(F.broadcast(conflicts), on=keys, how="left_semi").select(*cols)
    order = ["_source", "_block", "_pos"]
    first = rows.orderBy(*order).limit(limit).collect()
    wanted = {tuple(r[k] for k in keys) for r in first}
    if not wanted:
        return []
    key_cond = F.lit(False)
    for values in wanted:
        one = F.lit(True)
        for k, v in zip(keys, values, strict=True):
            one = one & (F.col(k) == F.lit(v))
        key_cond = key_cond | one
    counts = {tuple(r[k] for k in keys): int(r["n"]) for r in conflicts.where(key_cond).collect()}
    # every place of those operations, up to a few per record listed (the first by file and line)
    places = rows.where(key_cond).orderBy(*order).limit(limit * (MAX_OTHER_PLACES + 1)).collect()
    at: dict[tuple[Any, ...], list[str]] = {}
    for r, line in zip(places, _line_numbers(places, lines), strict=True):
        at.setdefault(tuple(r[k] for k in keys), []).append(_place(r["_source"], line, r["_kind"]))
    out: list[BadRecord] = []
    for r, line in zip(first, _line_numbers(first, lines), strict=True):
        key = tuple(r[k] for k in keys)
        here = _place(r["_source"], line, r["_kind"])
        others = [p for p in at.get(key, []) if p != here][:MAX_OTHER_PLACES]
        raw = tuple(r[f"_raw_{k}"] for k in records.DUPLICATE_KEY)
        problem = records.duplicate_problem(raw, others, counts[key] - 1 - len(others))
        out.append(BadRecord(path=_local_path(r["_source"]), line=line, problem=problem, kind=r["_kind"]))
    return out


def _place(source: str, line: int, kind: str) -> str:
    return BadRecord(path=_local_path(source), line=line, problem="", kind=kind).place


def _line_numbers(rows: list[Any], lines: DataFrame | None) -> list[int]:
    """The line (JSON) or row (Parquet) number, from 1, of each located row (``_source``, ``_block``,
    ``_pos``, ``_kind``)."""
    from pyspark.sql import functions as F

    starts: dict[tuple[str, int], int] = {}
    if lines is not None and any(r["_kind"] == "line" for r in rows):
        wanted = sorted({r["_source"] for r in rows if r["_kind"] == "line"})
        blocks = (
            lines.where(F.col("_source").isin(*wanted))
            .groupBy("_source", "_block")
            .agg(F.count(F.lit(1)).alias("n"), F.min("_pos").alias("first"))
            .collect()
        )
        by_file: dict[str, list[Any]] = {}
        for b in blocks:
            by_file.setdefault(b["_source"], []).append(b)
        for source, bs in by_file.items():
            before = 0
            for b in sorted(bs, key=lambda b: b["_block"]):
                starts[(source, b["_block"])] = before - int(b["first"])
                before += int(b["n"])
    return [
        starts[(r["_source"], r["_block"])] + int(r["_pos"]) + 1
        if r["_kind"] == "line"
        else int(r["_pos"]) + 1
        for r in rows
    ]


def _explain(reason: str, head: str | None, length: int) -> str:
    """Spark's reason, made exact by checking the line's text in Python (``records.record_problem``, the words
    ``read_records`` uses) whenever the whole line is at hand: Spark only knows "malformed" for some faults,
    and quotes a value with quotes or control characters as it is, where Python escapes it (one line)."""
    if head is None or length > len(head):
        return reason if length <= MAX_LINE_CHARS else f"{reason} (a line of {length:,} characters)"
    try:
        data = records.parse_line(head)
    except records.RecordError as exc:
        return str(exc)
    return records.record_problem(data) or reason


def _local_path(uri: str) -> str:
    parsed = urlparse(uri)
    return unquote(parsed.path) if parsed.scheme in ("file", "") else uri
