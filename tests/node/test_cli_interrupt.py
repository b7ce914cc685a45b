"""Ctrl-C and SIGTERM on real ``corda-trio`` processes: one line, exit 130 (Ctrl-C) or 0 (SIGTERM), the
records measured so far on disk, and no process of the command's session left behind."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.node.cli_helpers import CLI, descendants, still_running, wait_for

pytestmark = pytest.mark.slow


_STARTED: list[subprocess.Popen[str]] = []


@pytest.fixture(autouse=True)
def _nothing_left_after_a_failure() -> Iterator[None]:
    """Whatever a test asserted, its command's process group (a Spark JVM included) ends with the test."""
    yield
    while _STARTED:
        proc = _STARTED.pop()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _start(*args: str, cwd: Path) -> subprocess.Popen[str]:
    # A session of its own: the signal goes to the command only, as with `kill PID`.
    proc = _popen(*args, cwd=cwd)
    _STARTED.append(proc)
    return proc


def _popen(*args: str, cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*CLI, *args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip


def _bench_records(out: Path) -> int:
    """Records already written by a running bench (the ``.part`` file grows a batch at a time)."""
    return sum(p.read_bytes().count(b"\n") for p in out.glob("run-*.records.jsonl*"))


@pytest.mark.parametrize(
    ("signum", "line", "code"),
    [(signal.SIGINT, "interrupted", 130), (signal.SIGTERM, "terminated", 0)],
    ids=["ctrl-c", "sigterm"],
)
def test_bench_run_interrupted_keeps_its_records_and_leaves_no_child(
    tmp_path: Path, signum: int, line: str, code: int
) -> None:
    out = tmp_path / "out"
    # The wal scenario starts the store's commit helper process: it must not outlive the command.
    proc = _start(
        "bench", "run", "wal", "--out", str(out), "--closed", "--concurrency", "8", "--duration", "120",
        "--warmup", "0", "--no-progress", "--scratch", str(tmp_path / "scratch"), cwd=tmp_path,
    )  # fmt: skip
    try:
        wait_for(lambda: _bench_records(out) > 0, proc, what="a first batch of records")
        children = descendants(proc.pid)
        assert children, "the wal scenario should run a commit helper process"
        proc.send_signal(signum)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert stderr == f"{line}\n", stderr
    assert proc.returncode == code
    (meta_path,) = out.glob("run-*.meta.json")
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    assert meta["interrupted"] is True
    records = out / meta_path.name.replace(".meta.json", ".records.jsonl")
    written = records.read_text(encoding="utf-8").count("\n")
    assert written >= 8192 and meta["summary"]["recorded_ops"] + meta["summary"]["warmup_ops"] == written
    assert not list(out.glob("*.part"))
    assert still_running(children) == set()


@pytest.mark.parametrize(
    ("signum", "line", "code"),
    [(signal.SIGINT, "interrupted", 130), (signal.SIGTERM, "terminated", 0)],
    ids=["ctrl-c", "sigterm"],
)
def test_networkmap_serve_interrupted(tmp_path: Path, signum: int, line: str, code: int) -> None:
    net = tmp_path / "net"
    boot = subprocess.run(
        [*CLI, "network", "bootstrap", "--dir", str(net), "--node", "O=Alice,L=London,C=GB"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert boot.returncode == 0, boot.stderr
    proc = _start("networkmap", "serve", "--dir", str(net), cwd=tmp_path)
    try:
        assert proc.stdout is not None
        assert "serving http://" in proc.stdout.readline()
        proc.send_signal(signum)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert stderr.splitlines()[-1:] == [line] and "Traceback" not in stderr, stderr
    assert proc.returncode == code


@pytest.mark.spark
@pytest.mark.parametrize(
    ("signum", "line", "code"),
    [(signal.SIGINT, "interrupted", 130), (signal.SIGTERM, "terminated", 0)],
    ids=["ctrl-c", "sigterm"],
)
def test_report_interrupted_while_spark_runs(tmp_path: Path, signum: int, line: str, code: int) -> None:
    """py4j's own tracebacks about the interrupt are held back; the Spark JVM does not outlive the command."""
    records = tmp_path / "records"
    made = subprocess.run(
        [*CLI, "bench", "run", "codec", "--out", str(records), "--duration", "1", "--no-progress"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    proc = _start("report", "--in", str(records), "--out", str(tmp_path / "r.html"), cwd=tmp_path)
    try:
        seen: dict[int, int] = {}

        def spark_running() -> bool:
            seen.update(descendants(proc.pid))
            return any(_comm(pid) == "java" for pid in seen)

        wait_for(spark_running, proc, what="the Spark JVM", timeout=120)
        time.sleep(3)  # into the session's start-up or the job (a real process: real time)
        seen.update(descendants(proc.pid))
        assert proc.poll() is None, "the report finished before it could be interrupted"
        proc.send_signal(signum)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert "Traceback" not in stderr, stderr
    assert stderr.splitlines()[-1] == line, stderr
    assert proc.returncode == code
    assert still_running(seen) == set()


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm", encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return ""

