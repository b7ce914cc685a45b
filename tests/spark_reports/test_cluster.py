"""``corda-trio report`` on a real Spark standalone cluster (``--master spark://...``).

A module fixture starts a master and one worker (1 core, 1g) on 127.0.0.1 from the installed PySpark's own
``bin/spark-class``, in process groups of their own, and at the end stops them and checks that none of their
processes (the executors the worker started) is left. Where the test runs as root, the worker runs in a
mount namespace of its own in which two directories are hidden (a tmpfs over each): one for records the
driver sees and the workers do not, as on a cluster without a shared mount, and the ``spark_reports`` package
(which a worker on another machine does not have either; the executors need none of its files). The report
itself runs as the operator runs it: a ``corda-trio report`` process, its environment marked so that any
process of it left behind is found.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pyspark
import pytest

import spark_reports
from spark_reports import _session
from tests.interop.conftest import port_open
from tests.node.cli_helpers import CLI, descendants, still_running_after
from tests.ports import free_port
from tests.spark_reports.test_spark_report import _generate

pytestmark = [pytest.mark.spark, pytest.mark.slow]

SPARK_CLASS = Path(pyspark.__file__).resolve().parent / "bin" / "spark-class"
#: A started master or worker JVM answers within this (2-core build machine, loaded: 5-15 s).
START_SECONDS = 90.0


@attrs.frozen
class Cluster:
    master: str
    worker: subprocess.Popen[bytes]
    work_dir: Path
    #: a directory this machine sees and the worker does not (``None``: no mount namespace here)
    hidden: Path | None


def _start(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(
            args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
            start_new_session=True,
        )  # fmt: skip


def _wait(condition: Any, proc: subprocess.Popen[bytes], what: str, log: Path) -> None:
    deadline = time.monotonic() + START_SECONDS
    while not condition():
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-3000:]
            pytest.fail(f"{what} did not start (exit {proc.poll()}):\n{tail}")
        time.sleep(0.2)


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """Stop the daemons (their process groups) and check that nothing they started is left."""
    started = {pid: t for proc in procs for pid, t in descendants(proc.pid).items()}
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    assert still_running_after(started, 20) == set()


def _can_hide() -> bool:
    """This process may give a child a mount namespace of its own (root, ``unshare`` allowed)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "--mount", "true"], capture_output=True).returncode == 0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    d = tmp_path_factory.mktemp("spark-cluster")
    env = {**os.environ, "SPARK_HOME": str(SPARK_CLASS.parent.parent)}
    env.pop("SPARK_LOCAL_IP", None)
    port = free_port()
    master = _start(
        [str(SPARK_CLASS), "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
         "--port", str(port), "--webui-port", str(free_port())],
        d / "master.log", env,
    )  # fmt: skip
    procs = [master]
    try:
        _wait(lambda: port_open(port), master, "the Spark master", d / "master.log")
        worker_args = [
            str(SPARK_CLASS), "org.apache.spark.deploy.worker.Worker", f"spark://127.0.0.1:{port}",
            "--host", "127.0.0.1", "--port", str(free_port()), "--webui-port", str(free_port()),
            "--cores", "1", "--memory", "1g", "--work-dir", str(d / "work"),
        ]  # fmt: skip
        hidden = None
        if _can_hide():
            hidden = d / "not-on-the-worker"
            hidden.mkdir()
            package = _session.LOG4J2_PROPERTIES.parent
            hide = 'mount -t tmpfs tmpfs "$1" && mount -t tmpfs tmpfs "$2" && shift 2 && exec "$@"'
            hidden_dirs = [str(hidden), str(package)]
            worker_args = ["unshare", "--mount", "sh", "-c", hide, "sh", *hidden_dirs, *worker_args]
        log = d / "worker.log"
        worker = _start(worker_args, log, env)
        procs.append(worker)
        registered = b"Successfully registered with master"
        _wait(lambda: registered in log.read_bytes(), worker, "the Spark worker", log)
        yield Cluster(master=f"spark://127.0.0.1:{port}", worker=worker, work_dir=d / "work", hidden=hidden)
    finally:
        _stop(procs)


def _report(cluster: Cluster, *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """``corda-trio report ... --master CLUSTER`` to its end; then no process of it may be left (its driver
    JVM inherits the marked environment) and the worker runs no executor for it."""
    mark = uuid.uuid4().hex
    env = {**os.environ, "CORDA_TRIO_TEST_PROCESS": mark}
    started = time.monotonic()
    proc = subprocess.run(
        [*CLI, "report", *args, "--master", cluster.master, "--driver-memory", "1g"],
        capture_output=True, text=True, timeout=240, env=env,
    )  # fmt: skip
    elapsed = time.monotonic() - started
    assert _marked(mark) == [], "a process of the report outlived it"
    deadline = time.monotonic() + 30  # (the worker reaps the executor once the driver is gone)
    while descendants(cluster.worker.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert descendants(cluster.worker.pid) == {}, "an executor outlived the report"
    return proc, elapsed


def _marked(mark: str) -> list[int]:
    needle = f"CORDA_TRIO_TEST_PROCESS={mark}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if needle in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                    found.append(int(entry))
            except OSError:
                continue
    return found


def _outward_address() -> str | None:
    """This machine's address toward other machines (``None``: it has only loopback); no packet is sent."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))
        except OSError:
            return None
        address = str(s.getsockname()[0])
    return None if ipaddress.ip_address(address).is_loopback else address


def test_report_on_a_cluster_equals_the_local_report(cluster: Cluster, spark: Any, tmp_path: Path) -> None:
    """The same records, reported in local mode and on the cluster: the same tables, byte for byte. The
    executors were told to reach the driver at an address other machines can reach: it told them
    ``localhost`` (it bound to 127.0.0.1 for every master), and executors on other machines failed to
    connect, one after another, while the report waited without a word.

    The same run checks two more things. The ``cpu:`` line counts the executors' tasks besides the driver JVM
    (it named only the driver's JVM, which on a cluster does none of the tasks). And the executors are not
    told to read the driver's ``log4j2.properties``, a path their worker does not have here: each executor
    logged log4j's "ERROR Reconfiguration failed: No configuration found" twice on its start."""
    _generate(tmp_path / "in", "gen-c", slowdown=1.0, seed=5, t0_ns=1_800_000_000_000_000_000)
    local = spark_reports.build_report([tmp_path / "in"], tmp_path / "local" / "r.html", spark=spark)
    proc, _ = _report(cluster, "--in", str(tmp_path / "in"), "--out", str(tmp_path / "cluster" / "r.html"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert proc.stdout.startswith(f"report {tmp_path / 'cluster' / 'r.html'} (3,000 records, 1 run(s))")
    cpu = re.search(r"^  cpu: Spark driver JVM ([0-9.]+) s, executors' tasks ([0-9.]+) s$", proc.stdout, re.M)
    assert cpu is not None, proc.stdout
    assert float(cpu.group(1)) > 0 and float(cpu.group(2)) > 0, cpu.group(0)
    tables = sorted(p.name for p in local.tables_dir.glob("*.csv"))
    assert tables == ["errors.csv", "groups.csv", "stages.csv", "throughput.csv"]
    for name in tables:
        on_cluster = (tmp_path / "cluster" / "r_tables" / name).read_text()
        assert on_cluster == (local.tables_dir / name).read_text(), name
    html = (tmp_path / "cluster" / "r.html").read_text()
    assert f"master {cluster.master}, driver memory 1g" in html
    launched = sorted(cluster.work_dir.glob("app-*/*/stderr"), key=lambda p: p.stat().st_mtime)
    command = launched[-1].read_text(errors="replace")
    assert "log4j2.configurationFile" not in command
    assert "Reconfiguration failed" not in command, command[:2000]
    driver = re.search(r'"--driver-url" "spark://CoarseGrainedScheduler@([^"]+):\d+"', command)
    assert driver is not None, command[:2000]
    if _outward_address() is not None:  # (a machine with only loopback has nothing else to offer)
        host = driver.group(1)
        assert host != "localhost" and not ipaddress.ip_address(host).is_loopback, host


def test_a_cluster_without_room_for_an_executor_is_one_line_in_bounded_time(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Executors larger than any worker's memory never start: Spark waits for them forever ("Initial job has
    not accepted any resources", a warning the report does not show), so the report hung without a word.
    Now it stops after ``--executor-wait`` with one line naming the master and what it needs, exit 1."""
    _generate(tmp_path / "in", "gen-d", slowdown=1.0, seed=6, t0_ns=1_800_000_000_000_000_000)
    out = tmp_path / "r.html"
    proc, elapsed = _report(
        cluster, "--in", str(tmp_path / "in"), "--out", str(out), "--executor-memory", "2g",
        "--executor-wait", "5",
    )  # fmt: skip
    assert proc.returncode == 1 and proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert re.fullmatch(
        rf"corda-trio: error: the report got no executor within 5 s from Spark master {cluster.master}: it "
        r"needs a live worker with a free core and 2g of free memory \(--executor-memory\) that can connect "
        r"to this driver at \S+:\d+ \(set SPARK_LOCAL_IP to an address of this machine the workers reach\)",
        lines[0],
    ), lines[0]
    assert elapsed < 90, elapsed
    assert not out.exists()


def test_records_the_workers_do_not_see_are_one_line(cluster: Cluster, tmp_path: Path) -> None:
    """``--in`` on a disk of the driver's only: the executors cannot open the files. It was a Python traceback
    ending in "Py4JJavaError: <exception str() failed>" (the JVM that knew why was already stopped) after the
    scheduler's "Task 0 in stage 0.0 failed 4 times" line. Now one line names the file and the remedy."""
    if cluster.hidden is None:
        pytest.skip("needs a mount namespace for the worker (root and unshare)")
    _generate(cluster.hidden / "in", "gen-e", slowdown=1.0, seed=7, t0_ns=1_800_000_000_000_000_000)
    out = tmp_path / "r.html"
    proc, _ = _report(cluster, "--in", str(cluster.hidden / "in"), "--out", str(out))
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        f"corda-trio: error: Spark's executors cannot read the records (master {cluster.master}): File "
        f"file:{cluster.hidden / 'in' / 'run-gen-e.records.jsonl'} does not exist; on a cluster, each --in "
        "directory must be at the same path on every worker (a shared mount)"
    ]
    assert not out.exists()


def test_a_master_that_accepts_no_connection_is_one_line_at_once(tmp_path: Path) -> None:
    """Nothing listens at the master's port: Spark's client tried 3 x 20 s and then said "All masters are
    unresponsive! Giving up." (70 s measured). Now the report tries the port first: one line, at once."""
    _generate(tmp_path / "in", "gen-f", slowdown=1.0, seed=8, t0_ns=1_800_000_000_000_000_000)
    master = f"spark://127.0.0.1:{free_port()}"
    started = time.monotonic()
    proc = subprocess.run(
        [*CLI, "report", "--in", str(tmp_path / "in"), "--out", str(tmp_path / "r.html"), "--master", master],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        f"corda-trio: error: cannot connect to Spark master {master}: Connection refused"
    ]
    assert time.monotonic() - started < 30
    assert not (tmp_path / "r.html").exists()


def test_any_one_reachable_master_of_a_list_will_do(cluster: Cluster) -> None:
    """Standby masters (``spark://h1:P1,h2:P2``): one that answers as a Spark master is enough; when none
    does, each one's reason is named; a URL that is not host:port is left to Spark (it names the problem)."""
    up = cluster.master.removeprefix("spark://")
    down, also_down = free_port(), free_port()
    _session.check_master(f"spark://127.0.0.1:{down},{up}")
    both = f"spark://127.0.0.1:{down},127.0.0.1:{also_down}"
    with pytest.raises(spark_reports.ReportEnvironmentError) as refused:
        _session.check_master(both)
    assert str(refused.value) == (
        f"cannot connect to Spark master {both}: 127.0.0.1:{down}: Connection refused; "
        f"127.0.0.1:{also_down}: Connection refused"
    )
    for left_to_spark in ("spark://", "spark://host", "spark://:7077", "spark://h:99999", "local[2]"):
        _session.check_master(left_to_spark)


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts TCP connections and never says a word (another program's, not a Spark master)."""
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen(16)
        accepted: list[socket.socket] = []

        def accept() -> None:
            with contextlib.suppress(OSError):  # (closed at the end)
                while True:
                    accepted.append(listening.accept()[0])

        thread = threading.Thread(target=accept, daemon=True)
        thread.start()
        try:
            yield listening.getsockname()[1]
        finally:
            listening.shutdown(socket.SHUT_RDWR)
            for conn in accepted:
                conn.close()


def test_a_port_that_is_no_spark_master_is_one_line_in_bounded_time(silent_port: int, tmp_path: Path) -> None:
    """A ``spark://`` URL whose port accepts connections but is not a Spark master: Spark's client asked it
    3 x 20 s and then said only "All masters are unresponsive! Giving up." (67 s measured). Now the report
    probes the port in Spark's RPC protocol first: one line naming the master after 10 s, before any JVM."""
    _generate(tmp_path / "in", "gen-g", slowdown=1.0, seed=9, t0_ns=1_800_000_000_000_000_000)
    master = f"spark://127.0.0.1:{silent_port}"
    mark = uuid.uuid4().hex
    started = time.monotonic()
    proc = subprocess.run(
        [*CLI, "report", "--in", str(tmp_path / "in"), "--out", str(tmp_path / "r.html"), "--master", master],
        capture_output=True, text=True, timeout=120, env={**os.environ, "CORDA_TRIO_TEST_PROCESS": mark},
    )  # fmt: skip
    elapsed = time.monotonic() - started
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        f"corda-trio: error: cannot connect to Spark master {master}: it accepts connections but gave no "
        "answer in Spark's RPC protocol within 10 s (is it a Spark master's port?)"
    ]
    assert _session.MASTER_CONNECT_SECONDS <= elapsed < _session.MASTER_CONNECT_SECONDS + 15, elapsed
    assert _marked(mark) == [], "a process of the report outlived it"
    assert not (tmp_path / "r.html").exists()


def test_a_port_that_answers_but_not_as_spark_is_named() -> None:
    """A port whose program answers at once, but not as Spark does (here an HTTP server's reply): the probe
    says so without waiting; a master of the list that is a Spark master would still do."""
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()

        def answer() -> None:
            conn, _ = listening.accept()
            with conn:
                conn.recv(100)
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")

        thread = threading.Thread(target=answer, daemon=True)
        thread.start()
        master = f"spark://127.0.0.1:{listening.getsockname()[1]}"
        started = time.monotonic()
        with pytest.raises(spark_reports.ReportEnvironmentError) as raised:
            _session.check_master(master)
        thread.join()
    assert str(raised.value) == (
        f"cannot connect to Spark master {master}: it answered, but not in Spark's RPC protocol (is it a "
        "Spark master's port?): b'HTTP/1.1 '"
    )
    assert time.monotonic() - started < 5
