"""The summary tables (flat rows) and their CSV / Parquet files."""

from __future__ import annotations

import csv
import io
import os
import shutil
from collections import defaultdict
from pathlib import Path
from typing import Any, Final

from corda_trio.files import write_file_atomically

from ._job import PERCENTILES, JobResult

__all__ = ["REPORT_FILE_MODE", "build_tables", "peak_per_second", "write_tables"]

#: The mode of the report's files (the HTML and its CSV tables): ordinary files that others may read.
REPORT_FILE_MODE: Final = 0o644


#: Header of a table that has no rows (so an empty CSV still says what it would hold).
EMPTY_TABLE_COLUMNS = {
    "errors": ("run_id", "scenario", "link", "error", "count"),
    "comparison": ("before_run", "after_run", "scenario", "link", "size_class_bytes", "stage"),
}


def peak_per_second(result: JobResult) -> dict[tuple[str, str, str, int], float]:
    """Highest ok completions per second in any one timeline bin (1 s unless the run is long), per group."""
    peak: dict[tuple[str, str, str, int], float] = defaultdict(float)
    for p in result.series:
        key = (p.run_id, p.scenario, p.link, p.size_class)
        peak[key] = max(peak[key], p.ok_per_second)
    return dict(peak)


def _ms(ns: float | None) -> float | None:
    return None if ns is None else ns / 1e6


Table = list[dict[str, Any]]


def build_tables(result: JobResult, comparison: Table | None) -> dict[str, Table]:
    """``{table name: rows}``: groups, stages, throughput, errors and (with two runs) comparison."""
    peaks = peak_per_second(result)
    groups = []
    stages = []
    for g in result.groups:
        end = g.stage("end")
        row: dict[str, Any] = {
            "run_id": g.run_id,
            "scenario": g.scenario,
            "link": g.link,
            "size_class_bytes": g.size_class,
            "count": g.count,
            "ok": g.ok,
            "errors": g.errors,
            "error_rate": g.errors / g.count if g.count else 0.0,
            "duration_s": g.duration_seconds,
            "throughput_per_s": g.throughput_per_second,
            "peak_per_s": peaks.get(g.key, 0),
            "mb_per_s": (g.bytes_total / 1e6 / g.duration_seconds) if g.duration_seconds > 0 else 0.0,
        }
        for label in PERCENTILES:
            row[f"end_{label.replace('.', '_')}_ms"] = _ms(end.percentiles_ns[label]) if end else None
        row["end_max_ms"] = _ms(end.max_ns) if end else None
        groups.append(row)
        for s in g.stages:
            srow: dict[str, Any] = {
                "run_id": g.run_id,
                "scenario": g.scenario,
                "link": g.link,
                "size_class_bytes": g.size_class,
                "stage": s.stage,
                "count": s.count,
            }
            for label, ns in s.percentiles_ns.items():
                srow[f"{label.replace('.', '_')}_ms"] = _ms(ns)
            srow["max_ms"] = _ms(s.max_ns)
            srow["mean_ms"] = _ms(s.mean_ns)
            stages.append(srow)
    throughput = [
        {
            "run_id": p.run_id,
            "scenario": p.scenario,
            "link": p.link,
            "size_class_bytes": p.size_class,
            "second": p.second,
            "bin_seconds": p.width_seconds,
            "ok_per_s": p.ok_per_second,
            "errors_per_s": p.errors_per_second,
        }
        for p in result.series
    ]
    errors = [
        {"run_id": e.run_id, "scenario": e.scenario, "link": e.link, "error": e.error, "count": e.count}
        for e in result.errors
    ]
    tables = {"groups": groups, "stages": stages, "throughput": throughput, "errors": errors}
    if comparison is not None:
        tables["comparison"] = comparison
    return tables


#: The one part file of a table's Parquet directory (the layout Spark writes and reads: ``<name>.parquet/``).
PARQUET_PART: Final = "part-00000.parquet"


def write_tables(tables: dict[str, list[dict[str, Any]]], out_dir: Path) -> list[Path]:
    """Write each table as ``<name>.csv`` (one file) and, when it has rows, ``<name>.parquet`` (a directory
    holding :data:`PARQUET_PART` and an empty ``_SUCCESS``, as Spark writes it; Spark, pyarrow and pandas
    read the directory).

    The driver writes them with pyarrow: they are small (bounded by the job's limits), and five Spark write
    jobs cost 1.7-2.1 s of every report on the 2-core build machine, against milliseconds here. A table
    written again replaces the old one; each CSV file and Parquet part file appears whole (written aside,
    then renamed), so that an interrupted report leaves whole tables.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, rows in tables.items():
        columns = list(rows[0]) if rows else list(EMPTY_TABLE_COLUMNS.get(name, ()))
        csv_path = out_dir / f"{name}.csv"
        text = io.StringIO(newline="")
        writer = csv.DictWriter(text, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
        write_file_atomically(csv_path, text.getvalue().encode("utf-8"), REPORT_FILE_MODE)
        written.append(csv_path)
        if not rows:
            continue
        folder = out_dir / f"{name}.parquet"
        if folder.is_dir() and not folder.is_symlink():
            shutil.rmtree(folder)
        elif folder.exists() or folder.is_symlink():
            folder.unlink()
        folder.mkdir()
        part = folder / PARQUET_PART
        aside = folder / f".{PARQUET_PART}.part"
        pq.write_table(pa.Table.from_pylist(rows, schema=_arrow_schema(rows)), aside)
        os.replace(aside, part)
        (folder / "_SUCCESS").touch()
        written.append(folder)
    return written


def _arrow_schema(rows: list[dict[str, Any]]) -> Any:
    """Column types from the values: all strings -> string, all integers -> int64, none at all -> string for
    name-like columns, otherwise float64."""
    import pyarrow as pa

    fields = []
    for name in rows[0]:
        values = [r[name] for r in rows if r[name] is not None]
        if values and all(isinstance(v, str) for v in values):
            kind: Any = pa.string()
        elif values and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            kind = pa.int64()
        elif not values and name.endswith(("_run", "_id", "scenario", "link", "stage", "error")):
            kind = pa.string()
        else:
            kind = pa.float64()
        fields.append(pa.field(name, kind, nullable=True))
    return pa.schema(fields)
