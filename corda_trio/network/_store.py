"""Persistent store of the network map service (SQLite, WAL, ``synchronous=FULL``).

One row per legal name holds the newest accepted signed NodeInfo; network parameters are kept by hash with
one marked current.  Every write is one transaction, so a crash leaves either the old or the new map.

An operator's removal sticks: the removed node's identity key goes on a deny-list (with its legal name), and a
NodeInfo signed by a denied key, or for a denied legal name, is refused until ``readmit`` lifts the entry.
A new legal name confusable with a different one already in the map or on the deny-list (the same but for
letter case or accents: ``pki.CordaX500Name.confusable_key``) is refused: the first holds it (a name the
map already holds may always publish again, also one a map of an older build admitted beside a look-alike).
The map serial counts changes to the set of nodes (added, replaced, removed, readmitted); it moves with
every change that clients must see.
Methods are blocking: the server calls them through ``trio.to_thread.run_sync`` with one thread at a time.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Final, Literal

from corda_trio import files, pki

from ._model import SignedWithCert
from ._signing import VerifiedNodeInfo, decode_signed_node_info, identity_key_hash

__all__ = ["NetworkMapStore", "NetworkMapStoreError", "PutResult"]

#: The format of the map database (SQLite's ``user_version``: 0 in a database of a build from before it
#: was recorded, whose tables are the same). A newer build's (higher) is refused, never read or changed.
MAP_DB_FORMAT: Final = 1

PutResult = Literal["added", "replaced", "unchanged", "stale", "denied", "confusable"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS node_infos (
    legal_name TEXT PRIMARY KEY,
    hash TEXT NOT NULL UNIQUE,
    serial INTEGER NOT NULL,
    signed BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS denied (
    identity_key_hash TEXT PRIMARY KEY,
    legal_name TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS map_serial (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    serial INTEGER NOT NULL
);
INSERT OR IGNORE INTO map_serial (id, serial) VALUES (1, 0);
CREATE TABLE IF NOT EXISTS network_parameters (
    hash TEXT PRIMARY KEY,
    signed BLOB NOT NULL,
    current INTEGER NOT NULL DEFAULT 0
);
"""


_COLUMNS = {
    "node_infos": ["legal_name", "hash", "serial", "signed"],
    "denied": ["identity_key_hash", "legal_name"],
    "map_serial": ["id", "serial"],
    "network_parameters": ["hash", "signed", "current"],
}


class NetworkMapStoreError(Exception):
    """The map database cannot be opened or read (not SQLite, damaged, or not the map's)."""


class NetworkMapStore:
    """The map's durable state.  Thread-safe (one lock around the connection).

    Raises:
        NetworkMapStoreError: (constructor) ``path`` is not a usable map database; the message names it.
    """

    def __init__(self, path: str | Path) -> None:
        self._lock = threading.Lock()
        try:  # (SQLite says "disk I/O error" of a named pipe or /dev/zero: say what the file is)
            files.check_regular_file(path, missing_ok=True)
        except OSError as exc:
            raise NetworkMapStoreError(
                f"cannot open the network map database {path}: {exc.strerror}"
            ) from None
        try:
            self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        except sqlite3.Error as exc:
            raise NetworkMapStoreError(f"cannot open the network map database {path}: {exc}") from None
        try:
            # (first, before journal_mode or the schema change the file: a newer build's is left as it is)
            version = self._db.execute("PRAGMA user_version").fetchone()[0]
            if version > MAP_DB_FORMAT:
                self._db.close()
                raise NetworkMapStoreError(
                    f"{path}: network map database format {version} was written by a newer build of "
                    f"corda-trio (this build reads format {MAP_DB_FORMAT} and older); nothing was read or "
                    "changed: run the newer build on it"
                )
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(_SCHEMA)
            if version < MAP_DB_FORMAT:  # (new, or written before the format was recorded: the same tables)
                self._db.execute(f"PRAGMA user_version = {MAP_DB_FORMAT}")
            problem = self._db.execute("PRAGMA quick_check").fetchone()[0]
            if problem != "ok":  # (one line: SQLite's text may be "*** in database main ***\nPage 3: ...")
                lines = [x for x in str(problem).splitlines() if x.strip() and not x.startswith("***")]
                raise sqlite3.DatabaseError("; ".join(lines) or "database disk image is malformed")
            for table, columns in _COLUMNS.items():
                found = [r[1] for r in self._db.execute(f"PRAGMA table_info({table})")]
                if found != columns:
                    raise sqlite3.DatabaseError(f"table {table} has columns {found}, expected {columns}")
        except sqlite3.Error as exc:
            self._db.close()
            raise NetworkMapStoreError(
                f"{path} is not a usable network map database ({exc}); restore it from a backup"
            ) from None

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def put_node_info(self, node: VerifiedNodeInfo) -> PutResult:
        """Store ``node`` unless a NodeInfo with a higher or equal serial exists for its legal name.

        Returns:
            ``added`` (new legal name), ``replaced`` (newer serial), ``unchanged`` (the same bytes again),
            ``stale`` (an older or equal serial with different content: refused), ``denied`` (its key or
            name is on the deny-list) or ``confusable`` (a different, confusable name is in the map or on the
            deny-list: :meth:`confusable_with` names it).
        """
        name = str(node.legal_name)
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                row = self._db.execute(
                    "SELECT hash, serial FROM node_infos WHERE legal_name = ?", (name,)
                ).fetchone()
                denied = self._db.execute(
                    "SELECT 1 FROM denied WHERE identity_key_hash = ? OR legal_name = ?",
                    (node.identity_key_hash, name),
                ).fetchone()
                if denied is not None:
                    result: PutResult = "denied"
                elif row is None and self._confusable_with(node.legal_name) is not None:
                    result = "confusable"
                elif row is not None and row[0] == node.hash:
                    result = "unchanged"
                elif row is not None and row[1] >= node.node_info.serial:
                    result = "stale"
                else:
                    self._db.execute(
                        "INSERT OR REPLACE INTO node_infos (legal_name, hash, serial, signed) "
                        "VALUES (?, ?, ?, ?)",
                        (name, node.hash, node.node_info.serial, node.serialize()),
                    )
                    result = "added" if row is None else "replaced"
                    self._bump_serial()
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return result

    def confusable_with(self, name: pki.CordaX500Name) -> pki.CordaX500Name | None:
        """A different legal name in the map or on the deny-list that ``name`` is confusable with, or None."""
        with self._lock:
            return self._confusable_with(name)

    def _confusable_with(self, name: pki.CordaX500Name) -> pki.CordaX500Name | None:
        rows = self._db.execute("SELECT legal_name FROM node_infos UNION SELECT legal_name FROM denied")
        for (text,) in rows:
            try:
                held = pki.CordaX500Name.parse(text)
            except pki.InvalidNameError:  # (held before a rule it breaks existed: it is no one's look-alike)
                continue
            if name.is_confusable_with(held):
                return held
        return None

    def current_serial(self, legal_name: str) -> int | None:
        with self._lock:
            row = self._db.execute(
                "SELECT serial FROM node_infos WHERE legal_name = ?", (legal_name,)
            ).fetchone()
        return None if row is None else int(row[0])

    def _bump_serial(self) -> None:
        self._db.execute("UPDATE map_serial SET serial = serial + 1 WHERE id = 1")

    def map_serial(self) -> int:
        """How many times the set of nodes changed (the map clients see moves with it)."""
        with self._lock:
            return int(self._db.execute("SELECT serial FROM map_serial WHERE id = 1").fetchone()[0])

    def remove_node(self, legal_name: str) -> bool:
        """Remove a legal name from the map and deny its identity key (an operator action).

        The node stays out, also when it publishes again, until :meth:`readmit_node`.

        Returns:
            Whether the name was in the map.
        """
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                row = self._db.execute(
                    "SELECT signed FROM node_infos WHERE legal_name = ?", (legal_name,)
                ).fetchone()
                if row is not None:
                    key_hash = identity_key_hash(decode_signed_node_info(bytes(row[0])))
                    self._db.execute(
                        "INSERT OR REPLACE INTO denied (identity_key_hash, legal_name) VALUES (?, ?)",
                        (key_hash, legal_name),
                    )
                    self._db.execute("DELETE FROM node_infos WHERE legal_name = ?", (legal_name,))
                    self._bump_serial()
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return row is not None

    def readmit_node(self, legal_name: str) -> bool:
        """Lift the deny-list entries of ``legal_name`` (it may publish again); whether there were any."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                cursor = self._db.execute("DELETE FROM denied WHERE legal_name = ?", (legal_name,))
                if cursor.rowcount:
                    self._bump_serial()
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return cursor.rowcount > 0

    def denied(self) -> list[tuple[str, str]]:
        """The deny-list: ``(legal name, identity key hash)`` pairs, by name."""
        with self._lock:
            rows = self._db.execute(
                "SELECT legal_name, identity_key_hash FROM denied ORDER BY legal_name, identity_key_hash"
            )
            return [(str(r[0]), str(r[1])) for r in rows]

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

    def stored(self) -> list[tuple[str, str, str, bytes]]:
        """Everything the map serves, as stored: ``("node-info", legal name, hash, bytes)`` and
        ``("network-parameters", "", hash, bytes)`` rows (to check them: ``stored_damage``)."""
        with self._lock:
            nodes = self._db.execute("SELECT legal_name, hash, signed FROM node_infos ORDER BY legal_name")
            out = [("node-info", str(n), str(h), bytes(b)) for n, h, b in nodes]
            params = self._db.execute("SELECT hash, signed FROM network_parameters ORDER BY hash")
            out += [("network-parameters", "", str(h), bytes(b)) for h, b in params]
        return out

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
