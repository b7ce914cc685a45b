"""Starting a quiet, fast Spark session: Java discovery, log level, driver memory, master URL.

Theory of operation: PySpark starts a JVM through ``spark-submit``, which needs ``java``. We look for it in
``JAVA_HOME`` and then on ``PATH`` and fail with one clear line if it is missing (``.ci/run`` installs
openjdk-17-jre-headless). Everything the JVM must know at launch (driver memory, log4j2 configuration) is set
on the builder *before* the first ``getOrCreate()``; afterwards it cannot change. Logs are kept to errors by
our own ``log4j2.properties`` plus ``setLogLevel("ERROR")``; the console progress bar is off. The same code
runs against a cluster when ``master`` is a cluster URL. A cluster's executors log as the cluster is set up
to (into each worker's work directory): they are not given our file's path, which exists only where the
driver runs (an executor given a path its worker lacks logged log4j's "ERROR Reconfiguration failed: No
configuration found" twice and then ran with Spark's default INFO profile anyway).

Local and cluster masters differ in two ways. A local driver binds to 127.0.0.1 (``SPARK_LOCAL_IP``, given to
its JVM only): nothing outside this machine needs it. A cluster's executors connect to the driver at the
address it advertises, so there the driver binds as Spark chooses (the host name's address, or the first
address that is not loopback), unless the operator sets ``SPARK_LOCAL_IP``; with 127.0.0.1 it advertised
``localhost``, and executors on other machines failed to connect, again and again, while the report waited
without a word. And a cluster may give the report no executor at all (no live worker, none with a free core
and ``spark.executor.memory`` free, or executors that cannot reach the driver): Spark then waits forever
(it only logs "Initial job has not accepted any resources", a warning). :class:`_ExecutorWatch` stops the
report's jobs once it has had no executor for ``executor_wait_seconds``, and :func:`open_spark` turns that
into one :class:`ReportEnvironmentError` naming the master and what the cluster must provide.

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
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Final

import attrs

from corda_trio.hostport import host_port_text

from ._errors import ReportEnvironmentError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "EXECUTOR_WAIT_SECONDS",
    "MASTER_CONNECT_SECONDS",
    "ClassDataSharing",
    "SparkSettings",
    "check_master",
    "class_data_sharing",
    "find_java",
    "is_local",
    "open_spark",
]

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
#: How long a report on a cluster waits while it has no executor (at its start for the first one, later for
#: one to replace those it lost) before it stops with an error instead of waiting forever. An executor of a
#: live standalone worker on the 2-core build machine registered 2-5 s after the session started.
EXECUTOR_WAIT_SECONDS: Final = 60.0


#: How long the report tries to open a TCP connection to a ``spark://`` master before Spark starts, and then
#: waits for the master's answer to its probe (:func:`check_master`).
MASTER_CONNECT_SECONDS: Final = 10.0
#: The probe: a frame of Spark's RPC transport (``org.apache.spark.network.protocol``: 8-byte frame length,
#: 1-byte message type, the message) asking for a stream no Spark process serves. Every Spark RPC endpoint
#: (a master, a standby master) answers it at once with a ``StreamFailure`` frame ("Stream ... was not
#: found."), and logs nothing above INFO.
_PROBE_STREAM: Final = b"/files/corda-trio-probe"
_STREAM_REQUEST: Final = 6
_PROBE: Final = (
    (8 + 1 + 4 + len(_PROBE_STREAM)).to_bytes(8, "big")
    + bytes([_STREAM_REQUEST])
    + len(_PROBE_STREAM).to_bytes(4, "big")
    + _PROBE_STREAM
)
#: A frame header of Spark's RPC transport: 8 bytes of length (itself included) and 1 of message type. Only
#: the length is judged: a later Spark may add message types (4.x has 0 ChunkFetchRequest .. 12
#: MergedBlockMetaSuccess), and no text protocol's first 8 bytes read as a length below 2**31.
_SPARK_HEADER_BYTES: Final = 9


def check_master(master: str) -> None:
    """A ``spark://`` master that accepts no connection, or a port that accepts one but does not speak
    Spark's RPC protocol (another program's), is one error within :data:`MASTER_CONNECT_SECONDS`: Spark's own
    client tries 3 times, 20 s each, and then only says "All masters are unresponsive! Giving up." (70 s
    measured, for either). Any one master of a list (``spark://h1:7077,h2:7077``, standby masters) that
    answers will do; a URL that is not ``host:port`` is left to Spark, which names what is wrong with it. So
    is a port that closes the connection or answers in a few bytes (a master that requires authentication
    or TLS may), rather than risk refusing a real master.

    Raises:
        ReportEnvironmentError: no master of the URL accepts a connection and answers as Spark does (each
            one's reason).
    """
    if not master.startswith("spark://"):
        return
    problems = []
    for address in master.removeprefix("spark://").split(","):
        host, colon, port = address.rpartition(":")
        if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
            return
        try:
            problem = _probe(host.strip("[]"), int(port))
        except OSError as exc:
            problem = exc.strerror or str(exc)
        if problem is None:
            return
        problems.append((address, problem))
    said = problems[0][1] if len(problems) == 1 else "; ".join(f"{a}: {why}" for a, why in problems)
    raise ReportEnvironmentError(f"cannot connect to Spark master {master}: {said}")


def _probe(host: str, port: int) -> str | None:
    """Connect to ``host:port`` and send :data:`_PROBE`: ``None`` if the answer may be Spark's, else why
    not. Raises :class:`OSError` if no connection is made."""
    deadline = time.monotonic() + MASTER_CONNECT_SECONDS
    with socket.create_connection((host, port), timeout=MASTER_CONNECT_SECONDS) as sock:
        answer = b""
        try:
            sock.sendall(_PROBE)
            while len(answer) < _SPARK_HEADER_BYTES:
                sock.settimeout(max(0.001, deadline - time.monotonic()))
                chunk = sock.recv(_SPARK_HEADER_BYTES - len(answer))
                if not chunk:
                    return None  # closed without a full answer: left to Spark (see check_master)
                answer += chunk
        except TimeoutError:
            return (
                f"it accepts connections but gave no answer in Spark's RPC protocol within "
                f"{MASTER_CONNECT_SECONDS:g} s (is it a Spark master's port?)"
            )
        except OSError:  # reset: left to Spark
            return None
    length = int.from_bytes(answer[:8], "big")
    if _SPARK_HEADER_BYTES <= length < 2**31:
        return None
    return f"it answered, but not in Spark's RPC protocol (is it a Spark master's port?): {answer!r}"


def is_local(master: str) -> bool:
    """``master`` runs the tasks in the driver JVM (``local``, ``local[N]``, ``local[*]``, ``local[N,F]``)."""
    return master == "local" or master.startswith("local[")


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
        executor_memory: heap of each executor on a cluster (``spark.executor.memory``; ``None``: Spark's
            default, 1g). A worker offering less memory than this never runs one.
        executor_wait_seconds: on a cluster, how long the report may have no executor before it stops with
            :class:`ReportEnvironmentError` (local masters always have one).
    """

    master: str = "local[*]"
    driver_memory: str = DEFAULT_DRIVER_MEMORY
    shuffle_partitions: int = 8
    app_name: str = "corda-trio-report"
    class_data_sharing: bool = True
    executor_memory: str | None = None
    executor_wait_seconds: float = EXECUTOR_WAIT_SECONDS


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

    Raises:
        ReportEnvironmentError: no Java, a ``spark://`` master that accepts no connection
            (:func:`check_master`), Spark did not start, or (cluster master) the report had no executor for
            ``settings.executor_wait_seconds`` (raised from the ``with`` block, whose jobs were cancelled).
    """
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        yield active
        return
    java = find_java()
    check_master(settings.master)
    os.environ.setdefault("PYSPARK_PYTHON", _python())
    # (the driver JVM's environment only: a later cluster session of this process, or a command it starts,
    # must not inherit an address that only this machine can reach)
    jvm_env = {"SPARK_LOCAL_IP": "127.0.0.1"} if is_local(settings.master) else {}
    log_opt = f"-Dlog4j2.configurationFile=file:{LOG4J2_PROPERTIES}"
    cds = class_data_sharing(java) if settings.class_data_sharing and _launches_jvm() else None
    driver_opts = " ".join([log_opt, *DRIVER_JVM_OPTIONS, *([cds.java_options] if cds else [])])
    options = {
        "spark.master": settings.master,
        "spark.app.name": settings.app_name,
        "spark.driver.memory": settings.driver_memory,
        "spark.driver.extraJavaOptions": driver_opts,
        "spark.ui.showConsoleProgress": "false",
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": str(settings.shuffle_partitions),
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.adaptive.enabled": "true",
        # The report caches JSON input's parsed columns for its second pass (see ``_job.compute``); the
        # in-memory cache's column encoders cost more CPU than the cache saves (10M JSON lines: 601 MB
        # compressed, 668 MB not; the aggregate that fills it 117 s against 67 s of wall time).
        "spark.sql.inMemoryColumnarStorage.compressed": "false",
    }
    if settings.executor_memory is not None:
        options["spark.executor.memory"] = settings.executor_memory
    launched = _launches_jvm() and "PYSPARK_GATEWAY_PORT" not in os.environ
    output = _launch_gateway(options, jvm_env) if launched else None
    builder = SparkSession.builder
    for key, value in options.items():
        builder = builder.config(key, value)
    try:
        spark = builder.getOrCreate()
    except Exception as exc:  # the JVM is up but Spark is not (local[0], an unreachable cluster master)
        reason = _start_failure(exc, output)
        if launched:
            _end_jvm(kill=True)
        where = f"master {settings.master}, driver memory {settings.driver_memory}"
        raise ReportEnvironmentError(f"Spark did not start: {reason} ({where})") from None
    except BaseException:
        if launched:
            _end_jvm(kill=True)
        raise
    if output is not None:
        output.release()
    spark.sparkContext.setLogLevel("ERROR")
    watch = None if is_local(settings.master) else _ExecutorWatch(spark, settings)
    completed = False
    try:
        yield spark
        completed = True
    except Exception as exc:
        if watch is not None and watch.reason is not None:  # its jobs were cancelled: say why, in one line
            raise ReportEnvironmentError(watch.reason) from None
        failure = _job_failure(exc, settings.master)  # (asked now: the JVM that knows is stopped below)
        if failure is not None:
            raise ReportEnvironmentError(failure) from None
        raise
    finally:
        if watch is not None:
            watch.stop()
        _stop(spark)
        if cds is not None and cds.writes:
            cds.finish(keep=completed)
        elif launched:
            _end_jvm(kill=False)  # it cleans up after itself (temporary directories) as it exits


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
        status = _end_jvm(kill=not keep, timeout=timeout)
        if status is None:
            return
        tmp = self._temporary
        if keep and status == 0 and tmp.is_file() and tmp.stat().st_size > 0:
            os.replace(tmp, self.path)
        else:
            tmp.unlink(missing_ok=True)


def _end_jvm(*, kill: bool, timeout: float = 120.0) -> int | None:
    """End the JVM this process launched and wait for it: at the end of its stdin it exits as usual (its
    shutdown hooks remove Spark's temporary directories), or at once with ``kill``; one that takes longer
    than ``timeout`` is killed. Returns its exit status (``None``: no JVM of ours). The command then leaves
    no JVM running behind it."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    proc: subprocess.Popen[bytes] | None = getattr(gateway, "proc", None)
    if gateway is None or proc is None:
        return None
    with contextlib.suppress(Exception):
        gateway.shutdown()
    SparkContext._gateway = None  # a later session in this process launches a JVM of its own
    SparkContext._jvm = None
    try:
        if kill:
            proc.kill()
        elif proc.stdin is not None:
            proc.stdin.close()  # the gateway JVM exits at the end of its stdin
        proc.wait(timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        proc.kill()
        proc.wait()
    return proc.returncode


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
    context = spark.sparkContext
    server = getattr(context, "_accumulatorServer", None)
    if server is not None:
        context._accumulatorServer = None  # stop() skips the wait
    try:
        spark.stop()
    finally:
        if server is not None:
            threading.Thread(target=server.shutdown, name="spark-accumulator-stop", daemon=True).start()


def _job_failure(exc: Exception, master: str) -> str | None:
    """One line for a Spark job that failed (``None``: ``exc`` is not a Java exception).

    PySpark raises a failed job as ``Py4JJavaError``, whose text is asked of the JVM, so once the session is
    stopped the traceback only says "<exception str() failed>". The line names the deepest cause. A record
    file that an executor cannot find was seen by the driver (it listed it): on a cluster the workers do not
    see the driver's files under the same path.
    """
    java = getattr(exc, "java_exception", None)
    if java is None:
        return None
    try:
        causes = [java]
        while len(causes) < 50 and (cause := causes[-1].getCause()) is not None:
            causes.append(cause)
        missing = next((c for c in causes if c.getClass().getName() == "java.io.FileNotFoundException"), None)
        deepest = missing or causes[-1]
        said = (str(deepest.getMessage() or "").strip().splitlines() or ["(no message)"])[0]
        name = str(deepest.getClass().getSimpleName())
    except Exception:  # the JVM is gone: nothing to ask it
        return None
    if missing is not None and not is_local(master):
        return (
            f"Spark's executors cannot read the records (master {master}): {said}; on a cluster, each --in "
            "directory must be at the same path on every worker (a shared mount)"
        )
    return f"a Spark job failed (master {master}): {name}: {said}"


class _ExecutorWatch:
    """On a cluster: cancels the session's jobs, again and again, once it has had no executor for
    ``settings.executor_wait_seconds`` (:attr:`reason` then says why, for the error that follows). Polls
    Spark's status tracker twice a second from a daemon thread, from the session's start to :meth:`stop`."""

    def __init__(self, spark: SparkSession, settings: SparkSettings) -> None:
        self._context = spark.sparkContext
        self._settings = settings
        self._stopped = threading.Event()
        #: why the jobs were cancelled (``None``: they were not)
        self.reason: str | None = None
        self._thread = threading.Thread(target=self._watch, name="spark-executor-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop watching (before the session stops)."""
        self._stopped.set()
        self._thread.join()

    def _executors(self) -> int:
        # (the tracker lists the driver's block manager too)
        return max(0, len(self._context.statusTracker().getExecutorInfos()) - 1)

    def _watch(self) -> None:
        wait = self._settings.executor_wait_seconds
        since = time.monotonic()
        had_some = False
        while not self._stopped.wait(0.5):
            try:
                if self._executors() > 0:
                    since, had_some = time.monotonic(), True
                    continue
                if time.monotonic() - since < wait:
                    continue
                if self.reason is None:
                    self.reason = self._explain(wait, had_some)
                self._context.cancelAllJobs()
            except Exception:  # the JVM is going away: nothing left to watch
                return

    def _explain(self, wait: float, had_some: bool) -> str:
        conf = self._context.getConf()
        driver = driver_address(conf.get("spark.driver.host"), conf.get("spark.driver.port"))
        memory = self._settings.executor_memory or conf.get("spark.executor.memory", "1g")
        what = (
            f"lost its executors and got no other within {wait:g} s"
            if had_some
            else f"got no executor within {wait:g} s"
        )
        return (
            f"the report {what} from Spark master {self._settings.master}: it needs a live worker with a "
            f"free core and {memory} of free memory (--executor-memory) that can connect to this driver at "
            f"{driver} (set SPARK_LOCAL_IP to an address of this machine the workers reach)"
        )


def driver_address(host: str | None, port: str | None) -> str:
    """``HOST:PORT`` the workers dial the driver at (``spark.driver.host``, ``spark.driver.port``: Spark sets
    both when the context starts; ``?`` for one that is not set), an IPv6 host in brackets, with or without
    them in the conf (``[fd00::2]:40123``: ``fd00::2:40123`` does not say where the address ends)."""
    bare = (host or "?").removeprefix("[").removesuffix("]")
    if port is None or not port.isdigit():
        return host_port_text(bare, 0).removesuffix("0") + "?"
    return host_port_text(bare, int(port))


#: Lines the JVM prints on every start that say nothing to an operator: the launcher's note on the incubator
#: module Spark adds (``--add-modules=jdk.incubator.vector``) and DataSketches' note that it runs without
#: off-heap memory on Java > 11 (the report uses none). Dropped from the JVM's output; everything else passes.
JVM_NOISE: Final = (
    b"WARNING: Using incubator modules: jdk.incubator.vector",
    b"Warning: Java versions > Java 11 can only operate in restricted mode where no off-heap operations "
    b"are allowed!",
)


def _start_failure(exc: Exception, output: _JvmOutput | None) -> str:
    """Why the session did not start, in one line: the last error Spark logged with a reason (held back with
    the rest of the JVM's output while the session starts), else the Java exception's message."""
    said = output.held() if output is not None else []
    for line in reversed(said):
        _, found, reason = line.partition(" Reason: ")
        if found and reason.strip():
            return reason.strip()
    java = getattr(exc, "java_exception", None)
    with contextlib.suppress(Exception):  # (the gateway may be gone already)
        message = str(java.getMessage()) if java is not None else str(exc)
        if message.strip():
            return message.strip().splitlines()[0]
    return jvm_failure_reason(said) if said else type(exc).__name__


def _launch_gateway(options: dict[str, str], env: dict[str, str]) -> _JvmOutput:
    """Start the driver JVM as PySpark would, but with its output through :class:`_JvmOutput`: a JVM that
    exits before it is up (a master URL Spark does not know, a heap it cannot reserve) is one
    :class:`ReportEnvironmentError` naming its reason, not its stack trace and PySpark's. Returns its output,
    still held back: the caller releases it once the session is up (or names why it did not start).

    ``env`` holds environment variables for the JVM only (a variable already set in ours wins).

    Raises:
        ReportEnvironmentError: the JVM exited during its start.
    """
    from pyspark import SparkConf, SparkContext
    from pyspark.errors import PySparkRuntimeError
    from pyspark.java_gateway import launch_gateway

    conf = SparkConf(loadDefaults=False).setAll(list(options.items()))
    read_end, write_end = os.pipe()
    output = _JvmOutput(read_end)
    added = [name for name in env if name not in os.environ]
    try:
        # (PySpark gives the JVM a copy of our environment as it is at the launch)
        os.environ.update({name: env[name] for name in added})
        # (stdout too: HotSpot prints why it could not start there, and the JVM has nothing else to say on
        # the command's stdout)
        gateway = launch_gateway(conf, popen_kwargs={"stdout": write_end, "stderr": write_end})
    except PySparkRuntimeError as exc:
        if exc.getCondition() != "JAVA_GATEWAY_EXITED":
            raise
        raise ReportEnvironmentError(
            f"Spark's JVM did not start: {output.failure()} (master {options['spark.master']}, "
            f"driver memory {options['spark.driver.memory']})"
        ) from None
    finally:
        for name in added:
            os.environ.pop(name, None)
        os.close(write_end)  # the JVM has its own copy: the reader sees end of file when the JVM exits
    SparkContext._ensure_initialized(gateway=gateway, conf=conf)
    return output


class _JvmOutput:
    """The driver JVM's output (stdout and stderr, one pipe), read by a thread from before the JVM starts (so
    that it never blocks on a full pipe): held while the JVM starts, then copied to our stderr as it comes,
    without :data:`JVM_NOISE`."""

    def __init__(self, fd: int) -> None:
        self._lock = threading.Lock()
        self._held: list[bytes] | None = []
        self._ended = threading.Event()
        threading.Thread(target=self._copy, args=(fd,), name="spark-jvm-output", daemon=True).start()

    def _copy(self, fd: int) -> None:
        with os.fdopen(fd, "rb") as lines:
            for line in lines:
                if line.rstrip(b"\r\n") in JVM_NOISE:
                    continue
                with self._lock:
                    if self._held is not None:
                        if len(self._held) < 1000:
                            self._held.append(line)
                        continue
                with contextlib.suppress(OSError):
                    os.write(2, line)
        self._ended.set()

    def release(self) -> None:
        """The JVM is up: what it said so far goes out, and from now on each line as it comes."""
        with self._lock:
            held, self._held = self._held or [], None
        with contextlib.suppress(OSError):
            os.write(2, b"".join(held))

    def held(self) -> list[str]:
        """What the JVM said while its output is held back."""
        with self._lock:
            return [line.decode(errors="replace") for line in self._held or []]

    def failure(self, timeout: float = 10.0) -> str:
        """The JVM exited during its start: the line of what it said that tells why."""
        self._ended.wait(timeout)
        with self._lock:
            held = list(self._held or [])
        return jvm_failure_reason([line.decode(errors="replace") for line in held])


#: What a JVM that fails to start prints around its reason (skipped when looking for the reason).
_JVM_BOILERPLATE: Final = frozenset(
    {
        "Error occurred during initialization of VM",
        "Error: Could not create the Java Virtual Machine.",
        "Error: A fatal exception has occurred. Program will exit.",
    }
)
_UNCAUGHT: Final = re.compile(r'Exception in thread "[^"]*" [\w.$]+: (.+)')


def jvm_failure_reason(lines: list[str]) -> str:
    """The reason a JVM gave for ending during its start: the first line that is not boilerplate nor a stack
    frame, without the ``Exception in thread "main" some.Exception:`` before an uncaught exception's
    message."""
    for raw in lines:
        line = raw.strip()
        if not line or line in _JVM_BOILERPLATE or line.startswith(("at ", "... ", "Caused by:")):
            continue
        uncaught = _UNCAUGHT.fullmatch(line)
        return uncaught.group(1) if uncaught else line
    return "it printed no reason"


def _launches_jvm() -> bool:
    """The next session starts a JVM (its options apply), rather than reusing this process's gateway."""
    from pyspark import SparkContext

    return SparkContext._gateway is None


def _python() -> str:
    return sys.executable
