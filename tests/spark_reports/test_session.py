"""Where the driver JVM's class-data-sharing archive is kept and when a session writes it (no JVM started)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from spark_reports._session import class_data_sharing, driver_address, find_java


def test_archive_path_and_options_follow_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    java = find_java()
    first = class_data_sharing(java)
    assert first is not None and first.writes
    assert first.path.parent == tmp_path / "cache" / "corda-trio" / "spark-cds"
    options = first.java_options.split()
    assert options[0].startswith("-XX:ArchiveClassesAtExit=") and options[0].endswith(".tmp")
    assert options[1:] == ["-Xlog:cds*=off"]  # the JVM would print its CDS notes on the report's stdout
    first.path.write_bytes(b"archive")
    again = class_data_sharing(java)
    assert again is not None and again.path == first.path and not again.writes
    assert again.java_options.split() == [f"-XX:SharedArchiveFile={first.path}", "-Xlog:cds*=off"]


def test_no_archive_where_it_cannot_be_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "a cache"))
    assert class_data_sharing(find_java()) is None
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    assert class_data_sharing(find_java()) is None


@pytest.mark.parametrize(
    ("host", "port", "written"),
    [
        ("10.0.0.7", "40123", "10.0.0.7:40123"),
        ("driver.corp", "40123", "driver.corp:40123"),
        ("fd00::2", "40123", "[fd00::2]:40123"),
        ("[fd00::2]", "40123", "[fd00::2]:40123"),
        ("fd00::2", None, "[fd00::2]:?"),
        (None, None, "?:?"),
    ],
)
def test_the_driver_address_the_workers_need_is_written_as_an_address(
    host: str | None, port: str | None, written: str
) -> None:
    """The error of a report that got no executor names the driver's address for the operator to check:
    ``fd00::2:40123`` for an IPv6 one (``spark.driver.host`` and ``spark.driver.port`` joined with a colon),
    which does not say where the address ends; it is ``[fd00::2]:40123`` now, as every address printed."""
    assert driver_address(host, port) == written


@pytest.mark.spark
def test_a_failed_first_session_writes_no_archive_and_leaves_no_jvm(tmp_path: Path) -> None:
    """The first session (it would write the archive) ends with an error: its JVM is killed, not waited for,
    and neither an archive nor a temporary file is left (in a fresh process: no other session there)."""
    cache = tmp_path / "cache"
    script = (
        "import spark_reports as r\n"
        "with r.open_spark(r.SparkSettings(master='local[1]', driver_memory='1g')) as s:\n"
        "    assert s.range(10).count() == 10\n"
        "    raise SystemExit(3)\n"
    )
    proc = _in_a_fresh_process(script, cache)
    assert proc.returncode == 3, proc.stderr
    assert list((cache / "corda-trio" / "spark-cds").iterdir()) == []
    left = subprocess.run(["pgrep", "-f", str(cache)], capture_output=True, text=True)
    assert left.stdout.strip() == "", left.stdout


@pytest.mark.spark
def test_the_driver_jvm_gets_its_options_and_stop_leaves_no_accumulator_server(tmp_path: Path) -> None:
    """The collector and JIT settings reach the driver JVM; on leaving the session the JVM is stopped and
    PySpark's accumulator server is shut down (by a thread of its own, which the session does not wait for),
    so nothing keeps serving (in a fresh process: a session of its own)."""
    script = (
        "import threading, spark_reports as r\n"
        "from spark_reports._session import DRIVER_JVM_OPTIONS\n"
        "with r.open_spark(r.SparkSettings(master='local[1]', driver_memory='1g')) as s:\n"
        "    beans = s._jvm.java.lang.management.ManagementFactory\n"
        "    args = list(beans.getRuntimeMXBean().getInputArguments())\n"
        "    missing = [o for o in DRIVER_JVM_OPTIONS if o not in args]\n"
        "    assert not missing, (missing, args)\n"
        "    gcs = [b.getName() for b in beans.getGarbageCollectorMXBeans()]\n"
        "    assert set(gcs) == {'PS Scavenge', 'PS MarkSweep'}, gcs\n"
        "    context = s.sparkContext\n"
        "    server = context._accumulatorServer\n"
        "    assert server is not None\n"
        "assert context._jsc is None and getattr(context, '_accumulatorServer', None) is None\n"
        "stopper = [t for t in threading.enumerate() if t.name == 'spark-accumulator-stop']\n"
        "for t in stopper:\n"
        "    assert t.daemon\n"
        "    t.join(10)\n"
        "    assert not t.is_alive()\n"
        "assert server.server_shutdown and server.socket.fileno() == -1\n"
        "print('ok')\n"
    )
    proc = _in_a_fresh_process(script, tmp_path / "cache")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "ok"


def _in_a_fresh_process(script: str, cache: Path) -> subprocess.CompletedProcess[str]:
    """Runs ``script`` in a new interpreter whose cache directory (the CDS archive's) is ``cache``."""
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
        env={**os.environ, "XDG_CACHE_HOME": str(cache)},
    )  # fmt: skip
