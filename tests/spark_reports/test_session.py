"""Where the driver JVM's class-data-sharing archive is kept and when a session writes it (no JVM started)."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark_reports._session import class_data_sharing, find_java


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
