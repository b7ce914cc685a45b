"""``build_report``: input directories -> Spark job -> summary tables (CSV, Parquet) and the HTML report."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import platform
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from corda_trio.files import check_regular_file, write_file_atomically

from ._compare import NEED_TWO, compare_runs, comparison_table, resolve_runs
from ._errors import ReportInputError, ReportOutputError
from ._html import ReportContext, render_html
from ._job import JobResult, Sketch, compute
from ._schema import InputSet, discover_inputs, load_records
from ._session import SparkSettings, is_local, open_spark
from ._tables import REPORT_FILE_MODE, build_tables, write_tables

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
    #: the compared runs, the baseline first (``None``: no comparison)
    compared: tuple[str, ...] | None
    elapsed_seconds: float
    job: JobResult
    #: seconds per phase: spark start, input schema, aggregate, series, errors, tables
    phases: dict[str, float] = attrs.field(factory=dict)
    #: CPU seconds of the driver's Spark JVM (in local mode it runs the tasks too) until the report was
    #: written, or ``None`` if the JVM does not say; on a shared machine a steadier measure of the work than
    #: wall time
    jvm_cpu_seconds: float | None = None
    #: on a cluster, the CPU seconds of the report's tasks in the executors (:func:`_executor_cpu_seconds`),
    #: which ``jvm_cpu_seconds`` does not count there; ``None`` in local mode (counted in the driver's)
    executor_cpu_seconds: float | None = None


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


def _jvm_cpu_seconds(session: SparkSession) -> float | None:
    """CPU time of the driver JVM so far (``ProcessHandle.info().totalCpuDuration()``), if it reports it."""
    try:
        jvm: Any = session.sparkContext._jvm
        total = jvm.java.lang.ProcessHandle.current().info().totalCpuDuration()
        return int(total.get().toNanos()) / 1e9 if total.isPresent() else None
    except Exception:  # a cluster driver or Spark Connect without a local JVM: the figure is optional
        return None


def _executor_cpu_seconds(session: SparkSession) -> float | None:
    """On a cluster, the CPU time of the session's tasks in the executors so far: Spark's per-stage
    ``executorCpuTime`` plus ``executorDeserializeCpuTime`` (each task's thread, as the executors report it),
    summed over the stages its status store holds. The executor JVMs' own threads (JIT compilers, garbage
    collector, start) are not in it. ``None`` in local mode, where the tasks run in the driver JVM and its CPU
    figure holds them, or if Spark does not say.
    """
    context = session.sparkContext
    if is_local(context.master):
        return None
    try:
        spark_context = context._jsc.sc()
        # (task metrics reach the status store through the listener bus, after the task has ended)
        spark_context.listenerBus().waitUntilEmpty(10_000)
        store = spark_context.statusStore()
        # stageList(statuses, details, withSummaries, unsortedQuantiles, taskStatus): Scala's defaults
        # (all stages, no details) are methods of their own for a Java caller
        defaults = [getattr(store, f"stageList$default${i}")() for i in range(2, 6)]
        stages = store.stageList(None, *defaults).iterator()
        total_ns = 0
        while stages.hasNext():
            stage = stages.next()
            total_ns += int(stage.executorCpuTime()) + int(stage.executorDeserializeCpuTime())
    except Exception:  # a Spark without this status API, or Spark Connect: the figure is optional
        return None
    return total_ns / 1e9


def _unlike(job: JobResult, runs: Sequence[str]) -> list[str]:
    """The runs that did not measure what ``runs[0]`` measured (another set of (scenario, size class))."""
    kinds: dict[str, set[tuple[str, int]]] = {r: set() for r in runs}
    for g in job.groups:
        if g.run_id in kinds:
            kinds[g.run_id].add((g.scenario, g.size_class))
    return [r for r in runs[1:] if kinds[r] != kinds[runs[0]]]


def build_report(
    in_dirs: Sequence[Path],
    out_html: Path,
    *,
    settings: SparkSettings | None = None,
    compare: Sequence[str] | None = None,
    sketch: Sketch | None = None,
    spark: SparkSession | None = None,
    skip_bad: bool = False,
) -> ReportResult:
    """Read the records in ``in_dirs`` and write ``out_html`` plus ``<stem>_tables/``.

    Args:
        in_dirs: benchmark output directories (``corda-trio bench run --out``), or Parquet record sets.
        out_html: the report file to write (its directory is created).
        settings: Spark master, driver memory ... (ignored when ``spark`` is given or a session is active).
        compare: two or more run ids or unique prefixes, the baseline first: each other run is compared
            with it. By default, when the input holds several runs that all measured the same scenarios and
            payload size classes, each is compared with the earliest.
        sketch: the quantile sketch (default KLL, k = 16,384; see ``_job.Sketch``).
        spark: an existing session to use (tests share one).
        skip_bad: leave records that break the schema out (counted and named in the report) instead of
            failing with :class:`BadRecordsError`.

    Raises:
        BadRecordsError: records that break the schema (``FILE:LINE: problem`` for the first few).
        ReportInputError: missing, empty or malformed input; unknown run in ``compare``.
        ReportEnvironmentError: Spark cannot start (no Java, or its JVM ended during its start).
        ReportOutputError: another report is being written to ``out_html``; the report or its tables
            cannot be written.
    """
    started = time.perf_counter()
    settings = settings or SparkSettings()
    out_html = Path(out_html)
    inputs = discover_inputs([Path(d) for d in in_dirs])  # fails fast, before Spark starts
    if compare is not None and len(compare) < 2:
        raise ReportInputError(NEED_TWO)
    if out_html.suffix.lower() not in (".html", ".htm"):
        raise ReportInputError(f"--out {out_html}: the report is an HTML file; name it *.html")
    try:
        out_html.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        blocker = next((p for p in (out_html.parent, *out_html.parent.parents) if p.is_file()), None)
        if blocker is not None:
            raise ReportInputError(f"--out {out_html}: {blocker} is a file") from None
        raise ReportInputError(f"--out {out_html}: cannot create {out_html.parent}: {exc.strerror}") from None
    try:  # a pipe, a device or a directory there is not an earlier report to replace: refused before Spark
        check_regular_file(out_html, missing_ok=True)
    except OSError as exc:
        if exc.errno in (errno.EINVAL, errno.EISDIR):
            raise ReportInputError(f"--out {out_html}: {exc.strerror}") from None
    tables_dir = tables_dir_for(out_html)
    with _writing(out_html, tables_dir):
        return _build(inputs, out_html, tables_dir, started, settings, compare, sketch, spark, skip_bad)


@contextlib.contextmanager
def _writing(out_html: Path, tables_dir: Path) -> Iterator[None]:
    """Hold the report's tables directory (created now, so that a directory where nothing can be written is
    said before Spark starts) locked while the report is made: a second report with the same ``--out`` is
    refused at once, where the two would have written each other's tables and one of the two HTML files
    would have won. The lock (``flock`` on the directory) ends with the process, however it ends; an empty
    directory this call created is removed again when the report was not written."""
    created = not tables_dir.is_dir()
    try:
        tables_dir.mkdir(exist_ok=True)
        fd = os.open(tables_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise ReportInputError(f"--out {out_html}: cannot create {tables_dir}: {exc.strerror}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ReportOutputError(
                f"--out {out_html}: another report is being written there (it holds {tables_dir}); wait for "
                "it to end or choose another --out"
            ) from None
        try:
            yield
        except BaseException:
            if created:
                with contextlib.suppress(OSError):
                    tables_dir.rmdir()  # (only if empty: the tables of an earlier report are kept)
            raise
    finally:
        os.close(fd)


def _build(
    inputs: InputSet,
    out_html: Path,
    tables_dir: Path,
    started: float,
    settings: SparkSettings,
    compare: Sequence[str] | None,
    sketch: Sketch | None,
    spark: SparkSession | None,
    skip_bad: bool,
) -> ReportResult:
    """The rest of :func:`build_report`, once the output is held."""
    phases: dict[str, float] = {}

    def run(session: SparkSession) -> ReportResult:
        phases["spark start"] = time.perf_counter() - started
        mark = time.perf_counter()
        records = load_records(session, inputs)
        phases["input schema"] = time.perf_counter() - mark
        job = compute(records, sketch=sketch, skip_bad=skip_bad)
        runs = job.run_ids
        compared: tuple[str, ...] | None = None
        note = ""
        if compare is not None:
            compared = resolve_runs(job, compare)
        elif len(runs) >= 2:
            unlike = _unlike(job, runs)
            if not unlike:
                compared = tuple(runs)
            else:
                shown = ", ".join(unlike[:5]) + (f" and {len(unlike) - 5} more" if len(unlike) > 5 else "")
                note = (
                    f"The runs were not compared: {shown} measured other scenarios or payload size classes "
                    f"than {runs[0]}, so their ratios would mislead. Pass --compare BASELINE RUN... to "
                    "compare chosen runs anyway."
                )
        rows = compare_runs(job, compared) if compared else None
        tables = build_tables(job, comparison_table(rows) if rows is not None else None)
        phases.update(job.timings)
        mark = time.perf_counter()
        try:
            files = write_tables(tables, tables_dir)
        except OSError as exc:
            raise ReportOutputError(
                f"cannot write the report's tables into {tables_dir}: {exc.strerror or exc} (they may be "
                "incomplete; the report was not written)"
            ) from None
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
            records=job.records,
            elapsed_seconds=elapsed,
            phases=dict(phases),
            comparison_note=note,
        )
        comparison = (rows, compared) if rows is not None and compared else None
        html = render_html(job, inputs.metas, context, comparison)
        try:  # (whole or not at all: an interrupted report leaves the earlier one)
            write_file_atomically(out_html, html.encode("utf-8"), REPORT_FILE_MODE)
        except OSError as exc:
            raise ReportOutputError(f"cannot write the report {out_html}: {exc.strerror or exc}") from None
        return ReportResult(
            html_path=out_html,
            tables_dir=tables_dir,
            table_files=tuple(files),
            runs=tuple(runs),
            records=context.records,
            compared=compared,
            elapsed_seconds=time.perf_counter() - started,
            job=job,
            phases=dict(phases),
            jvm_cpu_seconds=_jvm_cpu_seconds(session),
            executor_cpu_seconds=_executor_cpu_seconds(session),
        )

    if spark is not None:
        return run(spark)
    with open_spark(settings) as session:
        return run(session)
