"""The bridge in its own process: the same ``BridgeManager`` and ``InboundAcceptor``, fed through the node's
local endpoint and the control protocol.

Theory of operation
-------------------
:meth:`ExternalBridge.run` loops forever (its owner cancels it). Each round is one *session* with the node:

1. Dial the node's local endpoint (plain AMQP on loopback, SASL PLAIN with the configured credentials).
   A completed handshake resets the backoff.
2. Attach a receiver from ``internal.bridge.notify`` and a sender to ``internal.bridge.control``; drive a
   :class:`ControlClient`: ``QueueQuery`` every second until a snapshot answers it, then follow
   ``BridgeRequest`` / ``BridgeDelete`` (and unsolicited snapshots).
3. Mirror the client's table into what the in-node components read: a :class:`PeerDirectory` (legal name,
   key-hash from the queue name, addresses) and :class:`AnnouncedQueues` (one :class:`RemoteQueue` per
   outbound queue, consumed through a receiver link on the endpoint). A :class:`BridgeManager` runs over
   them, so every bridge behaves exactly as in the node: resolve, dial round-robin with backoff, park
   addresses failing the identity check, ack (here: settle ``accepted`` towards the node, which then acks
   its WAL) only on the peer's ``accepted``, release everything else.
4. Once the snapshot named the node's inbox, run the :class:`InboundAcceptor` on the P2P address (one node,
   one inbox: a snapshot listing several stops the bridge with :class:`MultipleInboxesError`); it
   delivers through :class:`RemoteInbox` (a sender link to the inbox on the endpoint): a batch is settled
   ``accepted`` towards the peer only after the node settled each message ``accepted``, i.e. stored it.
5. If the connection to the node ends, the session ends: the manager, its bridges and the acceptor are
   cancelled (the node releases what they held; peers resend what was not settled), then back off, go to 1.
   While the node stays away its first failure is a warning, then a line a minute at most says the bridge is
   still retrying, and one line says when it reconnected (:class:`corda_trio.logs.Outage`).
"""

from __future__ import annotations

import itertools
import logging
import ssl
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Final

import attrs
import trio

from corda_trio import amqp, hostport, logs, pki, transport
from corda_trio.messaging import (
    InvalidMessageError,
    Peer,
    PeerDirectory,
    check_message_format,
    key_hash_of_address,
)

from ._backoff import Backoff
from ._control import (
    CONTROL_ADDRESS,
    NOTIFY_ADDRESS,
    ControlClient,
    ControlMessage,
    ControlProtocolError,
    ControlState,
    decode_control,
    encode_control,
)
from ._inbound import AcceptorConfig, InboundAcceptor
from ._manager import BridgeManager
from ._outbound import Bridge, BridgeConfig

if TYPE_CHECKING:
    from .float import FloatTunnel, TunnelConfig

__all__ = [
    "AnnouncedQueues",
    "BridgeTotals",
    "ExternalBridge",
    "ExternalBridgeConfig",
    "ListenError",
    "MultipleInboxesError",
    "RemoteInbox",
    "RemoteQueue",
]

log = logging.getLogger("corda_trio.bridge.external")


class ListenError(OSError):
    """The P2P acceptor cannot bind its address (a configuration problem: not retried)."""

    def __str__(self) -> str:
        return str(self.strerror)  # "cannot listen on HOST:PORT: why", without "[Errno N]"


class MultipleInboxesError(ControlProtocolError):
    """The node's snapshot lists more than one inbox queue. A bridge serves exactly one node and its one inbox
    (``protocol_spec/bridge-control.md`` §3): not retried, since asking again gives the same answer."""


@attrs.frozen(kw_only=True)
class ExternalBridgeConfig:
    """What an out-of-process bridge needs besides its TLS contexts."""

    #: The node's local endpoint and its credentials.
    node_host: str = "127.0.0.1"
    node_port: int
    username: str
    password: str = attrs.field(repr=False)
    #: Names this bridge in its queries (the node logs it).
    bridge_id: str = attrs.field(factory=lambda: f"bridge-{uuid.uuid4()}")
    #: Where the inbound acceptor listens (the node's P2P address as published in the network map).
    p2p: AcceptorConfig = attrs.field(factory=AcceptorConfig)
    bridges: BridgeConfig = attrs.field(factory=BridgeConfig)
    #: Behind floats: a ``float.TunnelConfig``; peers reach the inbox through the float this bridge
    #: activates (``float.FloatTunnel``, over ``ExternalBridge.tunnel_ssl_context``) and ``p2p`` is not
    #: listened on.
    floats: TunnelConfig | None = None


@attrs.define(eq=False)
class _RemoteDelivery:
    message_id: int
    payload: bytes


@attrs.define(eq=False)
class _RemoteConsumer:
    conn: transport.AmqpConnection
    name: str
    credit: int
    _receiver: transport.Receiver | None = None
    _held: dict[int, transport.Delivery] = attrs.field(factory=dict)

    async def __aenter__(self) -> _RemoteConsumer:
        # No max-message-size on this local link: the node bounded its queue's messages already, and the
        # limit that counts is the peer's, on the P2P link (a message it refuses is rejected back here and
        # dead-lettered by the node). The transport's default (10 MiB) made the node dead-letter anything
        # larger that a network with a higher maxMessageSize lets peers take.
        self._receiver = await self.conn.open_receiver(self.name, credit=self.credit, max_message_size=None)
        return self

    async def __aexit__(self, *exc: object) -> None:
        # Detaching the link with deliveries unsettled: the node puts them back in its queue, in order.
        assert self._receiver is not None
        with trio.CancelScope(shield=True):
            await self._receiver.aclose()

    def __aiter__(self) -> AsyncIterator[_RemoteDelivery]:
        return self

    async def __anext__(self) -> _RemoteDelivery:
        assert self._receiver is not None
        try:
            delivery = await self._receiver.receive()
        except trio.EndOfChannel:
            raise transport.LinkDetachedError(f"the node closed the link from {self.name}") from None
        return self._hold(delivery)

    def receive_nowait(self) -> _RemoteDelivery:
        """The next delivery already arrived on the link (not a checkpoint), or raise ``trio.WouldBlock``."""
        assert self._receiver is not None
        try:
            delivery = self._receiver.receive_nowait()
        except trio.EndOfChannel:
            raise trio.WouldBlock from None  # (the next __anext__ reports the end)
        return self._hold(delivery)

    def _hold(self, delivery: transport.Delivery) -> _RemoteDelivery:
        self._held[delivery.delivery_id] = delivery
        return _RemoteDelivery(delivery.delivery_id, delivery.payload)

    async def ack_many(self, message_ids: Sequence[int]) -> None:
        self.ack_many_nowait(message_ids)
        await trio.lowlevel.checkpoint()

    def ack_many_nowait(self, message_ids: Sequence[int]) -> None:
        """Settle the node's deliveries ``accepted`` (the node acks them in its queue); the dispositions leave
        with the connection's next write."""
        assert self._receiver is not None
        self._receiver.settle_many_nowait([self._held.pop(m) for m in message_ids], amqp.Accepted())

    async def reject(self, message_id: int, condition: str, description: str) -> None:
        """Pass a peer's rejection on to the node (which moves the message to its dead-letter queue)."""
        await self._held.pop(message_id).reject(condition, description)


async def _reject_at_node(
    queue_name: str,
    consumer: _RemoteConsumer,
    message_id: int,
    payload: bytes,
    condition: str,
    description: str,
) -> None:
    await consumer.reject(message_id, condition, description)


@attrs.frozen(eq=False)
class RemoteQueue:
    """An outbound queue of the node, consumed through its local endpoint (``Bridge.queue``)."""

    conn: transport.AmqpConnection
    name: str

    def consumer(self, *, credit: int, lazy_acks: bool = False) -> _RemoteConsumer:
        # (an ack here is an ``accepted`` sent to the node, whose own consumer of the queue decides how
        # it is written: ``lazy_acks`` is the node's business)
        return _RemoteConsumer(self.conn, self.name, credit)


@attrs.define(eq=False)
class RemoteInbox:
    """The node's inbox through its local endpoint (``InboundAcceptor.inbox``); :attr:`conn` is the current
    session's connection (``None`` between sessions: then every append fails and peers send again later)."""

    name: str
    conn: transport.AmqpConnection | None = None
    _sender: transport.Sender | None = None
    _sender_conn: transport.AmqpConnection | None = None
    _lock: trio.Lock = attrs.field(factory=trio.Lock)

    async def enqueue_many(self, payloads: Sequence[bytes]) -> None:
        """Send each, in order, and return once the node settled every one ``accepted`` (durable).

        Raises:
            AmqpTransportError: no connection to the node, the node refused one, or the link or
                connection ended first.
        """
        async with self._lock:  # one attach per connection, by the first caller
            conn = self.conn
            if conn is None:
                raise transport.AmqpConnectionError("the bridge is not connected to its node")
            if self._sender is None or self._sender_conn is not conn:
                self._sender = await conn.open_sender(self.name)
                self._sender_conn = conn
            sender = self._sender
        pending = [await sender.start_send(p) for p in payloads]
        for p in pending:
            assert p is not None
            outcome: Any = await p.outcome()
            if not isinstance(outcome, amqp.Accepted):
                raise transport.AmqpTransportError(f"the node settled an inbox message with {outcome!r}")


@attrs.define(eq=False)
class AnnouncedQueues:
    """The node's outbound queues as the control protocol announced them (``BridgeManager.messaging``)."""

    _queues: dict[str, RemoteQueue] = attrs.field(factory=dict)
    _version: int = 0
    _changed: trio.Event = attrs.field(factory=trio.Event)

    @property
    def outbound_version(self) -> int:
        return self._version

    def outbound_queues(self) -> dict[str, RemoteQueue]:
        return dict(self._queues)

    async def wait_outbound_changed(self, since: int) -> int:
        while self._version <= since:
            await self._changed.wait()
        return self._version

    def set(self, queues: dict[str, RemoteQueue]) -> None:
        if queues.keys() != self._queues.keys():
            self._queues = queues
            self._version += 1
            self._changed.set()
            self._changed = trio.Event()


@attrs.frozen
class BridgeTotals:
    """A peer's bridge counters summed over the bridge process's sessions with the node (each session runs
    new :class:`Bridge` objects, whose counters start at 0)."""

    delivered: int = 0
    connects: int = 0
    failures: int = 0
    restarts: int = 0

    def plus(self, bridge: Bridge, restarts: int) -> BridgeTotals:
        return BridgeTotals(
            delivered=self.delivered + bridge.delivered,
            connects=self.connects + bridge.connects,
            failures=self.failures + bridge.failures,
            restarts=self.restarts + restarts,
        )


@attrs.define(eq=False)
class ExternalBridge:
    """See the module docstring. ``await nursery.start(bridge.run)``; :meth:`wait_serving` gives the P2P port.

    The P2P acceptor is started once the first snapshot names the node's inbox and then stays up across
    sessions with the node (so the published port stays bound); the bridge manager lives in a session.
    """

    config: ExternalBridgeConfig
    #: The node's TLS contexts (mutual TLS anchored in the network root), as the in-node bridge uses them.
    client_ssl_context: ssl.SSLContext
    server_ssl_context: ssl.SSLContext
    #: With ``config.floats``: the tunnel PKI context the floats are dialled with (a ``bridge`` certificate).
    tunnel_ssl_context: ssl.SSLContext | None = None
    control: ControlClient = attrs.field(init=False)
    peers: PeerDirectory = attrs.field(factory=PeerDirectory, init=False)
    queues: AnnouncedQueues = attrs.field(factory=AnnouncedQueues, init=False)
    manager: BridgeManager | None = attrs.field(default=None, init=False)
    acceptor: InboundAcceptor | None = attrs.field(default=None, init=False)
    #: With ``config.floats``: the tunnel that activates a float and stores what it forwards.
    tunnel: FloatTunnel | None = attrs.field(default=None, init=False)
    inbox: RemoteInbox | None = attrs.field(default=None, init=False)
    #: Sessions with the node that completed the handshake.
    sessions: int = attrs.field(default=0, init=False)
    _serving: trio.Event = attrs.field(factory=trio.Event, init=False)
    _query_ids: Any = attrs.field(factory=itertools.count, init=False)
    #: the node down: its first failure a warning, then a line a minute at most, and one when it is back
    _outage: logs.Outage = attrs.field(init=False)
    #: Per outbound queue: the peer's legal name as the node last announced it (kept when the peer leaves, so
    #: its /metrics series keep one label) and the counters of the bridges of ended sessions.
    _peer_names: dict[str, str] = attrs.field(factory=dict, init=False)
    _ended: dict[str, BridgeTotals] = attrs.field(factory=dict, init=False)

    def __attrs_post_init__(self) -> None:
        self.control = ControlClient(bridge_id=self.config.bridge_id)
        cfg = self.config
        where = hostport.host_port_text(cfg.node_host, cfg.node_port)
        self._outage = logs.Outage(log, f"bridge {cfg.bridge_id}: the node at {where}")
        if self.config.floats is not None and self.tunnel_ssl_context is None:
            raise ValueError("config.floats needs tunnel_ssl_context (the bridge's tunnel certificate)")

    async def wait_serving(self) -> int:
        """Wait until the acceptor listens, or a float is active; returns the port peers dial."""
        await self._serving.wait()
        if self.tunnel is not None:
            return (await self.tunnel.wait_active())[1]
        assert self.acceptor is not None and self.acceptor.port is not None
        return self.acceptor.port

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve the node's queues until cancelled (never returns)."""
        c = self.config.bridges
        backoff = Backoff(c.initial_backoff_seconds, c.max_backoff_seconds, c.backoff_jitter)
        async with trio.open_nursery() as outer:
            task_status.started()
            while True:
                sessions = self.sessions
                try:
                    await self._session(backoff, outer)
                except Exception as exc:
                    _reraise_fatal(exc)
                    why = logs.failure_text(exc)
                    if self.sessions == sessions:  # the handshake never completed: there was no session
                        cfg = self.config
                        where = hostport.host_port_text(cfg.node_host, cfg.node_port)
                        self._outage.failed(
                            why,
                            "bridge %s: could not connect to the node at %s: %s",
                            cfg.bridge_id,
                            where,
                            why,
                        )
                    else:
                        self._outage.failed(
                            why, "bridge %s: session with the node ended: %s", self.config.bridge_id, why
                        )
                finally:
                    if self.inbox is not None:
                        self.inbox.conn = None
                    self._end_manager()
                    if self.control.state is not ControlState.DISCONNECTED:
                        self.control.disconnected()
                    self._mirror(None)
                await trio.sleep(backoff.next_delay())

    def peer_links(self) -> Iterator[tuple[str, Bridge | None, BridgeTotals]]:
        """Per outbound queue the node announced since this process started: the peer's legal name, its
        running bridge (``None`` between sessions with the node) and its counters since the process started
        (ended sessions' bridges plus the running one's)."""
        manager = self.manager
        running = manager.bridges() if manager is not None else {}
        for name, peer in sorted(self._peer_names.items()):
            totals = self._ended.get(name, BridgeTotals())
            bridge = running.get(name)
            if bridge is not None:
                assert manager is not None
                totals = totals.plus(bridge, manager.restarts(name))
            yield peer, bridge, totals

    def _end_manager(self) -> None:
        """Fold the session's bridges' counters into :attr:`_ended` (a new session starts new bridges)."""
        manager, self.manager = self.manager, None
        if manager is None:
            return
        for name, bridge in manager.bridges().items():
            self._ended[name] = self._ended.get(name, BridgeTotals()).plus(bridge, manager.restarts(name))

    async def _session(self, backoff: Backoff, outer: trio.Nursery) -> None:
        cfg = self.config
        amqp_config = amqp.ConnectionConfig(
            sasl_mechanisms=("PLAIN",),
            sasl_username=cfg.username,
            sasl_password=cfg.password,
            idle_timeout_ms=transport.idle_timeout_ms(cfg.bridges.idle_timeout_seconds),  # bridge.toml [p2p]
        )
        async with (
            transport.open_amqp_connection(cfg.node_host, cfg.node_port, config=amqp_config) as conn,
            trio.open_nursery() as nursery,
        ):
            backoff.reset()
            self._outage.connected()
            self.sessions += 1
            notify = await conn.open_receiver(NOTIFY_ADDRESS, credit=64)
            control = await conn.open_sender(CONTROL_ADDRESS)
            nursery.start_soon(self._watch_connection, conn)
            query_id = f"{cfg.bridge_id}-{next(self._query_ids)}"
            await self._send(control, self.control.connected(query_id, trio.current_time()))
            nursery.start_soon(self._query_timer, control)
            self.manager = BridgeManager(
                messaging=self.queues,
                resolver=self.peers,
                ssl_context=self.client_ssl_context,
                config=cfg.bridges,
                dead_letter=_reject_at_node,
            )
            await nursery.start(self.manager.run)
            async for delivery in notify:
                try:
                    check_message_format(delivery.message_format)
                    message = decode_control(delivery.payload)
                except (ControlProtocolError, InvalidMessageError) as exc:
                    log.warning("bridge %s: malformed control message dropped: %s", cfg.bridge_id, exc)
                    await delivery.reject(exc.condition, str(exc))  # (no-op: the node pre-settles)
                    continue
                before = self.control.version
                self.control.receive(message)
                if self.control.version != before:
                    self._mirror(conn)
                    await self._serve_inbox(conn, outer)
            raise transport.AmqpConnectionError("the node closed the notify link")

    async def _send(self, control: transport.Sender, messages: list[ControlMessage]) -> None:
        for message in messages:
            await control.send(encode_control(message), settled=True)

    async def _query_timer(self, control: transport.Sender) -> None:
        while self.control.deadline is not None:
            await trio.sleep_until(self.control.deadline)
            await self._send(control, self.control.tick(trio.current_time()))

    async def _watch_connection(self, conn: transport.AmqpConnection) -> None:
        await conn.wait_closed()
        raise conn.close_error or transport.AmqpConnectionError("the connection to the node ended")

    def _mirror(self, conn: transport.AmqpConnection | None) -> None:
        """Make the directory and the queues match the control table (empty without a connection)."""
        table = self.control.bridges if conn is not None else {}
        for name, entry in table.items():
            self._peer_names[name] = entry.legal_name
            self.peers.put(
                Peer(
                    legal_name=pki.CordaX500Name.parse(entry.legal_name),
                    key_hash=key_hash_of_address(name),
                    addresses=entry.addresses,
                )
            )
        wanted = {key_hash_of_address(name) for name in table}
        for peer in self.peers.peers():
            if peer.key_hash not in wanted:
                self.peers.remove(peer.key_hash)
        current = self.queues.outbound_queues()
        queues = {}
        for name in table:
            queue = current.get(name)
            queues[name] = queue if queue is not None and queue.conn is conn else RemoteQueue(conn, name)  # type: ignore[arg-type]
        self.queues.set(queues)

    async def _serve_inbox(self, conn: transport.AmqpConnection, outer: trio.Nursery) -> None:
        inboxes = self.control.inboxes
        if not inboxes:
            return
        if len(inboxes) > 1:
            names = ", ".join(entry.queue_name for entry in inboxes)
            raise MultipleInboxesError(
                f"the node lists {len(inboxes)} inbox queues ({names}); a bridge serves one node and its one "
                "inbox: run one bridge per node"
            )
        name = inboxes[0].queue_name
        if self.inbox is None and self.config.floats is not None:
            from .float import FloatTunnel  # the float package builds on this one

            assert self.tunnel_ssl_context is not None
            self.inbox = RemoteInbox(name, conn)
            # No resolver: this process knows only the peers it has queues for, not the network map; the
            # tunnel checks the rest (only this inbox, a legal name, a matching stamp) as the acceptor does.
            self.tunnel = FloatTunnel(
                inbox=self.inbox, tunnel_context=self.tunnel_ssl_context, config=self.config.floats
            )
            await outer.start(self.tunnel.run)
            floats = ", ".join(hostport.host_port_text(h, p) for h, p in self.config.floats.floats)
            log.info("bridge %s: peers reach %s through floats %s", self.config.bridge_id, name, floats)
            self._serving.set()
        elif self.inbox is None:
            self.inbox = RemoteInbox(name, conn)
            self.acceptor = InboundAcceptor(
                inbox=self.inbox, ssl_context=self.server_ssl_context, config=self.config.p2p
            )
            try:
                await outer.start(self.acceptor.run)
            except (OSError, BaseExceptionGroup) as exc:
                # The bind error arrives wrapped in the acceptor's nursery groups: unwrapped, it is fatal
                # (retrying the session would fail the same way forever).
                bind_error = _only_os_error(exc)
                if bind_error is None:
                    raise
                p2p = self.config.p2p
                where = hostport.host_port_text(p2p.host, p2p.port)
                what = f"cannot listen on {where}: {bind_error.strerror or bind_error}"
                raise ListenError(bind_error.errno, what) from None
            log.info(
                "bridge %s: accepting peers on port %s for %s",
                self.config.bridge_id,
                self.acceptor.port,
                name,
            )
            self._serving.set()
        elif self.inbox.name != name:
            raise ControlProtocolError(f"the node's inbox changed from {self.inbox.name} to {name}")
        else:
            self.inbox.conn = conn


_FATAL: Final = (ListenError, MultipleInboxesError)


def _only_os_error(exc: BaseException) -> OSError | None:
    """``exc`` if it is an OSError, or the first leaf of a group made of OSErrors only; else ``None``."""
    while isinstance(exc, BaseExceptionGroup):
        _, rest = exc.split(OSError)
        if rest is not None:
            return None
        exc = exc.exceptions[0]
    return exc if isinstance(exc, OSError) else None


def _reraise_fatal(exc: BaseException) -> None:
    """Re-raise a configuration problem (found in ``exc`` or its groups): retrying would not help."""
    while isinstance(exc, BaseExceptionGroup):
        found = exc.subgroup(_FATAL)
        if found is None:
            return
        exc = found.exceptions[0]
    if isinstance(exc, _FATAL):
        raise exc
