"""The node: one nursery tree that runs everything a ``node.toml`` describes.

Theory of operation
-------------------
:meth:`Node.run` takes the base directory's lock (a second node on the same directory is refused), reads the
keys, certificates and network parameters, opens the store and recovers every part of it (the durable queues,
then the keyed logs: the flow checkpoints), and then starts, in one nursery and in this order:

1. the messaging service (inbox dispatcher, deduplicator) over the broker's durable queues;
2. the inbound acceptor (AMQP 1.0 over mutual TLS, peers may only send to our inbox) or, with ``[float]``,
   the float tunnel instead (no listener of our own: peers reach us through the active float);
3. the bridge manager (one bridge per outbound queue whose peer is in the map);
4. the network map updater (publishes our freshly signed NodeInfo, which is also written to
   ``<base>/nodeInfo-<HASH>`` for the operator to copy to peers without a map service; polls the map or
   the ``additional-node-infos`` directory) and the task that turns its events into the
   :class:`~corda_trio.messaging.PeerDirectory` the messaging service and the bridges read;
5. the flow manager (which resumes checkpointed flows), when the flow framework is installed;
6. the RPC server and the ``/metrics`` endpoint.

A damaged store (a corrupt record, a manifest deleted) thus refuses the start before anything
network-facing runs or any file but the lock and the log is written: no NodeInfo signed, no map cache
opened, nothing published, no port bound. ``corda-trio node start`` says so in one line naming the file
(``cannot start, the store is damaged: ...``, exit 1), not as a fatal error of a node that ran.

Then it reports :class:`NodeAddresses` through ``task_status`` (the CLI prints the ready line) and waits.
:meth:`Node.request_stop` (SIGTERM, Ctrl-C) stops it gracefully: the node drains (no new RPC connections, no
new flows from RPC or peers), waits up to ``shutdown.timeout_seconds`` for running flows to finish or reach
a checkpoint, then cancels the tree. Cancellation is safe at any checkpoint (bridges ack only what the peer
accepted, the inbox is acked only after a handler's effects are durable), so stopping "at once" (a second
Ctrl-C, or the timeout) loses nothing either: leaving :func:`store.open_broker` finishes pending group commits
and closes the files (waiting at most ``[shutdown] timeout_seconds``, at least
:data:`MIN_STORE_CLOSE_SECONDS`, for the commit helper: a frozen one is killed, and :meth:`run` raises the
store's error saying so). A fatal store error (a failed write or fsync) ends :meth:`run` with that error.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import enum
import fcntl
import functools
import importlib
import json
import logging
import logging.handlers
import os
import socket
import sqlite3
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final, TextIO, final

import attrs
import trio
from cryptography.hazmat.primitives import serialization

from corda_trio import __version__, bridge, dns, logs, messaging, network, pki, rpc, store, transport
from corda_trio.bridge import float as float_
from corda_trio.files import open_for_appending, read_small_file, write_file_atomically

from ._certificates import (
    OwnCertificate,
    check_own_certificates,
    expiry_warning,
    own_certificates,
    watch_expiry,
)
from ._config import BridgeMode, ConfigError, LogFormat, NodeConfig
from ._descriptors import ListenerCaps, open_descriptors, plan_descriptors
from ._metrics import NodeMetrics, serve_metrics

__all__ = [
    "LOCK_FILE_NAME",
    "Node",
    "NodeAddresses",
    "NodeAlreadyRunningError",
    "NodeStartError",
    "configure_logging",
]

log = logging.getLogger("corda_trio.node")

#: The base directory's lock file (holds the pid of the node that runs there).
LOCK_FILE_NAME: Final[str] = "node.lock"
#: Written once the node is ready: its addresses as JSON (for tools and tests); removed on a clean stop.
RUNTIME_FILE_NAME: Final[str] = "node.json"
#: Written when the node first opens its store: the store's path (relative to the base directory when inside
#: it: a node directory moved or copied whole keeps it true), as JSON. From then on a store that is
#: missing (or empty), or a ``[store] directory`` that names another place, stops the node at start with one
#: line, instead of a start with an empty store that silently leaves the flows, messages and dedup ids
#: of the old one behind. Deleting the file is how an operator says a new, empty store is meant. It also says
#: (``"part_list": true``) that the store keeps its list of parts (``parts.json``, see ``corda_trio.store``):
#: from then on the store may not open without it, so that deleting it with some of the parts hides nothing.
STORE_RECORD_NAME: Final[str] = "store.json"
#: Poll interval in directory mode (no map service) and the upper bound of a map's max-age we honour.
DIRECTORY_POLL_SECONDS: Final[float] = 2.0
#: How long one ``[flows] modules`` entry may take to import (a module defines flows in milliseconds; one
#: that takes longer waits for something at import, and would hold the start for ever).
FLOW_MODULE_IMPORT_SECONDS: Final[float] = 20.0
#: The close reason (code 1001) of the RPC connections of a node that stops; a fatal error adds why
#: (``node stopping: the store failed: ...``).
RPC_STOPPING_REASON: Final[str] = "node stopping"
#: What the error line says when one of the node's own certificates expires while it runs.
OWN_EXPIRED_TEXT: Final[str] = (
    "peers refuse this node's connections until it is renewed and the node restarted"
)
#: Closing the store waits ``[shutdown] timeout_seconds``, but at least this long, for its commit helper
#: process to confirm the pending group commits; a helper frozen longer is killed (``BrokerConfig``).
MIN_STORE_CLOSE_SECONDS: Final[float] = 1.0


class NodeStartError(Exception):
    """The node cannot start (missing keys, unreadable parameters, port in use, ...); the message says why."""


class NodeAlreadyRunningError(NodeStartError):
    """Another node process holds the base directory."""


@final
@attrs.frozen(kw_only=True)
class NodeAddresses:
    """Where a running node can be reached (ports as actually bound)."""

    legal_name: str
    p2p: str
    rpc: str
    metrics: str | None
    key_hash: str
    #: External bridge mode: the local endpoint the bridge process connects to.
    bridge_endpoint: str | None = None

    def ready_line(self) -> str:
        metrics = f"  metrics {self.metrics}" if self.metrics else ""
        endpoint = f"  bridge endpoint {self.bridge_endpoint}" if self.bridge_endpoint else ""
        return f"node ready: {self.legal_name}  p2p {self.p2p}  rpc {self.rpc}{metrics}{endpoint}"


def _lock_base_directory(base: Path) -> int:
    base.mkdir(parents=True, exist_ok=True)
    fd = os.open(base / LOCK_FILE_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    _flock(fd, base)
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def _check_base_directory_free(base: Path) -> None:
    """Raise :class:`NodeAlreadyRunningError` if a node holds the base directory's lock (creating nothing:
    without a lock file, no node runs there)."""
    try:
        fd = os.open(base / LOCK_FILE_NAME, os.O_RDWR | os.O_CLOEXEC)
    except OSError:  # (none there; one that cannot be opened is reported by the lock itself)
        return
    _flock(fd, base)  # (closes it when refused)
    os.close(fd)  # (lets go of the lock)


def _flock(fd: int, base: Path) -> None:
    """Lock the base directory's lock file ``fd``, or close it and raise :class:`NodeAlreadyRunningError`."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
        finally:
            os.close(fd)
        raise NodeAlreadyRunningError(
            f"another node (pid {holder}) is running in base directory {base}; stop it first"
        ) from None


@attrs.define(eq=False)
class _Material:
    """What the node reads from disk before it starts anything."""

    server_context: Any
    client_context: Any
    trust_root: Any
    key_hash: str
    identity_chain: list[Any]
    identity_key: Any
    parameters: network.NetworkParameters
    parameters_hash: str
    #: ``[bridge] password_*`` (external mode) and ``proxy_password_*``, read with the rest: an unset one
    #: refuses the start before anything is written.
    bridge_password: str | None
    proxy_password: str | None
    #: the node's own certificates (TLS and identity chains, trust root), each once
    certificates: tuple[OwnCertificate, ...] = ()


def _import_flow_modules(config: NodeConfig) -> None:
    """Import ``[flows] modules``, so that the flows they register can be started and answer peers (and
    their checkpoints resume) from the start on. Importing one already imported does nothing.

    Raises:
        NodeStartError: a module cannot be imported (not found, or it raised while being imported).
    """
    for name in config.flows_modules:
        outcome: list[BaseException | None] = []

        def load(name: str = name, outcome: list[BaseException | None] = outcome) -> None:
            try:
                with contextlib.redirect_stdout(sys.stderr):  # stdout carries the ready line only
                    importlib.import_module(name)
            except BaseException as exc:  # (whatever the module's own code raises: one line, nothing started)
                outcome.append(exc)
            else:
                outcome.append(None)

        # A module that waits for something at import (a socket, a lock, input) would hold the start for
        # ever: it is imported on a thread of its own, given a bound, and left behind if it takes longer.
        importer = threading.Thread(target=load, name=f"import {name}", daemon=True)
        importer.start()
        importer.join(FLOW_MODULE_IMPORT_SECONDS)
        if not outcome:
            raise NodeStartError(
                f"flows.modules: importing {name!r} did not end within {FLOW_MODULE_IMPORT_SECONDS:g} s (its "
                "top-level code waits for something)"
            )
        if (exc := outcome[0]) is not None:
            raise NodeStartError(
                f"flows.modules: cannot import {name!r}: {type(exc).__name__}: {exc}"
            ) from None


def _load_material(config: NodeConfig) -> _Material:
    try:
        passphrase = config.key_passphrase.read()
        bridge_password = None
        if config.bridge_mode is BridgeMode.EXTERNAL and config.bridge_password is not None:
            bridge_password = config.bridge_password.read_text()  # (what the local endpoint asks for)
        proxy_password = (
            config.bridge_proxy_password.read_text() if config.bridge_proxy_password is not None else None
        )
        root = pki.read_certificate(config.trust_root)
        tls_key = pki.read_private_key(config.tls_key, passphrase)
        tls_chain = pki.read_certificates(config.tls_cert_chain)
        # (said here, naming both files: OpenSSL's refusal below names the temporary copies it loads)
        pki.check_key_pair(tls_chain[0], tls_key, cert_path=config.tls_cert_chain, key_path=config.tls_key)
        tls = {"cert_chain": tls_chain, "key": tls_key, "trust_root": root}
        server_context = pki.server_ssl_context(**tls)  # type: ignore[arg-type]
        client_context = pki.client_ssl_context(**tls)  # type: ignore[arg-type]
        identity_chain = pki.read_certificates(config.identity_cert_chain)
        identity_key = pki.read_private_key(config.identity_key, passphrase)
    except (ConfigError, pki.KeyStoreError) as exc:
        raise NodeStartError(str(exc)) from None
    certificates = own_certificates(
        [
            (config.tls_cert_chain, tls_chain),
            (config.identity_cert_chain, identity_chain),
            (config.trust_root, [root]),
        ]
    )
    try:
        check_own_certificates(certificates, now=dt.datetime.now(dt.UTC))
    except pki.CertificateValidationError as exc:
        raise NodeStartError(str(exc)) from None
    try:
        pki.check_key_pair(
            identity_chain[0],
            identity_key,
            cert_path=config.identity_cert_chain,
            key_path=config.identity_key,
        )
    except pki.KeyStoreError as exc:
        raise NodeStartError(str(exc)) from None
    if pki.CordaX500Name.from_x509_name(identity_chain[0].subject) != config.legal_name:
        raise NodeStartError(
            f"the identity certificate {config.identity_cert_chain} is not for {config.legal_name}"
        )
    try:
        raw = read_small_file(config.network_parameters, network.MAX_PAYLOAD_BYTES)
    except OSError as exc:
        raise NodeStartError(
            f"cannot read network parameters {config.network_parameters}: {exc.strerror}"
        ) from None
    try:
        params, params_hash = network.verify_network_parameters(
            raw, trust_root=root, now=dt.datetime.now(dt.UTC)
        )
    except network.NetworkMapError as exc:
        raise NodeStartError(f"network parameters {config.network_parameters} do not verify: {exc}") from None
    # (what our NodeInfo will carry and what peers will check of our TLS certificate, with the file each
    # came from: a chain file that lost its last certificate is read as the ones before it)
    for what, path, chain, role in (
        ("identity", config.identity_cert_chain, identity_chain, pki.CertRole.LEGAL_IDENTITY),
        ("TLS", config.tls_cert_chain, tls_chain, pki.CertRole.TLS),
    ):
        try:
            pki.validate_cert_path(chain, trust_root=root, now=dt.datetime.now(dt.UTC), leaf_role=role)
        except pki.CertificateValidationError as exc:
            raise NodeStartError(
                f"the {what} certificate chain {path} does not chain to the network root "
                f"{config.trust_root}: {exc}"
            ) from None
    return _Material(
        server_context=server_context,
        client_context=client_context,
        trust_root=root,
        key_hash=pki.key_hash(identity_chain[0].public_key()),
        identity_chain=identity_chain,
        identity_key=identity_key,
        parameters=params,
        parameters_hash=params_hash,
        bridge_password=bridge_password,
        proxy_password=proxy_password,
        certificates=certificates,
    )


@attrs.define(eq=False)
class Node:
    """See the module docstring: ``trio.run(Node(config).run)``."""

    config: NodeConfig
    version: str = __version__
    #: Filled in while running (read by the metrics collector and the RPC handlers).
    broker: store.Broker | None = None
    service: messaging.MessagingService | None = None
    #: What stores the messages peers send: the P2P acceptor, or with an external bridge the one behind the
    #: local endpoint (what the bridge process forwards).
    acceptor: bridge.InboundAcceptor | None = None
    #: Behind floats (``[float]``): the tunnel that activates one of them, instead of the acceptor.
    float_tunnel: float_.FloatTunnel | None = None
    bridges: bridge.BridgeManager | None = None
    updater: network.NetworkMapUpdater | None = None
    rpc_server: rpc.RpcServer | None = None
    metrics: NodeMetrics | None = None
    #: the listeners' connection caps, planned for the open-file limit at start (``._descriptors``)
    caps: ListenerCaps | None = None
    addresses: NodeAddresses | None = None
    peers: messaging.PeerDirectory = attrs.field(factory=messaging.PeerDirectory)
    draining: bool = False
    #: Each peer's legal name by identity key hash, as the network map first named it since the start, kept
    #: when the peer leaves the map: the ``peer`` label of its /metrics series (see :meth:`peer_links`).
    _peer_names: dict[str, str] = attrs.field(factory=dict)
    _material: _Material | None = None
    _started: float = attrs.field(factory=time.monotonic)
    _stop: trio.Event = attrs.field(factory=trio.Event)
    _rpc_scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    #: the network map updater's: cancelled when the node starts to stop (a map that cannot be reached
    #: is no news while the node drains; the peers it knows stay known)
    _map_scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    _flow_host: Any = None

    # --- lifecycle ---------------------------------------------------------------------------------

    def own_certificates(self) -> tuple[OwnCertificate, ...]:
        """The node's own certificates (empty until its keys are read)."""
        return () if self._material is None else self._material.certificates

    def request_stop(self) -> None:
        """Ask :meth:`run` to stop gracefully (idempotent; safe from any task)."""
        self._stop.set()

    def check_start(self) -> None:
        """Read what a start needs before it writes anything (the ``[flows] modules``, the passphrase, keys,
        certificates, network parameters, the store record and the store's parts) and whether its listening
        ports are free, so that a start refused for one of them creates nothing on disk: no base directory,
        lock file, log or store (a port taken between this check and the start is still refused, after
        them). Call it before :func:`configure_logging` (which creates the log file); :meth:`run` then uses
        what it read (without it, :meth:`run` reads them itself).

        Raises:
            NodeStartError: one of them is missing or unusable (the message names it).
            store.MissingPartError / store.PartListError: the store lost a part it had created, or its list.
            store.NewerFormatError: a newer build wrote the store.
        """
        _check_base_directory_free(self.config.base_directory)
        _import_flow_modules(self.config)
        self._material = _load_material(self.config)
        recorded = _check_store_record(self.config)
        if recorded is not _Recorded.NOTHING:  # (the store is there: its parts must be too; and its formats)
            store.check_parts(
                str(self.config.store_directory), require_part_list=recorded is _Recorded.STORE_WITH_PARTS
            )
        elif self.config.store_directory.is_dir():  # (an older build's store: no record; a newer one's?)
            store.check_store_format(str(self.config.store_directory))
        for what, host, port in _listeners(self.config):
            if port != 0:  # (a port of its own choosing cannot be taken)
                try:
                    _probe_listen(host, port)
                except OSError as exc:
                    raise NodeStartError(f"{_listen_text(what, host, port)}: {exc.strerror or exc}") from None

    async def run(self, *, task_status: trio.TaskStatus[NodeAddresses] = trio.TASK_STATUS_IGNORED) -> None:
        """Run until :meth:`request_stop` (then drain and return) or cancellation (stop at once).

        Raises:
            NodeAlreadyRunningError: another node runs on the base directory.
            NodeStartError: keys, certificates, parameters or ports are not usable.
            store.StoreError: the store cannot be opened, or failed while running (fatal).
        """
        cfg = self.config
        dns.use_own_dns_threads()  # a DNS server that never answers cannot take the store's threads
        lock_fd = _lock_base_directory(cfg.base_directory)
        runtime_file = cfg.base_directory / RUNTIME_FILE_NAME
        try:
            material = self._material
            if material is None:  # (check_start was not called: read it now)
                _import_flow_modules(cfg)
                self._material = material = await trio.to_thread.run_sync(_load_material, cfg)
            recorded = _check_store_record(cfg)
            broker_config = store.BrokerConfig(
                commit_process=cfg.store_commit_process,
                require_part_list=recorded is _Recorded.STORE_WITH_PARTS,
                close_timeout_seconds=max(cfg.shutdown_timeout_seconds, MIN_STORE_CLOSE_SECONDS),
            )
            try:
                cfg.store_directory.mkdir(parents=True, exist_ok=True)
            except FileExistsError:
                raise NodeStartError(
                    f"the store directory {cfg.store_directory} exists and is not a directory"
                ) from None
            async with store.open_broker(cfg.store_directory, config=broker_config) as broker:
                self.broker = broker
                # The keyed logs (flow checkpoints) are recovered now, as the queues were: a damaged one
                # refuses the start before anything is written or anyone hears of the node.
                await broker.open_keyed_logs()
                if recorded is not _Recorded.STORE_WITH_PARTS:  # (the store has its part list now)
                    _write_store_record(cfg)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._watch_store, broker)
                    if (
                        warning := expiry_warning(material.certificates, now=dt.datetime.now(dt.UTC))
                    ) is not None:
                        log.warning(warning)
                    nursery.start_soon(
                        functools.partial(watch_expiry, material.certificates, consequence=OWN_EXPIRED_TEXT)
                    )
                    addresses = await self._start(nursery, broker, material)
                    self.addresses = addresses
                    runtime_file.write_text(json.dumps(attrs.asdict(addresses)) + "\n")
                    log.info(addresses.ready_line())
                    task_status.started(addresses)
                    await self._stop.wait()
                    await self._shutdown(nursery)
                log.info("tasks stopped; closing the store")
            runtime_file.unlink(missing_ok=True)
            log.info("node stopped cleanly")
        finally:
            os.close(lock_fd)

    async def _watch_store(self, broker: store.Broker) -> None:
        """A store that can no longer write stops the node at once (everything acknowledged is on disk;
        a restart recovers it): the error ends :meth:`run`."""
        failure = await broker.wait_failed()
        # stderr gets the command's own last line (``corda-trio node start``), the log file this one
        log.critical("fatal store error, the node stops: %s", failure, extra={logs.FILE_ONLY: True})
        if self.rpc_server is not None:  # RPC clients are told why (the close reason of their connection)
            self.rpc_server.going_away_reason = f"{RPC_STOPPING_REASON}: the store failed: {failure}"
        raise failure

    async def _start(self, nursery: trio.Nursery, broker: store.Broker, material: _Material) -> NodeAddresses:
        cfg = self.config
        max_size = material.parameters.max_message_size
        service = await messaging.MessagingService.open(
            broker,
            messaging.MessagingConfig(
                legal_name=cfg.legal_name,
                key_hash=material.key_hash,
                max_message_size=max_size,
                fsync=cfg.store_fsync,
                platform_version=network.PLATFORM_VERSION,
                release_version=self.version,
            ),
            self.peers,
        )
        self.service = service
        # (before anything listens: the caps fit the open-file limit, see ._descriptors)
        self.caps = caps = plan_descriptors(
            p2p=cfg.bridge_mode is not BridgeMode.EXTERNAL and cfg.floats is None,
            metrics=cfg.metrics_address is not None,
            bridge_endpoint=cfg.bridge_mode is BridgeMode.EXTERNAL,
            in_use=open_descriptors(),
        )
        assert caps.rpc is not None  # (a node always serves RPC)
        if caps.warning is not None:
            log.warning(caps.warning)
        bridge_endpoint = None
        if cfg.bridge_mode is BridgeMode.EXTERNAL:
            bridge_endpoint = await self._start_endpoint(nursery, service, max_size)
        else:
            await self._start_bridges(nursery, service, material, max_size)
        await self._start_network_map(nursery, material)
        await self._start_flows(nursery, service)
        await nursery.start(service.run)
        self.rpc_server = rpc.RpcServer(
            handlers=self._flow_host.rpc_handlers() if self._flow_host is not None else {},
            immediate=self._rpc_immediate_handlers(),
            users=rpc.UserDatabase.of(cfg.rpc_users),
            host=cfg.rpc_address.host,
            port=cfg.rpc_address.port,
            max_connections=caps.rpc,
            max_refusing=caps.rpc_refusing,
            going_away_reason=RPC_STOPPING_REASON,
        )
        try:
            rpc_port = await nursery.start(self._run_rpc)
        except (OSError, ExceptionGroup) as exc:
            rpc_at = cfg.rpc_address
            raise _listen_error(exc, _listen_text("rpc", rpc_at.host, rpc_at.port)) from None
        metrics_at = None
        self.metrics = NodeMetrics.create(self)
        if cfg.metrics_address is not None:
            host, port = cfg.metrics_address
            try:
                metrics_port = await nursery.start(
                    functools.partial(
                        serve_metrics, max_connections=caps.metrics, max_refusing=caps.metrics_refusing
                    ),
                    self.metrics.exposition,
                    host,
                    port,
                )
            except (OSError, ExceptionGroup) as exc:
                raise _listen_error(exc, _listen_text("metrics", host, port)) from None
            metrics_at = f"http://{network.host_port_text(host, metrics_port)}/metrics"
        return NodeAddresses(
            legal_name=str(cfg.legal_name),
            p2p=str(cfg.p2p_address),
            rpc=f"ws://{network.host_port_text(cfg.rpc_address.host, rpc_port)}",
            metrics=metrics_at,
            key_hash=material.key_hash,
            bridge_endpoint=bridge_endpoint,
        )

    async def _start_bridges(
        self, nursery: trio.Nursery, service: messaging.MessagingService, material: _Material, max_size: int
    ) -> None:
        """In-process bridge mode: the inbound acceptor (or the float tunnel) and the bridge manager."""
        cfg = self.config
        if cfg.floats is not None:
            await self._start_float_tunnel(nursery, service, max_size)
        else:
            await self._start_acceptor(nursery, service, material, max_size)
        self.bridges = bridge.BridgeManager(
            messaging=service,
            resolver=self.peers,
            ssl_context=material.client_context,
            config=bridge.BridgeConfig(
                proxy=self._bridge_proxy(), idle_timeout_seconds=self.config.p2p_idle_timeout_seconds
            ),
        )
        await nursery.start(self.bridges.run)

    def _bridge_proxy(self) -> transport.SocksProxy | None:
        """``bridge.proxy`` with its password read (``None``: dial peers directly)."""
        cfg = self.config
        assert self._material is not None
        if cfg.bridge_proxy is None or self._material.proxy_password is None:
            return cfg.bridge_proxy
        return attrs.evolve(cfg.bridge_proxy, password=self._material.proxy_password)

    async def _start_float_tunnel(
        self, nursery: trio.Nursery, service: messaging.MessagingService, max_size: int
    ) -> None:
        """Behind floats: no listener of our own; the tunnel activates a float and stores what it forwards."""
        floats = self.config.floats
        assert floats is not None
        try:
            creds = float_.TunnelCredentials.read(floats.tunnel_cert, floats.tunnel_key, floats.tunnel_ca)
            role = creds.role
        except (pki.KeyStoreError, pki.PeerIdentityError) as exc:
            raise NodeStartError(f"float tunnel certificates: {exc}") from None
        if role != "bridge":
            raise NodeStartError(f"{floats.tunnel_cert} is a {role!r} tunnel certificate, not a bridge's")
        self.float_tunnel = float_.FloatTunnel(
            inbox=service.inbox,
            tunnel_context=creds.client_context(),
            config=float_.TunnelConfig(
                floats=[(a.host, a.port) for a in floats.control],
                tls_ref=floats.tls_ref,
                max_message_size=max_size,
                idle_timeout_seconds=floats.idle_timeout_seconds,
                handshake_timeout_seconds=floats.handshake_timeout_seconds,
            ),
            resolver=self.peers,
            on_checked=service.remember_received,
        )
        await nursery.start(self.float_tunnel.run)

    async def _start_acceptor(
        self, nursery: trio.Nursery, service: messaging.MessagingService, material: _Material, max_size: int
    ) -> None:
        cfg = self.config
        acceptor = bridge.InboundAcceptor(
            inbox=service.inbox,
            ssl_context=material.server_context,
            config=bridge.AcceptorConfig(
                host=cfg.p2p_listen.host,
                port=cfg.p2p_listen.port,
                max_message_size=max_size,
                idle_timeout_seconds=cfg.p2p_idle_timeout_seconds,
                max_connections=self.caps.p2p or transport.DEFAULT_MAX_CONNECTIONS,
            ),
            on_checked=service.remember_received,
        )
        self.acceptor = acceptor
        try:
            await nursery.start(acceptor.run)
        except (OSError, ExceptionGroup) as exc:
            raise _listen_error(exc, _listen_text("p2p", cfg.p2p_listen.host, cfg.p2p_listen.port)) from None

    async def _start_endpoint(
        self, nursery: trio.Nursery, service: messaging.MessagingService, max_size: int
    ) -> str:
        """External bridge mode: serve the local endpoint a ``corda-trio bridge start`` process uses."""
        cfg = self.config
        assert self._material is not None and self._material.bridge_password is not None
        password = self._material.bridge_password
        host, port = cfg.bridge_endpoint
        endpoint = bridge.LocalEndpoint(
            messaging=service,
            resolver=self.peers,
            config=bridge.EndpointConfig(
                username=cfg.bridge_username,
                password=password,
                host=host,
                port=port,
                max_message_size=max_size,
                idle_timeout_seconds=cfg.p2p_idle_timeout_seconds,
                max_connections=self.caps.bridge_endpoint or transport.DEFAULT_MAX_CONNECTIONS,
            ),
        )
        try:
            bound = await nursery.start(endpoint.run)
        except (OSError, ExceptionGroup) as exc:
            raise _listen_error(exc, _listen_text("bridge", host, port)) from None
        self.acceptor = endpoint.inbound  # (its counts are what the bridge process forwarded from peers)
        return network.host_port_text(host, bound)

    async def _run_rpc(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        assert self.rpc_server is not None
        with self._rpc_scope:  # cancelled first when the node stops: no new RPC
            await self.rpc_server.run(task_status=task_status)

    async def _start_network_map(self, nursery: trio.Nursery, material: _Material) -> None:
        cfg = self.config
        cfg.node_info_cache.parent.mkdir(parents=True, exist_ok=True)
        try:
            cache = network.NodeInfoCache(cfg.node_info_cache)
        except (sqlite3.Error, OSError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            raise NodeStartError(f"cannot open the network map cache {cfg.node_info_cache}: {why}") from None
        try:
            own_info = await trio.to_thread.run_sync(_write_own_node_info, cfg, material, cache)
        except BaseException:
            cache.close()
            raise
        send, receive = trio.open_memory_channel[network.MapEvent](256)
        self.updater = network.NetworkMapUpdater(
            trust_root=material.trust_root,
            cache=cache,
            events=send,
            client=network.NetworkMapClient(cfg.network_map_url) if cfg.network_map_url else None,
            node_infos_dir=cfg.additional_node_infos,
            own_node_info=own_info,
            poll_interval_seconds=DIRECTORY_POLL_SECONDS,
        )
        # a recipient or a sender not in the map: it may have joined since the last poll; ask the map now
        self.peers.on_unknown = self.updater.poll_soon
        nursery.start_soon(self._follow_map, receive)
        await nursery.start(self._run_updater, cache)

    async def _run_updater(
        self, cache: network.NodeInfoCache, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """The updater, which alone writes the cache: the cache is closed once it has stopped (the updater's
        last write may still run on a worker thread when its nursery is cancelled: the node failing to
        start, or stopping)."""
        assert self.updater is not None
        try:
            with self._map_scope:
                await self.updater.run(task_status=task_status)
        finally:
            cache.close()

    async def _follow_map(self, events: trio.MemoryReceiveChannel[network.MapEvent]) -> None:
        assert self._material is not None
        own = self._material.key_hash
        async for event in events:
            if isinstance(event, network.NodeAdded | network.NodeChanged):
                info = event.node if isinstance(event, network.NodeAdded) else event.new
                if info.identity_key_hash == own:
                    continue
                self._peer_names.setdefault(info.identity_key_hash, str(info.legal_name))
                self.peers.put(
                    messaging.Peer(
                        legal_name=info.legal_name,
                        key_hash=info.identity_key_hash,
                        addresses=[(a.host, a.port) for a in info.node_info.addresses],
                    )
                )
                addresses = ", ".join(str(a) for a in info.node_info.addresses)  # (HOST:PORT, as dialled)
                log.info("network map: %s at %s", info.legal_name, addresses)
            elif isinstance(event, network.NodeRemoved):
                self.peers.remove(event.node.identity_key_hash)
                log.info("network map: %s left", event.node.legal_name)
            elif isinstance(event, network.NetworkParametersChanged):
                if event.new_hash != self._material.parameters_hash:
                    log.warning(
                        "the network map advertises network parameters %s; this node runs with %s "
                        "(restart the node with the new parameters file to adopt them)",
                        event.new_hash, self._material.parameters_hash,
                    )  # fmt: skip

    async def _start_flows(self, nursery: trio.Nursery, service: messaging.MessagingService) -> None:
        """Start the flow manager (resuming checkpoints) if the flow framework is available."""
        from . import _flows

        self._flow_host = await _flows.start_flow_host(self, nursery, service)

    async def _shutdown(self, nursery: trio.Nursery) -> None:
        timeout = self.config.shutdown_timeout_seconds
        log.info("stopping: draining (up to %.0f s for running flows)", timeout)
        self.draining = True
        self._rpc_scope.cancel()
        self._map_scope.cancel()
        with trio.move_on_after(timeout) as scope:
            if self._flow_host is not None:
                await self._flow_host.drain()
        if scope.cancelled_caught:
            log.warning("flows still running after %.0f s: they resume from their checkpoints", timeout)
        else:
            log.info("no flow is running")
        nursery.cancel_scope.cancel()

    # --- views for RPC and metrics ----------------------------------------------------------------

    def uptime_seconds(self) -> float:
        return time.monotonic() - self._started

    def network_nodes(self) -> dict[str, network.VerifiedNodeInfo]:
        return self.updater.nodes() if self.updater is not None else {}

    def peer_links(self) -> Iterator[tuple[str, store.QueueStatistics | None, bridge.Bridge | None, int]]:
        """Per outbound queue: the peer's legal name, the queue's statistics, its bridge and bridge restarts.

        The name is the one the network map gave the peer (:attr:`_peer_names`), so a peer's series keep one
        label while it is away from the map; a queue whose peer the map has not named since the start (one
        left from before a restart, for a node gone from the map) is left out: its depth is on its queue's
        series. A message can only be sent once the bridge has the peer's NodeInfo, which names it."""
        if self.service is None:
            return
        running = self.bridges.bridges() if self.bridges is not None else {}
        for name, queue in sorted(self.service.outbound_queues().items()):
            label = self._peer_names.get(messaging.key_hash_of_address(name))
            if label is None:
                continue
            restarts = self.bridges.restarts(name) if self.bridges is not None else 0
            yield label, queue.statistics(), running.get(name), restarts

    def flow_statistics(self) -> dict[str, int] | None:
        return self._flow_host.statistics() if self._flow_host is not None else None

    def info(self) -> dict[str, Any]:
        assert self.addresses is not None and self._material is not None
        params = self._material.parameters
        return {
            "legal_name": self.addresses.legal_name,
            "key_hash": self.addresses.key_hash,
            "p2p_address": self.addresses.p2p,
            "rpc_address": self.addresses.rpc,
            "metrics_address": self.addresses.metrics,
            "version": self.version,
            "platform_version": network.PLATFORM_VERSION,
            "pid": os.getpid(),
            "uptime_seconds": round(self.uptime_seconds(), 3),
            "draining": self.draining,
            "network_map": self.config.network_map_url or "directory",
            "network_nodes": len(self.network_nodes()),
            "network_parameters_hash": self._material.parameters_hash,
            "max_message_size": params.max_message_size,
            "flows": sorted(self._flow_host.registered()) if self._flow_host is not None else [],
            "base_directory": str(self.config.base_directory),
        }

    # --- RPC ------------------------------------------------------------------------------------------

    def _rpc_immediate_handlers(self) -> dict[str, rpc.ImmediateHandler]:
        """The calls answered from memory (see :class:`rpc.RpcServer`): each a plain function."""
        handlers: dict[str, rpc.ImmediateHandler] = {
            "ping": self._rpc_ping,
            "whoami": self._rpc_whoami,
            "node_info": self._rpc_node_info,
            "network_map": self._rpc_network_map,
            "queue_statistics": self._rpc_queue_statistics,
            "drain": self._rpc_drain,
            "undrain": self._rpc_undrain,
        }
        if self._flow_host is not None:
            handlers.update(self._flow_host.rpc_immediate_handlers())
        return handlers

    def _rpc_ping(self, call: rpc.Call) -> Any:
        return call.args.get("echo", "pong")

    def _rpc_whoami(self, call: rpc.Call) -> Any:
        return {"user": call.user.username, "permissions": sorted(call.user.permissions)}

    def _rpc_node_info(self, call: rpc.Call) -> Any:
        return self.info()

    def _rpc_network_map(self, call: rpc.Call) -> Any:
        return [
            {
                "legal_name": name,
                "key_hash": n.identity_key_hash,
                "addresses": [str(a) for a in n.node_info.addresses],
                "platform_version": n.node_info.platform_version,
                "serial": n.node_info.serial,
                "hash": n.hash,
                "self": self._material is not None and n.identity_key_hash == self._material.key_hash,
            }
            for name, n in sorted(self.network_nodes().items())
        ]

    def _rpc_queue_statistics(self, call: rpc.Call) -> Any:
        if self.broker is None:
            return []
        return [attrs.asdict(s) for s in self.broker.statistics()]

    def _rpc_drain(self, call: rpc.Call) -> Any:
        self.draining = True
        log.info("draining (asked by RPC user %s)", call.user.username)
        if self._flow_host is not None:
            self._flow_host.set_draining(True)
        return {"draining": True, "running_flows": (self.flow_statistics() or {}).get("running", 0)}

    def _rpc_undrain(self, call: rpc.Call) -> Any:
        self.draining = False
        log.info("undrained (asked by RPC user %s)", call.user.username)
        if self._flow_host is not None:
            self._flow_host.set_draining(False)
        return {"draining": False, "running_flows": (self.flow_statistics() or {}).get("running", 0)}


def _write_own_node_info(config: NodeConfig, material: _Material, cache: network.NodeInfoCache) -> bytes:
    """Sign this start's NodeInfo, write it to ``<base>/nodeInfo-<HASH>`` (replacing the last one, whole or
    not at all) and return its bytes.

    Its serial is the time in milliseconds, but above that of the last NodeInfo this node signed: the one in
    that file and the one in the network map cache (which holds what the map listed, or what
    ``additional-node-infos/`` held), so a clock stepped back since then cannot make the map refuse it as
    stale (409) or peers keep the old one. The file is what an operator copies into the other nodes'
    ``additional-node-infos/`` in a network without a map service.

    Raises:
        NodeStartError: the NodeInfo does not verify, or the file cannot be written.
    """
    path = config.base_directory / network.node_info_file_name(config.legal_name)
    now = dt.datetime.now(dt.UTC)
    last: int | None = None
    known = [_read_own_file(path)]
    try:
        known.append(cache.load().get(str(config.legal_name)))
    except sqlite3.Error as exc:
        log.warning("cannot read our last NodeInfo from %s: %s", config.node_info_cache, exc)
    for data in known:
        if data is None:
            continue
        try:
            node = network.verify_node_info(data, trust_root=material.trust_root, now=now)
        except network.NetworkMapError:  # (not ours as it stands: it does not bound our serial)
            continue
        if node.identity_key_hash == material.key_hash:
            last = max(last or 0, node.node_info.serial)
    try:
        serial = network.next_serial(int(time.time() * 1000), last)
    except ValueError as exc:
        raise NodeStartError(f"cannot sign a newer NodeInfo than {path}: {exc}") from None
    info = network.NodeInfo(
        addresses=config.advertised_addresses,  # [p2p] advertise, in order; else p2p.address
        legal_identities=(
            tuple(c.public_bytes(serialization.Encoding.DER) for c in material.identity_chain),
        ),
        platform_version=network.PLATFORM_VERSION,
        serial=serial,
    )
    signed = network.sign_node_info(info, [material.identity_key])
    try:  # what every peer will check, checked here first
        data = network.verify_node_info(signed, trust_root=material.trust_root, now=now).serialize()
    except network.NetworkMapError as exc:
        raise NodeStartError(f"our own NodeInfo does not verify: {exc}") from None
    try:
        write_file_atomically(path, data, 0o644)
    except OSError as exc:
        raise NodeStartError(f"cannot write our NodeInfo to {path}: {exc.strerror or exc}") from None
    addresses = ", ".join(str(a) for a in info.addresses)
    log.info("our NodeInfo (serial %d, addresses %s) is in %s", serial, addresses, path)
    return data


def _read_own_file(path: Path) -> bytes | None:
    """The bytes of the node's last NodeInfo file, or ``None`` (there is none yet, or it cannot be read: it is
    replaced either way)."""
    try:
        return read_small_file(path, network.MAX_PAYLOAD_BYTES)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("cannot read our last NodeInfo %s (it is replaced): %s", path, exc)
        return None


class _Recorded(enum.Enum):
    """What :func:`_check_store_record` found."""

    NOTHING = "no store.json"
    STORE = "store.json names this store (written before stores kept a part list)"
    STORE_WITH_PARTS = "store.json names this store, which keeps its part list"


def _check_store_record(config: NodeConfig) -> _Recorded:
    """What the base directory records of the store (:data:`STORE_RECORD_NAME`); raises
    :class:`NodeStartError` when it records another place, or this one while it is missing or empty."""
    record = config.base_directory / STORE_RECORD_NAME
    try:
        text = read_small_file(record, 64 * 1024).decode()
    except FileNotFoundError:
        return _Recorded.NOTHING
    except OSError as exc:  # (the record is named already: its strerror, not "[Errno 21] ...: 'path'")
        raise NodeStartError(f"{record}: cannot be read: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise NodeStartError(f"{record}: cannot be read: {exc}") from None
    try:
        doc = json.loads(text)
        recorded, part_list = doc["store_directory"], doc.get("part_list", False)
        if not isinstance(recorded, str) or not isinstance(part_list, bool):
            raise TypeError(recorded)
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        raise NodeStartError(
            f"{record} is not the store record the node writes: delete it to start with the store at "
            f"{config.store_directory}"
        ) from None
    store_dir = config.store_directory.resolve()
    if recorded != _store_record_path(config):
        was = (config.base_directory.resolve() / recorded).resolve()
        raise NodeStartError(
            f"[store] directory is {store_dir}, but this node has run with the store at {was} "
            f"({record}): point [store] directory back at it, or delete {record.name} to start with "
            f"{store_dir}"
        )
    try:
        empty = not store_dir.is_dir() or not any(store_dir.iterdir())
    except OSError as exc:
        raise NodeStartError(f"the store directory {store_dir}: {exc.strerror or exc}") from None
    if empty:
        raise NodeStartError(
            f"the store {store_dir} is missing or empty, but this node has run with it ({record}): restore "
            f"it, or delete {record.name} to start this node with a new, empty store (flows, messages and "
            "deduplication ids of the old one are then gone)"
        )
    return _Recorded.STORE_WITH_PARTS if part_list else _Recorded.STORE


def _store_record_path(config: NodeConfig) -> str:
    """How the record names the store: relative to the base directory when inside it (so a node directory
    moved or copied whole keeps its record true), else absolute."""
    base, store_dir = config.base_directory.resolve(), config.store_directory.resolve()
    return str(store_dir.relative_to(base)) if store_dir.is_relative_to(base) else str(store_dir)


def _write_store_record(config: NodeConfig) -> None:
    """Record the store the node opened, which now has its part list (written whole or not at all)."""
    data = json.dumps({"store_directory": _store_record_path(config), "part_list": True}) + "\n"
    write_file_atomically(config.base_directory / STORE_RECORD_NAME, data.encode(), 0o644)


class _JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message (and the exception, if any)."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


#: What each listener of the node serves, as its errors say it.
_LISTENER_NAMES: Final = {"p2p": "peers", "rpc": "RPC", "metrics": "/metrics", "bridge": "the bridge"}


def _listen_text(what: str, host: str, port: int) -> str:
    return f"cannot listen for {_LISTENER_NAMES[what]} on {network.host_port_text(host, port)}"


def _listeners(config: NodeConfig) -> list[tuple[str, str, int]]:
    """``(what, host, port)`` of each socket the node listens on (see :meth:`Node._start`)."""
    out = []
    if config.bridge_mode is BridgeMode.EXTERNAL:
        out.append(("bridge", *config.bridge_endpoint))
    elif config.floats is None:  # (behind floats, peers reach the node through the float's tunnel)
        out.append(("p2p", config.p2p_listen.host, config.p2p_listen.port))
    out.append(("rpc", config.rpc_address.host, config.rpc_address.port))
    if config.metrics_address is not None:
        out.append(("metrics", *config.metrics_address))
    return out


def _probe_listen(host: str, port: int) -> None:
    """Bind (and let go) what ``trio.open_tcp_listeners(port, host=host)`` would bind: raises the
    ``OSError`` it would raise for a port another process listens on (``Address already in use``)."""
    for family, kind, proto, _name, address in socket.getaddrinfo(
        host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    ):
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)


def _listen_error(exc: BaseException, what: str) -> BaseException:
    """``what: <the system's reason>`` as a :class:`NodeStartError` when ``exc`` is, or holds only, the
    ``OSError`` of a listener that could not be opened (the listener tasks raise it inside their own
    nursery, so it may come wrapped in exception groups); anything else is returned as it is."""
    leaf = exc
    while isinstance(leaf, BaseExceptionGroup) and len(leaf.exceptions) == 1:
        leaf = leaf.exceptions[0]
    if isinstance(leaf, OSError):
        return NodeStartError(f"{what}: {leaf.strerror or leaf}")
    return exc


#: Control characters (C0 but tab, DEL, C1, and the Unicode line and paragraph separators) as escapes.
_CONTROL_ESCAPES: Final = {
    c: f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"
    for c in (*range(0x09), *range(0x0A, 0x20), *range(0x7F, 0xA0), 0x2028, 0x2029)
}


class _TextFormatter(logging.Formatter):
    """``time level logger: message``, one line per record: control characters in the message are escaped
    (``\\x0a``), so that text a peer or an RPC client chose (a client id, an address, a legal name) can
    neither start a forged log line nor send a terminal escape. A traceback, the node's own text, follows
    on its lines as usual."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = record.message.translate(_CONTROL_ESCAPES)
        return super().formatMessage(record)


class _LogFile(logging.handlers.RotatingFileHandler):
    """The node's log file. A record that cannot be written to it (the disk is full, its device is gone) is
    dropped, and the operator is told so once, in one line on stderr, and once more when it is written
    again, instead of ``logging``'s traceback for every record. The node goes on either way."""

    _failing = False
    _written = True

    def emit(self, record: logging.LogRecord) -> None:
        self._written = True
        super().emit(record)  # a failure calls handleError, which clears _written
        if self._written and self._failing:
            self._failing = False
            sys.stderr.write(f"corda-trio node: the log file {self.baseFilename} is written again\n")

    def _open(self) -> TextIO:
        # (not open(): a named pipe nobody reads would stop the node in it for ever, before it is up)
        fd = open_for_appending(self.baseFilename)
        return open(fd, self.mode, encoding=self.encoding, errors=self.errors)

    def handleError(self, record: logging.LogRecord) -> None:
        exc = sys.exc_info()[1]
        if not isinstance(exc, OSError):
            super().handleError(record)  # a record that cannot be formatted: a bug, with its traceback
            return
        self._written = False
        if not self._failing:
            self._failing = True
            sys.stderr.write(
                f"corda-trio node: warning: cannot write the log file {self.baseFilename}: "
                f"{exc.strerror or exc}; log records are dropped until it can be written again\n"
            )


def configure_logging(config: NodeConfig, *, console_level: int = logging.WARNING) -> Path:
    """Log to ``config.log_path`` (rotated at 64 MiB, 5 kept) in the configured format; warnings to stderr.

    Returns the log file's path.
    """
    path = config.log_path
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = _LogFile(path, maxBytes=64 * 1024 * 1024, backupCount=5)
    if config.log_format is LogFormat.JSON:
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(_TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers.clear()
    root.setLevel(getattr(logging, config.log_level.upper()))
    root.addHandler(handler)
    console = logging.StreamHandler(sys.stderr)
    console.setLevel(console_level)
    console.addFilter(lambda record: not getattr(record, logs.FILE_ONLY, False))
    console.setFormatter(_TextFormatter("corda-trio node: %(levelname)s %(name)s: %(message)s"))
    root.addHandler(console)
    return path
