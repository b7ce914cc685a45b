"""Persistent store of the network map service (SQLite, WAL, ``synchronous=FULL``).

One row per legal name holds the newest accepted signed NodeInfo; network parameters are kept by hash with
one marked current.  Every write is one transaction, so a crash leaves either the old or the new map.
Methods are blocking: the server calls them through ``trio.to_thread.run_sync`` with one thread at a time.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Literal

from ._model import SignedWithCert
from ._signing import VerifiedNodeInfo

__all__ = ["NetworkMapStore", "PutResult"]

PutResult = Literal["added", "replaced", "unchanged", "stale"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS node_infos (
    legal_name TEXT PRIMARY KEY,
    hash TEXT NOT NULL UNIQUE,
    serial INTEGER NOT NULL,
    signed BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS network_parameters (
    hash TEXT PRIMARY KEY,
    signed BLOB NOT NULL,
    current INTEGER NOT NULL DEFAULT 0
);
"""


class NetworkMapStore:
    """The map's durable state.  Thread-safe (one lock around the connection)."""

    def __init__(self, path: str | Path) -> None:
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def put_node_info(self, node: VerifiedNodeInfo) -> PutResult:
        """Store ``node`` unless a NodeInfo with a higher or equal serial exists for its legal name.

        Returns:
            ``added`` (new legal name), ``replaced`` (newer serial), ``unchanged`` (the same bytes again),
            or ``stale`` (an older or equal serial with different content: refused).
        """
        name = str(node.legal_name)
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                row = self._db.execute(
                    "SELECT hash, serial FROM node_infos WHERE legal_name = ?", (name,)
                ).fetchone()
                if row is not None and row[0] == node.hash:
                    result: PutResult = "unchanged"
                elif row is not None and row[1] >= node.node_info.serial:
                    result = "stale"
                else:
                    self._db.execute(
                        "INSERT OR REPLACE INTO node_infos (legal_name, hash, serial, signed) "
                        "VALUES (?, ?, ?, ?)",
                        (name, node.hash, node.node_info.serial, node.serialize()),
                    )
                    result = "added" if row is None else "replaced"
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return result

    def current_serial(self, legal_name: str) -> int | None:
        with self._lock:
            row = self._db.execute(
                "SELECT serial FROM node_infos WHERE legal_name = ?", (legal_name,)
            ).fetchone()
        return None if row is None else int(row[0])

    def remove_node(self, legal_name: str) -> bool:
        """Remove a legal name from the map (an operator action); returns whether it was there."""
        with self._lock:
            cursor = self._db.execute("DELETE FROM node_infos WHERE legal_name = ?", (legal_name,))
        return cursor.rowcount > 0

    def node_info_hashes(self) -> list[str]:
        with self._lock:
            return [r[0] for r in self._db.execute("SELECT hash FROM node_infos ORDER BY hash")]

    def legal_names(self) -> list[str]:
        with self._lock:
            return [r[0] for r in self._db.execute("SELECT legal_name FROM node_infos ORDER BY legal_name")]

    def get_node_info(self, hash_hex: str) -> bytes | None:
        with self._lock:
            row = self._db.execute(
                "SELECT signed FROM node_infos WHERE hash = ?", (hash_hex.upper(),)
            ).fetchone()
        return None if row is None else bytes(row[0])

    def set_current_parameters(self, hash_hex: str, signed: SignedWithCert | bytes) -> None:
        """Store signed parameters and make them current (the previous ones stay fetchable by hash)."""
        from . import _codec

        data = signed if isinstance(signed, bytes) else _codec.encode(signed.to_wire())
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute("UPDATE network_parameters SET current = 0")
                self._db.execute(
                    "INSERT OR REPLACE INTO network_parameters (hash, signed, current) VALUES (?, ?, 1)",
                    (hash_hex.upper(), data),
                )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def current_parameters_hash(self) -> str | None:
        with self._lock:
            row = self._db.execute("SELECT hash FROM network_parameters WHERE current = 1").fetchone()
        return None if row is None else str(row[0])

    def get_parameters(self, hash_hex: str) -> bytes | None:
        with self._lock:
            row = self._db.execute(
                "SELECT signed FROM network_parameters WHERE hash = ?", (hash_hex.upper(),)
            ).fetchone()
        return None if row is None else bytes(row[0])
