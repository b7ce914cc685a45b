"""Starting a quiet, fast Spark session: Java discovery, log level, driver memory, master URL.

Theory of operation: PySpark starts a JVM through ``spark-submit``, which needs ``java``. We look for it in
``JAVA_HOME`` and then on ``PATH`` and fail with one clear line if it is missing (``.ci/run`` installs
openjdk-17-jre-headless). Everything the JVM must know at launch (driver memory, log4j2 configuration) is set
on the builder *before* the first ``getOrCreate()``; afterwards it cannot change. Logs are kept to errors by
our own ``log4j2.properties`` plus ``setLogLevel("ERROR")``; the console progress bar is off. The same code
runs against a cluster when ``master`` is a cluster URL.

The driver JVM starts from a class-data-sharing archive (CDS, :func:`class_data_sharing`): the classes a
report loads (Scala, Spark, Janino, ...) are mapped from one file instead of being parsed and verified again
by every report. The first session that finds no archive has its JVM write one when it exits (we wait for
that, then move the file into place); later sessions start from it (on the 2-core build machine: session
start 17.7-20.4 s -> 9.2-9.7 s, the first query 9.1-10.7 s -> 3.5-4.2 s). The archive is a cache, kept
per Java and PySpark installation under ``$XDG_CACHE_HOME/corda-trio/spark-cds`` (about 190 MB); a stale
or damaged one is ignored by the JVM, which then loads classes the usual way.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Final

import attrs

from ._errors import ReportEnvironmentError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["ClassDataSharing", "SparkSettings", "class_data_sharing", "find_java", "open_spark"]

LOG4J2_PROPERTIES: Final = Path(__file__).with_name("log4j2.properties")
#: The driver JVM's collector and JIT settings. A report is a short batch job: with the default G1 collector
#: and compile thresholds, the two-core build machine spent 17 s of CPU in the JIT compilers on a report of
#: 1,000 records (16,838 methods compiled), and G1's write barriers and concurrent threads cost the JSON
#: reader's allocation-heavy parse. The parallel collector, and the optimising compiler (C2) kept for the
#: methods that run 10x more often than its defaults ask, make a report cheaper at every size (1,000 records:
#: 20 s of JVM CPU -> 14 s; 10M, alternating with the defaults: JSON lines 62.3 / 58.4 s -> 53.7 / 52.0 s, JVM
#: CPU 115 / 108 s -> 96 / 93 s; Parquet 30.7 / 30.7 s -> 29.1 s). Local mode runs the executors in the driver
#: JVM, so they apply to the whole job there; a cluster's executors keep their own settings.
DRIVER_JVM_OPTIONS: Final = (
    "-XX:+UseParallelGC",
    "-XX:Tier4InvocationThreshold=50000",
    "-XX:Tier4MinInvocationThreshold=20000",
    "-XX:Tier4CompileThreshold=60000",
    "-XX:Tier4BackEdgeThreshold=400000",
)
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
        class_data_sharing: start the driver JVM from a class-data-sharing archive, written by the first
            session that has none (see the module's docstring).
    """

    master: str = "local[*]"
    driver_memory: str = DEFAULT_DRIVER_MEMORY
    shuffle_partitions: int = 8
    app_name: str = "corda-trio-report"
    class_data_sharing: bool = True


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
    java = find_java()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", _python())
    log_opt = f"-Dlog4j2.configurationFile=file:{LOG4J2_PROPERTIES}"
    cds = class_data_sharing(java) if settings.class_data_sharing and _launches_jvm() else None
    driver_opts = " ".join([log_opt, *DRIVER_JVM_OPTIONS, *([cds.java_options] if cds else [])])
    builder = (
        SparkSession.builder.master(settings.master)
        .appName(settings.app_name)
        .config("spark.driver.memory", settings.driver_memory)
        .config("spark.driver.extraJavaOptions", driver_opts)
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
    completed = False
    try:
        yield spark
        completed = True
    finally:
        _stop(spark)
        if cds is not None and cds.writes:
            cds.finish(keep=completed)


@attrs.frozen(kw_only=True)
class ClassDataSharing:
    """The driver JVM's class-data-sharing archive: read from :attr:`path`, or written to a temporary file
    at the JVM's exit and moved to :attr:`path` (:meth:`finish`)."""

    path: Path
    #: No archive yet: this session's JVM writes one when it exits (decided once, before the JVM starts).
    writes: bool

    @property
    def _temporary(self) -> Path:
        return self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")

    @property
    def java_options(self) -> str:
        """The driver's JVM options (CDS log lines off: the JVM prints them on stdout)."""
        if self.writes:
            return f"-XX:ArchiveClassesAtExit={self._temporary} -Xlog:cds*=off"
        return f"-XX:SharedArchiveFile={self.path} -Xlog:cds*=off"

    def finish(self, *, keep: bool, timeout: float = 120.0) -> None:
        """Stop the session's JVM (its archive is written at exit) and move a complete archive into place.

        ``keep=False`` (the session ended with an error or an interrupt): the JVM is killed at once and writes
        nothing. A JVM that takes longer than ``timeout`` to exit is killed too; the next session tries again.
        """
        from pyspark import SparkContext

        gateway = SparkContext._gateway
        proc: subprocess.Popen[bytes] | None = getattr(gateway, "proc", None)
        if gateway is None or proc is None:
            return
        with contextlib.suppress(Exception):
            gateway.shutdown()
        SparkContext._gateway = None  # a later session in this process launches a JVM of its own
        SparkContext._jvm = None
        try:
            if not keep:
                proc.kill()
            elif proc.stdin is not None:
                proc.stdin.close()  # the gateway JVM exits at the end of its stdin
            proc.wait(timeout=timeout)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()
        tmp = self._temporary
        if keep and proc.returncode == 0 and tmp.is_file() and tmp.stat().st_size > 0:
            os.replace(tmp, self.path)
        else:
            tmp.unlink(missing_ok=True)


def class_data_sharing(java: str) -> ClassDataSharing | None:
    """The archive for ``java`` and the installed PySpark (``None`` when the cache directory is not writable,
    or its path holds white space).

    The archive's name is a hash of the Java executable (resolved path, size, modification time) and of
    PySpark's version and location and of :data:`DRIVER_JVM_OPTIONS`, so an upgrade of either, or other
    options, start a new archive.
    """
    import pyspark

    real = Path(java).resolve()
    try:
        st = real.stat()
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        folder = Path(base) / "corda-trio" / "spark-cds"
        if any(c.isspace() for c in str(folder)):
            return None  # Spark splits the JVM options at white space: no folder made for nothing
        folder.mkdir(parents=True, exist_ok=True)
    except (OSError, RuntimeError):  # no home directory, or a read-only one: start without sharing
        return None
    if not os.access(folder, os.W_OK):
        return None
    key = (
        f"{real}|{st.st_size}|{st.st_mtime_ns}|{pyspark.__version__}|{Path(pyspark.__file__).parent}|"
        + " ".join(DRIVER_JVM_OPTIONS)  # the archive is written and read with these options
    )
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    path = folder / f"spark-{pyspark.__version__}-{digest}.jsa"
    return ClassDataSharing(path=path, writes=not path.is_file())


def _stop(spark: SparkSession) -> None:
    """``spark.stop()``, without waiting for PySpark's accumulator server to notice it should stop.

    That server answers the JVM's accumulator updates on one connection that it polls once a second, and
    ``SparkContext.stop`` waits for the poll (0.8 s of every report's wall time, measured). The JVM is stopped
    first, as ``stop`` does; the server is then shut down by a daemon thread that a process at its end need
    not wait for.
    """
    import threading

    context = spark.sparkContext
    server = getattr(context, "_accumulatorServer", None)
    if server is not None:
        context._accumulatorServer = None  # stop() skips the wait
    try:
        spark.stop()
    finally:
        if server is not None:
            threading.Thread(target=server.shutdown, name="spark-accumulator-stop", daemon=True).start()


def _launches_jvm() -> bool:
    """The next session starts a JVM (its options apply), rather than reusing this process's gateway."""
    from pyspark import SparkContext

    return SparkContext._gateway is None


def _python() -> str:
    return sys.executable
