"""Ctrl-C and SIGTERM on real ``corda-trio`` processes: one line, exit 130 (Ctrl-C) or 0 (SIGTERM), the
records measured so far on disk, and no process of the command's session left behind."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
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


def _popen(*args: str, cwd: Path, python: bool = False) -> subprocess.Popen[str]:
    """``corda-trio ARGS`` (``python ARGS`` with ``python``) in a session of its own."""
    return subprocess.Popen(
        [sys.executable, *args] if python else [*CLI, *args], cwd=cwd, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
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


# --- a signal while the process starts --------------------------------------------------------------------


def test_the_sigterm_handler_is_in_place_before_the_command_line_is_imported() -> None:
    """The entry point (``python -m corda_trio``, the console script) takes SIGTERM over before it imports
    the command line: it was installed only once argparse, logging and ``corda_trio.node`` had loaded, and a
    SIGTERM before that ended the process with no line and status 143."""
    probe = (
        "import signal, sys, runpy\n"
        "install = signal.signal\n"
        "def traced(signum, handler):\n"
        "    if signum == signal.SIGTERM and not hasattr(traced, 'seen'):\n"
        "        heavy = ('argparse', 'logging', 'corda_trio.node')\n"
        "        traced.seen = sorted(m for m in heavy if m in sys.modules)\n"
        "        print('loaded at SIGTERM handler:', traced.seen, flush=True)\n"
        "    return install(signum, handler)\n"
        "signal.signal = traced\n"
        "sys.argv = ['corda-trio', '--version']\n"
        "runpy.run_module('corda_trio', run_name='__main__')\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "loaded at SIGTERM handler: []", done.stdout


def _catches_sigterm(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            caught = next(line for line in f if line.startswith("SigCgt:"))
    except (OSError, StopIteration):
        return False
    return bool(int(caught.split()[1], 16) & (1 << (signal.SIGTERM - 1)))


@pytest.fixture(scope="module")
def bootstrapped(tmp_path_factory: pytest.TempPathFactory) -> Path:
    net = tmp_path_factory.mktemp("early") / "net"
    boot = subprocess.run(
        [*CLI, "network", "bootstrap", "--dir", str(net), "--node", "O=Alice,L=London,C=GB"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert boot.returncode == 0, boot.stderr
    return net


@pytest.mark.parametrize("delay_ms", [0, 1, 2, 5, 10, 20])
def test_sigterm_as_soon_as_the_process_takes_it_is_one_line_and_exit_0(
    bootstrapped: Path, tmp_path: Path, delay_ms: int
) -> None:
    """SIGTERM the moment the entry point's handler is in place (seen in /proc), and a few ms later, while
    the command's modules load: one line, ``terminated``, exit 0, every time (a signal raised in the middle
    of an import could be swallowed by the import lock's callback: "Exception ignored", and the command then
    ran on, a node started and served as if no SIGTERM had come)."""
    for _ in range(3):
        proc = _popen(
            "-m", "corda_trio", "networkmap", "serve", "--dir", str(bootstrapped), cwd=tmp_path, python=True
        )
        _STARTED.append(proc)
        deadline = time.monotonic() + 10
        while not _catches_sigterm(proc.pid):
            assert time.monotonic() < deadline and proc.poll() is None, "SIGTERM is never caught"
        time.sleep(delay_ms / 1000)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
        assert (proc.returncode, stderr) == (0, "terminated\n")


@pytest.mark.parametrize("delay_ms", [0, 10, 20, 30, 40, 50, 60, 80])
def test_sigterm_early_in_a_process_is_one_line_or_the_interpreters_default(
    bootstrapped: Path, tmp_path: Path, delay_ms: int
) -> None:
    """SIGTERM at fixed delays after the start: before any code of ours runs (the interpreter's own start,
    ~15 to 30 ms here) the default action ends the process (status -15, no output); from then on it is one
    line and exit 0, never a traceback, never a process that goes on."""
    for _ in range(3):
        proc = _popen(
            "-m", "corda_trio", "networkmap", "serve", "--dir", str(bootstrapped), cwd=tmp_path, python=True
        )
        _STARTED.append(proc)
        time.sleep(delay_ms / 1000)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
        assert (proc.returncode, stderr) in ((-signal.SIGTERM, ""), (0, "terminated\n")), stderr
