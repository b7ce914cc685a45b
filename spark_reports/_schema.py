"""Finding and loading benchmark records (``protocol_spec/bench-records.md``) into Spark, with clear errors.

Input directories hold ``run-<id>.records.jsonl`` (JSON lines) and/or ``*.parquet`` record sets, plus
``run-<id>.meta.json`` files. JSON is read by Spark's JSON reader with an explicit schema (fast), which
cannot see a line's text; a checksum of every line against the record it was read as
(``LoadedRecords.text_checksum``) tells whether that was all there was to see, and if not, every line is
checked in full (``LoadedRecords.locate``, ``_validate.line_reason``). Bad records are counted during the
main aggregation (``_job.py``) and named by file and line.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import attrs

from corda_trio import records
from corda_trio.files import check_regular_file, read_small_file

from ._errors import ReportInputError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "RECORD_COLUMNS",
    "STAGES",
    "InputSet",
    "LoadedRecords",
    "discover_inputs",
    "load_records",
    "record_schema",
]

STAGES: Final = records.STAGES
#: (column, Spark type) in record order, from the one schema definition (``corda_trio.records.FIELDS``).
RECORD_COLUMNS: Final = tuple((f.name, f.kind) for f in records.FIELDS)
REQUIRED_COLUMNS: Final = records.REQUIRED_FIELDS


@attrs.frozen(kw_only=True)
class InputSet:
    """What was found in the input directories."""

    dirs: tuple[Path, ...]
    json_files: tuple[Path, ...]
    parquet_paths: tuple[Path, ...]
    metas: dict[str, dict[str, Any]]


def record_schema(*, corrupt_column: str | None = None) -> Any:
    """The Spark ``StructType`` of a record, the optional version field and Spark's corrupt-record column."""
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    types = {"string": StringType(), "long": LongType()}
    fields = [StructField(name, types[kind], nullable=True) for name, kind in RECORD_COLUMNS]
    fields.append(StructField(records.VERSION_FIELD, LongType(), nullable=True))
    if corrupt_column:
        fields.append(StructField(corrupt_column, StringType(), nullable=True))
    return StructType(fields)


@attrs.frozen(kw_only=True)
class LoadedRecords:
    """The records of all inputs as one DataFrame; the same records with their positions on demand.

    ``frame`` has the record columns in :data:`RECORD_COLUMNS` order, ``schema_version``, ``_reason``
    (``NULL`` for a valid record, else what is wrong) and, when some input is JSON lines, ``_canon`` (a
    64-bit hash of the line its record would be as the writer writes it; ``NULL`` for Parquet records).
    :meth:`locate` builds the positioned form, which checks each line's own text; it is slower to read and
    only used when :attr:`frame` cannot be trusted (some record is bad, or :meth:`text_checksum` differs
    from the sum of ``_canon``).
    """

    frame: Any
    _spark: Any = attrs.field(alias="spark", repr=False)
    _inputs: InputSet = attrs.field(alias="inputs", repr=False)

    @property
    def has_text(self) -> bool:
        """Some input is JSON lines (which each pass over the records parses again)."""
        return bool(self._inputs.json_files)

    def text_checksum(self) -> tuple[int, int, int]:
        """Over every non-empty line of the JSON inputs: the sums of the low and of the high 32 bits of
        ``xxhash64(line)``, and the number of lines (one pass over the text, no parse).

        Equal to the same sums of ``_canon`` over :attr:`frame` only if (but for a 64-bit hash collision)
        each line is the writer's form of a record that was read, and a line in that form is exactly its
        record (``_validate.canonical_line``): whatever a line is read as in the writer's form is that
        line, so a multiset of such forms equal to the lines leaves no line out.
        """
        from pyspark.sql import functions as F

        lines = self._spark.read.text([str(p) for p in self._inputs.json_files])
        row = (
            lines.where(F.octet_length("value") > 0)
            .select(*checksum_columns(F.xxhash64("value")))
            .collect()[0]
        )
        return (int(row[0] or 0), int(row[1] or 0), int(row[2] or 0))

    def locate(self) -> tuple[Any, Any | None]:
        """``(located, lines)``: ``located`` has the columns of :attr:`frame` plus ``_source`` / ``_block`` /
        ``_pos`` / ``_kind`` (where the record is; see ``_validate.py``) and ``_text_head`` / ``_text_len``
        (JSON: the start of the line); ``lines`` (JSON inputs) is every input line, for line numbers.

        Built only when some record is bad: defining these frames costs Spark's analysis of the
        text + ``from_json`` plan (seconds of a fresh JVM's warm-up), which a clean input never needs.
        """
        return _positioned(self._spark, self._inputs)


def checksum_columns(hashes: Any) -> list[Any]:
    """Aggregate columns summing 64-bit ``hashes`` without overflow (low and high 32 bits apart), and a count
    (:meth:`LoadedRecords.text_checksum`; the main aggregate sums ``_canon`` with them)."""
    from pyspark.sql import functions as F

    return [
        F.sum(hashes.bitwiseAND(F.lit(0xFFFFFFFF))),
        F.sum(F.shiftrightunsigned(hashes, 32)),
        F.count(hashes),
    ]


def discover_inputs(dirs: list[Path]) -> InputSet:
    """List record files and read meta files in ``dirs``.

    Raises:
        ReportInputError: a directory is missing, holds no records, or a meta file is not valid JSON.
    """
    json_files: list[Path] = []
    parquet_paths: list[Path] = []
    metas: dict[str, dict[str, Any]] = {}
    meta_files: dict[str, Path] = {}  # run id -> its meta file
    seen: dict[Path, Path] = {}  # resolved path -> as given
    for d in dirs:
        d = Path(d)
        if not d.is_dir():
            raise ReportInputError(f"input directory {d} does not exist or is not a directory")
        found_here = 0
        for entry in sorted(d.iterdir()):
            name = entry.name
            # (a meta file too: it sorts before its records, and was taken for a second meta file of its run)
            if name.endswith((".jsonl", ".parquet", records.META_SUFFIX)):
                try:
                    real = entry.resolve()
                except (OSError, RuntimeError) as exc:  # RuntimeError: a symlink loop (Python < 3.13)
                    raise ReportInputError(f"{entry} cannot be resolved: {exc}") from None
                if real in seen:
                    raise ReportInputError(
                        f"{entry}: the same records are given twice (also as {seen[real]}); counts would "
                        "double. Give each input directory once"
                    )
                seen[real] = entry
            if name.endswith(".jsonl"):
                _check_record_file(entry)
                json_files.append(entry)
                found_here += 1
            elif name.endswith(".parquet"):
                if not entry.is_dir():  # (a Parquet record set is a file or a directory of them)
                    _check_record_file(entry)
                parquet_paths.append(entry)
                found_here += 1
            elif name.endswith(records.META_SUFFIX):
                run_id, meta = _read_meta(entry)
                if run_id in metas:
                    raise ReportInputError(
                        f"{entry}: field run_id {run_id!r} is also the run of meta file "
                        f"{meta_files[run_id]}: one run has one meta file"
                    )
                metas[run_id], meta_files[run_id] = meta, entry
        if not found_here:
            raise ReportInputError(
                f"no benchmark records in {d}: expected run-<id>.records.jsonl or *.parquet "
                "(written by `corda-trio bench run --out DIR`)"
            )
    if parquet_paths == [] and all(f.stat().st_size == 0 for f in json_files):
        raise ReportInputError(f"the record files in {', '.join(map(str, dirs))} are all empty")
    return InputSet(
        dirs=tuple(Path(d) for d in dirs),
        json_files=tuple(json_files),
        parquet_paths=tuple(parquet_paths),
        metas=metas,
    )


def _check_record_file(path: Path) -> None:
    """Refuse a record file that Spark could not read, or that the search would have passed by (a named
    pipe, a device, a directory, a dangling symbolic link, no permission): leaving it out would change the
    report's figures without a word, and Spark would wait for a pipe's writer or stop with a traceback."""
    try:
        check_regular_file(path)
    except OSError as exc:
        why = exc.strerror
        if isinstance(exc, FileNotFoundError) and path.is_symlink():
            why = f"a symbolic link to {os.readlink(path)}, which does not exist"
        raise ReportInputError(f"record file {path} cannot be read: {why}") from None


#: A meta file is a short description of a run; a larger one is not read (the driver's memory stays bounded).
MAX_META_BYTES: Final = 1 << 20


def _read_meta(path: Path) -> tuple[str, dict[str, Any]]:
    """The run id and the contents of meta file ``path``; raises :class:`ReportInputError` naming the file."""
    try:
        # (bounded by reading, not by its size: /dev/zero or a pipe under this name has size 0)
        meta = json.loads(read_small_file(path, MAX_META_BYTES).decode("utf-8"))
    except OSError as exc:
        if exc.errno == errno.EFBIG:
            raise ReportInputError(f"meta file {path} is larger than {MAX_META_BYTES:,} bytes") from None
        raise ReportInputError(f"meta file {path} cannot be read: {exc.strerror}") from exc
    except ValueError as exc:
        raise ReportInputError(f"meta file {path} is not valid JSON: {exc}") from exc
    except RecursionError:
        raise ReportInputError(f"meta file {path} is nested too deeply to read") from None
    problem = records.meta_problem(meta, path.name)
    if problem is not None:
        raise ReportInputError(f"{path}: {problem}")
    return meta["run_id"], meta


#: Input splits per core. Each task's partial quantile sketches are merged at the end, and below ``k``
#: values per group a sketch keeps them all, so many small splits cost a second insertion of almost every
#: value; one split per core keeps that merge small (measured on 10M Parquet records, one session, load
#: 10-16: the aggregate took 70-104 s with 12 splits, 61 s with 8, 43 s with 3).
SPLITS_PER_CORE: Final = 1
#: The smallest input split (small inputs: the split size does not matter).
MIN_SPLIT_BYTES: Final = 8 << 20
#: The largest (a huge input on a cluster: tasks small enough to retry and to balance).
MAX_SPLIT_BYTES: Final = 4 << 30
#: What Spark counts for opening a file when it packs files into splits (``spark.sql.files.openCostInBytes``).
OPEN_COST_BYTES: Final = 4 << 20


def input_bytes(inputs: InputSet) -> int:
    """The size of the record files as Spark packs them: each file's bytes plus :data:`OPEN_COST_BYTES`."""
    files = list(inputs.json_files)
    for p in inputs.parquet_paths:
        files += [p] if p.is_file() else [f for f in p.rglob("*.parquet") if f.is_file()]
    return sum(f.stat().st_size + OPEN_COST_BYTES for f in files)


def split_bytes(total: int, cores: int) -> int:
    """``spark.sql.files.maxPartitionBytes`` for ``total`` input bytes: :data:`SPLITS_PER_CORE` per core."""
    return min(MAX_SPLIT_BYTES, max(MIN_SPLIT_BYTES, -(-total // (max(1, cores) * SPLITS_PER_CORE))))


#: How Spark parses a record line (the JSON reader and ``from_json`` alike): strict JSON, where Spark's
#: defaults accept single-quoted strings and ``NaN`` / ``Infinity``.
JSON_OPTIONS: Final = {
    "mode": "PERMISSIVE",
    "columnNameOfCorruptRecord": "_corrupt",
    "allowSingleQuotes": "false",
    "allowNonNumericNumbers": "false",
}


def load_records(spark: SparkSession, inputs: InputSet) -> LoadedRecords:
    """All records, each checked against the schema table in Spark (``_validate.reason_column``).

    Sets the session's input split size for these inputs (:func:`split_bytes`), and turns off the
    optimizer's constraint propagation.

    Raises:
        ReportInputError: a Parquet input cannot be read, lacks a column or has a column of the wrong type.
    """
    from pyspark.sql import functions as F

    from ._validate import canonical_line, reason_column

    split = split_bytes(input_bytes(inputs), spark.sparkContext.defaultParallelism)
    spark.conf.set("spark.sql.files.maxPartitionBytes", str(split))
    # The optimizer's constraint propagation rewrites each filter's condition through every alias below it;
    # with the line check's expression (``_validate.line_reason``) under ``_job``'s per-column ``valid``
    # conditions, it ran the driver out of memory ("GC overhead limit exceeded" planning a 35-line input).
    # It only infers extra filters (for joins), which these jobs do not need.
    spark.conf.set("spark.sql.constraintPropagation.enabled", "false")
    names = [n for n, _ in RECORD_COLUMNS]
    # JSON through Spark's JSON reader (measured 2.4x faster than text + from_json, which the line numbers
    # need; 6.3 s against 9.5-10.4 s of JVM CPU for 2M lines, 2026-11-30): the same rules, no line positions
    # and no sight of the line's text; :meth:`LoadedRecords.text_checksum` tells whether the text held more.
    main: list[DataFrame] = []
    if inputs.json_files:
        raw = (
            spark.read.schema(record_schema(corrupt_column="_corrupt"))
            .options(**JSON_OPTIONS)
            .json([str(p) for p in inputs.json_files])
        )
        reason = reason_column(corrupt=F.col("_corrupt")).alias("_reason")
        canon = F.xxhash64(canonical_line()).alias("_canon")
        main.append(raw.select(*names, records.VERSION_FIELD, reason, canon))
    for path in inputs.parquet_paths:
        typed = _typed_parquet(spark, path)
        canon = [F.lit(None).cast("long").alias("_canon")] if inputs.json_files else []
        main.append(typed.select(*names, records.VERSION_FIELD, reason_column().alias("_reason"), *canon))
    frame = main[0]
    for other in main[1:]:
        frame = frame.unionByName(other)
    return LoadedRecords(frame=frame, spark=spark, inputs=inputs)


def _typed_parquet(spark: SparkSession, path: Path, *extra: Any) -> DataFrame:
    """The record columns of one Parquet record set, cast to the schema's types (checked: names and types),
    and the ``extra`` columns (read in the same select: ``_metadata`` is only resolvable on the scan)."""
    from pyspark.sql import functions as F

    try:
        df = spark.read.parquet(str(path))
    except Exception as exc:  # pyspark raises its own AnalysisException family
        raise ReportInputError(f"cannot read Parquet records {path}: {_first_line(exc)}") from exc
    present = {f.name: f.dataType.simpleString() for f in df.schema.fields}
    missing = [name for name, _ in RECORD_COLUMNS if name not in present]
    if missing:
        raise ReportInputError(f"Parquet records {path} lack column(s) {', '.join(missing)}")
    unknown = [name for name in present if name not in records.KNOWN_FIELDS]
    if unknown:  # (as a JSON line's key that is not a field: a misspelt column would read as NULL)
        raise ReportInputError(f"Parquet records {path}: {records.unknown_fields_problem(unknown)}")
    # (the optional version column too: cast to long below, a text or fraction would read as NULL or 1)
    typed_columns = [
        *RECORD_COLUMNS,
        *([(records.VERSION_FIELD, "long")] if records.VERSION_FIELD in present else []),
    ]
    for name, kind in typed_columns:
        ok_types = {"string"} if kind == "string" else {"bigint", "int", "smallint", "tinyint"}
        if present[name] not in ok_types and present[name] != "void":
            raise ReportInputError(
                f"Parquet records {path}: column {name} has type {present[name]}, expected {kind}"
            )
    version = (
        F.col(records.VERSION_FIELD).cast("long")
        if records.VERSION_FIELD in present
        else F.lit(None).cast("long")
    )
    return df.select(
        *[F.col(n).cast(k).alias(n) for n, k in RECORD_COLUMNS], version.alias(records.VERSION_FIELD), *extra
    )


def _positioned(spark: SparkSession, inputs: InputSet) -> tuple[DataFrame, DataFrame | None]:
    """:meth:`LoadedRecords.locate`."""
    from pyspark.sql import functions as F

    from ._validate import MAX_LINE_CHARS, line_reason, reason_column

    names = [n for n, _ in RECORD_COLUMNS]
    meta_cols = ["_source", "_block", "_pos", "_kind", "_text_head", "_text_len"]
    frames: list[DataFrame] = []
    lines = None
    if inputs.json_files:
        lines = spark.read.text([str(p) for p in inputs.json_files]).select(
            F.col("_metadata.file_path").alias("_source"),
            F.col("_metadata.file_block_start").alias("_block"),
            F.monotonically_increasing_id().alias("_pos"),
            F.col("value"),
        )
        # a byte order mark starting a line is ignored, as the JSON reader ignores it; a line of JSON
        # whitespace only is skipped, as the JSON reader skips it
        value = F.col("value")
        text = F.when(F.startswith(value, F.lit("\ufeff")), F.substr(value, F.lit(2))).otherwise(value)
        parsed = lines.select(
            "_source", "_block", "_pos", "value", text.alias("_text"),
        ).where(F.btrim("_text", F.lit(" \t\r\n")) != "").select(
            "*", F.from_json("_text", record_schema(corrupt_column="_corrupt"), JSON_OPTIONS).alias("_r")
        )  # fmt: skip
        flat = parsed.select(
            *[F.col(f"_r.{n}").alias(n) for n in (*names, records.VERSION_FIELD, "_corrupt")],
            F.col("_r").isNull().alias("_unparsed"),
            "_source", "_block", "_pos", "value", "_text",
        )  # fmt: skip
        # bytes that are not UTF-8 fail Spark's JSON reader (a bad record), while from_json reads them as
        # replacement characters: named here, or the record would be counted as bad but never listed
        checked = reason_column(parsed=F.when(~F.col("_unparsed"), F.lit(1)), corrupt=F.col("_corrupt"))
        utf8 = F.when(~F.is_valid_utf8("value"), F.lit("the line is not valid UTF-8"))
        frames.append(
            flat.select(
                *names, records.VERSION_FIELD,
                utf8.otherwise(line_reason(F.col("_text"), checked)).alias("_reason"),
                "_source", "_block", "_pos", F.lit("line").alias("_kind"),
                F.left(F.col("value"), F.lit(MAX_LINE_CHARS)).alias("_text_head"),
                F.length("value").cast("long").alias("_text_len"),
            )
        )  # fmt: skip
    for path in inputs.parquet_paths:
        meta = F.col("_metadata")
        typed = _typed_parquet(spark, path, meta.file_path.alias("_source"), meta.row_index.alias("_pos"))
        frames.append(
            typed.select(
                *names, records.VERSION_FIELD, reason_column().alias("_reason"), "_source",
                F.lit(0).cast("long").alias("_block"), "_pos", F.lit("row").alias("_kind"),
                F.lit(None).cast("string").alias("_text_head"), F.lit(None).cast("long").alias("_text_len"),
            ).select(*names, records.VERSION_FIELD, "_reason", *meta_cols)
        )  # fmt: skip
    located = frames[0]
    for other in frames[1:]:
        located = located.unionByName(other)
    return located, lines


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
