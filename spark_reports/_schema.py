"""Finding and loading benchmark records (``protocol_spec/bench-records.md``) into Spark, with clear errors.

Input directories hold ``run-<id>.records.jsonl`` (JSON lines) and/or ``*.parquet`` record sets, plus
``run-<id>.meta.json`` files. JSON is read with an explicit schema in ``FAILFAST`` mode, so a malformed line
or a field of the wrong type stops the report with the file named instead of silently becoming nulls.
Fields that are present but null where the format requires a value are counted during the main aggregation
(``_job.py``) and reported the same way.
"""

from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import attrs

from corda_trio import records
from corda_trio.files import read_small_file

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

    ``frame`` has the record columns in :data:`RECORD_COLUMNS` order, ``schema_version``, and ``_reason``
    (``NULL`` for a valid record, else what is wrong). :meth:`locate` builds the positioned form, which is
    slower to read and only used to name bad records.
    """

    frame: Any
    _spark: Any = attrs.field(alias="spark", repr=False)
    _inputs: InputSet = attrs.field(alias="inputs", repr=False)

    @property
    def has_text(self) -> bool:
        """Some input is JSON lines (which each pass over the records parses again)."""
        return bool(self._inputs.json_files)

    def locate(self) -> tuple[Any, Any | None]:
        """``(located, lines)``: ``located`` has the columns of :attr:`frame` plus ``_source`` / ``_block`` /
        ``_pos`` / ``_kind`` (where the record is; see ``_validate.py``) and ``_text_head`` / ``_text_len``
        (JSON: the start of the line); ``lines`` (JSON inputs) is every input line, for line numbers.

        Built only when some record is bad: defining these frames costs Spark's analysis of the
        text + ``from_json`` plan (seconds of a fresh JVM's warm-up), which a clean input never needs.
        """
        return _positioned(self._spark, self._inputs)


def discover_inputs(dirs: list[Path]) -> InputSet:
    """List record files and read meta files in ``dirs``.

    Raises:
        ReportInputError: a directory is missing, holds no records, or a meta file is not valid JSON.
    """
    json_files: list[Path] = []
    parquet_paths: list[Path] = []
    metas: dict[str, dict[str, Any]] = {}
    seen: dict[Path, Path] = {}  # resolved path -> as given
    for d in dirs:
        d = Path(d)
        if not d.is_dir():
            raise ReportInputError(f"input directory {d} does not exist or is not a directory")
        found_here = 0
        for entry in sorted(d.iterdir()):
            name = entry.name
            if name.endswith((".jsonl", ".parquet")):
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
            if name.endswith(".jsonl") and entry.is_file():
                json_files.append(entry)
                found_here += 1
            elif name.endswith(".parquet"):
                parquet_paths.append(entry)
                found_here += 1
            elif name.endswith(".meta.json") and entry.is_file():
                metas.update(_read_meta(entry))
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


#: A meta file is a short description of a run; a larger one is not read (the driver's memory stays bounded).
MAX_META_BYTES: Final = 1 << 20


def _read_meta(path: Path) -> dict[str, dict[str, Any]]:
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
    problem = records.meta_problem(meta)
    if problem is not None:
        raise ReportInputError(f"{path}: {problem}")
    return {meta["run_id"]: meta}


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


def load_records(spark: SparkSession, inputs: InputSet) -> LoadedRecords:
    """All records, each checked against the schema table in Spark (``_validate.reason_column``).

    Sets the session's input split size for these inputs (:func:`split_bytes`).

    Raises:
        ReportInputError: a Parquet input cannot be read, lacks a column or has a column of the wrong type.
    """
    from pyspark.sql import functions as F

    from ._validate import reason_column

    split = split_bytes(input_bytes(inputs), spark.sparkContext.defaultParallelism)
    spark.conf.set("spark.sql.files.maxPartitionBytes", str(split))
    names = [n for n, _ in RECORD_COLUMNS]
    # JSON through Spark's JSON reader (measured 2.4x faster than text + from_json, which the line numbers
    # need): the same rules, no line positions; those come from :meth:`LoadedRecords.locate` only when some
    # record is bad.
    main: list[DataFrame] = []
    if inputs.json_files:
        raw = (
            spark.read.schema(record_schema(corrupt_column="_corrupt"))
            .option("mode", "PERMISSIVE")
            .option("columnNameOfCorruptRecord", "_corrupt")
            .json([str(p) for p in inputs.json_files])
        )
        reason = reason_column(corrupt=F.col("_corrupt")).alias("_reason")
        main.append(raw.select(*names, records.VERSION_FIELD, reason))
    for path in inputs.parquet_paths:
        typed = _typed_parquet(spark, path)
        main.append(typed.select(*names, records.VERSION_FIELD, reason_column().alias("_reason")))
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
    for name, kind in RECORD_COLUMNS:
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

    from ._validate import MAX_LINE_CHARS, reason_column

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
        options = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": "_corrupt"}
        parsed = lines.select(
            "_source", "_block", "_pos", "value",
            F.from_json("value", record_schema(corrupt_column="_corrupt"), options).alias("_r"),
        ).where(~(F.col("_r").isNull() & (F.trim(F.col("value")) == "")))  # fmt: skip
        flat = parsed.select(
            *[F.col(f"_r.{n}").alias(n) for n in (*names, records.VERSION_FIELD, "_corrupt")],
            F.col("_r").isNull().alias("_unparsed"),
            "_source", "_block", "_pos", "value",
        )  # fmt: skip
        # bytes that are not UTF-8 fail Spark's JSON reader (a bad record), while from_json reads them as
        # replacement characters: named here, or the record would be counted as bad but never listed
        checked = reason_column(parsed=F.when(~F.col("_unparsed"), F.lit(1)), corrupt=F.col("_corrupt"))
        utf8 = F.when(~F.is_valid_utf8("value"), F.lit("the line is not valid UTF-8"))
        frames.append(
            flat.select(
                *names, records.VERSION_FIELD,
                utf8.otherwise(checked).alias("_reason"),
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
