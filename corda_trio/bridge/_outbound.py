"""One bridge: moves a peer's durable outbound queue ``internal.peers.<key-hash>`` into its inbox.

Theory of operation
-------------------
``Bridge.run`` loops forever (its owner cancels it):

1. Resolve the peer by the queue's key-hash through the :class:`~corda_trio.messaging.PeerResolver`; an
   unknown peer or one without addresses waits for the next change.
2. Pick the next address round-robin, skipping *parked* ones (an address whose TLS identity check failed
   is parked for ``parked_retry_seconds`` and then tried again); dial it over mutual TLS, requiring the peer's
   TLS subject to be the legal name the map gives for the key-hash. A completed AMQP handshake resets the
   backoff. A handshake refused for a certificate's dates (expired, or not valid yet: clock skew, a renewed
   certificate) is no identity failure: it is retried with the backoff of step 4, not parked.
3. Attach one sender to ``p2p.inbound.<key-hash>`` and stream: a store consumer hands out queued messages (at
   most ``credit`` unacknowledged at once), each is sent unsettled as soon as the link has credit, and a
   settle task per message waits for the peer's outcome: ``accepted`` acks it in the WAL, anything else
   (rejected, released, modified, no state) ends the session with :class:`DeliveryRefusedError`.
4. Any failure (dial, TLS, link or connection loss, refusal, a change of the peer's addresses) ends the
   session; leaving the consumer releases every message still held, in order, so they are sent again (the
   receiver deduplicates). Then wait ``Backoff.next_delay()`` and go to 1. A peer that stays away is logged
   by a :class:`corda_trio.logs.Outage`: its first failure, then a line a minute at most, and one when it is
   back. A failure names what failed: ``could not connect to HOST:PORT`` for an attempt that never completed
   its TLS and AMQP handshake, ``session with HOST:PORT ended`` for a session that was up.

Cancellation at any checkpoint is the same as a failure: nothing is acked unless its ``accepted`` arrived.
"""

from __future__ import annotations

import collections
import enum
import logging
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Final, Protocol

import attrs
import trio

from corda_trio import amqp, hostport, logs, pki, store, transport
from corda_trio.messaging import Peer, PeerResolver, inbox_address, key_hash_of_address

from ._backoff import INITIAL_BACKOFF_SECONDS, MAX_BACKOFF_SECONDS, Backoff

__all__ = [
    "Bridge",
    "BridgeConfig",
    "BridgeState",
    "DeadLetter",
    "DeliveryRefusedError",
    "OutboundConsumer",
    "OutboundSource",
    "PeerChangedError",
    "stream_queue",
]

log = logging.getLogger("corda_trio.bridge")

#: Deliveries a bridge keeps unacknowledged at once (also bounded by the peer's link credit).
DEFAULT_BRIDGE_CREDIT: Final = 256
#: Messages a bridge takes from its queue and sends between two checkpoints, when they are at hand.
BURST_MESSAGES: Final = 64


class QueuedMessage(Protocol):
    @property
    def message_id(self) -> int: ...

    @property
    def payload(self) -> bytes: ...


class OutboundConsumer(Protocol):
    """What a bridge consumes: ``store.Consumer`` in the node, a link from the node's endpoint outside it.
    Leaving it (``async with``) puts every message not acked back in the queue, in order."""

    def __aiter__(self) -> AsyncIterator[Any]: ...

    def receive_nowait(self) -> Any:
        """The next message if one is at hand now (not a checkpoint), else raise ``trio.WouldBlock``."""

    async def ack_many(self, message_ids: Sequence[int]) -> None: ...

    def ack_many_nowait(self, message_ids: Sequence[int]) -> object:
        """``ack_many`` without a checkpoint, for a caller that has just passed one (the acks are not
        awaited: a lazy consumer's)."""


class OutboundSource(Protocol):
    """An outbound queue ``internal.peers.<key-hash>`` as a bridge sees it (``store.Queue`` or remote)."""

    @property
    def name(self) -> str: ...

    def consumer(self, *, credit: int, lazy_acks: bool = False) -> AbstractAsyncContextManager[Any]: ...


#: ``async dead_letter(queue name, consumer, message id, payload, condition, description)``: take a message
#: the peer *rejected* out of the queue for good (see ``MessagingService.dead_letter``), so that the messages
#: behind it keep flowing. Without one, a rejection ends the session like any other refusal.
DeadLetter = Callable[[str, Any, int, bytes, str, str], Awaitable[None]]


class DeliveryRefusedError(Exception):
    """The peer settled a message with something other than ``accepted``."""


class PeerChangedError(Exception):
    """The peer's addresses changed or it left the network map: reconnect."""


class BridgeState(enum.Enum):
    RESOLVING = "resolving"
    CONNECTING = "connecting"
    CONNECTED = "connected"
    BACKING_OFF = "backing-off"


@attrs.frozen(kw_only=True)
class BridgeConfig:
    """Tuning shared by the bridges of a node."""

    credit: int = attrs.field(default=DEFAULT_BRIDGE_CREDIT, validator=attrs.validators.ge(1))
    initial_backoff_seconds: float = INITIAL_BACKOFF_SECONDS
    max_backoff_seconds: float = MAX_BACKOFF_SECONDS
    backoff_jitter: float = 0.2
    #: How long an address whose TLS identity check failed is left alone.
    parked_retry_seconds: float = 300.0
    handshake_timeout_seconds: float = transport.DEFAULT_HANDSHAKE_TIMEOUT_SECONDS
    #: How long a peer may send no frame before its connection is closed (advertised to it halved): node.toml
    #: and bridge.toml ``[p2p] idle_timeout_seconds``. Not used when ``amqp_config`` is given.
    idle_timeout_seconds: float = transport.DEFAULT_IDLE_TIMEOUT_SECONDS
    #: AMQP settings of the bridge's connections (``None``: the engine's defaults, SASL PLAIN
    #: ``SystemUsers/Peer``, with ``idle_timeout_seconds``).
    amqp_config: amqp.ConnectionConfig | None = None
    #: Prepended to the peer's inbox address: ``""`` for corda-trio peers; e.g. ``"/queue/"`` when the
    #: "peer" is a broker such as RabbitMQ that names queues that way.
    target_prefix: str = ""
    #: Dial peers through this SOCKS5 / SOCKS4 proxy (``None``: directly).
    proxy: transport.SocksProxy | None = None


def _is_identity_failure(exc: BaseException) -> bool:
    """A TLS handshake refused for the peer's identity (wrong root, wrong name), not a network failure:
    ``exc``, what caused it, or any leaf of a group among them (a session's nursery groups the failures of
    its tasks, several at once when they fail together).

    A refusal for a certificate's dates (the peer's expired or not valid yet by our clock, or ours by the
    peer's) is not one: that peer may be accepted seconds later (a clock put right, a renewed certificate
    becoming valid), so it is retried with the usual backoff like an unreachable peer, not parked."""
    todo, seen = [exc], set()
    while todo:
        current = todo.pop()
        if id(current) in seen:  # (a chain of contexts can loop)
            continue
        seen.add(id(current))
        if isinstance(current, ssl.SSLError) and transport.is_certificate_date_failure(current):
            continue
        if isinstance(current, pki.PeerIdentityError | ssl.SSLCertVerificationError):
            return True
        if isinstance(current, ssl.SSLError) and "CERTIFICATE" in str(current).upper():
            return True
        if isinstance(current, BaseExceptionGroup):
            todo.extend(current.exceptions)
        cause = current.__cause__ or current.__context__
        if cause is not None:
            todo.append(cause)
    return False


def _failure_unless_cancelled(raised: BaseException) -> BaseException:
    """The failure a session ended with; re-raises if the bridge itself is being cancelled.

    A session's tasks can fail at the moment the bridge is cancelled (say, the peer left the map, which both
    stops the bridge and makes its watcher raise): the group then holds ``Cancelled`` *and* an ``Exception``.
    Cancellation wins; the other errors are only logged, so that nothing but ``Cancelled`` reaches the
    cancel scope of the owner (which would otherwise let the error through and crash the manager).
    """
    if isinstance(raised, BaseExceptionGroup):
        cancelled, rest = raised.split(trio.Cancelled)
        if cancelled is not None:
            if rest is not None:
                log.debug("errors while the bridge was cancelled: %r", rest)
            leaf: BaseException = cancelled
            while isinstance(leaf, BaseExceptionGroup):
                leaf = leaf.exceptions[0]
            raise leaf from None
        assert rest is not None
        while isinstance(rest, BaseExceptionGroup) and len(rest.exceptions) == 1:
            rest = rest.exceptions[0]
        if not isinstance(rest, Exception | ExceptionGroup):
            raise raised
        return rest
    if not isinstance(raised, Exception):
        raise raised
    return raised


@attrs.define(eq=False)
class Bridge:
    """See the module docstring."""

    queue: OutboundSource | store.Queue
    resolver: PeerResolver
    #: The node's client context (mutual TLS, trust anchored in the network root). ``None`` dials plain TCP
    #: without the identity check: only for a local broker standing in for a peer (interop tests).
    ssl_context: ssl.SSLContext | None
    config: BridgeConfig = attrs.field(factory=BridgeConfig)
    backoff: Backoff | None = None
    #: Where a message the peer rejected goes (``None``: a rejection ends the session and it is sent again).
    dead_letter: DeadLetter | None = None
    state: BridgeState = BridgeState.RESOLVING
    #: Counters: sessions established, messages acked after ``accepted``, sessions that ended in failure.
    connects: int = 0
    delivered: int = 0
    failures: int = 0
    last_error: str | None = None
    _next_address: int = 0
    _parked: dict[tuple[str, int], float] = attrs.field(factory=dict)
    _connected: trio.Event = attrs.field(factory=trio.Event)
    #: whether the current attempt completed its TLS and AMQP handshake (a session was up)
    _session_up: bool = False
    #: a peer away for hours: its first failure logged, then a line a minute at most, and one when it is back
    _outage: logs.Outage = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._outage = logs.Outage(log, f"bridge {self.queue.name}", level=logging.INFO)
        if self.backoff is None:
            c = self.config
            self.backoff = Backoff(c.initial_backoff_seconds, c.max_backoff_seconds, c.backoff_jitter)

    @property
    def key_hash(self) -> str:
        return key_hash_of_address(self.queue.name)

    def parked(self) -> dict[tuple[str, int], float]:
        """Parked addresses and the trio time at which each is tried again."""
        return dict(self._parked)

    async def wait_connected(self) -> None:
        """Wait until the next session is established (for tests and status)."""
        await self._connected.wait()

    def _pick(self, peer: Peer) -> tuple[str, int] | float:
        """The next address to dial, or the trio time at which a parked one may be tried."""
        now = trio.current_time()
        addresses = peer.addresses
        for step in range(len(addresses)):
            address = addresses[(self._next_address + step) % len(addresses)]
            if self._parked.get(address, 0.0) <= now:
                self._parked.pop(address, None)
                self._next_address = (self._next_address + step + 1) % len(addresses)
                return address
        return min(self._parked[a] for a in addresses)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Deliver the queue to the peer until cancelled (never returns)."""
        assert self.backoff is not None
        task_status.started()
        version = -1
        while True:
            self.state = BridgeState.RESOLVING
            peer = self.resolver.peer(self.key_hash)
            if peer is None or not peer.addresses:
                version = await self.resolver.wait_changed(max(version, self.resolver.version))
                continue
            picked = self._pick(peer)
            if isinstance(picked, float):
                await trio.sleep_until(picked)
                continue
            self._session_up = False
            try:
                await self._session(peer, picked)
            except BaseException as raised:
                exc = _failure_unless_cancelled(raised)
                self.failures += 1
                self.last_error = logs.failure_text(exc)
                if isinstance(exc, PeerChangedError):
                    log.info("bridge %s: %s", self.queue.name, exc)
                    continue  # reconnect to the new address at once
                if _is_identity_failure(exc):
                    self._parked[picked] = trio.current_time() + self.config.parked_retry_seconds
                    log.warning(
                        "bridge %s: %s failed the TLS identity check for %s, parked for %.0f s: %s",
                        self.queue.name, hostport.host_port_text(*picked), peer.legal_name,
                        self.config.parked_retry_seconds, self.last_error,
                    )  # fmt: skip
                else:
                    where = hostport.host_port_text(*picked)
                    # an attempt that never completed its handshake had no session to end
                    what = "session with %s ended" if self._session_up else "could not connect to %s"
                    self._outage.failed(
                        f"{where}: {self.last_error}",
                        f"bridge %s: {what}: %s", self.queue.name, where, self.last_error,
                    )  # fmt: skip
            self.state = BridgeState.BACKING_OFF
            await trio.sleep(self.backoff.next_delay())

    async def _session(self, peer: Peer, address: tuple[str, int]) -> None:
        assert self.backoff is not None
        self.state = BridgeState.CONNECTING
        expected = peer.legal_name
        async with transport.open_amqp_connection(
            address[0],
            address[1],
            ssl_context=self.ssl_context,
            peer_check=(lambda tls: pki.check_peer_legal_name(tls, expected)) if self.ssl_context else None,
            config=self.config.amqp_config
            or amqp.ConnectionConfig(
                idle_timeout_ms=transport.idle_timeout_ms(self.config.idle_timeout_seconds)
            ),
            handshake_timeout=self.config.handshake_timeout_seconds,
            proxy=self.config.proxy,
        ) as conn:
            self._session_up = True
            self.backoff.reset()
            self._outage.connected()
            sender = await conn.open_sender(self.config.target_prefix + inbox_address(peer.key_hash))
            self.state = BridgeState.CONNECTED
            self.connects += 1
            self._connected.set()
            self._connected = trio.Event()
            async with (
                # lazy acks: a crash may send again what the peer accepted last, which it drops as a
                # duplicate; no group commit (and wait) per batch of acks
                self.queue.consumer(credit=self.config.credit, lazy_acks=True) as consumer,
                trio.open_nursery() as nursery,
            ):
                nursery.start_soon(self._watch_connection, conn)
                nursery.start_soon(self._watch_peer, peer, address)
                await stream_queue(
                    consumer,
                    sender,
                    nursery,
                    self._count_delivered,
                    dead_letter=self.dead_letter,
                    queue_name=self.queue.name,
                )

    def _count_delivered(self, count: int) -> None:
        self.delivered += count

    async def _watch_connection(self, conn: transport.AmqpConnection) -> None:
        await conn.wait_closed()
        raise conn.close_error or transport.AmqpConnectionError("the connection ended")

    async def _watch_peer(self, peer: Peer, address: tuple[str, int]) -> None:
        version = self.resolver.version
        while True:
            version = await self.resolver.wait_changed(version)
            now = self.resolver.peer(peer.key_hash)
            if now is None or address not in now.addresses or now.legal_name != peer.legal_name:
                raise PeerChangedError(
                    f"{peer.legal_name} is no longer reachable at {hostport.host_port_text(*address)}"
                )


async def stream_queue(
    consumer: OutboundConsumer | store.Consumer,
    sender: transport.Sender,
    nursery: trio.Nursery,
    acked: Callable[[int], None] | None = None,
    dead_letter: DeadLetter | None = None,
    queue_name: str = "",
) -> None:
    """Send what ``consumer`` hands out, each unsettled as soon as ``sender`` has credit, and ack in the
    queue what the peer settles ``accepted``. Used by the bridges and by the node's local endpoint.

    One settling task (started in ``nursery``) takes the sent messages in order: it waits for the oldest
    one's outcome, then takes every following one already settled too, and acks them all with one
    ``ack_many`` (one group commit) before calling ``acked(count)``. Any outcome other than ``accepted`` (or
    the link failing) raises :class:`DeliveryRefusedError` (or the transport's error), which ends the nursery:
    the caller's consumer then puts back whatever was not acked, in order. With ``dead_letter``, a
    ``rejected`` message (the peer will never take it) is handed to it instead, after the messages before it
    were acked, and streaming goes on.
    """
    sent: collections.deque[tuple[int, transport.PendingDelivery | _RefusedHere, bytes]] = collections.deque()
    more = _Signal()
    nursery.start_soon(_settle_in_order, consumer, sent, more, acked, dead_letter, queue_name)
    send = sender.send_nowait
    receive_nowait = consumer.receive_nowait
    async for first in consumer:
        # with the message just received, whatever else is at hand (up to BURST_MESSAGES): one checkpoint
        # for all of them instead of one each; their frames leave in one write when this task next blocks
        batch = [first]
        while len(batch) < BURST_MESSAGES:
            try:
                batch.append(receive_nowait())
            except trio.WouldBlock:
                break
        for delivery in batch:
            try:
                try:
                    pending: transport.PendingDelivery | _RefusedHere = send(delivery.payload)
                except trio.WouldBlock:
                    pending = await sender.start_send(delivery.payload)  # type: ignore[assignment]
            except transport.AmqpTransportError as exc:
                # Larger than the max-message-size the peer advertised on the link: it would refuse it, so
                # it is not sent; like a rejection it goes to the dead letters in its turn (without one: the
                # session ends, as for any refusal).
                if exc.condition != _SIZE_EXCEEDED or dead_letter is None:
                    raise
                pending = _RefusedHere(str(exc))
            assert pending is not None
            sent.append((delivery.message_id, pending, delivery.payload))
        more.set()


_SIZE_EXCEEDED: Final = "amqp:link:message-size-exceeded"


@attrs.define(eq=False)
class _RefusedHere:
    """A message the link refused before sending (larger than the peer's max-message-size), standing in
    for a delivery the peer rejected with that condition."""

    description: str
    settled: bool = True
    error: None = None

    @property
    def state(self) -> amqp.Rejected:
        error = amqp.ErrorCondition(condition=amqp.Symbol(_SIZE_EXCEEDED), description=self.description)
        return amqp.Rejected(error=error)

    async def outcome(self) -> amqp.Rejected:
        return self.state


@attrs.define(eq=False)
class _Signal:
    """A re-armable event: ``set`` wakes the waiter, if any (cheaper than a new ``trio.Event`` each time)."""

    _event: trio.Event | None = None

    def set(self) -> None:
        if self._event is not None:
            self._event.set()
            self._event = None

    async def wait(self) -> None:
        if self._event is None:
            self._event = trio.Event()
        await self._event.wait()


async def _settle_in_order(
    consumer: OutboundConsumer | store.Consumer,
    sent: collections.deque[tuple[int, transport.PendingDelivery | _RefusedHere, bytes]],
    more: _Signal,
    acked: Callable[[int], None] | None,
    dead_letter: DeadLetter | None,
    queue_name: str,
) -> None:
    while True:
        while not sent:
            await more.wait()
        await sent[0][1].outcome()  # raises if the link or connection failed first
        ids = []
        while sent and (sent[0][1].settled or sent[0][1].error is not None):
            message_id, pending, payload = sent[0]
            outcome: Any = await pending.outcome() if not pending.settled else pending.state
            if isinstance(outcome, amqp.Accepted):
                ids.append(message_id)
                sent.popleft()
                continue
            if not isinstance(outcome, amqp.Rejected) or dead_letter is None:
                raise DeliveryRefusedError(f"message {message_id} was settled with {outcome!r}, not accepted")
            if ids:  # in order: what came before it first
                await consumer.ack_many(ids)
                if acked is not None:
                    acked(len(ids))
                ids = []
            error = outcome.error
            condition = str(error.condition) if error is not None else "amqp:internal-error"
            description = (error.description or "") if error is not None else "rejected without an error"
            await dead_letter(queue_name, consumer, message_id, payload, condition, description)
            sent.popleft()
        if ids:
            # lazy acks (the consumer is made so), just after the wait for the outcome: no checkpoint of
            # their own (one task step less per batch, at light load per message)
            consumer.ack_many_nowait(ids)
            if acked is not None:
                acked(len(ids))
