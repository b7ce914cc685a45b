"""Prometheus ``/metrics`` for the node: a collector that reads the components' own counters at scrape time,
exposed in the Prometheus text format over a small h11 HTTP server.

Theory of operation
-------------------
Nothing is counted twice: the queues, bridges, acceptor, RPC server and flow manager keep their counters
(they need them anyway, for ``node info`` and ``corda-trio store``), and :class:`NodeCollector` turns a
snapshot of them into metric families when Prometheus scrapes. The one exception is flow latency, a
histogram the node observes as flows finish (:attr:`NodeMetrics.flow_duration`). Counters restart at zero
with the process, which Prometheus' ``rate()`` handles.

Names follow Prometheus conventions: ``corda_trio_`` prefix, base units in the name (``_seconds``,
``_bytes``, ``_messages``), ``_total`` on counters (added by the client library).
"""

from __future__ import annotations

import functools
import gzip
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Final

import attrs
import h11
import prometheus_client
import trio
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.utils import floatToGoString

from corda_trio import bridge, network, transport
from corda_trio.bridge import float as fl

from ._cli import grouped_error

if TYPE_CHECKING:
    from ._node import Node

__all__ = [
    "BridgeProcessCollector",
    "FloatCollector",
    "NetworkMapCollector",
    "NodeCollector",
    "NodeMetrics",
    "new_registry",
    "serve_metrics",
    "start_process_metrics",
]

log = logging.getLogger("corda_trio.node.metrics")

#: Flow latency buckets (seconds): a local ping-pong takes milliseconds, a flow waiting on a peer that is
#: down can take minutes.
FLOW_DURATION_BUCKETS: Final = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
    300,
)
#: zlib level of a gzip answer: a node with two peers' 14.7 KB exposition becomes 2.7 KB; an 84 KB one takes
#: 0.5 ms here (level 9: 4 ms, for 2% fewer bytes).
GZIP_LEVEL: Final[int] = 6
#: A scrape request head larger than this is answered 431, however it arrives (a GET with a few headers).
MAX_REQUEST_BYTES: Final[int] = 16 * 1024
#: Time a client has to send its request.
REQUEST_TIMEOUT_SECONDS: Final[float] = 10.0
#: Scrapes served at once; one more is answered 503 (a scraper needs one or two: this bounds the descriptors a
#: flood of connections can take from the node).
MAX_CONNECTIONS: Final[int] = 32


@attrs.define(eq=False)
class NodeMetrics:
    """The node's registry: the collector plus the flow duration histogram."""

    registry: CollectorRegistry
    flow_duration: Histogram

    @classmethod
    def create(cls, node: Node) -> NodeMetrics:
        registry = new_registry(NodeCollector(node))
        flow_duration = Histogram(
            "corda_trio_flow_duration_seconds",
            "Time from a flow's start over RPC to its end (finished or failed)",
            labelnames=("flow",),
            buckets=FLOW_DURATION_BUCKETS,
            registry=registry,
        )
        return cls(registry=registry, flow_duration=flow_duration)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def new_registry(collector: Any) -> CollectorRegistry:
    """A registry of ``collector`` (a node's or a bridge process's), with no ``*_created`` series."""
    # The client library adds a ``<name>_created`` series (a start timestamp) to each histogram, which
    # Prometheus stores as a separate untyped series nobody asked for; the text format's counters need
    # none (a restart is seen by the value dropping). The switch is the library's, for the process: the
    # registry made here is the only one in it that matters.
    prometheus_client.disable_created_metrics()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry


def _counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> CounterMetricFamily:
    return CounterMetricFamily(f"corda_trio_{name}", doc, labels=list(labels))


def _gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"corda_trio_{name}", doc, labels=list(labels))


@attrs.define(eq=False)
class NodeCollector:
    """Builds metric families from a snapshot of the node's components (see the module docstring)."""

    node: Node

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        node = self.node
        yield from self._node_info(node)
        yield from self._queues(node)
        yield from self._p2p(node)
        yield from self._flows(node)
        yield from self._rpc(node)

    def _node_info(self, node: Node) -> Iterator[Metric]:
        info = _gauge("node_info", "The node's identity (value 1)", ("legal_name", "version"))
        info.add_metric([str(node.config.legal_name), node.version], 1)
        yield info
        up = _gauge("node_uptime_seconds", "Seconds since the node started")
        up.add_metric([], node.uptime_seconds())
        yield up
        draining = _gauge("node_draining", "1 while the node takes no new flows")
        draining.add_metric([], 1 if node.draining else 0)
        yield draining
        peers = _gauge("network_map_nodes", "Nodes in the network map (including this one)")
        peers.add_metric([], len(node.network_nodes()))
        yield peers
        certs = _gauge(
            "certificate_not_after_timestamp_seconds",
            "When each of the node's own certificates (TLS and identity chains, network root) expires "
            "(Unix time; peers refuse the node from then on)",
            ("role", "subject"),
        )
        for own in node.own_certificates():
            certs.add_metric([own.role, own.subject], own.not_after.timestamp())
        yield certs

    def _queues(self, node: Node) -> Iterator[Metric]:
        broker = node.broker
        if broker is None:
            return
        labels = ("queue",)
        depth = _gauge("queue_depth_messages", "Messages stored in the queue and not acknowledged", labels)
        size = _gauge("queue_size_bytes", "Record bytes of the messages in the queue", labels)
        age = _gauge("queue_oldest_message_age_seconds", "Age of the oldest message in the queue", labels)
        enq = _counter("queue_enqueued_messages", "Messages enqueued since the node started", labels)
        acked = _counter("queue_acked_messages", "Messages acknowledged since the node started", labels)
        released = _counter(
            "queue_released_messages", "Messages handed back for redelivery since the node started", labels
        )
        commits = _counter("store_group_commits", "Group commits (one write) of the queue's log", labels)
        fsyncs = _counter("store_fsyncs", "fdatasync calls of the queue's log", labels)
        batch = _gauge(
            "store_group_commit_records", "Mean records per group commit (fsync batch size)", labels
        )
        latency = SummaryMetricFamily(
            "corda_trio_store_group_commit_duration_seconds",
            "Group commit latency: from starting a batch's write to its write and fsync having returned",
            labels=list(labels),
        )
        for s in broker.statistics():
            lv = [s.name]
            depth.add_metric(lv, s.depth)
            size.add_metric(lv, s.bytes)
            age.add_metric(lv, s.oldest_age_seconds or 0.0)
            enq.add_metric(lv, s.enqueued)
            acked.add_metric(lv, s.acked)
            released.add_metric(lv, s.released)
            commits.add_metric(lv, s.group_commits)
            fsyncs.add_metric(lv, s.fsyncs)
            batch.add_metric(lv, s.records_per_fsync)
            latency.add_metric(lv, count_value=s.group_commits, sum_value=s.commit_seconds_total)
        yield from (depth, size, age, enq, acked, released, commits, fsyncs, batch, latency)

    def _p2p(self, node: Node) -> Iterator[Metric]:
        yield from _peer_families(
            (
                peer,
                *((s.acked, s.released, s.depth) if s is not None else (None, None, None)),
                _BridgeCounts.of(running, restarts),
            )
            for peer, s, running, restarts in node.peer_links()
        )
        yield from _inbound_families(node.acceptor, node.float_tunnel)
        service = node.service
        if service is not None:
            dedup = _gauge("p2p_dedup_ids", "Message ids the deduplicator remembers")
            dedup.add_metric([], len(service.deduplicator))
            yield dedup

    def _flows(self, node: Node) -> Iterator[Metric]:
        stats = node.flow_statistics()
        if stats is None:
            return
        started = _counter("flows_started", "Flows started on this node (initiated here or by a peer)")
        started.add_metric([], stats.get("started", 0))
        finished = _counter("flows_finished", "Flows that ended, by outcome", ("outcome",))
        for outcome in ("finished", "failed", "killed"):
            finished.add_metric([outcome], stats.get(outcome, 0))
        running = _gauge("flows_running", "Flows running or waiting now")
        running.add_metric([], stats.get("running", 0))
        parked = _gauge("flows_parked", "Flows parked with an error (retry or kill them)")
        parked.add_metric([], stats.get("parked", 0))
        responders = _gauge("flows_responders", "Running flows that peers started here (with a session init)")
        responders.add_metric([], stats.get("responders", 0))
        parked_messages = _gauge(
            "flows_parked_messages",
            "Inbox messages held by parked (or retrying) flows, and session inits held while draining, "
            "beside the inbox window (the inbox lends them credit, at most max_parked_messages)",
        )
        parked_messages.add_metric([], stats.get("parked_messages", 0))
        refused = _counter(
            "flows_session_messages_refused",
            "Session messages from peers refused (malformed, unknown session, out of sequence, too many "
            "flows from one peer ...); each reason is logged",
        )
        refused.add_metric([], stats.get("refused", 0))
        refused_inits = _counter(
            "flows_inits_refused",
            "Session inits rejected because their peer already had [flows] max_responders_per_peer flows "
            "running here, or because parked flows and a drain hold max_parked_messages and their responder "
            "has parked flows or the node is draining (also counted in flows_session_messages_refused)",
        )
        refused_inits.add_metric([], stats.get("refused_inits", 0))
        yield from (started, finished, running, parked, responders, parked_messages, refused, refused_inits)

    def _rpc(self, node: Node) -> Iterator[Metric]:
        server = node.rpc_server
        if server is None:
            return
        s = server.statistics()
        calls = _counter("rpc_calls", "RPC requests answered, by method and outcome", ("method", "outcome"))
        for (method, outcome), n in sorted(s.calls_total.items()):
            calls.add_metric([method, outcome], n)
        conns = _gauge("rpc_connections", "Open RPC connections")
        conns.add_metric([], s.connections_open)
        refused = _counter("rpc_connections_refused", "RPC connections answered 503: the limit was reached")
        refused.add_metric([], s.connections_refused_total)
        logins = _counter("rpc_failed_logins", "RPC logins refused (wrong user or password)")
        logins.add_metric([], s.failed_logins_total)
        yield from (calls, conns, refused, logins)


@attrs.define(eq=False)
class BridgeProcessCollector:
    """The series of a ``corda-trio bridge start`` process: its bridges and acceptor (or float tunnel) under
    the node's names for the same things, and ``bridge_process_*`` for the process and its link to the node.
    Counters count since this process started (its bridges of ended sessions with the node included)."""

    external: bridge.ExternalBridge
    version: str
    _started: float = attrs.field(factory=time.monotonic, init=False)

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        ext = self.external
        info = _gauge(
            "bridge_process_info", "The bridge process's identity (value 1)", ("bridge_id", "version")
        )
        info.add_metric([ext.config.bridge_id, self.version], 1)
        up = _gauge("bridge_process_uptime_seconds", "Seconds since the bridge process started")
        up.add_metric([], time.monotonic() - self._started)
        connected = _gauge(
            "bridge_process_node_connected", "1 while the bridge process has a session with its node"
        )
        connected.add_metric([], 1 if ext.manager is not None else 0)
        sessions = _counter(
            "bridge_process_node_sessions",
            "Sessions with the node's local endpoint that completed the handshake",
        )
        sessions.add_metric([], ext.sessions)
        yield from (info, up, connected, sessions)
        yield from _peer_families(
            (
                peer,
                totals.delivered,
                None,  # (redelivery and pending are the node's queues': on the node's /metrics)
                None,
                _BridgeCounts(
                    running.state if running is not None else None,
                    len(running.parked()) if running is not None else 0,
                    totals.connects,
                    totals.failures,
                    totals.restarts,
                ),
            )
            for peer, running, totals in ext.peer_links()
        )
        yield from _inbound_families(ext.acceptor, ext.tunnel)


@attrs.define(eq=False)
class FloatCollector:
    """The series of a ``corda-trio float start`` process (``float_*``), read from the float's counters."""

    float: fl.Float

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        f = self.float
        command = f.activation
        control = _gauge("float_control_connected", "1 while a bridge manager's control link is up")
        control.add_metric([], 1 if f.control_connected else 0)
        activated = _gauge("float_activated", "1 while the float is activated (its public port open)")
        activated.add_metric([], 1 if command is not None else 0)
        inboxes = _gauge("float_activated_inboxes", "Inboxes peers may send to through the float now")
        inboxes.add_metric([], len(command.inboxes) if command is not None else 0)
        tls = _gauge(
            "float_activation_tls_info",
            "1 for the [tls.<ref>] of float.toml the float presents to peers now (none: not activated)",
            ("tls_ref",),
        )
        if command is not None:
            tls.add_metric([command.tls_ref], 1)
        yield from (control, activated, inboxes, tls)
        open_now = _gauge("float_public_connections", "Peer connections open on the public port")
        open_now.add_metric([], f.open_connections)
        accepted = _counter(
            "float_public_connections_accepted",
            "Peer connections taken for their TLS handshake (past the connection and per-address limits)",
        )
        accepted.add_metric([], f.accepted_connections)
        refused = _counter(
            "float_public_connections_refused",
            "Peer connections refused, by reason (capacity, address_limit, tls, handshake_timeout, amqp)",
            ("reason",),
        )
        for reason, n in sorted(dict.copy(f.refusals.counts).items()):
            refused.add_metric([reason], n)
        attached = _counter("float_peer_links_attached", "Peer links to an activated inbox attached")
        attached.add_metric([], f.attached_links)
        links_refused = _counter(
            "float_peer_links_refused", "Peer links refused, by the AMQP condition sent", ("condition",)
        )
        for condition, n in sorted(dict.copy(f.refused_links_by_condition).items()):
            links_refused.add_metric([condition], n)
        yield from (open_now, accepted, refused, attached, links_refused)
        forwarded = _counter("float_deliveries_forwarded", "Peer deliveries forwarded to the inside")
        forwarded.add_metric([], f.forwarded)
        settled = _counter(
            "float_deliveries_accepted", "Peer deliveries settled accepted (the inside stored them)"
        )
        settled.add_metric([], f.accepted)
        rejected = _counter(
            "float_deliveries_refused",
            "Peer deliveries settled with another outcome: refused at the float or by the inside",
        )
        rejected.add_metric([], f.refused_deliveries)
        latency = f.latency
        buckets, total = [], 0
        for bound, n in zip((*fl.LATENCY_BUCKETS, float("inf")), latency.buckets, strict=True):
            total += n
            buckets.append((floatToGoString(bound), total))
        duration = HistogramMetricFamily(
            "corda_trio_float_forward_duration_seconds",
            "Time from a peer's delivery arriving at the float to the inside's outcome for it",
            buckets=buckets,
            sum_value=latency.sum_seconds,
        )
        yield from (forwarded, settled, rejected, duration)


@attrs.define(eq=False)
class NetworkMapCollector:
    """The series of ``corda-trio networkmap serve`` (``networkmap_*``), read from the service and its store
    at scrape time."""

    service: network.NetworkMapService

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        service = self.service
        store = service.store
        nodes = _gauge("networkmap_nodes", "Nodes in the map (their NodeInfos are served)")
        nodes.add_metric([], len(store.legal_names()))
        removed = _gauge(
            "networkmap_removed_nodes",
            "Nodes the operator removed (`corda-trio networkmap remove`) and has not readmitted",
        )
        removed.add_metric([], len(store.denied()))
        serial = _gauge("networkmap_serial", "The map's serial (it grows with each change of the map)")
        serial.add_metric([], store.map_serial())
        yield from (nodes, removed, serial)
        accepted = _counter(
            "networkmap_publications_accepted",
            "NodeInfo publications stored, by result (added, replaced, unchanged)",
            ("result",),
        )
        for result, n in sorted(dict.copy(service.accepted_publications).items()):
            accepted.add_metric([result], n)
        refused = _counter(
            "networkmap_publications_refused",
            "NodeInfo publications refused, by reason (each 403's reason, malformed, stale-serial)",
            ("reason",),
        )
        for reason, n in sorted(dict.copy(service.publication_refusals).items()):
            refused.add_metric([reason], n)
        requests = _counter(
            "networkmap_requests", "Responses sent, by endpoint and HTTP status", ("endpoint", "status")
        )
        for (endpoint, status), n in sorted(dict.copy(service.responses).items()):
            requests.add_metric([endpoint, str(status)], n)
        yield from (accepted, refused, requests)


@attrs.frozen
class _BridgeCounts:
    """What the ``bridge_*`` series of one peer show: a running bridge's state and parked addresses
    (``state`` ``None``: none runs now) and its counters."""

    state: bridge.BridgeState | None
    parked: int
    connects: int
    failures: int
    restarts: int

    @classmethod
    def of(cls, running: bridge.Bridge | None, restarts: int) -> _BridgeCounts | None:
        if running is None:
            return None
        return cls(running.state, len(running.parked()), running.connects, running.failures, restarts)


#: Per peer: legal name, messages sent (acked), redelivered, pending (``None``: not counted in this process),
#: and its bridge's series (``None``: no bridge).
_PeerLink = tuple[str, int | None, int | None, int | None, _BridgeCounts | None]


def _peer_families(links: Iterable[_PeerLink]) -> Iterator[Metric]:
    """The per-peer ``p2p_messages_*`` and ``bridge_*`` families of what we send: the node's (from its
    outbound queues and in-process bridges) and a bridge process's (from its bridges) have the same names."""
    labels = ("peer",)
    sent = _counter("p2p_messages_sent", "Messages the peer accepted (acked from its outbound queue)", labels)
    redelivered = _counter(
        "p2p_messages_redelivered", "Messages to the peer handed back for another attempt", labels
    )
    pending = _gauge("p2p_messages_pending", "Messages waiting in the peer's outbound queue", labels)
    state = _gauge("bridge_state", "1 for the bridge's current state", ("peer", "state"))
    parked = _gauge(
        "bridge_parked_addresses",
        "The peer's addresses the bridge parked: they failed the TLS identity check (tried again later)",
        labels,
    )
    connects = _counter("bridge_connects", "Sessions the bridge established", labels)
    failures = _counter("bridge_failures", "Sessions that ended in a failure (each is a reconnect)", labels)
    restarts = _counter("bridge_restarts", "Times the bridge manager restarted a crashed bridge", labels)
    for peer, n_sent, n_redelivered, n_pending, counts in links:
        for family, value in ((sent, n_sent), (redelivered, n_redelivered), (pending, n_pending)):
            if value is not None:
                family.add_metric([peer], value)
        if counts is None:
            continue
        if counts.state is not None:
            for member in bridge.BridgeState:
                state.add_metric([peer, member.value], 1 if counts.state is member else 0)
            parked.add_metric([peer], counts.parked)
        connects.add_metric([peer], counts.connects)
        failures.add_metric([peer], counts.failures)
        restarts.add_metric([peer], counts.restarts)
    yield from (sent, redelivered, pending, state, parked, connects, failures, restarts)


def _inbound_families(
    acceptor: bridge.InboundAcceptor | None, tunnel: bridge.float.FloatTunnel | None
) -> Iterator[Metric]:
    """What peers sent us: the acceptor's counters, or behind floats the tunnel's (in the node, or in the
    bridge process that runs them)."""
    labels = ("peer",)
    received = _counter(
        "p2p_messages_received", "Messages from the peer stored in our inbox and accepted", labels
    )
    rejected = _counter("p2p_messages_rejected", "Messages from peers rejected (malformed, too large)")
    refused = _counter("p2p_links_refused", "Links peers tried to attach to anything but our inbox")
    connections_refused = _counter(
        "p2p_connections_refused",
        "Inbound P2P connections refused before they were served, by reason (tls, handshake_timeout, "
        "amqp, address_limit, capacity); logged per source address at most once a minute",
        ("reason",),
    )
    if acceptor is not None:
        for reason, n in sorted(acceptor.refusals.counts.items()):
            connections_refused.add_metric([reason], n)
        by_peer = dict(acceptor.accepted_by_peer)
        for peer, n in sorted(by_peer.items()):
            received.add_metric([peer], n)
        if acceptor.accepted > sum(by_peer.values()):  # delivered without a TLS peer (a local endpoint)
            received.add_metric(["unknown"], acceptor.accepted - sum(by_peer.values()))
        rejected.add_metric([], acceptor.rejected)
        refused.add_metric([], acceptor.refused_links)
    released = _counter(
        "p2p_messages_released",
        "Messages from peers released, not stored: the sender is not in our network map yet (it sends "
        "them again; behind floats only)",
    )
    if tunnel is not None:  # behind floats: what the active float forwarded (instead of the acceptor)
        for peer, n in sorted(tunnel.stored_by_peer.items()):
            received.add_metric([peer], n)
        rejected.add_metric([], tunnel.rejected)
        released.add_metric([], tunnel.released)
    yield from (received, rejected, refused, connections_refused, released)


async def start_process_metrics(nursery: trio.Nursery, collector: Any, host: str, port: int) -> str:
    """Serve a process's /metrics (``collector``'s, with :func:`serve_metrics`) in ``nursery``, for a bridge
    process, a float or the map service; returns its URL, which the process's ready line names.

    Raises:
        bridge.ListenError: the address cannot be bound (its text is the one line the process exits with).
    """
    registry = new_registry(collector)
    try:
        bound = await nursery.start(serve_metrics, functools.partial(generate_latest, registry), host, port)
    except (OSError, ExceptionGroup) as exc:
        leaf = grouped_error(exc, OSError)
        if leaf is None:
            raise
        what = f"cannot listen for /metrics on {network.host_port_text(host, port)}: {leaf.strerror or leaf}"
        raise bridge.ListenError(leaf.errno, what) from None
    return f"http://{network.host_port_text(host, bound)}/metrics"


async def serve_metrics(
    exposition: Callable[[], bytes],
    host: str,
    port: int,
    *,
    max_connections: int | None = None,
    max_refusing: int | None = None,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``GET /metrics`` (``exposition()``) on ``host:port`` until cancelled; reports the bound port.

    At most ``max_connections`` (default :data:`MAX_CONNECTIONS`; the node shrinks it under a low open-file
    limit) at once, each for at most :data:`REQUEST_TIMEOUT_SECONDS`; one more is answered ``503`` (at most
    ``max_refusing`` at once, default ``transport.MAX_REFUSING``)
    (``transport.serve_listeners``: refusals and a lack of descriptors are logged at most once per
    ``transport.ACCEPT_ERROR_LOG_INTERVAL_SECONDS``)."""
    listeners = await trio.open_tcp_listeners(port, host=host)
    async with trio.open_nursery() as nursery:
        serve = functools.partial(
            transport.serve_listeners,
            _handler(exposition),
            listeners,
            max_connections=MAX_CONNECTIONS if max_connections is None else max_connections,
            refuse=transport.refuse_with_http_503,
            max_refusing=max_refusing,
        )
        await nursery.start(serve)
        task_status.started(transport.listener_port(listeners))


def _handler(exposition: Callable[[], bytes]) -> Callable[[trio.SocketStream], Any]:
    async def handle(stream: trio.SocketStream) -> None:
        async with stream:
            try:
                with trio.fail_after(REQUEST_TIMEOUT_SECONDS):
                    await _serve_one(stream, exposition)
            except (trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError):
                return

    return handle


async def _serve_one(stream: trio.SocketStream, exposition: Callable[[], bytes]) -> None:
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_REQUEST_BYTES)
    try:
        event = await transport.receive_http_event(
            stream, conn, max_head_bytes=MAX_REQUEST_BYTES, receive_bytes=4096
        )
    except h11.RemoteProtocolError as exc:  # not HTTP, or a request line / headers over the limit
        status = exc.error_status_hint
        reason = "request headers too large" if status == 431 else "not an HTTP request"
        await _answer(stream, conn, status, f"{reason}; see /metrics\n".encode(), b"text/plain", True)
        await transport.drain_before_close(stream)
        return
    if not isinstance(event, h11.Request):
        return  # ConnectionClosed or anything unexpected
    path = event.target.split(b"?", 1)[0]
    extra: tuple[tuple[bytes, bytes], ...] = ()
    if event.method not in (b"GET", b"HEAD"):
        status, body, ctype = 405, b"only GET and HEAD\n", b"text/plain"
        extra = ((b"allow", b"GET, HEAD"),)  # RFC 9110 §15.5.6: a 405 lists the methods that work
    elif path != b"/metrics":
        status, body, ctype = 404, b"see /metrics\n", b"text/plain"
    else:
        status, body, ctype = 200, exposition(), CONTENT_TYPE_LATEST.encode()
        extra = ((b"vary", b"accept-encoding"),)  # (a cache must not give a gzip answer to a plain request)
        if accepts_gzip(event.headers):
            body = gzip.compress(body, compresslevel=GZIP_LEVEL, mtime=0)
            extra += ((b"content-encoding", b"gzip"),)
    await _answer(stream, conn, status, body, ctype, event.method != b"HEAD", extra)


def accepts_gzip(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    """Whether the request's ``Accept-Encoding`` (h11's lower-cased header names) accepts ``gzip``: named
    with a non-zero weight, or ``*`` with one and ``gzip`` not named (RFC 9110 §12.5.3). Prometheus sends
    ``Accept-Encoding: gzip``; ``gzip;q=0`` refuses it; without the header the answer is plain."""
    weights: dict[bytes, float] = {}
    for name, value in headers:
        if name != b"accept-encoding":
            continue
        for item in value.split(b","):
            coding, *params = (part.strip() for part in item.split(b";"))
            weight = 1.0
            for param in params:
                key, _, q = param.partition(b"=")
                if key.strip().lower() == b"q":
                    try:
                        weight = float(q)
                    except ValueError:
                        weight = 0.0
            if coding:
                weights[coding.lower()] = weight
    return weights.get(b"gzip", weights.get(b"x-gzip", weights.get(b"*", 0.0))) > 0


async def _answer(
    stream: trio.SocketStream,
    conn: h11.Connection,
    status: int,
    body: bytes,
    ctype: bytes,
    with_body: bool,
    extra: tuple[tuple[bytes, bytes], ...] = (),
) -> None:
    headers = [(b"content-type", ctype), (b"connection", b"close"), *extra]
    await stream.send_all(transport.http_response(conn, status, headers, body, with_body=with_body))
