"""``corda-trio report`` as a real process against record files and report paths that are not what they
should be, two reports at once, and a report killed hard: one line naming the file, before Spark starts;
never a report of fewer records than given, never two reports mixed in one ``--out``."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.node.cli_helpers import CLI, descendants, run_cli, still_running_after, wait_for

#: The command run without the capabilities that let root read and write any file (a user's view).
AS_A_USER = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]


@pytest.fixture(scope="module")
def records(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory of real benchmark records (one short codec run)."""
    out = tmp_path_factory.mktemp("records") / "in"
    made = run_cli("bench", "run", "codec", "--out", str(out), "--duration", "1", "--no-progress")
    assert made.returncode == 0, made.stderr
    return out


PIPE = "not a regular file: a named pipe"
DEVICE = "not a regular file: a character device"
SECOND = "run-20261130T000000-codec-abcdef.records.jsonl"


def _put(path: Path, kind: str, records: Path) -> None:
    """Put ``kind`` at ``path``: what an operator (or a mistake) leaves where a file is read or written."""
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "dev-full":
        path.symlink_to("/dev/full")
    elif kind == "dir":
        path.mkdir()
    elif kind == "dangling":
        path.symlink_to(path.parent / "gone.jsonl")
    elif kind == "unreadable":
        shutil.copy(next(records.glob("*.records.jsonl")), path)
        path.chmod(0)
    else:
        raise AssertionError(kind)


@pytest.mark.parametrize(
    ("kind", "problem"),
    [
        ("fifo", PIPE),
        ("dev-zero", DEVICE),
        ("dir", "Is a directory"),
        ("dangling", "a symbolic link to {d}/gone.jsonl, which does not exist"),
        ("unreadable", "Permission denied"),
    ],
)
def test_a_record_file_that_cannot_be_read_is_named_before_spark_starts(
    records: Path, tmp_path: Path, kind: str, problem: str
) -> None:
    """A second record file that is a pipe, /dev/zero, a directory or a dangling link was passed over
    without a word (the report of the rest said nothing of it); an unreadable one was a Py4JJavaError
    traceback after the whole Spark start."""
    given = tmp_path / "in"
    shutil.copytree(records, given)
    _put(given / SECOND, kind, records)
    started = time.monotonic()
    done = subprocess.run(
        [*AS_A_USER, *CLI, "report", "--in", str(given), "--out", str(tmp_path / "out" / "r.html")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.stderr == (
        f"corda-trio: error: record file {given / SECOND} cannot be read: {problem.format(d=given)}\n"
    ), done.stderr
    assert done.returncode == 2
    assert time.monotonic() - started < 20  # (no Spark: it starts in 10-40 s here)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("kind", "problem"),
    [("fifo", PIPE), ("dev-full", DEVICE), ("dir", "Is a directory"), ("read-only-dir", None)],
)
def test_an_out_path_that_cannot_hold_a_report_is_refused_before_spark_starts(
    records: Path, tmp_path: Path, kind: str, problem: str | None
) -> None:
    """--out naming a pipe, a /dev/full link or a directory, or a file in a directory the user cannot
    write, was found out after the whole Spark run (or the pipe replaced by the report)."""
    out = tmp_path / "out" / "r.html"
    out.parent.mkdir()
    if kind == "read-only-dir":
        out.parent.chmod(0o555)
        problem = f"cannot create {tmp_path / 'out' / 'r_tables'}: Permission denied"
    else:
        _put(out, kind, records)
    started = time.monotonic()
    done = subprocess.run(
        [*AS_A_USER, *CLI, "report", "--in", str(records), "--out", str(out)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.stderr == f"corda-trio: error: --out {out}: {problem}\n", done.stderr
    assert done.returncode == 2
    assert time.monotonic() - started < 20
    assert sorted(p.name for p in out.parent.iterdir()) == ([] if kind == "read-only-dir" else ["r.html"])


_STARTED: list[subprocess.Popen[str]] = []


@pytest.fixture
def _nothing_left() -> Iterator[None]:
    yield
    while _STARTED:
        proc = _STARTED.pop()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm", encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return ""


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.usefixtures("_nothing_left")
def test_a_second_report_to_the_same_out_is_refused_and_one_killed_hard_leaves_a_rerun_that_works(
    records: Path, tmp_path: Path
) -> None:
    """Two reports with one --out both ran to the end, writing each other's tables and the same
    '<out>.part' file (one report's tables could stand beside the other's HTML, or the two be mixed in
    one file). Now the second is refused at once; one killed with SIGKILL (its JVM too) leaves no
    half-written report and no lock, and the same command run again writes a whole report."""
    out = tmp_path / "out" / "r.html"
    first = subprocess.Popen(
        [*CLI, "report", "--in", str(records), "--out", str(out)], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    _STARTED.append(first)
    seen: dict[int, int] = {}

    def spark_running() -> bool:
        seen.update(descendants(first.pid))
        return any(_comm(pid) == "java" for pid in seen)

    wait_for(spark_running, first, what="the Spark JVM", timeout=120)
    second = run_cli("report", "--in", str(records), "--out", str(out), timeout=60)
    assert second.stderr == (
        f"corda-trio: error: --out {out}: another report is being written there (it holds "
        f"{tmp_path / 'out' / 'r_tables'}); wait for it to end or choose another --out\n"
    ), second.stderr
    assert second.returncode == 1
    assert first.poll() is None, "the first report ended before the second was refused"
    os.killpg(first.pid, signal.SIGKILL)  # kill -9 of the command and its JVM, as a crash would
    first.wait()
    assert still_running_after(seen, 20) == set()  # (the JVM's exit follows the command's: not at once)
    assert not out.exists() and not list(out.parent.glob(".*"))

    again = run_cli("report", "--in", str(records), "--out", str(out), timeout=300)
    assert again.returncode == 0, again.stderr
    html = out.read_text(encoding="utf-8")
    assert html.rstrip().endswith("</html>") and html.count("<html") == 1
    assert sorted(p.name for p in out.parent.iterdir()) == ["r.html", "r_tables"]
    assert not [p for p in (out.parent / "r_tables").iterdir() if p.name.startswith(".")]
