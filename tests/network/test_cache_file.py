"""The node-info cache's file: a damaged one is moved aside with a warning and the cache starts empty (it
is a cache: the network map and the node-info directory fill it again); other failures are raised."""

from __future__ import annotations

import contextlib
import logging
import sqlite3
from pathlib import Path

import pytest

from corda_trio import network


def _aside(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if ".damaged-" in p.name)


def test_a_file_that_is_not_a_database_is_moved_aside(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "network-map-cache.db"
    garbage = bytes(range(256)) * 16
    path.write_bytes(garbage)
    with caplog.at_level(logging.WARNING, logger="corda_trio.network.cache"):
        cache = network.NodeInfoCache(path)
    try:
        assert cache.load() == {} and cache.parameters() is None
        cache.set_parameters("ab", b"signed")  # usable at once
        assert cache.parameters() == ("ab", b"signed")
    finally:
        cache.close()
    (moved,) = _aside(tmp_path)
    assert (tmp_path / moved).read_bytes() == garbage  # kept as it was, for a look
    assert f"is damaged (file is not a database): moved aside to {tmp_path / moved}" in caplog.text


def test_a_database_with_a_damaged_page_is_moved_aside(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "cache.db"
    cache = network.NodeInfoCache(path)
    cache.set_parameters("ab" * 32, b"p" * 100)
    with cache._lock:  # many rows, so that the table spans pages well past the file's first
        cache._db.executemany(
            "INSERT INTO node_infos (legal_name, hash, signed) VALUES (?, ?, ?)",
            [(f"O=N{i}, L=London, C=GB", "h", b"s" * 300) for i in range(200)],
        )
        cache._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    cache.close()
    data = bytearray(path.read_bytes())
    page = 4096
    assert len(data) >= 8 * page
    data[3 * page : 6 * page] = b"\xa5" * (3 * page)  # three pages of the table's b-tree overwritten
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="corda_trio.network.cache"):
        cache = network.NodeInfoCache(path)
    try:
        assert cache.load() == {}
    finally:
        cache.close()
    assert len(_aside(tmp_path)) == 1
    assert "is damaged (" in caplog.text  # (found by SQLite's quick check on opening)


def test_a_cache_path_that_cannot_be_opened_is_an_error_and_nothing_is_moved(tmp_path: Path) -> None:
    path = tmp_path / "cache.db"
    path.mkdir()
    with pytest.raises(IsADirectoryError):  # (refused before SQLite: it said "unable to open database file")
        network.NodeInfoCache(path)
    assert path.is_dir() and _aside(tmp_path) == []


def test_a_cache_a_newer_build_wrote_is_moved_aside_unread(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Its format (SQLite's user_version) is above this build's: before, this build read it (and wrote to it)
    as its own; now it is kept as it was, under another name, and the cache starts empty."""
    path = tmp_path / "network-map-cache.db"
    cache = network.NodeInfoCache(path)
    cache.set_parameters("ab", b"signed by a newer build")
    cache.close()
    with contextlib.closing(sqlite3.connect(path)) as db:
        assert db.execute("PRAGMA user_version").fetchone() == (1,)  # (this build records its format)
        db.execute("PRAGMA user_version = 2")
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    newer = path.read_bytes()
    with caplog.at_level(logging.WARNING, logger="corda_trio.network.cache"):
        cache = network.NodeInfoCache(path)
    try:
        assert cache.load() == {} and cache.parameters() is None
    finally:
        cache.close()
    (moved,) = [p.name for p in tmp_path.iterdir() if ".newer-" in p.name and not p.name.endswith("-wal")]
    assert (tmp_path / moved).read_bytes() == newer
    assert (
        f"network map cache {path} was written by a newer build of corda-trio (format 2; this build reads "
        f"format 1 and older): moved aside, unread, to {tmp_path / moved}"
    ) in caplog.text
