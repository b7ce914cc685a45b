"""Benchmark of the report pipeline: ``corda-trio report`` over N synthetic records (default 10,000,000).

Run ``python -m bench.spark_report [--records N] [--master local[2]] [--keep DIR]``.

1. Generates N synthetic records (``spark_reports.write_synthetic``: Spark ``range`` -> Parquet, 8 files) in
   its own Spark session; this is set-up and not timed.
2. Runs ``corda-trio report --in DIR --out DIR/report.html --master local[2]`` as a fresh process and times it
   from process start to exit: JVM start, reading, the three aggregations, the tables (CSV + Parquet) and
   the HTML. That wall time is the figure (target: <= 60 s for 10M records on the 2-core machine).

Prints one JSON line with the timings.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: The console script's entry point, run in a fresh interpreter.
CLI = "import sys; from corda_trio.node._cli import main; sys.exit(main())"

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.spark_report", description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=10_000_000)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--driver-memory", default="4g")
    parser.add_argument("--keep", type=Path, help="generate into / reuse this directory and keep it")
    args = parser.parse_args(argv)

    work = args.keep or Path(tempfile.mkdtemp(prefix="spark-report-bench-"))
    data = work / "records"
    try:
        gen_seconds = None
        if not (data / "run-synthetic-1.records.parquet").exists():
            import spark_reports

            start = time.perf_counter()
            settings = spark_reports.SparkSettings(master=args.master, driver_memory=args.driver_memory)
            with spark_reports.open_spark(settings) as spark:
                spark_reports.write_synthetic(spark, data, args.records, run_id="synthetic-1", partitions=8)
            gen_seconds = time.perf_counter() - start
        out = work / "report.html"
        cmd = [sys.executable, "-c", CLI, "report", "--in", str(data), "--out", str(out),
               "--master", args.master, "--driver-memory", args.driver_memory]  # fmt: skip
        start = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            print(proc.stderr, file=sys.stderr)
            return 1
        result = {
            "benchmark": "spark_report",
            "records": args.records,
            "master": args.master,
            "driver_memory": args.driver_memory,
            "cpu_count": os.cpu_count(),
            "generate_seconds": gen_seconds,
            "report_wall_seconds": round(wall, 2),
            "target_seconds": 60,
            "report_stdout": proc.stdout.strip(),
            "html_bytes": out.stat().st_size,
        }
        print(json.dumps(result))
        return 0
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
