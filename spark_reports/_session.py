"""Starting a quiet, fast Spark session: Java discovery, log level, driver memory, master URL.

Theory of operation: PySpark starts a JVM through ``spark-submit``, which needs ``java``. We look for it in
``JAVA_HOME`` and then on ``PATH`` and fail with one clear line if it is missing (``.ci/run`` installs
openjdk-17-jre-headless). Everything the JVM must know at launch (driver memory, log4j2 configuration) is set
on the builder *before* the first ``getOrCreate()``; afterwards it cannot change. Logs are kept to errors by
our own ``log4j2.properties`` plus ``setLogLevel("ERROR")``; the console progress bar is off. The same code
runs against a cluster when ``master`` is a cluster URL.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Final

import attrs

from ._errors import ReportEnvironmentError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["SparkSettings", "find_java", "open_spark"]

LOG4J2_PROPERTIES: Final = Path(__file__).with_name("log4j2.properties")
#: Default driver heap. In ``local`` mode the driver JVM also runs the executors, so this heap holds the
#: tasks' working memory (aggregation buffers, quantile sketches); the driver's own share is only the
#: collected aggregates. 4g ran 10M records on the 2-core build machine (bench/spark_report.py); smaller
#: inputs need less (the tests use 1g).
DEFAULT_DRIVER_MEMORY: Final = "4g"


@attrs.frozen(kw_only=True)
class SparkSettings:
    """How to run Spark.

    Attributes:
        master: ``local[*]`` (all local cores), ``local[2]``, or a cluster URL (``spark://host:7077``).
        driver_memory: JVM heap of the driver (``spark.driver.memory``), e.g. ``"2g"``.
        shuffle_partitions: ``spark.sql.shuffle.partitions``; a few per core is right for report-sized
            aggregates (Spark's default of 200 costs seconds of task overhead on a laptop).
        app_name: shown in the Spark UI of a cluster.
    """

    master: str = "local[*]"
    driver_memory: str = DEFAULT_DRIVER_MEMORY
    shuffle_partitions: int = 8
    app_name: str = "corda-trio-report"


def find_java() -> str:
    """Path of the ``java`` executable Spark will use.

    Raises:
        ReportEnvironmentError: no Java in ``JAVA_HOME`` or on ``PATH`` (with the fix in the message).
    """
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        candidate = Path(java_home) / "bin" / "java"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
        raise ReportEnvironmentError(f"JAVA_HOME={java_home} has no executable bin/java; fix or unset it")
    found = shutil.which("java")
    if found is None:
        raise ReportEnvironmentError(
            "Spark needs Java 17 or newer and none was found on PATH or in JAVA_HOME; "
            "install it (e.g. apt-get install openjdk-17-jre-headless)"
        )
    return found


@contextmanager
def open_spark(settings: SparkSettings) -> Iterator[SparkSession]:
    """A configured SparkSession, stopped on exit (unless one was already running in this process).

    If a session is already active (tests share one), it is reused as is and left running.
    """
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        yield active
        return
    find_java()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", _python())
    log_opt = f"-Dlog4j2.configurationFile=file:{LOG4J2_PROPERTIES}"
    builder = (
        SparkSession.builder.master(settings.master)
        .appName(settings.app_name)
        .config("spark.driver.memory", settings.driver_memory)
        .config("spark.driver.extraJavaOptions", log_opt)
        .config("spark.executor.extraJavaOptions", log_opt)
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", str(settings.shuffle_partitions))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.adaptive.enabled", "true")
        # The report caches JSON input's parsed columns for its second pass (see ``_job.compute``); the
        # in-memory cache's column encoders cost more CPU than the cache saves (10M JSON lines: 601 MB
        # compressed, 668 MB not; the aggregate that fills it 117 s against 67 s of wall time).
        .config("spark.sql.inMemoryColumnarStorage.compressed", "false")
    )
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    try:
        yield spark
    finally:
        spark.stop()


def _python() -> str:
    import sys

    return sys.executable
