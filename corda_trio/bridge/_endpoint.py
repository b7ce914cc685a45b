"""The node's local endpoint: its broker as an authenticated AMQP 1.0 server, for an out-of-process bridge.

Theory of operation
-------------------
:class:`LocalEndpoint` serves plain AMQP on a loopback address; SASL PLAIN is the only mechanism and the
credentials are the configured ones (compared in constant time). Per connection, link requests are answered
(``protocol_spec/bridge-control.md`` section 1):

* a receiver from ``internal.peers.<key-hash>`` (an outbound queue the messaging service knows) consumes
  that queue: messages go out unsettled as the link has credit, each is acked in the queue only when the
  client settles it ``accepted``; anything else (another outcome, the link or connection ending, the client
  detaching) ends the link's consumer, which puts every unacked message back in order. One consumer per queue
  (a second is refused with ``amqp:resource-locked``), so the per-sender order holds. A link whose
  max-message-size is below the network's ``max_message_size`` is refused with ``amqp:precondition-failed``:
  a message above it would be dead-lettered for good by the client's setting, not a peer's refusal;
* a sender to the node's inbox goes through :meth:`InboundAcceptor.pump_link` in trusted mode (checked
  again, message-format 0 included, stored, settled ``accepted`` once durable); one in snd-settle-mode
  ``settled`` is refused with ``amqp:not-implemented``, as at the acceptor (``messaging.check_inbox_sender``);
* a sender to :data:`CONTROL_ADDRESS` carries ``QueueQuery`` messages, answered with a correlated
  ``QueueSnapshot`` on the notify links of the same connection;
* a receiver from :data:`NOTIFY_ADDRESS` gets the snapshots and, whenever the wanted bridges change (a
  queue declared, the network map changed), the ``BridgeRequest`` / ``BridgeDelete`` difference. Each notify
  link has its own bounded queue and task; a link that falls that far behind is detached (its bridge
  reconnects and queries again). When the endpoint starts it broadcasts an unsolicited snapshot.

Control messages are pre-settled and never stored: they are recomputed from durable state.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
from typing import Final

import attrs
import trio

from corda_trio import amqp, logs, store, transport
from corda_trio.messaging import (
    DEFAULT_MAX_MESSAGE_SIZE,
    OUTBOUND_PREFIX,
    InvalidMessageError,
    MessagingService,
    PeerResolver,
    check_inbox_sender,
    check_message_format,
    key_hash_of_address,
)

from ._control import (
    CONTROL_ADDRESS,
    NOTIFY_ADDRESS,
    BridgeEntry,
    ControlMessage,
    ControlProtocolError,
    QueueEntry,
    QueueQuery,
    QueueSnapshot,
    UnknownControlMessage,
    decode_control,
    diff_entries,
    encode_control,
)
from ._inbound import AcceptorConfig, InboundAcceptor
from ._manager import _first_of
from ._outbound import DEFAULT_BRIDGE_CREDIT, DeliveryRefusedError, stream_queue

__all__ = ["EndpointConfig", "LocalEndpoint", "wanted_bridges"]

log = logging.getLogger("corda_trio.bridge.endpoint")

#: Control messages a notify link may have queued before it is detached as too slow.
NOTIFY_BACKLOG: Final = 1024


def _loopback(instance: object, attribute: attrs.Attribute[str], value: str) -> None:
    try:
        ok = value == "localhost" or ipaddress.ip_address(value).is_loopback
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"{attribute.name}: the local endpoint binds only a loopback address, not {value!r}")


@attrs.frozen(kw_only=True)
class EndpointConfig:
    """Where the endpoint listens and who may connect."""

    username: str = attrs.field(validator=attrs.validators.min_len(1))
    password: str = attrs.field(validator=attrs.validators.min_len(1), repr=False)
    host: str = attrs.field(default="127.0.0.1", validator=_loopback)
    port: int = 0
    #: Messages handed to a consuming bridge unacked at once (and the inbox link's credit).
    credit: int = attrs.field(default=DEFAULT_BRIDGE_CREDIT, validator=attrs.validators.ge(1))
    max_message_size: int = attrs.field(default=DEFAULT_MAX_MESSAGE_SIZE, validator=attrs.validators.ge(1))
    #: How long a bridge process may send no frame before its connection is closed (node.toml ``[p2p]
    #: idle_timeout_seconds``: a frozen bridge process is given up after it, its messages released).
    idle_timeout_seconds: float = transport.DEFAULT_IDLE_TIMEOUT_SECONDS
    #: Connections served at once (a bridge process needs one; the node sizes it to its open-file limit).
    max_connections: int = attrs.field(
        default=transport.DEFAULT_MAX_CONNECTIONS, validator=attrs.validators.ge(1)
    )


def wanted_bridges(messaging: MessagingService, resolver: PeerResolver) -> dict[str, BridgeEntry]:
    """The node's wanted bridges: every outbound queue whose peer the map knows, by queue name."""
    wanted = {}
    for name in messaging.outbound_queues():
        peer = resolver.peer(key_hash_of_address(name))
        if peer is not None:
            wanted[name] = BridgeEntry(
                legal_name=str(peer.legal_name), queue_name=name, addresses=peer.addresses
            )
    return wanted


@attrs.define(eq=False)
class _Notify:
    send: trio.MemorySendChannel[bytes]
    sender: transport.Sender
    #: Cancelled when the link falls :data:`NOTIFY_BACKLOG` behind: its task detaches it at once.
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)


@attrs.define(eq=False)
class LocalEndpoint:
    """See the module docstring. ``port = await nursery.start(endpoint.run)``."""

    messaging: MessagingService
    resolver: PeerResolver
    config: EndpointConfig
    port: int | None = None
    #: Counters: control messages handled, connections served.
    queries: int = 0
    connections: int = 0
    _announced: dict[str, BridgeEntry] = attrs.field(factory=dict)
    _notify: dict[transport.AmqpConnection, list[_Notify]] = attrs.field(factory=dict)
    _consuming: set[str] = attrs.field(factory=set)
    _inbox: InboundAcceptor | None = None

    @property
    def inbound(self) -> InboundAcceptor | None:
        """What stores the messages the bridge forwards to the inbox; its counters (``accepted_by_peer``,
        ``rejected``) are what the node received from its peers. ``None`` until :meth:`run` has started."""
        return self._inbox

    def _amqp_config(self) -> amqp.ConnectionConfig:
        user, password = self.config.username.encode(), self.config.password.encode()

        def check(username: str, given: str) -> bool:
            return hmac.compare_digest(username.encode(), user) & hmac.compare_digest(
                given.encode(), password
            )

        return amqp.ConnectionConfig(
            sasl_mechanisms=("PLAIN",),
            sasl_plain_check=check,
            idle_timeout_ms=transport.idle_timeout_ms(self.config.idle_timeout_seconds),
        )

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; reports the bound port through ``task_status``."""
        self._inbox = InboundAcceptor(
            inbox=self.messaging.inbox,
            ssl_context=None,
            config=AcceptorConfig(credit=self.config.credit, max_message_size=self.config.max_message_size),
        )
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(
                lambda task_status: transport.serve_amqp(
                    self._handle,
                    self.config.port,
                    host=self.config.host,
                    config=self._amqp_config(),
                    max_connections=self.config.max_connections,
                    task_status=task_status,
                )
            )
            self.port = transport.listener_port(listeners)
            self._announced = wanted_bridges(self.messaging, self.resolver)
            self._broadcast_snapshot(None)  # unsolicited, at start (reaches bridges attached by now)
            nursery.start_soon(self._follow_changes)
            task_status.started(self.port)

    # --- control ---------------------------------------------------------------------------------------

    def _snapshot(self, correlation_id: str | None) -> QueueSnapshot:
        config = self.messaging.config
        return QueueSnapshot(
            correlation_id=correlation_id,
            inbox_queues=[QueueEntry(legal_name=str(config.legal_name), queue_name=config.inbox)],
            outbound_queues=[self._announced[name] for name in sorted(self._announced)],
        )

    def _broadcast_snapshot(self, correlation_id: str | None) -> None:
        payload = encode_control(self._snapshot(correlation_id))
        for links in self._notify.values():
            for link in links:
                self._post(link, payload)

    def _post(self, link: _Notify, payload: bytes) -> None:
        try:
            link.send.send_nowait(payload)
        except trio.WouldBlock:
            log.warning("notify link %s is %d messages behind: closing it", link.sender.name, NOTIFY_BACKLOG)
            link.send.close()
            # detach it now: draining the backlog first would keep it (and its payloads) for as long as the
            # client grants no credit, and hand a slow bridge stale messages before it could query again
            link.scope.cancel()
        except trio.ClosedResourceError:
            pass

    async def _follow_changes(self) -> None:
        outbound_seen = self.messaging.outbound_version
        peers_seen = self.resolver.version
        while True:
            async with trio.open_nursery() as waiters:
                waiters.start_soon(_first_of, waiters, self.messaging.wait_outbound_changed, outbound_seen)
                waiters.start_soon(_first_of, waiters, self.resolver.wait_changed, peers_seen)
            outbound_seen = self.messaging.outbound_version
            peers_seen = self.resolver.version
            wanted = wanted_bridges(self.messaging, self.resolver)
            changes = diff_entries(self._announced, wanted)
            self._announced = wanted
            for message in changes:
                payload = encode_control(message)
                for links in self._notify.values():
                    for link in links:
                        self._post(link, payload)

    def _on_control(
        self, conn: transport.AmqpConnection, message: ControlMessage | UnknownControlMessage
    ) -> None:
        if isinstance(message, QueueQuery):
            self.queries += 1
            log.info("queue query %s from bridge %s", message.query_id, message.bridge_id)
            payload = encode_control(self._snapshot(message.query_id))
            for link in self._notify.get(conn, ()):
                self._post(link, payload)
        elif isinstance(message, UnknownControlMessage):
            log.info("ignored an unknown control message %s", message.descriptor)
        else:
            log.warning("a bridge sent %s, which only a node sends: ignored", type(message).__name__)

    # --- connections -----------------------------------------------------------------------------------

    async def _handle(self, conn: transport.AmqpConnection) -> None:
        self.connections += 1
        inbox = self.messaging.inbox.name
        self._notify[conn] = []
        try:
            async with trio.open_nursery() as nursery:
                async for request in conn.link_requests():
                    address = request.address or ""
                    if request.peer_is_sender and address == inbox:
                        assert self._inbox is not None
                        try:
                            check_inbox_sender(request.attach.snd_settle_mode)
                        except InvalidMessageError as exc:
                            await request.refuse(exc.condition, exc.description)
                            continue
                        receiver = await request.accept_receiver(credit=self.config.credit)
                        nursery.start_soon(self._inbox.pump_link, receiver, None)
                    elif request.peer_is_sender and address == CONTROL_ADDRESS:
                        receiver = await request.accept_receiver(credit=64)
                        nursery.start_soon(self._control_link, conn, receiver)
                    elif not request.peer_is_sender and address == NOTIFY_ADDRESS:
                        sender = await request.accept_sender()
                        send, receive = trio.open_memory_channel[bytes](NOTIFY_BACKLOG)
                        link = _Notify(send, sender)
                        self._notify[conn].append(link)
                        nursery.start_soon(self._notify_link, link, receive)
                    elif not request.peer_is_sender and address.startswith(OUTBOUND_PREFIX):
                        await self._consume(request, address, nursery)
                    else:
                        what = "sender to" if request.peer_is_sender else "receiver from"
                        await request.refuse(
                            "amqp:unauthorized-access",
                            f"local clients may attach a receiver from {OUTBOUND_PREFIX}<key-hash> or "
                            f"{NOTIFY_ADDRESS}, or a sender to {inbox} or {CONTROL_ADDRESS}; "
                            f"not a {what} {address!r}",
                        )
                for link in self._notify[conn]:  # the connection ended: let the notify tasks finish
                    link.send.close()
        finally:
            del self._notify[conn]

    async def _consume(self, request: transport.LinkRequest, name: str, nursery: trio.Nursery) -> None:
        queue = self.messaging.outbound_queues().get(name)
        if queue is None:
            await request.refuse("amqp:not-found", f"no outbound queue {name!r}")
            return
        if name in self._consuming:
            await request.refuse("amqp:resource-locked", f"{name} already has a consumer")
            return
        limit = request.attach.max_message_size
        if limit and limit < self.config.max_message_size:
            # A message above the link's limit would not be sent, and stream_queue dead-letters it for good
            # as a refusal: a local client's setting must not decide that (the network's limit bounds what
            # the node's queues hold; whether a peer takes a message is the peer's link's decision).
            await request.refuse(
                "amqp:precondition-failed",
                f"a consumer of {name} must take messages up to the network's max_message_size of "
                f"{self.config.max_message_size} bytes; this link's max-message-size is {limit}",
            )
            return
        self._consuming.add(name)
        try:
            sender = await request.accept_sender()
        except BaseException:
            self._consuming.discard(name)
            raise
        nursery.start_soon(self._stream, queue, sender)

    async def _stream(self, queue: store.Queue, sender: transport.Sender) -> None:
        name = sender.address or ""
        try:
            # lazy acks, as the in-node bridge's: the peer drops what a crash makes us send again
            consumer_cm = queue.consumer(credit=self.config.credit, lazy_acks=True)
            async with consumer_cm as consumer, trio.open_nursery() as n:
                n.start_soon(_raise_when_detached, sender)
                await stream_queue(
                    consumer, sender, n, dead_letter=self.messaging.dead_letter, queue_name=name
                )
        except* (transport.AmqpTransportError, DeliveryRefusedError) as group:
            log.info("consumer of %s ended: %s", name, logs.failure_text(group))
        finally:
            self._consuming.discard(name)

    async def _control_link(self, conn: transport.AmqpConnection, receiver: transport.Receiver) -> None:
        try:
            async for delivery in receiver:
                try:
                    # (a payload in another message-format is not standard sections: never read as one)
                    check_message_format(delivery.message_format)
                    message = decode_control(delivery.payload)
                except (ControlProtocolError, InvalidMessageError) as exc:
                    log.warning("malformed control message dropped: %s", exc)
                    await delivery.reject(exc.condition, str(exc))
                    continue
                await delivery.accept()  # a no-op for the pre-settled messages bridges send
                self._on_control(conn, message)
        except transport.AmqpTransportError as exc:
            log.info("control link ended: %s", exc)

    async def _notify_link(self, link: _Notify, receive: trio.MemoryReceiveChannel[bytes]) -> None:
        sender = link.sender
        try:
            async with receive:
                with link.scope:
                    async for payload in receive:
                        await sender.start_send(payload, settled=True)
        except transport.AmqpTransportError as exc:
            log.info("notify link ended: %s", exc)
        finally:
            with trio.CancelScope(shield=True):
                await sender.aclose()


async def _raise_when_detached(sender: transport.Sender) -> None:
    raise await sender.wait_detached()
