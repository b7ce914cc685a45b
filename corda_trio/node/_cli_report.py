"""``corda-trio report``: turn benchmark records into a Spark latency / throughput report.

Example::

    corda-trio report --in bench-out --out report.html                 # local[*]
    corda-trio report --in before/ --in after/ --out cmp.html --compare RUN_A RUN_B [RUN_C ...]
    corda-trio report --in bench-out --out report.html --master spark://head:7077 --driver-memory 2g
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import re
import sys
from collections.abc import Iterator

from ._cli import CliError, _is_interrupt, path_arg

__all__ = ["register"]


def register(parser: argparse.ArgumentParser) -> None:
    """Add the ``report`` arguments (the group has no sub-commands)."""
    parser.add_argument(
        "--in", dest="in_dirs", type=path_arg, action="append", required=True, metavar="DIR",
        help="directory of benchmark records (repeatable; runs from all are combined)",
    )  # fmt: skip
    parser.add_argument(
        "--out", type=path_arg, required=True, help="the HTML report to write (tables go next to it)"
    )
    parser.add_argument("--master", default="local[*]", help="Spark master URL (default local[*])")
    parser.add_argument("--driver-memory", default="4g", help="Spark driver heap, e.g. 2g (default 4g)")
    parser.add_argument(
        "--executor-memory", metavar="SIZE",
        help="cluster master: heap of each Spark executor, e.g. 512m (default Spark's, 1g); a worker must "
        "offer this much free memory to run one",
    )  # fmt: skip
    parser.add_argument(
        "--executor-wait", type=float, default=60.0, metavar="SECONDS",
        help="cluster master: stop with an error when the report has had no executor this long (default 60)",
    )  # fmt: skip
    parser.add_argument(
        "--compare", nargs="+", metavar="RUN",
        help="compare runs (ids or unique prefixes): the first is the baseline, each other run is compared "
        "with it; default: all runs, when they all measured the same scenarios and payload sizes",
    )  # fmt: skip
    parser.add_argument(
        "--sketch", default="kll",
        help="percentile estimator: kll[:K] (DataSketches KLL, default k=16384, rank error 0.018%%) or "
        "gk[:ACCURACY] (percentile_approx, rank error 1/accuracy, slower)",
    )  # fmt: skip
    parser.add_argument(
        "--skip-bad", action="store_true",
        help="leave records that break the record schema out of the report (counted and listed in it) "
        "instead of failing",
    )  # fmt: skip
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    import spark_reports

    try:
        sketch = spark_reports.Sketch.parse(args.sketch)
    except ValueError as exc:
        raise CliError(str(exc), 2) from exc
    heaps = (("--driver-memory", args.driver_memory), ("--executor-memory", args.executor_memory))
    for option, size in heaps:
        if size is not None and not re.fullmatch(r"[1-9][0-9]*[kKmMgGtT]?", size):
            raise CliError(f"{option} must be a JVM heap size such as 512m or 4g, not {size!r}", 2)
    if not 0 < args.executor_wait < float("inf"):
        raise CliError(f"--executor-wait must be a number of seconds > 0, not {args.executor_wait:g}", 2)
    settings = spark_reports.SparkSettings(
        master=args.master,
        driver_memory=args.driver_memory,
        executor_memory=args.executor_memory,
        executor_wait_seconds=args.executor_wait,
    )
    try:
        with _py4j_logs_held_back():
            result = spark_reports.build_report(
                args.in_dirs,
                args.out,
                settings=settings,
                compare=tuple(args.compare) if args.compare else None,
                sketch=sketch,
                skip_bad=args.skip_bad,
            )
    except spark_reports.BadRecordsError as exc:
        for line in exc.lines:
            print(line, file=sys.stderr)
        raise CliError(str(exc), 2) from None
    except spark_reports.ReportInputError as exc:
        raise CliError(str(exc), 2) from exc
    except spark_reports.ReportError as exc:
        raise CliError(str(exc), 1) from exc
    compared = (
        f"; compared {', '.join(result.compared[1:])} with {result.compared[0]}" if result.compared else ""
    )
    print(
        f"report {result.html_path} ({result.records:,} records, {len(result.runs)} run(s){compared}) "
        f"in {result.elapsed_seconds:.1f} s; tables in {result.tables_dir}"
    )
    job = result.job
    if job.bad_count:
        print(f"  warning: {job.bad_count:,} bad record(s) left out (--skip-bad); listed in the report")
    if job.duplicates:
        print(f"  warning: {job.duplicates:,} duplicate record(s) dropped (same run, scenario, link and seq)")
    print("  time: " + ", ".join(f"{name} {seconds:.1f} s" for name, seconds in result.phases.items()))
    if result.jvm_cpu_seconds is not None and result.executor_cpu_seconds is not None:  # (a cluster)
        print(
            f"  cpu: Spark driver JVM {result.jvm_cpu_seconds:.1f} s, executors' tasks "
            f"{result.executor_cpu_seconds:.1f} s"
        )
    elif result.jvm_cpu_seconds is not None:  # (local mode: the tasks ran in that JVM)
        print(f"  cpu: Spark JVM {result.jvm_cpu_seconds:.1f} s")
    return 0


@contextlib.contextmanager
def _py4j_logs_held_back() -> Iterator[None]:
    """Hold back what py4j logs (on its loggers and, through ``logging.exception``, the root) while the
    report runs: shown afterwards if the run ended otherwise, dropped if it was interrupted. On Ctrl-C or
    SIGTERM, py4j logs the KeyboardInterrupt and the broken connection that follows with tracebacks; the
    CLI reports an interrupt itself, in one line."""
    held: list[logging.LogRecord] = []

    def hold(record: logging.LogRecord) -> bool:
        held.append(record)
        return False

    loggers = [logging.getLogger(name) for name in ("", "py4j", "py4j.java_gateway", "py4j.clientserver")]
    for logger in loggers:
        logger.addFilter(hold)
    interrupted = False
    try:
        yield
    except BaseException as exc:
        interrupted = _is_interrupt(exc)
        raise
    finally:
        for logger in loggers:
            logger.removeFilter(hold)
        if not interrupted:
            for record in held:
                logging.getLogger(record.name if record.name != "root" else "").handle(record)
