"""The node side of the network map: a persistent cache of verified NodeInfos and the poller that keeps it
current and tells the bridge manager what changed.

Theory of operation
-------------------
The updater owns ``nodes``: legal name -> :class:`VerifiedNodeInfo`.  Its sources are the map service
(``GET /network-map``, then the NodeInfos whose hashes it does not know yet) and, optionally, a directory of
signed NodeInfo files (``additional-node-infos/``) for networks without a map service.  Every NodeInfo is
verified against the pinned network root before it is believed; one that fails is logged (each distinct
reason for each file or hash once, not at every poll) and ignored, never fatal.  When both sources know a
legal name, the higher serial wins.

Each poll computes the new ``nodes`` and diffs it against the old one by legal name: a new name is
:class:`NodeAdded`, a vanished one :class:`NodeRemoved`, a different hash :class:`NodeChanged` (new addresses,
say).  The new state is written to SQLite in one transaction *before* the events are sent, so after a crash
the cache never claims less than the consumer was told.  :meth:`NetworkMapUpdater.run` first emits
``NodeAdded`` for everything in the persisted cache (so a consumer that starts empty converges), publishes
the node's own NodeInfo (retrying with backoff), then polls every ``max-age`` seconds as the server asks.
Events go into a bounded memory channel: a slow consumer slows polling rather than growing memory.

A node that meets a name it does not know (a flow sends to a node it has not seen, a float forwards a message
from one) calls :meth:`NetworkMapUpdater.poll_soon`: the node may have joined since the last poll, and
waiting for the next one would hold the first flow between two nodes started together for up to ``max-age``.
The early poll comes :data:`EARLY_POLL_SPACING_SECONDS` after the previous poll at the soonest, and the
requests meanwhile are one poll, so a flow retrying its send or a peer sending from unknown names costs the
map one request per spacing at most; the next regular poll is ``max-age`` after the early one. While the
map is failing, requests wait for the backoff's retry. In directory mode the same holds for the directory.

A node stays in the map only while the map holds its NodeInfo, so each poll also checks that the map lists
the node's own current NodeInfo (its hash: the map's list, not the merged view, since a copy in the
node-info directory says nothing about the map).  When it does not (the operator removed the node and then
readmitted it, or the service lost its database), the node publishes again, with the same retry and backoff
as at start. A poll counts for this only if it asked for the map after the last publication got its answer:
one that asked while a publication was in flight says nothing of it (a map back from an outage meets the
retried publication and the retried poll together).  A refusal (400, 403 such as ``removed-by-operator``,
409) is not retried by backoff: the next poll asks again, so a removed node knocks once per poll interval,
and each distinct refusal is logged once, not at every poll.

While the map service cannot be reached (or fails: a 5xx, a timeout, a map that does not verify), polls and
publications are retried with backoff up to a minute, and their failures are logged together as one outage
(:class:`corda_trio.logs.Outage`, as a bridge logs a peer that is away): the first failure in full with its
cause (``publishing our NodeInfo failed (retry in 1 s): ...``, or the poll's), then at most one line a minute
(``network map http://...: still retrying, 129 failed attempts in 3543 s, latest: ...``), and one line when
a poll or publication reaches the map again (``network map http://...: reconnected after 130 failed attempts
/ 3603 s``). They share one outage because they fail for the same reason, the map away; a map that answers
polls but fails publications (a 5xx) ends an outage at each poll and starts one at each failed publication,
so it writes two lines per publication attempt (the failure with its cause, the reconnection), bounded by the
publication backoff (one attempt a minute once it has grown).

With a map service, a NodeInfo in the node-info directory is still believed, and the map cannot take it
away: a node the operator removes from the map stays in this node's view while its file is there. A network
bootstrapped by an older build wrote every node's NodeInfo there even with a map service, so the first poll
of an updater that has a map service warns once when the directory holds NodeInfos of other nodes (naming
the directory and what it means); the node's own copy does not count.
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import sqlite3
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Final, final

import attrs
import trio
from cryptography import x509

from corda_trio import files, logs, pki

from ._client import NetworkMapClient
from ._codec import MAX_PAYLOAD_BYTES
from ._errors import MalformedPayloadError, NetworkMapError, NetworkMapHttpError, PayloadRejectedError
from ._model import NetworkParameters, sha256_hex
from ._signing import (
    VerifiedNodeInfo,
    decode_signed_node_info,
    identity_key_hash,
    verify_network_map,
    verify_network_parameters,
    verify_node_info,
)

__all__ = [
    "EARLY_POLL_SPACING_SECONDS",
    "MapEvent",
    "NetworkMapUpdater",
    "NetworkParametersChanged",
    "NodeAdded",
    "NodeChanged",
    "NodeInfoCache",
    "NodeRemoved",
    "node_info_file_name",
]

log = logging.getLogger("corda_trio.network.cache")

#: The cache file's format (SQLite's ``user_version``; 0 in a file of a build from before it was
#: recorded, whose tables are the same). A newer build's (higher) is moved aside unread, like a damaged one.
CACHE_FORMAT: Final = 1
#: Poll interval when the server sends no ``max-age``, and the longest we ever wait between polls.
DEFAULT_POLL_SECONDS: Final[float] = 30.0
MAX_POLL_SECONDS: Final[float] = 600.0
#: Retry after a failed poll or publish: doubling from 1 s up to 60 s.
RETRY_INITIAL_SECONDS: Final[float] = 1.0
RETRY_MAX_SECONDS: Final[float] = 60.0
#: An early poll (:meth:`NetworkMapUpdater.poll_soon`: the node met a name it does not know) comes this long
#: after the previous poll at the soonest: requests meanwhile are one poll, so neither a flow's retries nor a
#: peer sending from names the map does not hold make a node ask the map more than once in this time.
EARLY_POLL_SPACING_SECONDS: Final[float] = 1.0
#: Files in the node-infos directory are called ``nodeInfo-<HASH>`` (as Corda's are).
NODE_INFO_FILE_PREFIX: Final[str] = "nodeInfo-"
#: The warning about other nodes' NodeInfos in the node-info directory names at most this many of them.
DIRECTORY_NAMES_QUOTED: Final = 3
#: How many distinct "ignoring <NodeInfo>: <why>" lines the updater remembers having logged (each is logged
#: once, not at every poll; past this many the memory is cleared and they may be logged again).
IGNORED_LINES_REMEMBERED: Final = 1024


def node_info_file_name(legal_name: pki.CordaX500Name) -> str:
    """The name of a node's signed NodeInfo file, in its own base directory (written at each start) and in
    its peers' ``additional-node-infos/``: ``nodeInfo-<HASH>``, HASH the SHA-256 of the canonical legal name
    (as Corda names them), so that every version of one node's NodeInfo has the same name and a new copy
    replaces the old one."""
    return NODE_INFO_FILE_PREFIX + sha256_hex(str(legal_name).encode())


@final
@attrs.frozen(kw_only=True)
class NodeAdded:
    """A legal name appeared in the network."""

    node: VerifiedNodeInfo


@final
@attrs.frozen(kw_only=True)
class NodeRemoved:
    """A legal name left the network."""

    node: VerifiedNodeInfo


@final
@attrs.frozen(kw_only=True)
class NodeChanged:
    """A node published a new NodeInfo (new serial; addresses may have changed)."""

    old: VerifiedNodeInfo
    new: VerifiedNodeInfo

    @property
    def addresses_changed(self) -> bool:
        return self.old.node_info.addresses != self.new.node_info.addresses


@final
@attrs.frozen(kw_only=True)
class NetworkParametersChanged:
    """The map advertises parameters other than the ones the node had (``old_hash`` None at first sight)."""

    old_hash: str | None
    new_hash: str
    parameters: NetworkParameters


MapEvent = NodeAdded | NodeRemoved | NodeChanged | NetworkParametersChanged


class NodeInfoCache:
    """SQLite cache of signed NodeInfos by legal name, plus the last accepted network parameters.

    It is a cache: everything in it comes back from the network map and the node-info directory (and is
    verified again when loaded). A damaged file (not a database, or one that fails SQLite's quick check) is
    therefore moved aside, as ``<name>.damaged-<UTC time>`` with its ``-wal`` / ``-shm`` files, with a
    warning, and the cache starts empty.

    Raises:
        OSError: the file is not a regular file (a directory, a named pipe, a device) or cannot be read;
            nothing is moved aside.
        sqlite3.Error: the file cannot be opened for another reason.
    """

    def __init__(self, path: str | Path) -> None:
        self._lock = threading.Lock()
        files.check_regular_file(path, missing_ok=True)  # (SQLite: "disk I/O error" of a pipe or /dev/zero)
        try:
            self._db = _open_cache(path)
        except _NewerCacheError as exc:
            aside = _move_aside(Path(path), "newer")
            log.warning(
                "network map cache %s was written by a newer build of corda-trio (format %d; this build "
                "reads format %d and older): moved aside, unread, to %s; it is rebuilt from the network map "
                "and the node-info directory",
                path,
                exc.args[0],
                CACHE_FORMAT,
                aside,
            )
            self._db = _open_cache(path)
        except _DamagedCacheError as exc:
            aside = _move_aside(Path(path), "damaged")
            log.warning(
                "network map cache %s is damaged (%s): moved aside to %s; it is rebuilt from the network map "
                "and the node-info directory",
                path,
                exc,
                aside,
            )
            self._db = _open_cache(path)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def load(self) -> dict[str, bytes]:
        """legal name -> signed NodeInfo bytes."""
        with self._lock:
            return {r[0]: bytes(r[1]) for r in self._db.execute("SELECT legal_name, signed FROM node_infos")}

    def replace_all(self, nodes: Mapping[str, VerifiedNodeInfo]) -> None:
        """Make the cache hold exactly ``nodes`` (one transaction)."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute("DELETE FROM node_infos")
                self._db.executemany(
                    "INSERT INTO node_infos (legal_name, hash, signed) VALUES (?, ?, ?)",
                    [(name, n.hash, n.serialize()) for name, n in nodes.items()],
                )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def parameters(self) -> tuple[str, bytes] | None:
        with self._lock:
            row = self._db.execute("SELECT hash, signed FROM parameters WHERE id = 1").fetchone()
        return None if row is None else (str(row[0]), bytes(row[1]))

    def set_parameters(self, hash_hex: str, signed: bytes) -> None:
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO parameters (id, hash, signed) VALUES (1, ?, ?)", (hash_hex, signed)
            )


class _DamagedCacheError(Exception):
    """The cache's file is not a database, or a damaged one."""


class _NewerCacheError(Exception):
    """The cache's file is of a newer build's format (``args[0]``)."""


def _open_cache(path: str | Path) -> sqlite3.Connection:
    """Open (or create) the cache database.

    Raises:
        _DamagedCacheError: the file is not a database or fails SQLite's quick check.
        sqlite3.Error: it cannot be opened for another reason.
    """
    db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
    try:
        version = db.execute("PRAGMA user_version").fetchone()[0]  # (first: before anything changes the file)
        if version > CACHE_FORMAT:
            raise _NewerCacheError(version)  # (closed below)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.executescript(
            "CREATE TABLE IF NOT EXISTS node_infos (legal_name TEXT PRIMARY KEY, hash TEXT NOT NULL, "
            "signed BLOB NOT NULL);"
            "CREATE TABLE IF NOT EXISTS parameters (id INTEGER PRIMARY KEY CHECK (id = 1), "
            "hash TEXT NOT NULL, signed BLOB NOT NULL);"
        )
        problems = [str(row[0]) for row in db.execute("PRAGMA quick_check")]
    except sqlite3.DatabaseError as exc:
        db.close()
        if exc.sqlite_errorcode in (sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_CORRUPT):
            raise _DamagedCacheError(str(exc)) from None
        raise
    except BaseException:
        db.close()
        raise
    if problems != ["ok"]:
        db.close()
        raise _DamagedCacheError(f"quick check: {'; '.join(problems[:3])}")
    if version < CACHE_FORMAT:
        db.execute(f"PRAGMA user_version = {CACHE_FORMAT}")
    return db


def _move_aside(path: Path, why: str) -> Path:
    """Rename the database ``path`` (and its write-ahead log files) to ``<name>.<why>-<UTC time>``; returns
    its new name."""
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S%fZ")
    aside = path.with_name(f"{path.name}.{why}-{stamp}")
    for suffix in ("-wal", "-shm"):
        extra = path.with_name(path.name + suffix)
        if extra.exists():
            extra.rename(aside.with_name(aside.name + suffix))
    path.rename(aside)
    return aside


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


@attrs.define(eq=False)
class NetworkMapUpdater:
    """Keeps a node's view of the network current and reports changes as :data:`MapEvent` s.

    Attributes:
        trust_root: the pinned network root.
        cache: the persistent cache.
        events: where events go (bounded channel; the bridge manager reads the other end).
        client: the map service client, or ``None`` for a network without one.
        node_infos_dir: directory of ``nodeInfo-*`` files, or ``None``.
        own_node_info: this node's signed NodeInfo, published by :meth:`run` (``None``: do not publish).
        clock: current UTC time, for certificate validity.
        poll_interval_seconds: interval between polls when the map sends no ``max-age`` (and in directory
            mode).
    """

    trust_root: x509.Certificate
    cache: NodeInfoCache
    events: trio.MemorySendChannel[MapEvent]
    client: NetworkMapClient | None = None
    node_infos_dir: Path | None = None
    own_node_info: bytes | None = None
    clock: Callable[[], dt.datetime] = _utcnow
    poll_interval_seconds: float = DEFAULT_POLL_SECONDS
    _nodes: dict[str, VerifiedNodeInfo] = attrs.field(factory=dict, init=False)
    _parameters_hash: str | None = attrs.field(default=None, init=False)
    #: NodeInfo hashes the map listed at its last successful poll (``None``: not polled yet).
    _map_hashes: frozenset[str] | None = attrs.field(default=None, init=False)
    #: Publications of our NodeInfo that got an answer (taken or refused) ...
    _answered_publications: int = attrs.field(default=0, init=False)
    #: ... and how many had when the request for ``_map_hashes`` was sent.
    _map_asked_after: int = attrs.field(default=0, init=False)
    #: The map's last refusal of our NodeInfo (logged once), ``None`` once it takes it.
    _refusal: str | None = attrs.field(default=None, init=False)
    #: A publication (with its retries) is under way.
    _publishing: bool = attrs.field(default=False, init=False)
    #: The node-info directory was checked for other nodes' NodeInfos (with a map service: once).
    _directory_checked: bool = attrs.field(default=False, init=False)
    #: The "ignoring ..." lines :meth:`_verify` logged (each once; at most IGNORED_LINES_REMEMBERED).
    _ignored_logged: set[str] = attrs.field(factory=set, init=False)
    #: The map service away: the failed polls and publications together (its first failure, then a line a
    #: minute at most, and one when the map answers again).
    _outage: logs.Outage = attrs.field(init=False)
    #: Set by :meth:`poll_soon`; a new one as each poll starts (that poll answers what was asked before it).
    _poll_asked: trio.Event = attrs.field(factory=trio.Event, init=False)

    def __attrs_post_init__(self) -> None:
        url = self.client.base_url if self.client is not None else "(none)"
        self._outage = logs.Outage(log, f"network map {url}")

    def nodes(self) -> dict[str, VerifiedNodeInfo]:
        """Snapshot: canonical legal name -> verified NodeInfo."""
        return dict(self._nodes)

    def poll_soon(self) -> None:
        """Ask :meth:`run` for a poll before the next one is due: the node met a name that is not in its view
        (a recipient, a sender), which may have joined the map since the last poll.

        Cheap, from any task of the updater's trio run: requests are coalesced, and the early poll comes
        :data:`EARLY_POLL_SPACING_SECONDS` after the previous poll at the soonest (the next regular one is
        then the map's ``max-age`` after it). While the map is failing, the backoff stands: the retry is the
        next poll.
        """
        self._poll_asked.set()

    async def load_cache(self) -> list[MapEvent]:
        """Load and re-verify the persisted cache; emits and returns ``NodeAdded`` for each entry."""
        events = await self._load_cache_state()
        for event in events:
            await self.events.send(event)
        return events

    async def _load_cache_state(self) -> list[MapEvent]:
        stored = await trio.to_thread.run_sync(self.cache.load)
        params = await trio.to_thread.run_sync(self.cache.parameters)
        self._parameters_hash = params[0] if params else None
        events: list[MapEvent] = []
        for name, data in sorted(stored.items()):
            node = self._verify(data, f"cached NodeInfo of {name}")
            if node is not None:
                self._nodes[str(node.legal_name)] = node
                events.append(NodeAdded(node=node))
        return events

    async def publish_own(self) -> str:
        """Publish ``own_node_info`` once (raises :class:`NetworkMapHttpError` on failure)."""
        if self.client is None or self.own_node_info is None:
            raise RuntimeError("nothing to publish, or no map service")
        return await self.client.publish(self.own_node_info)

    async def poll_once(self) -> tuple[list[MapEvent], float]:
        """Fetch the current view from every source, persist it, emit and return the events.

        Returns:
            The events and the number of seconds until the next poll (the map's ``max-age``).

        Raises:
            NetworkMapError: the map service failed or sent a map that does not verify. The map's part of the
                view is then left as it was (nothing is removed while the map cannot be asked), but the
                node-info directory is still read and what it adds or changes is persisted and emitted first.
            OSError: the same, for a failure to reach the map service.
        """
        wanted: dict[str, VerifiedNodeInfo] = {}
        events: list[MapEvent] = []
        interval = self.poll_interval_seconds
        failure: NetworkMapError | OSError | None = None
        if self.client is not None:
            try:
                interval = await self._poll_map(wanted, events)
            except (NetworkMapError, OSError) as exc:
                failure = exc
                wanted = dict(self._nodes)
        if self.node_infos_dir is not None:
            from_directory = []
            for name, data in await trio.to_thread.run_sync(self._scan_dir):
                node = self._verify(data, name)
                if node is not None:
                    self._merge(wanted, node)
                    from_directory.append(node)
            self._check_directory(from_directory)
        events.extend(self._diff(wanted))
        if any(not isinstance(e, NetworkParametersChanged) for e in events):
            await trio.to_thread.run_sync(self.cache.replace_all, wanted)
        self._nodes = wanted
        for event in events:
            await self.events.send(event)
        if failure is not None:
            raise failure
        return events, interval

    async def _poll_map(self, wanted: dict[str, VerifiedNodeInfo], events: list[MapEvent]) -> float:
        """The map service's part of :meth:`poll_once`: its nodes go into ``wanted``, a parameters change
        into ``events``; returns the seconds until the next poll."""
        assert self.client is not None
        interval = self.poll_interval_seconds
        asked_after = self._answered_publications
        response = await self.client.fetch_map()
        network_map = verify_network_map(response.signed_map, trust_root=self.trust_root, now=self.clock())
        if response.max_age_seconds is not None:
            interval = min(max(float(response.max_age_seconds), 1.0), MAX_POLL_SECONDS)
        self._map_hashes = frozenset(network_map.node_info_hashes)
        self._map_asked_after = asked_after
        if network_map.network_parameters_hash != self._parameters_hash:
            events.append(await self._fetch_parameters(network_map.network_parameters_hash))
        known = {n.hash: n for n in self._nodes.values()}
        for hash_hex in network_map.node_info_hashes:
            node = known.get(hash_hex)
            if node is None:
                try:
                    data = await self.client.fetch_node_info(hash_hex)
                except NetworkMapHttpError as exc:
                    if exc.status != 404:
                        raise
                    log.info("NodeInfo %s left the map while we polled; skipped", hash_hex)
                    continue
                node = self._verify(data, f"NodeInfo {hash_hex}")
                if node is not None and node.hash != hash_hex:
                    log.warning("map listed %s but the service returned %s; ignored", hash_hex, node.hash)
                    node = None
            if node is not None:
                self._merge(wanted, node)
        return interval

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Load the cache, then publish and poll forever (until cancelled).

        ``nodes()`` holds the cached view when ``nursery.start(updater.run)`` returns; the matching
        ``NodeAdded`` events are sent right after, so the consumer may start reading only then.
        """
        cached = await self._load_cache_state()
        task_status.started()
        for event in cached:
            await self.events.send(event)
        async with trio.open_nursery() as nursery:
            own_hash = None
            if self.client is not None and self.own_node_info is not None:
                own_hash = decode_signed_node_info(self.own_node_info).hash
                try:  # first attempt inline, so the first poll already sees our own NodeInfo
                    await self._publish_once()
                except NetworkMapError as exc:  # (unreachable, or frozen: a request timeout)
                    self._publishing = True
                    nursery.start_soon(functools.partial(self._publish_with_retry, failed=exc))
            retry = RETRY_INITIAL_SECONDS
            just_published = True
            while True:
                self._poll_asked = trio.Event()  # (this poll answers the requests so far)
                early_ok = True
                try:
                    _, interval = await self.poll_once()
                    retry = RETRY_INITIAL_SECONDS
                    self._outage.connected()  # the map answered: an outage of it is over
                    if self._own_missing(own_hash) and not self._publishing and not just_published:
                        self._publishing = True
                        nursery.start_soon(self._publish_with_retry)
                except (NetworkMapError, OSError) as exc:
                    # (an OSError as the system says it and the file: `Too many open files (the limit,
                    # ulimit -n, is 64): <dir>`, not `[Errno 24] Too many open files: '<dir>'`)
                    why = files.os_error_text(exc) if isinstance(exc, OSError) else exc
                    self._outage.failed(
                        logs.failure_text(exc), "network map poll failed (retry in %.0f s): %s", retry, why
                    )
                    interval, retry = retry, min(retry * 2, RETRY_MAX_SECONDS)
                    early_ok = False  # (backing off: an early request waits for the retry)
                just_published = False
                await self._wait_for_next_poll(interval, early_ok=early_ok)

    async def _wait_for_next_poll(self, interval: float, *, early_ok: bool) -> None:
        """Sleep ``interval`` seconds, or, when ``early_ok`` and :meth:`poll_soon` asks, until
        :data:`EARLY_POLL_SPACING_SECONDS` after the poll that just ended (whichever comes first)."""
        polled_at = trio.current_time()
        with trio.move_on_after(interval):
            if not early_ok:
                await trio.sleep_forever()
            await self._poll_asked.wait()
            await trio.sleep_until(polled_at + EARLY_POLL_SPACING_SECONDS)
            log.debug("polling the network map early: a name not in this node's view was met")

    def _own_missing(self, own_hash: str | None) -> bool:
        """The map, at its last poll, did not list our current NodeInfo (which we publish), and that poll
        asked after our last publication got its answer: a listing sent before that says nothing about it.

        (Without the second condition, a poll that asked while a publication was in flight and returned
        after it landed published the same NodeInfo again: ``added``, then ``unchanged`` 50 ms later, each
        time the map came back from an outage.)
        """
        if own_hash is None or self._map_hashes is None or own_hash in self._map_hashes:
            return False
        return self._map_asked_after == self._answered_publications

    async def _publish_once(self) -> None:
        """Publish ``own_node_info`` once and log the outcome.

        A refusal (400, 403, 409: the map will not take this NodeInfo as it stands, such as
        ``removed-by-operator``) is logged the first time it is seen and returns: the next poll that misses
        our NodeInfo asks again.

        Raises:
            NetworkMapHttpError: any other failure (the service unreachable, a 5xx), to be retried.
        """
        try:
            outcome = await self.publish_own()
        except NetworkMapHttpError as exc:
            if exc.status not in (400, 403, 409):
                raise
            self._answered_publications += 1
            self._outage.connected()  # the map answered: an outage of it is over
            if str(exc) != self._refusal:
                log.error("the network map refused our NodeInfo (asking again at each poll): %s", exc)
            self._refusal = str(exc)
            return
        self._answered_publications += 1
        self._outage.connected()  # the map answered: an outage of it is over
        if self._refusal is not None:
            log.info("the network map takes our NodeInfo again (%s)", outcome)
        else:
            log.info("published own NodeInfo: %s", outcome)
        self._refusal = None

    async def _publish_with_retry(self, *, failed: NetworkMapError | None = None) -> None:
        """:meth:`_publish_once` until it succeeds or is refused, backing off; clears ``_publishing``.

        ``failed``: the attempt just made failed so (it is logged and the first retry waits the backoff).
        """
        delay = RETRY_INITIAL_SECONDS
        try:
            while True:
                if failed is not None:
                    self._outage.failed(
                        logs.failure_text(failed),
                        "publishing our NodeInfo failed (retry in %.0f s): %s",
                        delay,
                        failed,
                    )
                    await trio.sleep(delay)
                    delay = min(delay * 2, RETRY_MAX_SECONDS)
                try:
                    await self._publish_once()
                    return
                except NetworkMapError as exc:
                    failed = exc
        finally:
            self._publishing = False

    async def _fetch_parameters(self, hash_hex: str) -> NetworkParametersChanged:
        assert self.client is not None
        data = await self.client.fetch_network_parameters(hash_hex)
        params, actual = verify_network_parameters(data, trust_root=self.trust_root, now=self.clock())
        if actual != hash_hex:
            raise PayloadRejectedError(f"parameters {hash_hex} hash to {actual}", reason="hash-mismatch")
        await trio.to_thread.run_sync(self.cache.set_parameters, hash_hex, data)
        event = NetworkParametersChanged(old_hash=self._parameters_hash, new_hash=hash_hex, parameters=params)
        self._parameters_hash = hash_hex
        return event

    def _verify(self, data: bytes, what: str) -> VerifiedNodeInfo | None:
        try:
            return verify_node_info(data, trust_root=self.trust_root, now=self.clock())
        except (MalformedPayloadError, PayloadRejectedError) as exc:
            line = f"ignoring {what}: {exc}"
            if line not in self._ignored_logged:  # (the same file or map entry fails at every poll)
                if len(self._ignored_logged) >= IGNORED_LINES_REMEMBERED:
                    self._ignored_logged.clear()
                self._ignored_logged.add(line)
                log.warning("%s", line)
            return None

    @staticmethod
    def _merge(into: dict[str, VerifiedNodeInfo], node: VerifiedNodeInfo) -> None:
        name = str(node.legal_name)
        current = into.get(name)
        if current is None or node.node_info.serial > current.node_info.serial:
            into[name] = node

    def _check_directory(self, found: list[VerifiedNodeInfo]) -> None:
        """With a map service, warn once if the node-info directory holds other nodes' NodeInfos (see the
        module docstring): the map cannot take those nodes out of this node's view."""
        if self.client is None or self._directory_checked:
            return
        self._directory_checked = True
        own = None
        if self.own_node_info is not None:
            own = identity_key_hash(decode_signed_node_info(self.own_node_info))
        others = sorted({str(n.legal_name) for n in found if n.identity_key_hash != own})
        if not others:
            return
        named = "; ".join(others[:DIRECTORY_NAMES_QUOTED])
        if len(others) > DIRECTORY_NAMES_QUOTED:
            named += f"; and {len(others) - DIRECTORY_NAMES_QUOTED} more"
        log.warning(
            "%s holds the NodeInfo of %d other node%s (%s): with a network map service, those nodes stay in "
            "this node's view even if the map operator removes them; delete those files to rely on the map "
            "alone",
            self.node_infos_dir, len(others), "" if len(others) == 1 else "s", named,
        )  # fmt: skip

    def _scan_dir(self) -> list[tuple[str, bytes]]:
        assert self.node_infos_dir is not None
        if not self.node_infos_dir.is_dir():
            return []
        found = []
        for path in sorted(self.node_infos_dir.iterdir()):
            if path.name.startswith(NODE_INFO_FILE_PREFIX) and path.is_file():
                try:
                    found.append((str(path), files.read_small_file(path, MAX_PAYLOAD_BYTES)))
                except OSError as exc:
                    log.warning("cannot read %s: %s", path, exc.strerror)
        return found

    def _diff(self, wanted: Mapping[str, VerifiedNodeInfo]) -> list[MapEvent]:
        events: list[MapEvent] = []
        for name in sorted(self._nodes.keys() - wanted.keys()):
            events.append(NodeRemoved(node=self._nodes[name]))
        for name in sorted(wanted):
            old = self._nodes.get(name)
            if old is None:
                events.append(NodeAdded(node=wanted[name]))
            elif old.hash != wanted[name].hash:
                events.append(NodeChanged(old=old, new=wanted[name]))
        return events
