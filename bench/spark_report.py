"""Benchmark of the report pipeline: ``corda-trio report`` over N synthetic records (default 10,000,000).

Run ``python -m bench.spark_report [--records N] [--formats parquet,jsonl] [--master local[2]] [--keep DIR]``.

1. Generates N synthetic records (``spark_reports.write_synthetic``: Spark ``range`` -> Parquet, 8 files) in
   its own Spark session, and the same records as JSON lines (8 ``*.jsonl`` files, every field written, as
   the harness writes them); this is set-up and not timed.
2. For each input format, runs ``corda-trio report --in DIR --out DIR/report.html --master local[2]`` as a
   fresh process and times it from process start to exit: JVM start, reading, the schema check of every
   record, the aggregations, the duplicate count, the tables (CSV + Parquet) and the HTML. That wall time
   is the figure (targets on the 2-core machine: Parquet <= 30 s, JSON lines <= 60 s for 10M records).

The last line printed is JSON: ``records``, ``seconds`` per input format, the Spark JVM's CPU seconds per
format (``jvm_cpu_seconds``, as the report prints them: on a shared machine a steadier measure of the work
than the wall time, which grows with the other processes' load), the machine's load average before and
after, and ``steal_cores``: per format, the mean cores that a hypervisor stole for other guests while the
report ran (the machine is shared: say so when quoting the figures); and ``reference_cpu_ms``, the CPU time
of a fixed pure-Python workload before and after (``corda_trio.testing.reference_cpu_ms``): a virtual CPU can
run slower on one day than on another without any stolen time.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from corda_trio.testing import MachineCpu, load_average, reference_cpu_ms

#: The console script's entry point, run in a fresh interpreter.
CLI = "import sys; from corda_trio.node._cli import main; sys.exit(main())"
TARGET_SECONDS = {"parquet": 30, "jsonl": 60}


def _generate(data: Path, count: int, formats: list[str], master: str, driver_memory: str) -> float | None:
    """Write the synthetic records in each format that is not there yet; returns the seconds spent."""
    missing = [f for f in formats if not (data / f / "run-synthetic-1.meta.json").exists()]
    if not missing:
        return None
    import spark_reports

    start = time.perf_counter()
    settings = spark_reports.SparkSettings(master=master, driver_memory=driver_memory)
    with spark_reports.open_spark(settings) as spark:
        parquet = data / "parquet"
        if not (parquet / "run-synthetic-1.meta.json").exists():
            spark_reports.write_synthetic(spark, parquet, count, run_id="synthetic-1", partitions=8)
        if "jsonl" in missing:
            out = data / "jsonl"
            tmp = data / "jsonl-spark"
            shutil.rmtree(tmp, ignore_errors=True)
            frame = spark.read.parquet(str(parquet / "run-synthetic-1.records.parquet"))
            frame.repartition(8).write.option("ignoreNullFields", "false").json(str(tmp))
            out.mkdir(parents=True, exist_ok=True)
            for i, part in enumerate(sorted(tmp.glob("part-*.json"))):
                part.rename(out / f"run-synthetic-1.part{i:02d}.records.jsonl")
            shutil.rmtree(tmp)
            shutil.copy(parquet / "run-synthetic-1.meta.json", out / "run-synthetic-1.meta.json")
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.spark_report", description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=10_000_000)
    parser.add_argument("--formats", default="parquet,jsonl", help="input formats to time (parquet, jsonl)")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--driver-memory", default="4g")
    parser.add_argument("--keep", type=Path, help="generate into / reuse this directory and keep it")
    args = parser.parse_args(argv)
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    if not formats or set(formats) - set(TARGET_SECONDS):
        parser.error(f"--formats: choose from {', '.join(TARGET_SECONDS)}")

    work = args.keep or Path(tempfile.mkdtemp(prefix="spark-report-bench-"))
    data = work / "records"
    try:
        load_before, speed_before = load_average(), reference_cpu_ms()
        gen_seconds = _generate(data, args.records, formats, args.master, args.driver_memory)
        seconds: dict[str, float] = {}
        cpu: dict[str, float | None] = {}
        stdout: dict[str, str] = {}
        steal: dict[str, float] = {}  # mean cores stolen by the hypervisor while each report ran
        for fmt in formats:
            out = work / f"report-{fmt}.html"
            cmd = [sys.executable, "-c", CLI, "report", "--in", str(data / fmt), "--out", str(out),
                   "--master", args.master, "--driver-memory", args.driver_memory]  # fmt: skip
            start, machine = time.perf_counter(), MachineCpu()
            proc = subprocess.run(cmd, capture_output=True, text=True)
            seconds[fmt] = round(time.perf_counter() - start, 2)
            steal[fmt] = MachineCpu().since(machine)["steal_cores"]
            if proc.returncode != 0:
                print(proc.stderr, file=sys.stderr)
                return 1
            stdout[fmt] = proc.stdout.strip()
            found = re.search(r"^  cpu: Spark JVM ([0-9.]+) s$", stdout[fmt], re.MULTILINE)
            cpu[fmt] = float(found.group(1)) if found else None
            print(
                f"{fmt}: {seconds[fmt]} s (target {TARGET_SECONDS[fmt]} s; cores stolen by the hypervisor: "
                f"{steal[fmt]})\n  {stdout[fmt]}",
                flush=True,
            )
        result = {
            "benchmark": "spark_report",
            "records": args.records,
            "seconds": seconds,
            "target_seconds": {f: TARGET_SECONDS[f] for f in formats},
            "jvm_cpu_seconds": cpu,
            "master": args.master,
            "driver_memory": args.driver_memory,
            "cpu_count": os.cpu_count(),
            "load_average_before": load_before,
            "load_average_after": load_average(),
            "steal_cores": steal,
            # how fast the CPU ran (corda_trio.testing.reference_cpu_ms, before and after; lower is faster)
            "reference_cpu_ms": [speed_before, reference_cpu_ms()],
            "generate_seconds": None if gen_seconds is None else round(gen_seconds, 1),
        }
        print(json.dumps(result))
        return 0
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
