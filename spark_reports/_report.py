"""``build_report``: input directories -> Spark job -> summary tables (CSV, Parquet) and the HTML report."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from ._compare import compare_runs, comparison_table, resolve_run
from ._errors import ReportInputError
from ._html import ReportContext, render_html
from ._job import JobResult, Sketch, compute
from ._schema import discover_inputs, load_records
from ._session import SparkSettings, open_spark
from ._tables import build_tables, write_tables

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["ReportResult", "build_report", "tables_dir_for"]


@attrs.frozen(kw_only=True)
class ReportResult:
    """What :func:`build_report` produced."""

    html_path: Path
    tables_dir: Path
    table_files: tuple[Path, ...]
    runs: tuple[str, ...]
    records: int
    compared: tuple[str, str] | None
    elapsed_seconds: float
    job: JobResult
    #: seconds per phase: spark start, input schema, aggregate, series, errors, tables
    phases: dict[str, float] = attrs.field(factory=dict)


def tables_dir_for(html_path: Path) -> Path:
    """``report.html`` -> ``report_tables/`` next to it."""
    return html_path.with_name(html_path.stem + "_tables")


def _host() -> dict[str, Any]:
    try:
        out = subprocess.run(
            ["git", "-C", str(Path(__file__).resolve().parent), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
        )
        commit = out.stdout.strip() if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "git_commit": commit,
    }


def _alike(job: JobResult, a: str, b: str) -> bool:
    """Whether two runs measured the same thing: equal sets of (scenario, size class)."""

    def kinds(run: str) -> set[tuple[str, int]]:
        return {(g.scenario, g.size_class) for g in job.groups if g.run_id == run}

    return kinds(a) == kinds(b)


def build_report(
    in_dirs: Sequence[Path],
    out_html: Path,
    *,
    settings: SparkSettings | None = None,
    compare: tuple[str, str] | None = None,
    sketch: Sketch | None = None,
    spark: SparkSession | None = None,
    skip_bad: bool = False,
) -> ReportResult:
    """Read the records in ``in_dirs`` and write ``out_html`` plus ``<stem>_tables/``.

    Args:
        in_dirs: benchmark output directories (``corda-trio bench run --out``), or Parquet record sets.
        out_html: the report file to write (its directory is created).
        settings: Spark master, driver memory ... (ignored when ``spark`` is given or a session is active).
        compare: (before, after) run ids or unique prefixes; by default, when the input holds exactly two
            runs of the same scenarios and payload size classes, the earlier is compared with the later.
        sketch: the quantile sketch (default KLL, k = 16,384; see ``_job.Sketch``).
        spark: an existing session to use (tests share one).
        skip_bad: leave records that break the schema out (counted and named in the report) instead of
            failing with :class:`BadRecordsError`.

    Raises:
        BadRecordsError: records that break the schema (``FILE:LINE: problem`` for the first few).
        ReportInputError: missing, empty or malformed input; unknown run in ``compare``.
        ReportEnvironmentError: Spark cannot start (no Java).
    """
    started = time.perf_counter()
    settings = settings or SparkSettings()
    out_html = Path(out_html)
    inputs = discover_inputs([Path(d) for d in in_dirs])  # fails fast, before Spark starts
    if out_html.suffix.lower() not in (".html", ".htm"):
        raise ReportInputError(f"--out {out_html}: the report is an HTML file; name it *.html")
    out_html.parent.mkdir(parents=True, exist_ok=True)
    tables_dir = tables_dir_for(out_html)

    phases: dict[str, float] = {}

    def run(session: SparkSession) -> ReportResult:
        phases["spark start"] = time.perf_counter() - started
        mark = time.perf_counter()
        records = load_records(session, inputs)
        phases["input schema"] = time.perf_counter() - mark
        job = compute(records, sketch=sketch, skip_bad=skip_bad)
        runs = job.run_ids
        pair: tuple[str, str] | None = None
        note = ""
        if compare is not None:
            pair = (resolve_run(job, compare[0]), resolve_run(job, compare[1]))
            if pair[0] == pair[1]:
                raise ReportInputError("--compare needs two different runs")
        elif len(runs) == 2 and _alike(job, *runs):
            pair = (runs[0], runs[1])
        elif len(runs) == 2:
            note = (
                f"Runs {runs[0]} and {runs[1]} were not compared: they differ in scenario or payload size "
                "classes, so their ratios would mislead. Pass --compare BEFORE AFTER to compare them anyway."
            )
        rows = compare_runs(job, *pair) if pair else None
        tables = build_tables(job, comparison_table(rows, *pair) if rows is not None and pair else None)
        phases.update(job.timings)
        mark = time.perf_counter()
        files = write_tables(session, tables, tables_dir)
        phases["tables"] = time.perf_counter() - mark
        elapsed = time.perf_counter() - started
        context = ReportContext(
            generated_at=datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
            input_dirs=tuple(str(d) for d in inputs.dirs),
            tables_dir=str(tables_dir),
            spark_version=session.version,
            master=session.sparkContext.master,
            driver_memory=session.sparkContext.getConf().get("spark.driver.memory", "default"),
            report_host=_host(),
            records=sum(g.count for g in job.groups),
            elapsed_seconds=elapsed,
            phases=dict(phases),
            comparison_note=note,
        )
        html = render_html(job, inputs.metas, context, (rows, *pair) if rows is not None and pair else None)
        tmp = out_html.with_name(out_html.name + ".part")
        tmp.write_text(html, encoding="utf-8")
        os.replace(tmp, out_html)
        return ReportResult(
            html_path=out_html,
            tables_dir=tables_dir,
            table_files=tuple(files),
            runs=tuple(runs),
            records=context.records,
            compared=pair,
            elapsed_seconds=time.perf_counter() - started,
            job=job,
            phases=dict(phases),
        )

    if spark is not None:
        return run(spark)
    with open_spark(settings) as session:
        return run(session)
