"""The node's messaging service: send durably towards peers, receive from the inbox, dispatch by topic.

Theory of operation
-------------------
Sending. :meth:`MessagingService.send` turns an :class:`OutgoingMessage` into its wire form (``_model``),
checks its size against the network's ``max_message_size`` and appends it durably to the outbound queue of the
recipient, ``internal.peers.<key-hash>``, declaring that queue on first use (the bridge manager is told, see
:meth:`MessagingService.wait_outbound_changed`, and starts a bridge for it). ``send`` returns once the message
is on disk; from then on the bridge owns it. The outbound queues deliver early
(``store.Broker.declare_queue``): their bridge may send a message while its group commit is still being
synced, which takes that sync off the path of every message. So a crash of the machine may lose a message
that its peer already has, and whose ``send`` did not return; a sender that sends it again with the same
dedup id (the flow framework does) has the copy dropped by the peer. A message to this node itself goes
straight into its own inbox.

Receiving. :meth:`MessagingService.run` consumes the inbox ``p2p.inbound.<own key-hash>`` with one dispatcher
task, so handlers see messages in inbox order per topic (which is send order per sender: bridges and the
acceptor keep it), one handler call at a time. For each message: claim its ``_AMQ_DUPL_ID``, scoped by its
sender (:meth:`MessagingService.dedup_key`), with the :class:`Deduplicator` (a duplicate is acked and
dropped), await its topic's handler, then, in a separate commit task so that the next message can be handled
meanwhile, commit the id (and the handler's receipt) durably and only then ack the inbox message. Commits
and acks are batched: whatever was handled while the previous group commit ran, or within
:data:`COMMIT_HOLD_SECONDS` of the first message waiting, goes into the next one.

No head-of-line blocking: a message whose topic has no handler yet, or whose handler raised, is *parked*
(held, unacked, in memory) with the messages of its topic behind it, and the dispatcher goes on with the
other topics. A second task hands parked messages over, in order, once their topic has a handler and, after a
failure, :data:`HANDLER_RETRY_SECONDS` have passed. Parked messages count against ``inbox_credit``: if that
many are parked, the dispatcher waits (memory stays bounded). So that a topic nobody handles cannot take all
of it (and stop every other topic), at most half of ``inbox_credit`` wait for a handler: more go to
:data:`DEAD_LETTER_QUEUE` (reason ``amqp:not-found``), durably, then are acked from the inbox.
Each is logged as a warning, per sender at most once a minute (the first in full, then a summary counting
the rest: ``corda_trio.logs.PeerWarnings``): a member sending thousands cannot flood the log, nor the store:
the dead letters are bounded (:data:`DEFAULT_DEAD_LETTERS_MAX_MESSAGES`), past the bound each move drops
the oldest one.
An inbox message the dispatcher cannot decode (the acceptor checks what peers send, so this is a local bug or
disk damage) is moved to :data:`DEAD_LETTER_QUEUE` with the reason in its headers, durably, and only then
acked from the inbox: held, it would take inbox credit for good.
Cancellation at any point leaves unacked messages in the inbox: they are handed over again after a restart
unless their id was committed.

Lent credit. A handler may keep a deferred receipt unresolved for a long time: the flow manager's, when the
flow that should consume the message is parked by its hospital until an operator retries or kills it, or when
a session init waits for a draining node to be undrained. Such a message holds a unit of ``inbox_credit`` all
that while, and ``inbox_credit`` of them would stop the inbox for every topic. So the handler *lends* the
inbox consumer a unit for each message it holds so (:meth:`MessagingService.lend_inbox_credit`) and takes it
back when it goes on with the message (:meth:`MessagingService.return_inbox_credit`): the consumer may then
hold ``inbox_credit`` messages being handled plus the lent ones. The lender bounds what it lends (the flow
manager's ``max_parked_messages``). Nothing else changes: the lent messages are still acked only once their
consumption is durable.
"""

from __future__ import annotations

import collections
import logging
import math
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final

import attrs
import trio

from corda_trio import amqp, logs, pki, store

from ._dedupe import DEFAULT_RETAIN, Deduplicator
from ._model import (
    InvalidMessageError,
    OutgoingMessage,
    ReceivedMessage,
    from_amqp,
    inbox_address,
    outbound_queue,
    stamp_validated_user,
    to_amqp,
)
from ._peers import Peer, PeerResolver

__all__ = [
    "DEAD_LETTER_QUEUE",
    "DEFAULT_MAX_MESSAGE_SIZE",
    "HANDLER_RETRY_SECONDS",
    "DeferredReceipt",
    "Handler",
    "HandlerRegistration",
    "MessageTooLargeError",
    "MessagingConfig",
    "MessagingService",
    "UnknownRecipientError",
]

log = logging.getLogger("corda_trio.messaging")

DEFAULT_MAX_MESSAGE_SIZE: Final = 10 * 1024 * 1024
#: Where a bridge puts an outbound message its peer *rejected* (it will never accept it: sending it again
#: would block the queue behind it for ever). Headers: ``<queue name>\n<condition>\n<description>`` (UTF-8).
DEAD_LETTER_QUEUE: Final = "internal.dead-letters"
#: The dead letters kept at most (``MessagingConfig.dead_letters_max_messages`` / ``_max_bytes``): a member
#: that sends messages for a topic nobody handles, for as long as it likes, would otherwise grow the node's
#: store without end. Past either, each move drops the oldest dead letters (acked: nothing reads them; the
#: store's compaction reclaims their space), logged per minute at most, counted by the queue's acks.
DEFAULT_DEAD_LETTERS_MAX_MESSAGES: Final = 10_000
DEFAULT_DEAD_LETTERS_MAX_BYTES: Final = 256 * 1024 * 1024
#: How long a message whose handler raised waits before it is handed over again.
HANDLER_RETRY_SECONDS: Final = 1.0
#: Inbox messages the dispatcher takes between two checkpoints of its own, when they are at hand (handlers
#: that wait checkpoint as they do).
DISPATCH_BURST: Final = 64
#: How long the commit task lets handled messages gather before it commits their ids (one group commit, one
#: ``fdatasync``, for all of them). Handlers do not wait for it, only the inbox acks do. Without the hold, at
#: moderate rates every handled message had a commit of its own, and the inbox's appends, which peers wait
#: for, queued behind those syncs in the commit helper (bench/p2p at 3,000 msg/s: the dedup log's syncs went
#: from ~290/s to ~95/s, and all the receiver's syncs from ~590/s to ~340/s).
COMMIT_HOLD_SECONDS: Final = 0.005
#: How long a stopping service may take to commit the ids of the messages it handled last (see
#: ``MessagingService._commit_loop``).
STOP_COMMIT_SECONDS: Final = 5.0

#: ``async def handler(message) -> bytes | None``: the optional bytes are a receipt committed with the id.
#: A handler may instead return a *deferred receipt*, ``async () -> bytes | None``: the dispatcher goes on
#: with the next message at once, and the commit task awaits it before committing the id and acking (so a
#: handler can make its outcome durable in batches); if it raises, the claim is dropped and the message is
#: redelivered.
DeferredReceipt = Callable[[], Awaitable[bytes | None]]
Handler = Callable[[ReceivedMessage], Awaitable[bytes | DeferredReceipt | None]]


class MessageTooLargeError(ValueError):
    """A message is larger than the network parameter ``max_message_size``."""


class UnknownRecipientError(LookupError):
    """The recipient is not a node known to the network map."""


@attrs.frozen(kw_only=True)
class MessagingConfig:
    """What the messaging service needs to know about its node and the network."""

    legal_name: pki.CordaX500Name
    #: ``pki.key_hash`` of the node's legal identity key (names its inbox).
    key_hash: str
    #: The network parameter ``max_message_size`` (encoded AMQP message, bytes).
    max_message_size: int = attrs.field(default=DEFAULT_MAX_MESSAGE_SIZE, validator=attrs.validators.ge(1))
    platform_version: int = 1
    release_version: str = "0.1.0"
    #: Inbox messages handled or being committed at once.
    inbox_credit: int = attrs.field(default=1024, validator=attrs.validators.ge(1))
    #: fsync policy of the queues this service declares (``None``: the store's default, ``always``).
    fsync: store.FsyncPolicy | str | None = None
    #: Dedup ids remembered at least (see ``Deduplicator``).
    dedup_retain: int = attrs.field(default=DEFAULT_RETAIN, validator=attrs.validators.ge(1))
    #: Dead letters kept at most, in messages and in record bytes (the newest one is always kept);
    #: see :data:`DEFAULT_DEAD_LETTERS_MAX_MESSAGES`.
    dead_letters_max_messages: int = attrs.field(
        default=DEFAULT_DEAD_LETTERS_MAX_MESSAGES, validator=attrs.validators.ge(1)
    )
    dead_letters_max_bytes: int = attrs.field(
        default=DEFAULT_DEAD_LETTERS_MAX_BYTES, validator=attrs.validators.ge(1)
    )

    @property
    def inbox(self) -> str:
        return inbox_address(self.key_hash)


@attrs.frozen(eq=False)
class HandlerRegistration:
    """Returned by :meth:`MessagingService.add_message_handler`; pass it to ``remove_message_handler``."""

    topic: str
    handler: Handler


@attrs.define(eq=False)
class _Parked:
    message_id: int
    message: ReceivedMessage
    #: trio time before which it is not handed over again (after a handler failed on it)
    not_before: float = 0.0


async def _set_then_cancel(event: trio.Event, nursery: trio.Nursery) -> None:
    await event.wait()
    nursery.cancel_scope.cancel()


@attrs.define(eq=False)
class MessagingService:
    """See the module docstring. Build it with :meth:`open`, then run :meth:`run` in a nursery."""

    broker: store.Broker
    config: MessagingConfig
    resolver: PeerResolver
    deduplicator: Deduplicator
    inbox: store.Queue
    sender_uuid: str = attrs.field(factory=lambda: str(uuid.uuid4()))
    _seq: int = 0
    _handlers: dict[str, HandlerRegistration] = attrs.field(factory=dict)
    _handlers_changed: trio.Event = attrs.field(factory=trio.Event)
    _outbound: dict[str, store.Queue] = attrs.field(factory=dict)
    _outbound_version: int = 0
    _outbound_changed: trio.Event = attrs.field(factory=trio.Event)
    _dead_letters: store.Queue | None = None
    #: takes the oldest dead letters off once there are more than the config keeps (see _trim_dead_letters)
    _dead_letter_trimmer: store.Consumer | None = None
    _dead_letter_trim_lock: trio.Lock = attrs.field(factory=trio.Lock)
    _parked: dict[str, collections.deque[_Parked]] = attrs.field(factory=dict)
    _parked_changed: trio.Event = attrs.field(factory=trio.Event)
    _handler_lock: trio.Lock = attrs.field(factory=trio.Lock)
    #: inbox credit lent by handlers holding deferred receipts (see the module docstring), and the inbox
    #: consumer while :meth:`run` runs
    _lent_credit: int = 0
    _inbox_consumer: store.Consumer | None = None
    #: stored inbox payload -> (message as the acceptor decoded it, validated user), see remember_received
    _decoded: collections.OrderedDict[bytes, tuple[amqp.Message, str]] = attrs.field(
        factory=collections.OrderedDict
    )
    #: messages for a topic nobody handles moved to the dead letters: a warning per sender at most once a
    #: minute (a member can send thousands; the dead-letter queue's counters count every one)
    _dead_letter_log: logs.PeerWarnings = attrs.field(
        init=False, factory=lambda: logs.PeerWarnings(log, f"messages from %s moved to {DEAD_LETTER_QUEUE}")
    )
    #: the oldest dead letters dropped to keep the queue within its bounds: a warning a minute at most
    _dead_letter_drop_log: logs.PeerWarnings = attrs.field(
        init=False, factory=lambda: logs.PeerWarnings(log, "more of the oldest messages dropped from %s")
    )
    #: this node's legal name as ``_AMQ_VALIDATED_USER`` carries it (see :meth:`dedup_key`)
    _own_name: str = attrs.field(
        init=False, default=attrs.Factory(lambda self: str(self.config.legal_name), takes_self=True)
    )

    @classmethod
    async def open(
        cls, broker: store.Broker, config: MessagingConfig, resolver: PeerResolver
    ) -> MessagingService:
        """Declare the inbox, load the persisted dedup ids and the existing outbound queues."""
        inbox = await broker.declare_queue(config.inbox, fsync=config.fsync)
        dedup = await Deduplicator.open(broker, retain=config.dedup_retain)
        service = cls(broker=broker, config=config, resolver=resolver, deduplicator=dedup, inbox=inbox)
        for name in broker.list_queues(outbound_queue("")):
            service._outbound[name] = await broker.declare_queue(
                name, fsync=config.fsync, early_delivery=True
            )
        return service

    # --- sending ---------------------------------------------------------------------------------------

    def create_message(
        self,
        topic: str,
        data: bytes,
        *,
        dedup_id: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> OutgoingMessage:
        """A message for :meth:`send`; ``dedup_id`` defaults to a fresh random id (give a deterministic one
        when a replay must be recognised as the same message)."""
        return OutgoingMessage(
            topic=topic, data=data, dedup_id=dedup_id or f"M-{uuid.uuid4()}", headers=dict(headers or {})
        )

    def _resolve(self, recipient: pki.CordaX500Name | Peer | str) -> str:
        if isinstance(recipient, Peer):
            return recipient.key_hash
        if isinstance(recipient, str):  # a key-hash (e.g. of a service identity)
            if recipient == self.config.key_hash or self.resolver.peer(recipient) is not None:
                return recipient
            self.resolver.report_unknown()  # (it may have joined the map since the node last polled it)
            raise UnknownRecipientError(f"no node with identity key-hash {recipient} in the network map")
        if recipient == self.config.legal_name:
            return self.config.key_hash
        peer = self.resolver.peer_named(recipient)
        if peer is None:
            self.resolver.report_unknown()  # (it may have joined the map since the node last polled it)
            # A look-alike of a name in the map is a typo, never a node to come: the map refuses it.
            held = pki.find_confusable(recipient, (p.legal_name for p in self.resolver.peers()))
            hint = f"; did you mean {str(held)!r} (it differs only in case or accents)?" if held else ""
            raise UnknownRecipientError(f"{recipient} is not in the network map{hint}")
        return peer.key_hash

    async def send(self, message: OutgoingMessage, recipient: pki.CordaX500Name | Peer | str) -> None:
        """Store ``message`` durably for ``recipient`` (a legal name, a ``Peer`` or an identity key-hash).

        Returns once the message is durable in the outbound queue (or, for this node itself, its inbox).

        Raises:
            MessageTooLargeError: the encoded message exceeds ``max_message_size``.
            UnknownRecipientError: the recipient is not in the network map.
        """
        await self.send_many([message], recipient)

    async def send_many(
        self, messages: Sequence[OutgoingMessage], recipient: pki.CordaX500Name | Peer | str
    ) -> None:
        """Like :meth:`send` for several messages, in this order, in one group commit (all or none checked
        before anything is stored)."""
        key_hash = self._resolve(recipient)
        to_self = key_hash == self.config.key_hash
        payloads = []
        for message in messages:
            self._seq += 1
            payloads.append(self._encode(message, to_self, self._seq))
        queue = self.inbox if to_self else await self.outbound_queue_for(key_hash)
        if len(payloads) == 1:
            await queue.enqueue(payloads[0])
        elif payloads:
            await queue.enqueue_many(payloads)

    def check_size(self, message: OutgoingMessage, recipient: pki.CordaX500Name | Peer | str) -> None:
        """Raise :class:`MessageTooLargeError` if :meth:`send` would refuse ``message`` for its size: for
        a caller that must know before it commits to sending (a flow, before its checkpoint)."""
        try:
            to_self = self._resolve(recipient) == self.config.key_hash
        except UnknownRecipientError:
            to_self = False
        self._encode(message, to_self, 2**63 - 1)  # (the widest sequence number: an upper bound)

    def _encode(self, message: OutgoingMessage, to_self: bool, seq: int) -> bytes:
        wire = to_amqp(
            message,
            platform_version=self.config.platform_version,
            release_version=self.config.release_version,
            sender_uuid=self.sender_uuid,
            send_seq_no=seq,
        )
        if to_self:
            wire = stamp_validated_user(wire, str(self.config.legal_name))
        payload = wire.encode()
        if len(payload) > self.config.max_message_size:
            raise MessageTooLargeError(
                f"message on topic {message.topic!r} is {len(payload)} bytes encoded, above the "
                f"network's max_message_size of {self.config.max_message_size} bytes"
            )
        return payload

    async def outbound_queue_for(self, key_hash: str) -> store.Queue:
        """The outbound queue towards ``key_hash``, declared on first use."""
        name = outbound_queue(key_hash)
        queue = self._outbound.get(name)
        if queue is None:
            queue = await self.broker.declare_queue(name, fsync=self.config.fsync, early_delivery=True)
            if name not in self._outbound:
                self._outbound[name] = queue
                self._outbound_version += 1
                self._outbound_changed.set()
                self._outbound_changed = trio.Event()
        return queue

    async def dead_letter(
        self,
        queue_name: str,
        consumer: store.Consumer,
        message_id: int,
        payload: bytes,
        condition: str,
        description: str,
    ) -> None:
        """Move a message the peer rejected from ``consumer``'s outbound queue into :data:`DEAD_LETTER_QUEUE`
        (durably, then acked from the outbound queue; a crash between the two leaves a copy in both, which the
        receiver deduplicates if it is ever sent again)."""
        log.error("%s: the peer rejected message %d (%s: %s); moved to %s",
                  queue_name, message_id, condition, description, DEAD_LETTER_QUEUE)  # fmt: skip
        await self._move_to_dead_letters(queue_name, consumer, message_id, payload, condition, description)

    async def _move_to_dead_letters(
        self,
        queue_name: str,
        consumer: store.Consumer,
        message_id: int,
        payload: bytes,
        condition: str,
        description: str,
    ) -> None:
        """Append ``payload`` to :data:`DEAD_LETTER_QUEUE` durably, with the headers
        ``<queue>\\n<condition>\\n<description>`` (UTF-8), then ack it from ``consumer``. A crash between the
        two leaves a copy in both."""
        if self._dead_letters is None:
            self._dead_letters = await self.broker.declare_queue(DEAD_LETTER_QUEUE, fsync=self.config.fsync)
        headers = f"{queue_name}\n{condition}\n{description}".encode()
        await self._dead_letters.enqueue(payload, headers=headers)
        await consumer.ack(message_id)
        await self._trim_dead_letters(self._dead_letters)

    async def _trim_dead_letters(self, queue: store.Queue) -> None:
        """Drop the oldest dead letters while ``queue`` holds more than ``dead_letters_max_messages`` or
        (more than one message) ``dead_letters_max_bytes``: ack them, oldest first, through a consumer of
        its own (one trim at a time)."""
        config = self.config

        def over(stats: store.QueueStatistics) -> bool:
            return stats.depth > config.dead_letters_max_messages or (
                stats.depth > 1 and stats.bytes > config.dead_letters_max_bytes
            )

        if not over(queue.statistics()):
            return
        async with self._dead_letter_trim_lock:
            if self._dead_letter_trimmer is None:
                self._dead_letter_trimmer = queue.consumer(credit=1)
            trimmer = self._dead_letter_trimmer
            while over(stats := queue.statistics()):
                oldest = await trimmer.receive()
                await trimmer.ack(oldest.message_id)
                origin = oldest.headers.decode(errors="replace").split("\n")[:2]
                self._dead_letter_drop_log.warning(
                    DEAD_LETTER_QUEUE, f"message {oldest.message_id} ({': '.join(origin)})",
                    "%s holds %d messages (%d bytes) and keeps at most %d messages and %d bytes: dropped the "
                    "oldest, message %d (%s); the rest of this minute's drops are counted",
                    DEAD_LETTER_QUEUE, stats.depth, stats.bytes, config.dead_letters_max_messages,
                    config.dead_letters_max_bytes, oldest.message_id, ": ".join(origin),
                )  # fmt: skip

    @property
    def outbound_version(self) -> int:
        return self._outbound_version

    def outbound_queues(self) -> dict[str, store.Queue]:
        """Outbound queues by name (``internal.peers.<key-hash>``)."""
        return dict(self._outbound)

    async def wait_outbound_changed(self, since: int) -> int:
        """Wait until an outbound queue was declared after version ``since``; returns the new version."""
        while self._outbound_version <= since:
            await self._outbound_changed.wait()
        return self._outbound_version

    # --- receiving -------------------------------------------------------------------------------------

    def remember_received(
        self, payloads: Sequence[bytes], messages: Sequence[amqp.Message], user: str
    ) -> None:
        """An in-node acceptor's hand-off: ``payloads``, about to be stored in the inbox, decode to
        ``messages`` (checked already) stamped with ``user``; the dispatcher takes them from here instead of
        decoding the same bytes again. Only a cache keyed by the exact stored bytes (so a hit is what
        decoding would give): at most twice ``inbox_credit`` entries, oldest dropped first; a payload not
        found here is decoded as usual."""
        decoded = self._decoded
        for payload, message in zip(payloads, messages, strict=True):
            decoded[payload] = (message, user)
        while len(decoded) > 2 * self.config.inbox_credit:
            decoded.popitem(last=False)

    def _received(self, payload: bytes) -> ReceivedMessage:
        memo = self._decoded.pop(payload, None)
        if memo is None:
            return from_amqp(amqp.Message.decode(payload))
        message, user = memo
        return from_amqp(message, checked=True, validated_user=user)  # the acceptor checked it

    def add_message_handler(self, topic: str, handler: Handler) -> HandlerRegistration:
        """Handle messages on ``topic`` (one handler per topic). Messages wait in the inbox until then.

        Raises:
            ValueError: a handler for ``topic`` is already registered.
        """
        if topic in self._handlers:
            raise ValueError(f"a handler for topic {topic!r} is already registered")
        registration = HandlerRegistration(topic, handler)
        self._handlers[topic] = registration
        self._handlers_changed.set()
        self._handlers_changed = trio.Event()
        return registration

    def remove_message_handler(self, registration: HandlerRegistration) -> None:
        """Stop handling ``registration.topic`` (no-op if it was removed already)."""
        if self._handlers.get(registration.topic) is registration:
            del self._handlers[registration.topic]

    def lend_inbox_credit(self, n: int) -> None:
        """A handler holds ``n`` more deferred receipts that will stay unresolved for a long time (a parked
        flow's messages): let the inbox hand out ``n`` more messages meanwhile (see the module docstring)."""
        if n < 0:
            raise ValueError("lent credit must be >= 0")
        self._lent_credit += n
        if self._inbox_consumer is not None:
            self._inbox_consumer.add_credit(n)

    def return_inbox_credit(self, n: int) -> None:
        """Take back ``n`` units lent with :meth:`lend_inbox_credit` (the handler goes on with those
        messages: they hold ordinary credit again until they are acked).

        Raises:
            ValueError: more than is lent (a caller bug).
        """
        if not 0 <= n <= self._lent_credit:
            raise ValueError(f"cannot return {n} units of inbox credit: {self._lent_credit} are lent")
        self._lent_credit -= n
        if self._inbox_consumer is not None:
            self._inbox_consumer.take_back_credit(n)

    @property
    def lent_inbox_credit(self) -> int:
        """Inbox credit lent by handlers now (:meth:`lend_inbox_credit`)."""
        return self._lent_credit

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Consume the inbox and dispatch to the handlers until cancelled."""
        # (inbox message id, dedup id to commit or None for a duplicate, receipt), in handling order
        done_send, done_receive = trio.open_memory_channel[tuple[int, str | None, bytes]](math.inf)
        credit = self.config.inbox_credit + self._lent_credit
        async with (
            # lazy acks: an inbox message is acked only once its dedup id is durable, so what a crash
            # brings back is dropped as a duplicate; no group commit (and wait) per batch of acks
            self.inbox.consumer(credit=credit, lazy_acks=True) as consumer,
            trio.open_nursery() as commits,
        ):
            self._inbox_consumer = consumer
            try:
                commits.start_soon(self._commit_loop, consumer, done_receive)
                commits.start_soon(self._run_parked, consumer, done_send, commits)
                task_status.started()
                await self._consume(consumer, done_send, commits)
            finally:
                self._inbox_consumer = None

    async def _consume(
        self,
        consumer: store.Consumer,
        done_send: trio.MemorySendChannel[tuple[int, str | None, bytes]],
        commits: trio.Nursery,
    ) -> None:
        async for first in consumer:
            # with the message just received, whatever else is at hand (up to DISPATCH_BURST): one
            # checkpoint for all of them instead of one each
            batch = [first]
            while len(batch) < DISPATCH_BURST:
                try:
                    batch.append(consumer.receive_nowait())
                except trio.WouldBlock:
                    break
            for delivery in batch:
                await self._take_in(consumer, delivery, done_send, commits)

    async def _take_in(
        self,
        consumer: store.Consumer,
        delivery: store.Delivery,
        done: trio.MemorySendChannel[tuple[int, str | None, bytes]],
        commits: trio.Nursery,
    ) -> None:
        """One inbox message: decoded (or moved to the dead letters), deduplicated, dispatched or parked."""
        try:
            message = self._received(delivery.payload)
        except (amqp.DecodeError, InvalidMessageError) as exc:
            # The acceptor validates what peers send: this is a local bug or disk damage. Holding it would
            # eat inbox credit for good: move it aside (durably, then ack it here).
            if isinstance(exc, InvalidMessageError):
                condition, description = exc.condition, exc.description
            else:
                condition, description = "amqp:decode-error", f"malformed message: {exc}"
            log.error("inbox message %d is malformed (%s: %s); moved to %s",
                      delivery.message_id, condition, description, DEAD_LETTER_QUEUE)  # fmt: skip
            await self._move_to_dead_letters(self.inbox.name, consumer, delivery.message_id,
                                             delivery.payload, condition, description)  # fmt: skip
            return
        waiting_room = max(1, self.config.inbox_credit // 2)
        if message.topic not in self._handlers and self._waiting_for_handlers() >= waiting_room:
            # Parked messages hold inbox credit: unbounded, a topic nobody handles (a peer's typo, a newer
            # peer's protocol, a hostile peer) would stop every other topic once inbox_credit of them wait.
            # Past half the credit, they go aside to the dead letters (durably, nothing lost).
            waiting = self._waiting_for_handlers()
            description = f"no handler for topic {message.topic!r}; {waiting} messages already wait for one"
            self._dead_letter_log.warning(
                str(message.validated_user), description,
                "inbox message %d from %s: %s; moved to %s",
                delivery.message_id, message.validated_user, description, DEAD_LETTER_QUEUE,
            )  # fmt: skip
            await self._move_to_dead_letters(self.inbox.name, consumer, delivery.message_id,
                                             delivery.payload, "amqp:not-found", description)  # fmt: skip
            return
        key = self.dedup_key(message)
        # (an id remembered bare from another node was stored before ids were scoped by sender)
        if (key is not message.dedup_id and message.dedup_id in self.deduplicator) or (
            not self.deduplicator.begin(key)
        ):
            log.debug("duplicate %s from %s dropped", message.dedup_id, message.validated_user)
            done.send_nowait((delivery.message_id, None, b""))
            return
        topic = message.topic
        if topic in self._parked or topic not in self._handlers:
            # behind a parked message of its topic, or no handler yet: wait aside, in order
            self._park(topic, _Parked(delivery.message_id, message))
            return
        if not await self._dispatch(consumer, delivery.message_id, message, done, commits):
            retry = _Parked(delivery.message_id, message, trio.current_time() + HANDLER_RETRY_SECONDS)
            self._park(topic, retry)

    def dedup_key(self, message: ReceivedMessage) -> str:
        """The id the :class:`Deduplicator` keeps for ``message``: another node's ``_AMQ_DUPL_ID`` scoped by
        that sender (``<validated user> NUL <id>``), this node's own messages' bare.

        Ids are a sender's business: the flow framework derives them from flow ids, which a client id makes
        predictable. Unscoped, any member of the network could send one first and have the real message
        dropped as its duplicate (a flow between two other nodes then waited for ever).
        """
        user = message.validated_user
        if user is None or user == self._own_name:
            return message.dedup_id
        return f"{user}\x00{message.dedup_id}"

    def _waiting_for_handlers(self) -> int:
        """Messages parked because their topic has no handler (not those whose handler failed)."""
        return sum(len(waiting) for topic, waiting in self._parked.items() if topic not in self._handlers)

    def _park(self, topic: str, parked: _Parked) -> None:
        self._parked.setdefault(topic, collections.deque()).append(parked)
        self._parked_changed.set()
        self._parked_changed = trio.Event()

    async def _dispatch(
        self,
        consumer: store.Consumer,
        message_id: int,
        message: ReceivedMessage,
        done: trio.MemorySendChannel[tuple[int, str | None, bytes]],
        commits: trio.Nursery,
    ) -> bool:
        """Hand a claimed message to its topic's handler; ``False`` if the handler raised (retry later)."""
        registration = self._handlers.get(message.topic)
        if registration is None:
            return False
        lock = self._handler_lock  # handlers run one at a time, as from a single dispatcher
        try:
            lock.acquire_nowait()  # the usual case, without a checkpoint
        except trio.WouldBlock:
            await lock.acquire()
        try:
            receipt = await registration.handler(message)
        except Exception:
            log.exception("handler for topic %r failed on %s; retrying", message.topic, message.dedup_id)
            return False
        finally:
            lock.release()
        key = self.dedup_key(message)
        if callable(receipt):  # a deferred receipt: awaited aside, the next message goes on
            commits.start_soon(self._await_deferred, consumer, message_id, key, receipt, done)
        else:
            done.send_nowait((message_id, key, receipt or b""))
        return True

    async def _run_parked(
        self,
        consumer: store.Consumer,
        done: trio.MemorySendChannel[tuple[int, str | None, bytes]],
        commits: trio.Nursery,
    ) -> None:
        """Hand over parked messages, per topic in order, once their topic has a handler and their retry time
        (after a failed handler) has come; sleep until something changes otherwise."""
        while True:
            handlers_changed, parked_changed = self._handlers_changed, self._parked_changed
            wake = math.inf
            for topic in list(self._parked):
                waiting = self._parked[topic]
                while waiting and topic in self._handlers:
                    head = waiting[0]
                    if head.not_before > trio.current_time():
                        wake = min(wake, head.not_before)
                        break
                    if await self._dispatch(consumer, head.message_id, head.message, done, commits):
                        waiting.popleft()
                    else:
                        head.not_before = trio.current_time() + HANDLER_RETRY_SECONDS
                if not waiting:
                    del self._parked[topic]
            if self._handlers_changed is not handlers_changed or self._parked_changed is not parked_changed:
                continue  # something changed while handlers ran: look again at once
            with trio.move_on_at(wake):
                async with trio.open_nursery() as waiters:
                    waiters.start_soon(_set_then_cancel, handlers_changed, waiters)
                    waiters.start_soon(_set_then_cancel, parked_changed, waiters)

    def parked(self) -> dict[str, int]:
        """Messages waiting aside per topic (no handler yet, or a handler that failed and will be retried)."""
        return {topic: len(waiting) for topic, waiting in self._parked.items()}

    async def _await_deferred(
        self,
        consumer: store.Consumer,
        message_id: int,
        dedup_id: str,
        receipt: DeferredReceipt,
        done: trio.MemorySendChannel[tuple[int, str | None, bytes]],
    ) -> None:
        try:
            outcome = await receipt() or b""
        except Exception as exc:
            # (a group, as from the flow's nursery, is named by its cause: logs.failure_text)
            why = logs.failure_text(exc)
            log.warning("deferred handler outcome of %s failed: %s; redelivering", dedup_id, why)
            self.deduplicator.abandon(dedup_id)
            consumer.release(message_id)
            return
        done.send_nowait((message_id, dedup_id, outcome))

    async def _commit_loop(
        self,
        consumer: store.Consumer,
        done: trio.MemoryReceiveChannel[tuple[int, str | None, bytes]],
    ) -> None:
        """Commit the handled messages' ids (whatever has accumulated, in one group commit), then ack their
        inbox messages (lazily: the acks ride with the inbox's next group commit). An inbox message is acked
        only after its id (and receipt) is durable; a duplicate needs no commit. Cancelled (the service
        stops: the node stops once its flows are drained), it commits and acks what was handled and is not
        committed yet (and what deferred receipts resolved as the stop came hand over), within
        :data:`STOP_COMMIT_SECONDS`, before it ends: what a clean stop leaves behind is
        not handed over again after the restart (a message whose flow finished meanwhile would then be
        refused as one for an unknown session). Past that bound (a stuck store), or killed, those messages
        stay claimed and unacked: redelivered after a restart, and dropped there by their ids or by their
        flows."""
        batch: list[tuple[int, str | None, bytes]] = []
        try:
            async for first in done:
                batch = [first]
                await trio.sleep(COMMIT_HOLD_SECONDS)  # let the messages handled meanwhile share the commit
                batch += _drain(done)
                await self._commit_handled(consumer, batch)
                batch = []
        except trio.Cancelled:
            dedup = self.deduplicator
            with trio.CancelScope(deadline=trio.current_time() + STOP_COMMIT_SECONDS, shield=True):
                while True:
                    # (a deferred receipt resolved as the stop came has its task woken, not run yet: it
                    # hands its id over at this checkpoint, or during the commit, for the next round)
                    await trio.lowlevel.checkpoint()
                    batch += _drain(done)
                    # (cancelled during the commit: what it committed already is not committed twice)
                    batch = [b for b in batch if b[1] is None or dedup.receipt(b[1]) is None]
                    if not batch:
                        break
                    try:
                        await self._commit_handled(consumer, batch)
                    except Exception as exc:
                        # (info: the store's failure, when it is one, is what the node stops with and says in
                        # its one line; nothing is lost, and this is no second error for the operator)
                        log.info("stopping: the ids of %d handled messages were not committed (%s); "
                                 "they will be handed over again", len(batch), exc)  # fmt: skip
                        break
                    batch = []
            raise

    async def _commit_handled(
        self, consumer: store.Consumer, batch: list[tuple[int, str | None, bytes]]
    ) -> None:
        items = [(dedup_id, receipt) for _, dedup_id, receipt in batch if dedup_id is not None]
        if items:
            await self.deduplicator.commit_many(items)
        # lazy (the acks ride with the inbox's next group commit), after the hold's checkpoint
        consumer.ack_many_nowait([message_id for message_id, _, _ in batch])


def _drain(channel: trio.MemoryReceiveChannel[Any]) -> list[Any]:
    """Everything ``channel`` holds right now."""
    out = []
    while True:
        try:
            out.append(channel.receive_nowait())
        except (trio.WouldBlock, trio.EndOfChannel):
            return out
