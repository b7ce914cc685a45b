"""Drive an ``amqp.Connection`` over any trio Stream: one reader, one write lock, bounded channels.

Theory of operation
-------------------
:class:`AmqpConnection` owns a stream and a sans-IO engine. Three tasks run in a nursery the connection's
owner supplies (``open_amqp_connection`` / ``serve_amqp`` do that):

* the *reader* owns ``receive_some``: it feeds the engine, routes the events to the objects waiting for them
  (senders, receivers, link requests), calls ``tick`` and flushes whatever the engine queued in reply;
* the *writer* flushes output that application calls queued without writing themselves (transfers and
  settlements are batched this way: one ``send_all`` carries many frames);
* the *timer* sleeps until the deadline ``tick`` returned (heartbeats, idle timeout). A deadline that passed
  long ago when the engine is next ticked means this process was stopped (SIGSTOP, a paused VM): the timers
  are put off once by :data:`STALL_GRACE_SECONDS`, so that the peer's frames that arrived meanwhile are read
  before the idle timeout judges its silence.

Every write goes through :meth:`AmqpConnection._flush`, which holds a ``StrictFIFOLock`` and drains the engine
*inside* the lock, so frames leave in the order the engine produced them. A write that fails or is cancelled
may have sent part of a frame: the connection is then marked broken, the stream closed forcefully and the
exception re-raised (a cancelled ``send_all`` has sent an unknown amount).

Goodbye. Once the engine is closed (a ``close`` decided by either side, a protocol violation, a failed SASL
exchange, EOF), whichever task notices it runs :meth:`AmqpConnection._goodbye`: under the write lock (so a
write in flight completes first) it sends everything the engine still queued, our ``close`` or
``sasl-outcome`` included, then half-closes plain TCP (``send_eof``). The reader keeps reading (the engine
discards what arrives) until the peer's ``close`` or EOF, or until the goodbye's deadline
(:data:`CLOSE_TIMEOUT_SECONDS` after it started, for all of it; :data:`PRE_OPEN_CLOSE_TIMEOUT_SECONDS` for a
peer that never sent its ``open``: a bad protocol header, a failed SASL exchange); only then is the stream
closed, over TLS with a ``close_notify`` first (bounded by :data:`CLOSE_NOTIFY_TIMEOUT_SECONDS`). Reading to
the end matters: a socket closed with unread input answers with a RST, and a RST can destroy our last frames
before the peer reads them. A peer that our idle timeout found silent is not waited for: it is frozen or gone,
and its close would not come. Our ``close`` (and over TLS the ``close_notify``) go out if the stream takes
them at once, within :data:`SILENT_PEER_CLOSE_TIMEOUT_SECONDS` (the socket's buffer may be full: the peer
stopped reading too), and the connection ends then, so a silent peer is noticed after the idle timeout, not
after the idle timeout plus the graceful goodbye.

Closing under cancellation. When the task that owns the connection is cancelled, the reader is cancelled
with it, so nobody would read the peer's reply: :meth:`AmqpConnection.aclose` then gives the goodbye
:data:`CANCELLED_CLOSE_TIMEOUT_SECONDS` (shielded): our ``close`` and the half-close go out, and ``aclose``
itself reads (and discards) until the peer's ``close`` or EOF, which with a live peer takes one round trip;
a silent peer costs at most that bound (then the ``close_notify``, over TLS), never the graceful one.

Nothing is reported as delivered that the peer did not settle: ``Sender.send`` returns the peer's terminal
state only after a ``disposition`` settled it; if the link or the connection goes away first, every waiting
``send`` raises (:class:`LinkDetachedError` / :class:`AmqpConnectionError`) and the caller sends again.

Incoming deliveries go into a memory channel whose buffer equals the receiver's credit plus the engine's
``max_credit_overrun`` (a peer that sends beyond its credit is absorbed up to that bound and up to
``max_credit_overrun_bytes``, beyond either the engine detaches the link); the credit is topped up only for
deliveries the application took out (and for deliveries the peer aborted, which take a credit and never reach
the application), and never beyond what the buffer has free, so a slow consumer or an overrunning peer slows
the peer instead of growing memory.
"""

from __future__ import annotations

import datetime as dt
import itertools
import logging
import math
from collections.abc import AsyncIterator, Callable
from typing import Any, Final, Literal

import trio

from corda_trio import amqp

from ._errors import (
    AmqpConnectionError,
    AmqpTransportError,
    AuthenticationError,
    DeliveryUnknownError,
    LinkDetachedError,
)
from ._tls import TlsStream
from ._tls_failures import describe_tls_failure

__all__ = ["AmqpConnection", "Delivery", "LinkRequest", "PendingDelivery", "Receiver", "Sender"]

log = logging.getLogger("corda_trio.transport")

RECEIVE_SIZE_BYTES: Final = 256 * 1024
#: Bound on a graceful goodbye, all of it: our last frames out and the peer's close (or EOF) in.
CLOSE_TIMEOUT_SECONDS: Final = 2.0
#: Bound on sending the TLS close_notify once the goodbye is over.
CLOSE_NOTIFY_TIMEOUT_SECONDS: Final = 0.5
#: Bound on the goodbye to a peer that our idle timeout found silent: our close (and the close_notify) go out
#: if the socket takes them now; a full send buffer (the peer stopped reading) is not waited on, nor is the
#: peer's close (best effort: the connection ends within this bound).
SILENT_PEER_CLOSE_TIMEOUT_SECONDS: Final = 0.1
#: Bound on the goodbye to a peer that never sent its ``open`` (a bad protocol header, a failed SASL exchange,
#: a close before the open exchange): it has no ``close`` of its own to send, only our reply (our header, the
#: SASL outcome) to read before it ends the connection. With the graceful bound a hostile client held a
#: connection slot for 2 s per bad header.
PRE_OPEN_CLOSE_TIMEOUT_SECONDS: Final = 0.5
#: Bound on the goodbye (our close out, the peer's in) when the connection's owner was cancelled: a peer on
#: a working network answers our close within a round trip; a silent one is not waited for longer.
CANCELLED_CLOSE_TIMEOUT_SECONDS: Final = 0.5
#: A timer that fires this much later than its deadline means that this process was not running (stopped
#: with SIGSTOP, a paused VM, swap, a blocked event loop): the engine's timers wait this long again, once, so
#: that the reader first takes what the peer sent meanwhile (see :meth:`AmqpConnection._tick`).
STALL_GRACE_SECONDS: Final = 0.5
#: ``max_message_size=DEFAULT``: take the connection config's limit.
DEFAULT: Final[Any] = amqp.FROM_CONFIG
LINK_REQUEST_BACKLOG: Final = 64

#: When a receiving link tops its credit up: see :meth:`AmqpConnection.open_receiver`.
RefillPolicy = Literal["half", "empty"]
_ids = itertools.count(1)


class PendingDelivery:
    """An outgoing delivery waiting for the peer's settlement."""

    __slots__ = ("_done", "delivery_id", "error", "settled", "state")

    def __init__(self, delivery_id: int) -> None:
        self.delivery_id = delivery_id
        self.state: Any = None
        self.error: BaseException | None = None
        self.settled = False
        self._done = trio.Event()

    def _resolve(self, state: Any) -> None:
        self.state = state
        self.settled = True
        self._done.set()

    def _fail(self, error: BaseException) -> None:
        if not self._done.is_set():
            self.error = error
            self._done.set()

    async def outcome(self) -> Any:
        """Wait for the peer's terminal delivery state (``amqp.Accepted()``, ``Rejected``, ...).

        Raises:
            LinkDetachedError / AmqpConnectionError: the link or connection ended first: not delivered.
            DeliveryUnknownError: the peer settled without a state.
        """
        await self._done.wait()
        if self.error is not None:
            raise self.error
        if self.state is None:
            raise DeliveryUnknownError(f"delivery {self.delivery_id} was settled without an outcome")
        return self.state


class Sender:
    """A sending link. Use :meth:`send` (or :meth:`start_send` + ``outcome()`` to pipeline)."""

    def __init__(
        self, conn: AmqpConnection, channel: int, handle: int, address: str | None, name: str
    ) -> None:
        self._conn = conn
        self.channel = channel
        self.handle = handle
        self.address = address
        self.name = name
        self._pending: dict[int, PendingDelivery] = {}
        self._credit_lot = trio.lowlevel.ParkingLot()
        self._attached = trio.Event()
        self._detached = trio.Event()
        self._error: BaseException | None = None
        self.remote_attach: Any = None
        #: The receiver drains (spec 2.6.7) and woke tasks that waited for credit; ``_sent_draining``: one
        #: of them has sent since (see ``AmqpConnection._finish_drains``).
        self._draining = False
        self._sent_draining = False

    async def wait_detached(self) -> BaseException:
        """Wait until the link is gone (detached by either side, or the connection ended); returns why."""
        await self._detached.wait()
        assert self._error is not None
        return self._error

    @property
    def credit(self) -> int:
        """Credit the peer currently grants us."""
        if self._error is not None:
            return 0
        return self._conn._engine.credit(self.channel, self.handle)

    async def send(
        self, message: amqp.Message | bytes, *, settled: bool = False, message_format: int = 0
    ) -> Any:
        """Send one message and wait for its outcome (``message_format``: see :meth:`send_nowait`).

        Returns:
            The peer's terminal delivery state (``amqp.Accepted()`` on success), or ``None`` for a
            pre-settled send (``settled=True``: fire and forget).

        Raises:
            LinkDetachedError / AmqpConnectionError: the link or connection ended before the outcome arrived:
                the message must be considered *not* delivered.
        """
        pending = await self.start_send(message, settled=settled, message_format=message_format)
        if pending is None:
            return None
        return await pending.outcome()

    async def start_send(
        self, message: amqp.Message | bytes, *, settled: bool = False, message_format: int = 0
    ) -> PendingDelivery | None:
        """Wait for credit, then queue the message (see :meth:`send_nowait`); always a checkpoint."""
        await trio.lowlevel.checkpoint()
        while True:
            try:
                return self.send_nowait(message, settled=settled, message_format=message_format)
            except trio.WouldBlock:
                await self._credit_lot.park()

    def send_nowait(
        self, message: amqp.Message | bytes, *, settled: bool = False, message_format: int = 0
    ) -> PendingDelivery | None:
        """Queue the message now; returns a handle to await its outcome (``None`` when pre-settled).

        The frames go out with the next flush, which the connection's writer task does as soon as the caller
        blocks, so a burst of ``send_nowait`` calls leaves in one write. ``message_format``: the transfer's
        message-format (spec 2.7.5); 0, the default, is the standard AMQP message.

        Raises:
            trio.WouldBlock: no credit right now.
            LinkDetachedError / AmqpConnectionError: the link or connection is gone.
            AmqpTransportError: the message is larger than the peer accepts.
        """
        self._raise_if_dead()
        conn = self._conn
        engine = conn._engine
        if engine.credit(self.channel, self.handle) <= 0:
            raise trio.WouldBlock
        payload = message.encode() if isinstance(message, amqp.Message) else bytes(message)
        try:
            delivery_id = engine.send_transfer(
                self.channel, self.handle, payload, settled=settled, message_format=message_format
            )
        except amqp.LocalProtocolError as exc:
            raise AmqpTransportError(exc.description, condition=str(exc.condition)) from exc
        pending = None
        if not settled:
            pending = PendingDelivery(delivery_id)
            self._pending[delivery_id] = pending
        if self._draining:
            self._sent_draining = True
        conn._request_flush()
        return pending

    def _raise_if_dead(self) -> None:
        if self._error is not None:
            raise self._error
        self._conn._raise_if_broken()

    def _on_settled(self, delivery_id: int, state: Any) -> None:
        pending = self._pending.pop(delivery_id, None)
        if pending is not None:
            pending._resolve(state)

    def _on_detached(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error
        pending, self._pending = self._pending, {}
        for p in pending.values():
            p._fail(error)
        self._credit_lot.unpark_all()
        self._attached.set()
        self._detached.set()

    async def aclose(self) -> None:
        """Detach the link (closing it). Deliveries still waiting fail with :class:`LinkDetachedError`."""
        await self._conn._detach(self)

    async def __aenter__(self) -> Sender:
        return self

    async def __aexit__(self, *exc: object) -> None:
        with trio.CancelScope(shield=True):
            await self.aclose()


class Delivery:
    """A message received on a :class:`Receiver`; settle it with :meth:`accept` (or reject/release/modify)."""

    __slots__ = ("_receiver", "delivery_id", "delivery_tag", "message_format", "payload", "settled")

    def __init__(self, receiver: Receiver, event: amqp.DeliveryReceived) -> None:
        self._receiver = receiver
        self.delivery_id = event.delivery_id
        self.delivery_tag = event.delivery_tag
        #: The transfer's message-format (spec 2.7.5): 0 is the standard AMQP message (``amqp.Message``),
        #: anything else a format the payload must not be read as unless the application knows it.
        self.message_format = event.message_format
        self.payload = event.payload
        self.settled = event.settled

    @property
    def message(self) -> amqp.Message:
        """The decoded message (raises ``amqp.DecodeError`` for a malformed payload)."""
        return amqp.Message.decode(self.payload)

    async def settle(self, state: Any) -> None:
        """Settle with ``state`` (``amqp.Accepted()``, ``amqp.Rejected(...)``, ...); no-op if pre-settled.

        Raises:
            LinkDetachedError / AmqpConnectionError: the link or connection is gone, also when the peer
                detached the link cleanly: the outcome cannot reach the peer, which sends the delivery again.
        """
        if self.settled:
            await trio.lowlevel.checkpoint()
            return
        self.settled = True
        await self._receiver._settle(self.delivery_id, state)

    def settle_nowait(self, state: Any) -> None:
        """:meth:`settle` without the checkpoint: settle a run of deliveries, then yield once, so that their
        dispositions leave together (the engine merges contiguous ones into one frame)."""
        if not self.settled:
            self.settled = True
            self._receiver._settle_nowait(self.delivery_id, state)

    async def accept(self) -> None:
        """Settle with ``accepted``."""
        await self.settle(amqp.Accepted())

    async def reject(self, condition: str = "amqp:internal-error", description: str | None = None) -> None:
        """Settle with ``rejected`` and an error."""
        error = amqp.ErrorCondition(condition=amqp.Symbol(condition), description=description)
        await self.settle(amqp.Rejected(error=error))

    async def release(self) -> None:
        """Settle with ``released`` (the sender may deliver it again, elsewhere)."""
        await self.settle(amqp.Released())


class Receiver:
    """A receiving link: ``async for delivery in receiver`` (ends when the link or connection closes)."""

    def __init__(
        self,
        conn: AmqpConnection,
        channel: int,
        handle: int,
        address: str | None,
        name: str,
        credit: int,
        refill: RefillPolicy = "half",
    ) -> None:
        if credit < 1:
            raise ValueError(f"credit must be at least 1, got {credit}")
        if refill not in ("half", "empty"):
            raise ValueError(f'refill must be "half" or "empty", got {refill!r}')
        # Credit is topped up when this many deliveries were taken since the last grant.
        self._refill_after = credit if refill == "empty" else max(1, (credit + 1) // 2)
        self._conn = conn
        self.channel = channel
        self.handle = handle
        self.address = address
        self.name = name
        self.capacity = credit
        # credit plus what the engine absorbs from a peer that overruns it (see the module docstring)
        buffer = credit + conn._engine.config.max_credit_overrun
        self._send_channel, self._receive_channel = trio.open_memory_channel[Delivery](buffer)
        self._taken = 0
        self._attached = trio.Event()
        self._error: BaseException | None = None
        #: The link is gone (a clean detach by the peer leaves ``_error`` None): grant no more credit.
        self._gone = False
        self.remote_attach: Any = None

    def _on_delivery(self, event: amqp.DeliveryReceived) -> None:
        # Cannot overflow: the engine takes at most max_credit_overrun deliveries beyond the last limit we
        # granted, a grant never exceeds the free buffer minus that margin, and no grant is made while the
        # buffer holds more than our credit (which would forgive the peer's overrun).
        try:
            self._send_channel.send_nowait(Delivery(self, event))
        except (trio.WouldBlock, trio.ClosedResourceError):  # defensive: never let a peer crash the reader
            conn = self._conn
            if self._error is None and conn._broken is None:
                error = amqp.ErrorCondition(
                    condition=amqp.Condition.TRANSFER_LIMIT_EXCEEDED,
                    description=f"link {self.name!r}: more deliveries than the receiver can buffer",
                )
                try:
                    conn._engine.detach(self.channel, self.handle, error=error)
                except amqp.LocalProtocolError:
                    pass
                self._on_detached(LinkDetachedError.from_error(error, "link detached"))
                conn._request_flush()

    def _on_aborted(self) -> None:
        # An aborted delivery (spec 2.6.14) took a credit and never reaches the application: it counts as
        # taken, or a peer that aborted as many deliveries as it had credit for would never get credit again.
        self._taken += 1
        if self._taken >= self._refill_after:
            self._replenish()

    @property
    def overrun_total(self) -> int:
        """Deliveries the peer sent beyond the credit we granted (absorbed; see the module docstring)."""
        try:
            return self._conn._engine.link(self.channel, self.handle).overrun_total
        except amqp.LocalProtocolError:
            return 0

    def _on_detached(self, error: BaseException | None) -> None:
        if self._error is None:
            self._error = error
        self._gone = True
        self._send_channel.close()
        self._attached.set()

    async def receive(self) -> Delivery:
        """The next delivery.

        Raises:
            LinkDetachedError / AmqpConnectionError: the link or connection ended with an error.
            trio.EndOfChannel: the link was closed cleanly and every delivery was consumed.
        """
        try:
            delivery = await self._receive_channel.receive()
        except trio.EndOfChannel:
            if self._error is not None:
                raise self._error from None
            raise
        self._taken += 1
        if self._taken >= self._refill_after:
            self._replenish()
        return delivery

    def receive_nowait(self) -> Delivery:
        """The next delivery if one has arrived already (to take a batch after :meth:`receive`).

        Raises:
            trio.WouldBlock: nothing buffered right now.
            LinkDetachedError / AmqpConnectionError / trio.EndOfChannel: as :meth:`receive`.
        """
        try:
            delivery = self._receive_channel.receive_nowait()
        except trio.EndOfChannel:
            if self._error is not None:
                raise self._error from None
            raise
        self._taken += 1
        if self._taken >= self._refill_after:
            self._replenish()
        return delivery

    def _replenish(self) -> None:
        conn = self._conn
        if self._gone or conn._broken is not None:
            # (a peer that detached the link cleanly: the deliveries still buffered are taken, but no frame
            # may name the handle any more; granting credit raised LocalProtocolError to the application)
            return
        buffered = self._receive_channel.statistics().current_buffer_used
        self._taken = 0
        if buffered >= self.capacity:
            # Deliveries the peer sent beyond its credit fill the buffer: grant nothing. (A grant, even of
            # zero, restarts the engine's overrun count from the new limit.) The next takes grant again.
            return
        # Back-pressure: deliveries a peer sent beyond its credit are still buffered, so it gets less.
        conn._engine.flow(self.channel, self.handle, credit=self.capacity - buffered)
        conn._request_flush()

    def __aiter__(self) -> AsyncIterator[Delivery]:
        return self

    async def __anext__(self) -> Delivery:
        try:
            return await self.receive()
        except trio.EndOfChannel:
            raise StopAsyncIteration from None

    async def settle_many(self, deliveries: list[Delivery], state: Any) -> None:
        """Settle several deliveries of this link with ``state`` at once (one flush, one checkpoint);
        pre-settled or already settled ones are skipped.

        Raises:
            LinkDetachedError / AmqpConnectionError: as :meth:`Delivery.settle`.
        """
        self.settle_many_nowait(deliveries, state)
        await trio.lowlevel.checkpoint()

    def settle_many_nowait(self, deliveries: list[Delivery], state: Any) -> None:
        """:meth:`settle_many` without its checkpoint, for a caller that has just passed one (the
        dispositions leave with the writer task's next write)."""
        conn = self._conn
        settle = conn._engine.settle
        checked = False
        for delivery in deliveries:
            if not delivery.settled:
                if not checked:  # (once: every delivery of the batch is on this link)
                    self._check_settleable()
                    checked = True
                delivery.settled = True
                settle(self.channel, delivery.delivery_id, state)
        conn._request_flush()

    async def _settle(self, delivery_id: int, state: Any) -> None:
        self._settle_nowait(delivery_id, state)
        await trio.lowlevel.checkpoint()

    def _settle_nowait(self, delivery_id: int, state: Any) -> None:
        self._check_settleable()
        conn = self._conn
        conn._engine.settle(self.channel, delivery_id, state)
        conn._request_flush()

    def _check_settleable(self) -> None:
        """Raise unless an outcome can still reach the peer.

        A peer may detach its link cleanly (``closed`` true or false) with deliveries unsettled, e.g. while
        the application is storing them: the engine forgets them with the link (spec 2.6.6: the sender
        keeps them and sends them again), so there is nobody left to settle them with.

        Raises:
            AmqpConnectionError: the connection is gone.
            LinkDetachedError: the link is gone (its error, or: the peer detached it without one).
        """
        self._conn._raise_if_broken()
        if self._error is not None:
            raise self._error
        if self._gone:
            raise LinkDetachedError(
                f"link {self.name!r} was detached by the peer before the outcome was sent: the peer has "
                "the delivery unsettled and sends it again"
            )

    async def aclose(self) -> None:
        """Detach the link (closing it)."""
        await self._conn._detach(self)

    async def detach(self, condition: str, description: str) -> None:
        """Detach the link (closing it) with an error: what the peer has unsettled on it, it sends again.
        Nothing happens when the link or connection is gone already."""
        error = amqp.ErrorCondition(condition=amqp.Symbol(condition), description=description)
        await self._conn._detach(self, error=error)

    async def __aenter__(self) -> Receiver:
        return self

    async def __aexit__(self, *exc: object) -> None:
        with trio.CancelScope(shield=True):
            await self.aclose()


class LinkRequest:
    """A link the peer attached (server side): answer ``accept_receiver``, ``accept_sender`` or ``refuse``.

    Attributes:
        attach: the peer's ``amqp.Attach``.
        peer_is_sender: ``True`` if the peer wants to send to us (then ``address`` is its target).
        address: the target address (peer sends) or the source address (peer receives).
    """

    def __init__(self, conn: AmqpConnection, channel: int, handle: int, attach: Any) -> None:
        self._conn = conn
        self.channel = channel
        self.handle = handle
        self.attach = attach
        self.peer_is_sender = not attach.role
        terminus = attach.target if self.peer_is_sender else attach.source
        # (a terminus of another type, a transaction coordinator (spec 4.5.1) say, has no address)
        self.address: str | None = getattr(terminus, "address", None) if terminus is not None else None
        self.name: str = attach.name
        self.answered = False

    async def accept_receiver(
        self, *, credit: int = 100, refill: RefillPolicy = "half", max_message_size: Any = DEFAULT
    ) -> Receiver:
        """Accept a peer's sending link: we receive, granting ``credit`` (``refill``: see open_receiver).

        ``max_message_size``: the largest message (bytes) we take on this link, advertised in our attach;
        a larger one detaches the link with ``amqp:link:message-size-exceeded``. Default: the connection
        config's (``amqp.ConnectionConfig.max_message_size``); ``None`` = no limit.

        Raises:
            LinkDetachedError: the link is gone already (the peer detached it, or overran its credit
                beyond the engine's bound before we answered).
        """
        if not self.peer_is_sender:
            raise ValueError("the peer wants to receive: use accept_sender()")
        self._answer()
        conn = self._conn
        receiver = Receiver(conn, self.channel, self.handle, self.address, self.name, credit, refill)
        receiver.remote_attach = self.attach
        receiver._attached.set()
        early = conn._early_deliveries.pop((self.channel, self.handle), ())
        if not self._still_waiting():
            receiver._on_detached(LinkDetachedError(f"link {self.name!r} was detached before an answer"))
            await trio.lowlevel.checkpoint()
            return receiver
        conn._links[(self.channel, self.handle)] = receiver
        for event in early:  # transfers the peer pipelined behind its attach
            receiver._on_delivery(event)
        # Our attach says receiver-settle-mode first, whatever the peer proposed: every outcome here settles
        # the delivery as it reports it (a sender that wanted second learns it and may detach).
        conn._engine.accept_link(
            self.channel, self.handle, max_message_size=max_message_size, rcv_settle_mode=0
        )
        conn._engine.flow(self.channel, self.handle, credit=credit)
        await conn._flush()
        return receiver

    async def accept_sender(self) -> Sender:
        """Accept a peer's receiving link: we send from ``address``."""
        if self.peer_is_sender:
            raise ValueError("the peer wants to send: use accept_receiver()")
        self._answer()
        conn = self._conn
        sender = Sender(conn, self.channel, self.handle, self.address, self.name)
        sender.remote_attach = self.attach
        sender._attached.set()
        if not self._still_waiting():
            sender._on_detached(LinkDetachedError(f"link {self.name!r} was detached before an answer"))
            await trio.lowlevel.checkpoint()
            return sender
        conn._links[(self.channel, self.handle)] = sender
        conn._engine.accept_link(self.channel, self.handle)
        await conn._flush()
        return sender

    async def refuse(
        self, condition: str = "amqp:unauthorized-access", description: str | None = None
    ) -> None:
        """Refuse the link (null terminus + detach with the error, spec 2.6.3)."""
        self._answer()
        conn = self._conn
        conn._early_deliveries.pop((self.channel, self.handle), None)
        if conn._broken is None and self._still_waiting():
            conn._engine.refuse_link(
                self.channel,
                self.handle,
                amqp.ErrorCondition(condition=amqp.Symbol(condition), description=description),
            )
            await conn._flush()

    @property
    def gone(self) -> bool:
        """The link went before our answer: the peer detached it (an attach and a detach pipelined), or the
        engine did (the peer overran its credit). The engine answered it already; an answer sends nothing."""
        return not self.answered and (self._conn._broken is not None or not self._still_waiting())

    def _answer(self) -> None:
        if self.answered:
            raise RuntimeError("this link request was already answered")
        self.answered = True
        self._conn._raise_if_broken()

    def _still_waiting(self) -> bool:
        """Whether the engine still waits for our answer (it may have detached an overrunning link)."""
        try:
            link = self._conn._engine.link(self.channel, self.handle)
        except amqp.LocalProtocolError:
            return False
        # (the very attach: a peer may detach it unanswered and attach again under the same name and handle)
        return link.remote_attach is self.attach and link.state is amqp.LinkState.ATTACH_RCVD


class AmqpConnection:
    """A running AMQP connection (either role). Build it with ``open_amqp_connection`` or ``serve_amqp``.

    ``on_violation`` is told each protocol violation of the peer (a bad header, a malformed frame), which ends
    the connection; by default each is logged as a warning. A server passes its own, which bounds what a
    remote can make it log (``serve_amqp``: per source address). A peer silent for our idle timeout
    (``amqp.IdleTimeoutError``) is no violation: the connection ends with an error that names the timeout,
    and its owner logs that.

    Attributes:
        peer_identity: whatever the ``peer_check`` callable returned (e.g. the peer's legal name).
        remote_open: the peer's ``open`` once the connection is open.
    """

    def __init__(
        self,
        stream: trio.abc.Stream,
        engine: amqp.Connection,
        *,
        peer_identity: Any = None,
        label: str | None = None,
        on_violation: Callable[[amqp.RemoteProtocolError], None] | None = None,
    ) -> None:
        self._stream = stream
        self._on_violation = on_violation
        #: ``TlsStream.send_all_nowait`` (the writer task's send without a second scheduling point), if any
        self._send_nowait: Callable[[bytes], bool] | None = (
            stream.send_all_nowait if isinstance(stream, TlsStream) else None
        )
        self._engine = engine
        #: the TLS stream, if any: bytes of a record still arriving count against the idle timeout (a 16 KiB
        #: record is handed over whole, and takes 2.6 s to cross a 50 kbit/s link)
        self._tls: TlsStream | None = stream if isinstance(stream, TlsStream) else None
        self._tls_bytes_seen = self._tls.bytes_received if self._tls is not None else 0
        self.peer_identity = peer_identity
        self.id = label or f"amqp-{next(_ids)}"
        self._write_lock = trio.StrictFIFOLock()
        self._flush_wanted = trio.Event()
        self._timer_wake = trio.Event()
        self._deadline: float | None = None
        self._stall_grace = False  # the engine's timers were put off once after a stall of this process
        self._peer_silent = False  # our idle timeout fired: the goodbye does not wait for the peer
        self._write_scope: trio.CancelScope | None = None  # around the send_all in flight (_send_all)
        self._broken: AmqpConnectionError | None = None
        self._ended_cleanly = False
        self._stream_dead = False
        # goodbye (see the module docstring): started, no more writes, when the reader stops waiting
        self._closing = False
        self._writes_done = False
        self._linger_deadline = math.inf
        self._read_scope: trio.CancelScope | None = None
        self._reader_active = False
        self._reader_done = trio.Event()
        self._link_change: trio.Event | None = None
        self._closed = trio.Event()
        self._opened = trio.Event()
        self._session_begun = trio.Event()
        self._channel: int | None = None
        self._links: dict[tuple[int, int], Sender | Receiver] = {}
        #: Senders whose receiver drains while tasks wait for their credit (see ``_finish_drains``).
        self._draining: set[Sender] = set()
        # deliveries on links the application has not answered yet (a peer may pipeline transfers behind
        # its attach); bounded by the engine's max_credit_overrun, handed over by accept_receiver
        self._early_deliveries: dict[tuple[int, int], list[amqp.DeliveryReceived]] = {}
        self._link_names = itertools.count()
        self._requests_send, self._requests_receive = trio.open_memory_channel[LinkRequest](
            LINK_REQUEST_BACKLOG
        )
        self.remote_open: Any = None

    # --- lifecycle -----------------------------------------------------------------------------------

    async def _run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the reader, writer and timer until the connection ends (started with ``nursery.start``)."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._reader)
            nursery.start_soon(self._writer)
            nursery.start_soon(self._timer)
            task_status.started()
            await self._flush()
            await self._closed.wait()
            nursery.cancel_scope.cancel()

    async def _handshake(self, *, begin_session: bool) -> None:
        """Wait for the peer's open (and, as client, map our session)."""
        await self._wait_for(self._opened)
        if begin_session:
            await self._require_session()

    async def _wait_for(self, event: trio.Event) -> None:
        async with trio.open_nursery() as nursery:

            async def watch() -> None:
                await self._closed.wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(watch)
            await event.wait()
            nursery.cancel_scope.cancel()
        self._raise_if_broken()
        if not event.is_set():
            raise AmqpConnectionError("the connection ended during the AMQP handshake")

    async def aclose(self) -> None:
        """Close gracefully (``close`` frame, wait for the peer's), then close the stream.

        Whatever the engine still has queued (for example the ``close`` that reports a peer's protocol
        violation) is flushed first. Shielded from cancellation and bounded: :data:`CLOSE_TIMEOUT_SECONDS`,
        or :data:`CANCELLED_CLOSE_TIMEOUT_SECONDS` when called in a cancelled scope (the owner is being
        cancelled, and the reader with it); plus :data:`CLOSE_NOTIFY_TIMEOUT_SECONDS` over TLS.
        """
        cancelled = trio.current_effective_deadline() == -math.inf
        with trio.CancelScope(shield=True):
            budget = CANCELLED_CLOSE_TIMEOUT_SECONDS if cancelled else CLOSE_TIMEOUT_SECONDS
            deadline = trio.current_time() + self._close_budget(budget)
            with trio.move_on_at(deadline):
                if self._broken is None and not self._engine.closed:
                    self._engine.close()
                try:
                    await self._flush()
                except (trio.BrokenResourceError, trio.ClosedResourceError, AmqpConnectionError):
                    pass
                if self._engine.closed:
                    await self._goodbye(deadline)
                self._linger_until(deadline)
                if self._reader_active:
                    # the reader sees the peer's close (or EOF, or the deadline) and closes the stream; a
                    # reader cancelled with our owner ends without doing so
                    await self._reader_done.wait()
                if not self._closed.is_set() and not self._stream_dead:
                    await self._drain()
            self._set_broken(AmqpConnectionError("the connection was closed locally"))
            if not self._closed.is_set():
                await self._final_close()

    @property
    def closed(self) -> bool:
        """Whether the connection has ended."""
        return self._broken is not None

    @property
    def close_error(self) -> AmqpConnectionError | None:
        """Why the connection ended (``None`` while it runs)."""
        return self._broken

    @property
    def ended_cleanly(self) -> bool:
        """Whether the peer ended the connection with a close without an error (a normal end, no failure)."""
        return self._ended_cleanly

    async def wait_closed(self) -> None:
        """Wait until the connection has ended (for any reason)."""
        await self._closed.wait()

    # --- public API ----------------------------------------------------------------------------------

    async def open_sender(
        self, address: str, *, name: str | None = None, settle_mode: int | None = None
    ) -> Sender:
        """Attach a sending link to ``address`` and wait until the peer answers.

        Raises:
            LinkDetachedError: the peer refused the link (e.g. ``amqp:unauthorized-access``).
            AmqpTransportError: the attach cannot be sent (``amqp:frame-size-too-small``: larger than the
                peer's max-frame-size, e.g. a very long address).
        """
        self._raise_if_broken()
        channel = await self._require_session()
        name = name or f"{self._engine.config.container_id}-sender-{next(self._link_names)}"
        handle = self._attach(
            channel, amqp.Role.SENDER, name=name, target=address, snd_settle_mode=settle_mode
        )
        sender = Sender(self, channel, handle, address, name)
        self._links[(channel, handle)] = sender
        await self._flush()
        await sender._attached.wait()
        sender._raise_if_dead()
        if sender.remote_attach is not None and sender.remote_attach.target is None:
            # refused: the detach with the reason follows the attach
            await self._wait_detached(sender)
        return sender

    async def open_receiver(
        self,
        address: str,
        *,
        credit: int = 100,
        name: str | None = None,
        refill: RefillPolicy = "half",
        max_message_size: Any = DEFAULT,
    ) -> Receiver:
        """Attach a receiving link from ``address`` and grant ``credit`` (kept topped up as you consume).

        Args:
            max_message_size: the largest message (bytes) we take on this link, advertised in the attach
                (default: the connection config's; ``None`` = no limit). A larger delivery detaches the
                link with ``amqp:link:message-size-exceeded`` (the receiver then raises
                :class:`LinkDetachedError`).
            refill: ``"half"`` (default) tops the credit up once half of it was consumed, so the sender
                never stalls. ``"empty"`` grants new credit only when all of it was consumed, so no
                transfer is ever in flight when a ``flow`` arrives: for peers that miscount credit granted
                while transfers are in flight (RabbitMQ 3.x's AMQP 1.0 plugin, rabbitmq-server#2597),
                which a spec-conforming receiver would otherwise have to close for credit overrun.

        Raises:
            LinkDetachedError / AmqpTransportError: as :meth:`open_sender`.
        """
        self._raise_if_broken()
        channel = await self._require_session()
        name = name or f"{self._engine.config.container_id}-receiver-{next(self._link_names)}"
        handle = self._attach(
            channel, amqp.Role.RECEIVER, name=name, source=address, max_message_size=max_message_size
        )
        receiver = Receiver(self, channel, handle, address, name, credit, refill)
        self._links[(channel, handle)] = receiver
        self._engine.flow(channel, handle, credit=credit)
        await self._flush()
        await receiver._attached.wait()
        if receiver._error is not None:
            raise receiver._error
        if receiver.remote_attach is not None and receiver.remote_attach.source is None:
            await self._wait_detached(receiver)
        return receiver

    def link_requests(self) -> trio.MemoryReceiveChannel[LinkRequest]:
        """Links the peer attaches (server side); iterate and answer each one."""
        return self._requests_receive

    # --- internals -----------------------------------------------------------------------------------

    def _attach(self, channel: int, role: bool, **kw: Any) -> int:
        """``engine.attach``; an attach the engine will not send is an :class:`AmqpTransportError`."""
        try:
            return self._engine.attach(channel, role, **kw)
        except amqp.LocalProtocolError as exc:
            raise AmqpTransportError(exc.description, condition=str(exc.condition)) from exc

    async def _require_session(self) -> int:
        """Our session's channel; begins a new session if the peer ended the last one."""
        if self._channel is None:
            self._session_begun = trio.Event()
            self._channel = self._engine.begin_session()
            await self._flush()
            await self._wait_for(self._session_begun)
        return self._channel

    async def _wait_detached(self, link: Sender | Receiver) -> None:
        with trio.move_on_after(5.0):
            while link._error is None:
                await self._wait_link_change()
        if link._error is not None:
            raise link._error
        raise LinkDetachedError(f"the peer answered the attach of {link.address!r} with a null terminus")

    async def _wait_link_change(self) -> None:
        if self._link_change is None:
            self._link_change = trio.Event()
        await self._link_change.wait()

    def _notify_link_change(self) -> None:
        if self._link_change is not None:
            self._link_change.set()
            self._link_change = None

    async def _detach(self, link: Sender | Receiver, *, error: amqp.ErrorCondition | None = None) -> None:
        if link._error is not None or self._broken is not None:
            await trio.lowlevel.checkpoint()
            return
        try:
            self._engine.detach(link.channel, link.handle, closed=True, error=error)
        except amqp.LocalProtocolError:
            await trio.lowlevel.checkpoint()
            return
        link._on_detached(LinkDetachedError("the link was closed locally"))
        try:
            await self._flush()
        except (trio.BrokenResourceError, trio.ClosedResourceError, AmqpConnectionError):
            pass

    def _raise_if_broken(self) -> None:
        if self._broken is not None:
            raise self._broken

    def _request_flush(self) -> None:
        self._flush_wanted.set()

    async def _flush(self, *, just_yielded: bool = False) -> None:
        """Write everything the engine queued (in order, under the write lock). ``just_yielded``: the caller
        (the writer task) has just passed a scheduling point, so when the bytes go out at once (or there are
        none) this adds none."""
        if not self._engine.wants_write:
            if not just_yielded:
                await trio.lowlevel.checkpoint()
            self._tick()
            return
        lock = self._write_lock
        try:
            lock.acquire_nowait()  # the usual case, without the scheduling point ``async with`` adds
        except trio.WouldBlock:
            await lock.acquire()
        try:
            data = self._engine.data_to_send()
            if data and not self._stream_dead and not self._writes_done:
                try:
                    send_nowait = self._send_nowait if just_yielded else None
                    if send_nowait is None:
                        await self._send_all(data)
                    else:
                        try:
                            if not send_nowait(data):
                                await self._send_all(b"")  # the rest of what it took
                        except trio.WouldBlock:  # nothing taken
                            await self._send_all(data)
                except BaseException as exc:
                    # Part of a frame may be on the wire: the connection cannot continue.
                    self._set_broken(AmqpConnectionError(f"write failed or was interrupted: {exc!r}"))
                    with trio.CancelScope(shield=True):
                        await self._drop_stream()
                    if isinstance(exc, trio.BrokenResourceError | trio.ClosedResourceError):
                        raise AmqpConnectionError(f"write failed: {exc!r}") from exc
                    raise
            self._tick()
        finally:
            lock.release()

    async def _send_all(self, data: bytes) -> None:
        """``send_all`` (under the write lock), abandoned once the peer is found silent: a frozen peer stops
        reading, so a write may wait for room in its buffer for ever, and with it every later write, our
        close included. It gets :data:`SILENT_PEER_CLOSE_TIMEOUT_SECONDS` from the idle timeout (or from its
        start, after it); abandoned, it raises ``trio.BrokenResourceError``: part of it may be out."""
        with trio.CancelScope() as scope:
            if self._peer_silent:
                scope.deadline = trio.current_time() + SILENT_PEER_CLOSE_TIMEOUT_SECONDS
            self._write_scope = scope
            try:
                await self._stream.send_all(data)
            finally:
                self._write_scope = None
        if scope.cancelled_caught:
            raise trio.BrokenResourceError("the peer found silent took no more data")

    def _finish_drains(self) -> None:
        """Give back the credit of draining receivers that our woken senders did not use (spec 2.6.7).

        A drain that arrives while a task waits for credit wakes it; once it has sent (the writer runs after
        every send) and no task waits for credit any more, the sender has nothing more to send right now:
        the rest of the credit goes back (``drained``). Without this, a drain that found a task waiting,
        which then had fewer messages than the credit, was never answered: Qpid Proton's
        ``Receiver.drain`` waited for ever.
        """
        engine = self._engine
        for sender in list(self._draining):
            if not sender._sent_draining and sender._error is None:
                continue  # the woken task has not sent yet
            self._draining.discard(sender)
            sender._draining = False
            if sender._error is not None or sender._credit_lot:
                continue
            try:
                link = engine.link(sender.channel, sender.handle)
            except amqp.LocalProtocolError:
                continue
            if link.drain and link.link_credit > 0 and link.state is amqp.LinkState.ATTACHED:
                engine.drained(sender.channel, sender.handle)

    def _tick(self) -> None:
        now = trio.current_time()
        stalled = self._deadline is not None and now - self._deadline > STALL_GRACE_SECONDS
        if stalled and not self._stall_grace:
            # The deadline passed long ago: this process was not running (SIGSTOP, a paused VM, swap, a
            # blocked loop), and what a live peer sent meanwhile waits unread. Judged now, our own pause
            # would look like the peer's silence (the idle timeout), so the reader goes first: the timers
            # wait STALL_GRACE_SECONDS more, once (a loop that is always late still ticks every other time).
            self._stall_grace = True
            self._deadline = now + STALL_GRACE_SECONDS
            self._timer_wake.set()
            return
        self._stall_grace = False
        tls = self._tls
        if tls is not None and tls.bytes_received != self._tls_bytes_seen:  # (part of a record may be in)
            self._engine.receive_progress(tls.bytes_received - self._tls_bytes_seen)
            self._tls_bytes_seen = tls.bytes_received
        try:
            deadline = self._engine.tick(now)
        except amqp.RemoteProtocolError as exc:
            self._handle_events(exc.events)
            if isinstance(exc, amqp.IdleTimeoutError):
                # (a silent peer is gone or frozen, not misbehaving: the connection's end, whose error
                # names the timeout, is what its owner logs, once; it is no refusal of the peer; nor is
                # its close waited for: see _goodbye)
                self._peer_silent = True
                if self._write_scope is not None:  # a write in flight waits for room the peer won't make
                    self._write_scope.deadline = min(
                        self._write_scope.deadline, now + SILENT_PEER_CLOSE_TIMEOUT_SECONDS
                    )
            else:
                self._peer_violated(exc)
            self._flush_wanted.set()
            return
        if deadline != self._deadline:
            earlier = deadline is not None and (self._deadline is None or deadline < self._deadline)
            self._deadline = deadline
            if earlier:
                self._timer_wake.set()

    def _peer_violated(self, exc: amqp.RemoteProtocolError) -> None:
        if self._on_violation is not None:
            self._on_violation(exc)
        else:
            log.warning("%s: protocol violation by the peer: %s", self.id, exc)

    async def _writer(self) -> None:
        try:
            while True:
                await self._flush_wanted.wait()
                # Let every runnable task queue its frames first (consumers settling a batch of deliveries,
                # a sender filling its window): one send_all then carries all of them.
                await trio.lowlevel.cancel_shielded_checkpoint()
                self._flush_wanted = trio.Event()
                if self._draining:
                    self._finish_drains()
                await self._flush(just_yielded=True)
                if self._engine.closed:
                    await self._goodbye()
                    return
        except (trio.BrokenResourceError, trio.ClosedResourceError, AmqpConnectionError):
            self._set_broken(AmqpConnectionError("the transport broke while writing"))
            with trio.CancelScope(shield=True):
                await self._drop_stream()

    async def _timer(self) -> None:
        while self._broken is None:
            deadline = self._deadline if self._deadline is not None else math.inf
            with trio.move_on_at(deadline):
                await self._timer_wake.wait()
            self._timer_wake = trio.Event()
            self._tick()
            self._flush_wanted.set()
        await trio.lowlevel.checkpoint()

    async def _reader(self) -> None:
        self._reader_active = True
        try:
            await self._read()
        finally:
            self._reader_active = False
            self._reader_done.set()

    async def _read(self) -> None:
        engine = self._engine
        stream = self._stream
        try:
            # One scope for the whole loop (not one per read: that showed in profiles); _goodbye sets its
            # deadline, which ends the wait for the peer's close (the loop just stops, as on EOF).
            with trio.CancelScope(deadline=self._linger_deadline) as scope:
                self._read_scope = scope
                while True:
                    if self._closing and engine.state is amqp.ConnectionState.END:
                        break  # both close frames exchanged: nothing the peer sends now matters
                    data = await stream.receive_some(RECEIVE_SIZE_BYTES)
                    if self._closing:
                        # After our goodbye: read on (the engine discards) until the peer's close or EOF.
                        if not data:
                            break
                        try:
                            engine.receive_data(data)
                        except amqp.RemoteProtocolError:
                            pass
                        continue
                    try:
                        events = engine.receive_data(data)
                    except amqp.RemoteProtocolError as exc:
                        self._peer_violated(exc)
                        self._handle_events(exc.events)
                        await self._goodbye()
                        continue
                    if events:
                        self._handle_events(events)
                    self._tick()
                    if engine.wants_write:
                        self._flush_wanted.set()  # the writer sends replies (flows, heartbeats) next batch
                    if not data or engine.closed:
                        await self._goodbye()
                        if not data:
                            break
        except (trio.BrokenResourceError, trio.ClosedResourceError, AmqpConnectionError) as exc:
            # (with TLS 1.3 a peer that refuses our certificate says so in an alert read only now)
            why = describe_tls_failure(exc, None, now=dt.datetime.now(dt.UTC)) or repr(exc)
            self._set_broken(AmqpConnectionError(f"transport failed: {why}"))
            with trio.CancelScope(shield=True):
                await self._drop_stream()
            return
        finally:
            self._read_scope = None
        await self._final_close()

    async def _goodbye(self, deadline: float | None = None) -> None:
        """The engine is closed: send what it queued (our close), half-close, and let the reader linger.

        Runs once, in whichever task noticed first; shielded, and bounded by ``deadline`` (by default
        :data:`CLOSE_TIMEOUT_SECONDS` from now), which also ends the reader's wait for the peer's close. A
        peer found silent (our idle timeout) gets :data:`SILENT_PEER_CLOSE_TIMEOUT_SECONDS` for our last
        frames, and its close is not waited for.
        """
        if self._closing:
            await trio.lowlevel.checkpoint()
            return
        self._closing = True
        if deadline is None:
            deadline = trio.current_time() + self._close_budget(CLOSE_TIMEOUT_SECONDS)
        if self._peer_silent:
            deadline = min(deadline, trio.current_time() + SILENT_PEER_CLOSE_TIMEOUT_SECONDS)
        error = self._engine.close_error
        if self._broken is None:
            if error is None:
                self._set_broken(AmqpConnectionError("the connection was closed"))
            else:
                self._set_broken(AmqpConnectionError.from_error(error, "the connection was closed"))
        stream = self._stream
        with trio.CancelScope(shield=True):
            with trio.move_on_at(deadline):
                try:
                    async with self._write_lock:  # a write in flight completes first
                        data = self._engine.data_to_send()
                        if data and not self._stream_dead:
                            await stream.send_all(data)
                        self._writes_done = True
                        if isinstance(stream, trio.abc.HalfCloseableStream) and not self._stream_dead:
                            await stream.send_eof()  # plain TCP: FIN after our last frame
                except (trio.BrokenResourceError, trio.ClosedResourceError, trio.BusyResourceError):
                    pass
        self._writes_done = True
        self._linger_until(trio.current_time() if self._peer_silent else deadline)

    def _close_budget(self, budget: float) -> float:
        """How long a goodbye may take: ``budget``, or less for a peer that never opened."""
        return budget if self._engine.remote_open is not None else min(budget, PRE_OPEN_CLOSE_TIMEOUT_SECONDS)

    def _linger_until(self, deadline: float) -> None:
        """The reader waits for the peer's close (or EOF) until ``deadline`` at the latest."""
        self._linger_deadline = min(self._linger_deadline, deadline)
        if self._read_scope is not None:
            self._read_scope.deadline = min(self._read_scope.deadline, self._linger_deadline)

    async def _drain(self) -> None:
        """Read and discard until the peer's close or EOF, in ``aclose`` once the reader is gone.

        Called only after our goodbye, within ``aclose``'s deadline: closing a socket with unread input
        would answer with a RST, which can destroy our close before the peer reads it.
        """
        engine = self._engine
        try:
            while engine.state is not amqp.ConnectionState.END:
                data = await self._stream.receive_some(RECEIVE_SIZE_BYTES)
                if not data:
                    break
                try:
                    engine.receive_data(data)
                except amqp.RemoteProtocolError:
                    pass
        except (trio.BrokenResourceError, trio.ClosedResourceError, trio.BusyResourceError):
            pass

    async def _final_close(self) -> None:
        """Close the stream: over TLS send close_notify first (bounded); then the connection is over."""
        stream = self._stream
        with trio.CancelScope(shield=True):
            if isinstance(stream, trio.SSLStream | TlsStream) and not self._stream_dead:
                bound = (
                    SILENT_PEER_CLOSE_TIMEOUT_SECONDS if self._peer_silent else CLOSE_NOTIFY_TIMEOUT_SECONDS
                )
                with trio.move_on_after(bound):
                    async with self._write_lock:
                        self._writes_done = True
                        try:
                            await stream.aclose()  # close_notify, then the TCP socket
                        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                            pass
            await self._drop_stream()

    async def _drop_stream(self) -> None:
        """Close the stream without ceremony; the connection is over."""
        self._stream_dead = True
        await trio.aclose_forcefully(self._stream)
        self._closed.set()

    def _set_broken(self, error: AmqpConnectionError, *, clean: bool = False) -> None:
        """No more API operations: fail every waiter with ``error`` (the stream may still flush a close).

        ``clean``: the peer closed without an error: receivers then simply end (``async for`` stops);
        senders still fail their unsettled deliveries, which were not delivered.
        """
        if self._broken is not None:
            return
        self._broken = error
        self._ended_cleanly = clean
        for link in list(self._links.values()):
            link._on_detached(None if clean and isinstance(link, Receiver) else error)
        self._links.clear()
        self._requests_send.close()
        self._notify_link_change()

    # --- events --------------------------------------------------------------------------------------

    def _handle_events(self, events: list[amqp.Event]) -> None:
        links = self._links
        for event in events:
            kind = type(event)
            if kind is amqp.DeliverySettled:
                link = links.get((event.channel, event.handle))
                if isinstance(link, Sender):
                    link._on_settled(event.delivery_id, event.state)
            elif kind is amqp.DeliveryReceived:
                link = links.get((event.channel, event.handle))
                if isinstance(link, Receiver):
                    link._on_delivery(event)
                elif link is None:
                    self._early_deliveries.setdefault((event.channel, event.handle), []).append(event)
            elif kind is amqp.CreditUpdated:
                link = links.get((event.channel, event.handle))
                if isinstance(link, Sender):
                    if event.drain and event.credit > 0:
                        if not link._credit_lot:
                            # The receiver asks us to use the credit or give it back, and no task is
                            # waiting to send: nothing is queued, so give it back at once (spec 2.6.7).
                            self._engine.drained(event.channel, event.handle)
                            self._flush_wanted.set()
                        else:  # they send what they have; the rest goes back once they did
                            link._draining = True
                            link._sent_draining = False
                            self._draining.add(link)
                    link._credit_lot.unpark_all()
            else:
                self._handle_rare_event(event)

    def _handle_rare_event(self, event: amqp.Event) -> None:
        if isinstance(event, amqp.ConnectionOpened):
            self.remote_open = event.remote_open
            self._opened.set()
        elif isinstance(event, amqp.SessionBegun):
            if self._channel is None or self._channel == event.channel:
                self._channel = event.channel
                self._session_begun.set()
        elif isinstance(event, amqp.LinkAttached):
            link = self._links.get((event.channel, event.handle))
            if link is not None:
                link.remote_attach = event.remote_attach
                link._attached.set()
        elif isinstance(event, amqp.LinkAttachRequested):
            request = LinkRequest(self, event.channel, event.handle, event.attach)
            try:
                self._requests_send.send_nowait(request)
            except (trio.WouldBlock, trio.ClosedResourceError):
                if not request._still_waiting():  # the peer detached it already (later in the same input)
                    return
                self._engine.refuse_link(
                    event.channel,
                    event.handle,
                    amqp.ErrorCondition(
                        condition=amqp.Condition.RESOURCE_LIMIT_EXCEEDED,
                        description="too many unanswered link attaches",
                    ),
                )
        elif isinstance(event, amqp.LinkDetached):
            self._early_deliveries.pop((event.channel, event.handle), None)
            link = self._links.pop((event.channel, event.handle), None)
            if link is not None:
                if event.error is not None:
                    err: BaseException = LinkDetachedError.from_error(event.error, "link detached")
                    link._on_detached(err)
                elif isinstance(link, Receiver) and event.by_peer:
                    link._on_detached(None)
                else:
                    link._on_detached(
                        LinkDetachedError("the link was detached" + (" by the peer" if event.by_peer else ""))
                    )
            self._notify_link_change()
        elif isinstance(event, amqp.SessionEnded):
            error = AmqpConnectionError.from_error(event.error, "the session ended")
            for key, link in list(self._links.items()):
                if key[0] == event.channel:
                    link._on_detached(error)
                    del self._links[key]
            if event.channel == self._channel:
                self._channel = None
                self._session_begun = trio.Event()
        elif isinstance(event, amqp.ConnectionClosed):
            sasl = self._engine.sasl_result
            error_cls = AuthenticationError if sasl is not None and not sasl.ok else AmqpConnectionError
            default = "the peer closed the connection" if event.by_peer else "we closed the connection"
            clean = event.by_peer and event.error is None
            closed = error_cls.from_error(event.error, default, by_peer=event.error_from_peer)
            self._set_broken(closed, clean=clean)  # type: ignore[arg-type]
        elif isinstance(event, amqp.TransferAborted):
            link = self._links.get((event.channel, event.handle))
            if isinstance(link, Receiver):
                link._on_aborted()
            log.debug("%s: %s", self.id, event)
        elif isinstance(event, amqp.DeliveryStateChanged | amqp.SaslCompleted):
            log.debug("%s: %s", self.id, event)
