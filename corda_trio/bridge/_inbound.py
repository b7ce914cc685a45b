"""The inbound acceptor: the node's AMQP 1.0 server on its P2P address.

Theory of operation
-------------------
``serve_amqp`` runs TLS with a required client certificate anchored in the network root, then
``pki.check_peer_is_network_node`` (the leaf has the TLS role and a legal name); its subject becomes the
connection's validated user. Per connection, link requests are answered: a sender attaching to this node's own
inbox gets a receiving link with ``credit``; anything else is refused with ``amqp:unauthorized-access`` and a
description naming the one allowed address, and a sender in snd-settle-mode ``settled`` (pre-settled,
at-most-once transfers, which no outcome reaches) with ``amqp:not-implemented``
(``messaging.check_inbox_sender``).

Per accepted link one task takes whatever has arrived on the link (in order), validates each message
(transfer message-format 0, decodable, required headers, size at most ``max_message_size``,
``_AMQ_VALIDATED_USER`` absent or equal to the TLS subject), rejects the bad ones with their condition (the
link stays up), stamps ``_AMQ_VALIDATED_USER`` on the good ones and appends them to the inbox in one group
commit; only when that returns, i.e. the batch is durable, are they settled ``accepted``. In the node,
``on_checked`` (``MessagingService.remember_received``) is given each batch's decoded messages just before the
append, so that the dispatcher does not decode the same bytes a second time. Order is kept: one
writer per link, batches in arrival order. Flow control: the engine grants credit again only as deliveries are
taken from the link, and the writer takes them only as fast as the inbox commits, so a slow disk slows the
peers instead of growing memory (at most ``credit`` messages per link in memory, plus what a peer overruns
within the engine's bound).

The same writer serves the node's local endpoint when the bridge runs in its own process
(:meth:`InboundAcceptor.pump_link` with ``user=None``): there the out-of-process acceptor has checked and
stamped each message already, the writer checks it again (required headers, size, a validated user present)
and stores it unchanged. ``inbox`` is anything with a ``name`` and an ``enqueue_many`` that returns once
durable: the store's queue in the node, a link to the node's endpoint in a bridge process. The float's tunnel
stores what its float forwards with the same writer (:func:`take_arrivals`, :func:`store_checked`) and a
check of its own.

A rejected message, and a refused link, is logged as a warning per source at most once a minute (the first
in full, then a summary counting the rest: ``corda_trio.logs.PeerWarnings``; a burst of refused links that
stops gets its summary once its minute is over), so a member sending thousands of bad messages or attaching
thousands of links to other addresses cannot flood the log; the acceptor's statistics count every one
(``rejected``, ``refused_links``).

An inbox that cannot take a batch (in a bridge process: the node's endpoint is gone, the node stopped, its
disk full, say) does not leave the batch unsettled on a link nobody reads any more: the peer's connection
stays up, so its bridge would wait for the outcomes for ever, also once the node is back. The batch is
settled ``released`` (the peer keeps every message and sends it again: its bridge ends the session, backs
off and reconnects) and the link is closed; a warning per peer at most once a minute says so.

Cancellation at any checkpoint leaves unsettled deliveries unsettled: the sender sends them again.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable, Sequence
from typing import Final, Protocol

import attrs
import trio

from corda_trio import amqp, logs, pki, store, transport
from corda_trio.messaging import (
    DEFAULT_MAX_MESSAGE_SIZE,
    HEADER_VALIDATED_USER,
    InvalidMessageError,
    check_inbox_sender,
    check_message_format,
    check_p2p_message,
    stamped_payload,
)

__all__ = [
    "AcceptorConfig",
    "CheckDelivery",
    "InboundAcceptor",
    "Inbox",
    "OnChecked",
    "RetryLaterError",
    "store_checked",
    "take_arrivals",
    "tally",
]

log = logging.getLogger("corda_trio.bridge.inbound")

DEFAULT_INBOUND_CREDIT: Final = 256


class Inbox(Protocol):
    """Where accepted messages go: ``store.Queue`` in the node, the endpoint's inbox link in a bridge."""

    @property
    def name(self) -> str: ...

    async def enqueue_many(self, payloads: Sequence[bytes]) -> object:
        """Append in this order; return once durable (raise if not)."""


#: ``check(payload) -> (sender, message as decoded, payload to store)``, or ``InvalidMessageError`` with the
#: condition to reject the delivery with. ``sender`` is the legal name to count and hand over with the
#: message, ``None`` when not known here (a local bridge's already stamped message).
CheckDelivery = Callable[[bytes], tuple[str | None, amqp.Message, bytes]]
#: Told each run of consecutive checked messages of one sender just before they are appended to the inbox
#: (the payloads to store, the messages as decoded, the sender): ``MessagingService.remember_received``.
OnChecked = Callable[[Sequence[bytes], Sequence[amqp.Message], str], None]


class RetryLaterError(Exception):
    """Raised by a :data:`CheckDelivery`: the delivery cannot be taken now but may be later (its claimed
    sender is not in this node's network map yet). It is settled ``released``, not ``rejected``: the sender
    keeps the message and sends it again."""


async def take_arrivals(receiver: transport.Receiver) -> list[transport.Delivery]:
    """The next delivery on ``receiver`` (waiting for it) and whatever else has arrived meanwhile, in order.

    Raises:
        trio.EndOfChannel: the link ended with nothing left to take.
    """
    batch = [await receiver.receive()]
    while True:
        try:
            batch.append(receiver.receive_nowait())
        except (trio.WouldBlock, trio.EndOfChannel):
            return batch


async def store_checked(
    receiver: transport.Receiver,
    batch: Sequence[transport.Delivery],
    inbox: Inbox | store.Queue,
    check: CheckDelivery,
    on_checked: OnChecked | None,
    who: str,
    rejected_log: logs.PeerWarnings,
) -> tuple[dict[str | None, int], int, int]:
    """Check each delivery of ``batch`` (its transfer's message-format must be 0, the standard AMQP message:
    ``messaging.check_message_format``; then ``check``), reject the bad ones with their condition (the link
    stays up), release those the check says may be taken later (:class:`RetryLaterError`), append the good
    ones to ``inbox`` in one group commit and, only once that is durable, settle them ``accepted``.

    Returns (messages stored by sender, messages rejected, messages released). ``who`` names the source in
    the log; each rejection goes to ``rejected_log`` (see :func:`rejected_messages_log`), which bounds the
    lines per source.
    """
    good: list[transport.Delivery] = []
    payloads: list[bytes] = []
    checked: list[tuple[str | None, amqp.Message]] = []
    rejected = released = 0
    for delivery in batch:
        try:
            check_message_format(delivery.message_format)
            sender, message, payload = check(delivery.payload)
        except InvalidMessageError as exc:
            rejected += 1
            rejected_log.warning(who, exc.description, "%s: rejected a message: %s", who, exc.description)
            await delivery.reject(exc.condition, exc.description)
            continue
        except RetryLaterError:
            released += 1  # (the check says why, as often as it sees fit)
            await delivery.release()
            continue
        good.append(delivery)
        payloads.append(payload)
        checked.append((sender, message))
    stored: dict[str | None, int] = {}
    if good:
        run = 0
        for i in range(1, len(payloads) + 1):  # per run of consecutive messages of one sender
            if i == len(payloads) or checked[i][0] != checked[run][0]:
                sender = checked[run][0]
                if on_checked is not None and sender is not None:
                    on_checked(payloads[run:i], [m for _, m in checked[run:i]], sender)
                stored[sender] = stored.get(sender, 0) + i - run
                run = i
        await inbox.enqueue_many(payloads)
        # no checkpoint of its own: the caller's next wait for deliveries is one (one task step less per
        # batch, which at light load is per message)
        receiver.settle_many_nowait(good, amqp.Accepted())
    return stored, rejected, released


def rejected_messages_log() -> logs.PeerWarnings:
    """The log of messages :func:`store_checked` rejects: a warning per source at most once a minute."""
    return logs.PeerWarnings(log, "messages from %s rejected")


def ended_links_log(logger: logging.Logger = log) -> logs.PeerWarnings:
    """The log of a member's links that ended with an error (its connection dropped without a close, a
    reset): a member whose process dies in a loop can end them at will, so an info line per member at most
    once a minute, the rest at debug and counted into a summary."""
    return logs.PeerWarnings(logger, "links from %s ended with an error", level=logging.INFO)


def tally(stored: dict[str | None, int], by_peer: dict[str, int]) -> int:
    """Add what :func:`store_checked` stored to the counts ``by_peer`` (known senders); returns the total."""
    for sender, n in stored.items():
        if sender is not None:
            by_peer[sender] = by_peer.get(sender, 0) + n
    return sum(stored.values())


@attrs.frozen(kw_only=True)
class AcceptorConfig:
    """Where and how the acceptor listens."""

    host: str = "127.0.0.1"
    port: int = 0
    credit: int = attrs.field(default=DEFAULT_INBOUND_CREDIT, validator=attrs.validators.ge(1))
    max_message_size: int = attrs.field(default=DEFAULT_MAX_MESSAGE_SIZE, validator=attrs.validators.ge(1))
    handshake_timeout_seconds: float = transport.DEFAULT_HANDSHAKE_TIMEOUT_SECONDS
    #: How long a peer may send no frame before its connection is closed (advertised to it halved).
    idle_timeout_seconds: float = transport.DEFAULT_IDLE_TIMEOUT_SECONDS
    #: Connections served at once, handshakes included (``transport.serve_amqp``); one more is closed.
    max_connections: int = attrs.field(
        default=transport.DEFAULT_MAX_CONNECTIONS, validator=attrs.validators.ge(1)
    )


@attrs.define(eq=False)
class InboundAcceptor:
    """See the module docstring. ``await nursery.start(acceptor.run)``; then :attr:`port` is bound."""

    inbox: Inbox | store.Queue
    #: ``None`` only for an acceptor used through :meth:`pump_link` by the local endpoint (never served).
    ssl_context: ssl.SSLContext | None
    config: AcceptorConfig = attrs.field(factory=AcceptorConfig)
    port: int | None = None
    #: In the node: ``MessagingService.remember_received``, told each batch about to be stored (the stamped
    #: payloads, the messages as decoded and checked here, the user): the dispatcher need not decode again.
    on_checked: OnChecked | None = None
    #: Counters: messages stored and accepted, messages rejected, links refused.
    accepted: int = 0
    rejected: int = 0
    refused_links: int = 0
    #: Messages stored and accepted, by the sending peer's legal name (the TLS subject).
    accepted_by_peer: dict[str, int] = attrs.field(factory=dict)
    #: Connections refused before they were served (failed TLS handshake, a certificate of another network, an
    #: AMQP protocol violation ...), by reason: ``transport.InboundRefusals``.
    refusals: transport.InboundRefusals = attrs.field(factory=transport.InboundRefusals, init=False)
    _rejected_log: logs.PeerWarnings = attrs.field(factory=rejected_messages_log, init=False)
    #: a peer's bridge comes back after each backoff while the node is away: a warning per peer a minute
    _released_log: logs.PeerWarnings = attrs.field(
        factory=lambda: logs.PeerWarnings(log, "links from %s closed, the inbox unavailable"), init=False
    )
    #: a member can attach thousands of links to other addresses: a warning per member a minute
    _refused_log: logs.PeerWarnings = attrs.field(
        factory=lambda: logs.PeerWarnings(log, "links from %s refused"), init=False
    )
    _ended_log: logs.PeerWarnings = attrs.field(factory=ended_links_log, init=False)

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; reports the bound port through ``task_status``."""
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(
                lambda task_status: transport.serve_amqp(
                    self._handle,
                    self.config.port,
                    host=self.config.host,
                    ssl_context=self.ssl_context,
                    peer_check=pki.check_peer_is_network_node,
                    config=amqp.ConnectionConfig(
                        sasl_mechanisms=transport.SERVER_SASL_MECHANISMS,
                        idle_timeout_ms=transport.idle_timeout_ms(self.config.idle_timeout_seconds),
                    ),
                    handshake_timeout=self.config.handshake_timeout_seconds,
                    max_connections=self.config.max_connections,
                    refusals=self.refusals,
                    task_status=task_status,
                )
            )
            self.port = transport.listener_port(listeners)
            # a burst that stops gets its count too
            nursery.start_soon(self._refused_log.report_due)
            nursery.start_soon(self._ended_log.report_due)
            task_status.started(self.port)

    async def _handle(self, conn: transport.AmqpConnection) -> None:
        user = str(conn.peer_identity)
        inbox = self.inbox.name
        async with trio.open_nursery() as nursery:
            async for request in conn.link_requests():
                if not request.peer_is_sender or request.address != inbox:
                    what = "sender to" if request.peer_is_sender else "receiver from"
                    self._refused_link(user, f"a {what} {request.address!r}")
                    await request.refuse(
                        "amqp:unauthorized-access",
                        f"peers may only attach a sender to {inbox}, not a {what} {request.address!r}",
                    )
                    continue
                try:
                    check_inbox_sender(request.attach.snd_settle_mode)
                except InvalidMessageError as exc:
                    self._refused_link(user, f"a pre-settled sender to {request.address!r}")
                    await request.refuse(exc.condition, exc.description)
                    continue
                # The network's max_message_size on the link itself: advertised in our attach, and a
                # transfer that grows past it ends the link (amqp:link:message-size-exceeded) at that frame,
                # with nothing of it buffered beyond the limit.
                receiver = await request.accept_receiver(
                    credit=self.config.credit, max_message_size=self.config.max_message_size
                )
                nursery.start_soon(self.pump_link, receiver, user)

    def _refused_link(self, user: str, what: str) -> None:
        """Count a link of ``user`` refused; log it (bounded per member: ``_refused_log``)."""
        self.refused_links += 1
        self._refused_log.warning(user, what, "%s: refused %s", user, what)

    async def pump_link(self, receiver: transport.Receiver, user: str | None) -> None:
        """Check, store and settle what arrives on ``receiver`` until the link ends.

        ``user``: the peer's TLS subject, stamped on each message; ``None`` for a trusted local bridge whose
        messages carry the stamp already (required).
        """
        max_size = self.config.max_message_size

        def check(payload: bytes) -> tuple[str | None, amqp.Message, bytes]:
            try:
                message = amqp.Message.decode(payload)
            except amqp.DecodeError as exc:
                raise InvalidMessageError("amqp:decode-error", f"malformed message: {exc}") from None
            check_p2p_message(message, max_size=max_size, encoded_size=len(payload))
            if user is not None:
                return user, message, stamped_payload(payload, message, user)
            stamp = (message.application_properties or {}).get(HEADER_VALIDATED_USER)
            if not stamp:
                raise InvalidMessageError(
                    "amqp:unauthorized-access",
                    f"a bridge must stamp {HEADER_VALIDATED_USER} with the peer's TLS subject",
                )
            # (the stamp names the sender, so accepted_by_peer counts per peer behind a bridge process too)
            return str(stamp), message, payload

        who = user or "local bridge"
        batch: list[transport.Delivery] = []
        try:
            while True:
                try:
                    batch = await take_arrivals(receiver)
                except trio.EndOfChannel:
                    return
                stored, rejected, _released = await store_checked(  # (this check never releases)
                    receiver, batch, self.inbox, check, self.on_checked, who, self._rejected_log
                )
                self.rejected += rejected
                self.accepted += tally(stored, self.accepted_by_peer)
        except (transport.AmqpTransportError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            released = await _give_back(receiver, batch)
            if released is None:  # (a member whose process dies in a loop: an info line per member a minute)
                self._ended_log.warning(who, str(exc), "%s: link %s ended: %s", who, receiver.name, exc)
            else:
                self._released_log.warning(
                    who, f"released {released}: {exc}",
                    "%s: the inbox %s cannot take messages now (%s): released %d and closed link %s; the "
                    "peer sends them again", who, self.inbox.name, exc, released, receiver.name,
                )  # fmt: skip


async def _give_back(receiver: transport.Receiver, batch: Sequence[transport.Delivery]) -> int | None:
    """After a failure while ``batch`` was being stored: if it was the inbox that failed, not the peer's link
    (in a bridge process the node's endpoint went away: the node stopped, its disk full, say), settle what
    of ``batch`` is unsettled ``released`` (the peer keeps it and sends it again; never lost, never left
    waiting for an outcome that would not come while the connection stays up) and close the link; return
    how many were released. ``None``: the link or connection itself had failed (nothing to settle on)."""
    unsettled = [d for d in batch if not d.settled]
    if not unsettled:  # (the batch was settled: it is the link or the connection that ended)
        return None
    try:
        receiver.settle_many_nowait(unsettled, amqp.Released())
    except (transport.AmqpTransportError, trio.BrokenResourceError, trio.ClosedResourceError):
        return None
    await receiver.aclose()
    return len(unsettled)
