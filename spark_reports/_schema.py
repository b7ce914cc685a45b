"""Finding and loading benchmark records (``protocol_spec/bench-records.md``) into Spark, with clear errors.

Input directories hold ``run-<id>.records.jsonl`` (JSON lines) and/or ``*.parquet`` record sets, plus
``run-<id>.meta.json`` files. JSON is read with an explicit schema in ``FAILFAST`` mode, so a malformed line
or a field of the wrong type stops the report with the file named instead of silently becoming nulls.
Fields that are present but null where the format requires a value are counted during the main aggregation
(``_job.py``) and reported the same way.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import attrs

from corda_trio import records

from ._errors import ReportInputError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["RECORD_COLUMNS", "STAGES", "InputSet", "discover_inputs", "load_records", "record_schema"]

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


def record_schema() -> Any:
    """The Spark ``StructType`` of a record."""
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    types = {"string": StringType(), "long": LongType()}
    return StructType([StructField(name, types[kind], nullable=True) for name, kind in RECORD_COLUMNS])


def discover_inputs(dirs: list[Path]) -> InputSet:
    """List record files and read meta files in ``dirs``.

    Raises:
        ReportInputError: a directory is missing, holds no records, or a meta file is not valid JSON.
    """
    json_files: list[Path] = []
    parquet_paths: list[Path] = []
    metas: dict[str, dict[str, Any]] = {}
    for d in dirs:
        d = Path(d)
        if not d.is_dir():
            raise ReportInputError(f"input directory {d} does not exist or is not a directory")
        found_here = 0
        for entry in sorted(d.iterdir()):
            name = entry.name
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


def _read_meta(path: Path) -> dict[str, dict[str, Any]]:
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ReportInputError(f"meta file {path} is not valid JSON: {exc}") from exc
    problem = records.meta_problem(meta)
    if problem is not None:
        raise ReportInputError(f"{path}: {problem}")
    return {meta["run_id"]: meta}


def load_records(spark: SparkSession, inputs: InputSet) -> DataFrame:
    """One DataFrame with all records, columns in :data:`RECORD_COLUMNS` order and types.

    Raises:
        ReportInputError: a Parquet input lacks a column or has a column of an incompatible type.
    """
    from pyspark.sql import functions as F

    schema = record_schema()
    frames: list[DataFrame] = []
    if inputs.json_files:
        frames.append(
            spark.read.schema(schema)
            .option("mode", "FAILFAST")
            .json([str(p) for p in inputs.json_files])
        )
    for path in inputs.parquet_paths:
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
        frames.append(df.select(*[F.col(n).cast(k).alias(n) for n, k in RECORD_COLUMNS]))
    result = frames[0]
    for other in frames[1:]:
        result = result.unionByName(other)
    return result


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
