"""Transfers and flow control of the connection engine: link credit, session windows, sending and receiving.

Theory of operation
-------------------
:class:`TransferMixin` is the part of :class:`~corda_trio.amqp.Connection` that moves deliveries; the
connection dispatches ``flow`` and ``transfer`` frames to it and keeps the lifecycle (headers, SASL, open,
begin, attach, detach, end, close). The bookkeeping lives on :class:`Session` (windows, delivery ids) and
:class:`Link` (credit, delivery-count, partial deliveries); this module holds the rules:

* sending (``send_transfer``): one credit per delivery; frames are cut at the peer's max-frame-size and wait
  in the session while the peer's incoming window is closed (``_unblock`` sends them when a flow opens it);
* receiving (``_on_transfer``): session window first (a frame beyond it is a window violation), then link
  credit. A delivery beyond every limit we granted is absorbed up to ``max_credit_overrun`` deliveries and
  ``max_credit_overrun_bytes`` bytes (counted frame by frame, before a frame's payload is kept); one more
  detaches only that link (``amqp:link:transfer-limit-exceeded``). A delivery's running size is checked
  against our max-message-size *before* each frame's payload is kept, so nothing beyond the limit is ever
  buffered. A delivery's message-format is its first transfer's (omitted: 0); a continuation transfer that
  states another one detaches the link (``amqp:invalid-field``, spec 2.7.5). Which formats an application
  takes is its own decision (``DeliveryReceived.message_format``);
* flows: every flow for a link carries handle, delivery-count and link-credit; re-opening the session window
  (half used, on the next output) restates the link state of every receiving link whose credit changed.
"""

from __future__ import annotations

from . import _performatives as P
from ._config import UINT_MAX, ConnectionConfig
from ._engine_errors import LocalProtocolError
from ._errors import Condition
from ._events import (
    CreditUpdated,
    DeliveryReceived,
    Event,
    TransferAborted,
)
from ._frames import encode_frame
from ._link import SERIAL_MOD, Link
from ._session import Session
from ._state import LinkState
from ._types import Symbol

__all__ = ["TransferMixin", "error"]


def error(condition: Symbol, description: str) -> P.ErrorCondition:
    """An ``amqp.ErrorCondition`` (the frame type) with ``condition`` and ``description``."""
    return P.ErrorCondition(condition=condition, description=description)


_error = error


def _check_delivery_id_free(session: Session, delivery_id: int) -> None:
    """A new delivery's id must not be one of the session's unsettled incoming deliveries.

    A disposition names deliveries by id (spec 2.7.6), so a reused id would make our settlement of one
    delivery settle the other as well, and settling the second raised ``LocalProtocolError`` in the
    application. The sender assigns ids in sequence (Qpid Proton refuses any other than the next); we
    refuse only a reuse, with ``amqp:invalid-field``, and the connection closes: the sender has every
    delivery we had not settled unsettled and sends it again.
    """
    if delivery_id in session.incoming_unsettled:
        raise LocalProtocolError(
            f"transfer with delivery-id {delivery_id}, which an unsettled delivery of this session has",
            condition=Condition.INVALID_FIELD,
        )


class TransferMixin:
    """Transfers and flow control of :class:`~corda_trio.amqp.Connection` (see the module docstring)."""

    # provided by Connection
    config: ConnectionConfig
    remote_max_frame_size: int
    _out: list[bytes]
    _events: list[Event]
    _sessions: dict[int, Session]
    _sessions_by_remote: dict[int, Session]
    _dispositions_dirty: bool
    _refills: list[Session]

    def flow(
        self, channel: int, handle: int, *, credit: int, drain: bool = False, echo: bool = False
    ) -> None:
        """Receiver link: set our credit to ``credit`` (absolute) and send a ``flow``.

        Nothing is sent once our ``detach`` is out (the application's, or the engine's for an overrun or an
        oversize message, which the application learns of only later): no frame may name the handle then.
        """
        session, link = self._session_link(channel, handle, sending=False)  # senders get credit
        if not 0 <= credit <= UINT_MAX:
            raise LocalProtocolError(f"credit must fit a uint, got {credit}")
        if link.machine.state is LinkState.DETACH_SENT:
            return
        link.grant(credit)
        link.drain = drain
        self._send_flow(session, link, echo=echo)

    def drained(self, channel: int, handle: int) -> None:
        """Sender link: we have nothing to send for a draining receiver: give the credit back (spec 2.6.7)."""
        session, link = self._session_link(channel, handle, sending=True)
        link.delivery_count = (link.delivery_count + link.link_credit) % SERIAL_MOD
        link.link_credit = 0
        self._send_flow(session, link)

    def send_transfer(
        self,
        channel: int,
        handle: int,
        payload: bytes,
        *,
        delivery_tag: bytes | None = None,
        settled: bool | None = None,
        message_format: int = 0,
    ) -> int:
        """Queue a delivery (split into frames at the peer's max-frame-size); returns its delivery id.

        Args:
            payload: the encoded message (its sections).
            delivery_tag: unique among the link's unsettled deliveries; default: a link-local counter.
            settled: send pre-settled; default follows the link's snd-settle-mode.

        Raises:
            LocalProtocolError: the link is not an attached sender, has no credit (condition
                ``amqp:link:transfer-limit-exceeded``), or the message exceeds the peer's max-message-size
                (``amqp:link:message-size-exceeded``).
        """
        session, link = self._session_link(channel, handle, sending=True, state=LinkState.ATTACHED)
        self._check_can_send()
        if link.link_credit <= 0:
            raise LocalProtocolError(
                f"link {link.name!r} has no credit", condition=Condition.TRANSFER_LIMIT_EXCEEDED
            )
        limit = link.remote_max_message_size
        if limit and len(payload) > limit:
            raise LocalProtocolError(
                f"message of {len(payload)} bytes exceeds the peer's max-message-size {limit}",
                condition=Condition.MESSAGE_SIZE_EXCEEDED,
            )
        if settled is None:
            settled = link.snd_settle_mode == P.SenderSettleMode.SETTLED
        if delivery_tag is None:
            delivery_tag = (
                link.next_tag.to_bytes(8, "big")
                if link.next_tag > 0xFFFFFFFF
                else link.next_tag.to_bytes(4, "big")
            )
            link.next_tag += 1
        if self._dispositions_dirty:
            self._flush_dispositions()
        delivery_id = session.next_delivery_id
        session.next_delivery_id = (delivery_id + 1) % SERIAL_MOD
        link.link_credit -= 1
        link.delivery_count = (link.delivery_count + 1) % SERIAL_MOD
        if not settled:
            session.outgoing_unsettled[delivery_id] = link
            link.unsettled[delivery_id] = delivery_tag
        ch = session.channel
        max_frame = self.remote_max_frame_size
        first = P.Transfer(
            handle=link.handle,
            delivery_id=delivery_id,
            delivery_tag=delivery_tag,
            message_format=message_format,
            settled=settled,
            more=False,
        )
        frame = encode_frame(first, ch, payload)
        if len(frame) <= max_frame:
            frames = [frame]
        else:
            frames = self._split_transfer(
                link, ch, delivery_id, delivery_tag, message_format, settled, payload, max_frame
            )
        if session.blocked or session.remote_incoming_window < len(frames):
            session.blocked.extend(frames)
            self._unblock(session)
        else:
            session.remote_incoming_window -= len(frames)
            session.next_outgoing_id = (session.next_outgoing_id + len(frames)) % SERIAL_MOD
            self._out.extend(frames)
        return delivery_id

    def _send_flow(self, session: Session, link: Link | None, *, echo: bool = False) -> None:
        if self._dispositions_dirty:
            self._flush_dispositions()
        if link is None:
            flow = P.Flow(
                next_incoming_id=session.next_incoming_id,
                incoming_window=session.incoming_window,
                next_outgoing_id=session.next_outgoing_id,
                outgoing_window=session.outgoing_window,
                echo=echo,
            )
        else:
            flow = P.Flow(
                next_incoming_id=session.next_incoming_id,
                incoming_window=session.incoming_window,
                next_outgoing_id=session.next_outgoing_id,
                outgoing_window=session.outgoing_window,
                handle=link.handle,
                delivery_count=link.delivery_count,
                link_credit=link.link_credit,
                drain=link.drain if link.role else False,
                echo=echo,
            )
            link.flow_sent = (link.delivery_count, link.link_credit)
        self._out.append(encode_frame(flow, session.channel))

    def _send_window_flows(self, session: Session) -> None:
        """Re-open the session window; every receiving link whose credit changed gets its link state too.

        Some clients (uamqp) stop honouring link credit after a session-only ``flow``; so the window travels
        in link flows (handle, delivery-count, link-credit) whenever a link's state moved since its last flow.
        """
        sent = False
        for link in session.links.values():
            if (
                link.role
                and link.machine.state is LinkState.ATTACHED
                and link.flow_sent != (link.delivery_count, link.link_credit)
            ):
                self._send_flow(session, link)
                sent = True
        if not sent:
            self._send_flow(session, None)

    def _split_transfer(
        self,
        link: Link,
        channel: int,
        delivery_id: int,
        tag: bytes,
        message_format: int,
        settled: bool,
        payload: bytes,
        max_frame: int,
    ) -> list[bytes]:
        """Cut one delivery into transfer frames of at most ``max_frame`` bytes (spec 2.6.14 ``more``)."""
        first = P.Transfer(
            handle=link.handle,
            delivery_id=delivery_id,
            delivery_tag=tag,
            message_format=message_format,
            settled=settled,
            more=True,
        )
        cont = P.Transfer(handle=link.handle, more=True)
        last = P.Transfer(handle=link.handle, more=False)
        first_room = max_frame - len(encode_frame(first, channel))
        cont_room = max_frame - len(encode_frame(cont, channel))
        if first_room <= 0 or cont_room <= 0:
            raise LocalProtocolError(
                f"the peer's max-frame-size {max_frame} cannot hold a transfer",
                condition=Condition.FRAME_SIZE_TOO_SMALL,
            )
        view = memoryview(payload)
        frames = [encode_frame(first, channel, bytes(view[:first_room]))]
        pos = first_room
        total = len(payload)
        while pos < total:
            end = pos + cont_room
            perf = cont if end < total else last
            frames.append(encode_frame(perf, channel, bytes(view[pos:end])))
            pos = end
        return frames

    def _unblock(self, session: Session) -> None:
        """Send blocked transfer frames as far as the peer's incoming window allows."""
        blocked = session.blocked
        while blocked and session.remote_incoming_window > 0:
            self._out.append(blocked.popleft())
            session.remote_incoming_window -= 1
            session.next_outgoing_id = (session.next_outgoing_id + 1) % SERIAL_MOD

    def _on_flow(self, channel: int, frame: P.Flow, payload: bytes) -> None:
        session = self._remote_session(channel, "flow")
        base = frame.next_incoming_id if frame.next_incoming_id is not None else 0
        window = (base + frame.incoming_window - session.next_outgoing_id) % SERIAL_MOD
        session.remote_incoming_window = window if window < SERIAL_MOD // 2 else 0
        session.remote_outgoing_window = frame.outgoing_window
        if session.blocked:
            self._unblock(session)
        if frame.handle is None:
            if frame.echo:
                self._send_flow(session, None)
            return
        link = session.links_by_remote.get(frame.handle)
        if link is None:
            raise LocalProtocolError(
                f"flow for handle {frame.handle}, which is not attached",
                condition=Condition.UNATTACHED_HANDLE,
            )
        if link.role:
            link.apply_receiver_flow(frame.delivery_count)
            link.available = frame.available
        else:
            link.apply_sender_flow(frame.delivery_count, frame.link_credit)
            link.drain = frame.drain
        self._events.append(
            CreditUpdated(
                channel=session.channel,
                handle=link.handle,
                credit=link.link_credit,
                drain=bool(frame.drain),
                available=frame.available,
            )
        )
        if frame.echo:
            self._send_flow(session, link)

    def _on_transfer(self, channel: int, frame: P.Transfer, payload: bytes) -> None:
        session = self._sessions_by_remote.get(channel)
        if session is None:
            session = self._remote_session(channel, "transfer")
        if session.incoming_window <= 0:
            raise LocalProtocolError(
                f"transfer beyond our session incoming-window ({session.incoming_window_config} frames)",
                condition=Condition.WINDOW_VIOLATION,
            )
        session.incoming_window -= 1
        if session.next_incoming_id is not None:
            session.next_incoming_id = (session.next_incoming_id + 1) % SERIAL_MOD
        link = session.links_by_remote.get(frame.handle)
        if link is None:
            raise LocalProtocolError(
                f"transfer on handle {frame.handle}, which is not attached",
                condition=Condition.UNATTACHED_HANDLE,
            )
        if not link.role:
            raise LocalProtocolError(
                f"transfer on handle {frame.handle}, where the peer is the receiver",
                condition=Condition.NOT_ALLOWED,
            )
        state = link.machine.state
        if state is not LinkState.ATTACHED:
            if state is LinkState.DETACH_SENT:
                self._refill_window(session)
                return  # in flight when we detached: ignore
            if state is not LinkState.ATTACH_RCVD:
                raise LocalProtocolError(
                    f"transfer on link {link.name!r} in state {state.value}",
                    condition=Condition.ILLEGAL_STATE,
                )
        events = self._events
        if link.partial_chunks is None:
            if frame.delivery_id is None:
                raise LocalProtocolError(
                    "the first transfer of a delivery has no delivery-id", condition=Condition.INVALID_FIELD
                )
            _check_delivery_id_free(session, frame.delivery_id)
            if link.received_total >= link.max_limit:
                # Credit overrun: absorb up to max_credit_overrun (the transport grants less while the
                # excess is buffered); beyond that only this link goes, never the connection.
                excess = link.received_total - link.max_limit + 1
                allowed = self.config.max_credit_overrun
                if excess > allowed:
                    self._link_error(
                        session,
                        link,
                        Condition.TRANSFER_LIMIT_EXCEEDED,
                        f"transfer frame beyond link credit: {excess} deliveries past the "
                        f"{link.max_limit} we granted on link {link.name!r} (we absorb {allowed})",
                    )
                    self._refill_window(session)
                    return
                if not self._absorb_overrun(session, link, len(payload)):
                    self._refill_window(session)
                    return
                link.overrun_total += 1
            link.received_total += 1
            link.link_credit = max(0, link.link_credit - 1)
            link.delivery_count = (link.delivery_count + 1) % SERIAL_MOD
            tag = frame.delivery_tag if frame.delivery_tag is not None else b""
            if frame.aborted:
                events.append(
                    TransferAborted(
                        channel=session.channel,
                        handle=link.handle,
                        delivery_id=frame.delivery_id,
                        delivery_tag=tag,
                    )
                )
            elif not frame.more:
                limit = link.max_message_size
                if limit is not None and len(payload) > limit:
                    self._too_big(session, link, len(payload))
                else:
                    settled = bool(frame.settled)
                    if not settled:
                        session.incoming_unsettled[frame.delivery_id] = link
                    events.append(
                        DeliveryReceived(
                            channel=session.channel,
                            handle=link.handle,
                            delivery_id=frame.delivery_id,
                            delivery_tag=tag,
                            payload=payload,
                            settled=settled,
                            message_format=frame.message_format or 0,
                            state=frame.state,
                        )
                    )
            elif self._check_size(session, link, len(payload)):
                link.partial_chunks = [payload]
                link.partial_size = len(payload)
                link.partial_id = frame.delivery_id
                link.partial_tag = tag
                link.partial_settled = bool(frame.settled)
                link.partial_format = frame.message_format or 0
                link.partial_state = frame.state
        else:
            if frame.delivery_id is not None and frame.delivery_id != link.partial_id:
                raise LocalProtocolError(
                    f"transfer for delivery {frame.delivery_id} while delivery "
                    f"{link.partial_id} is incomplete",
                    condition=Condition.INVALID_FIELD,
                )
            if frame.aborted:
                events.append(
                    TransferAborted(
                        channel=session.channel,
                        handle=link.handle,
                        delivery_id=link.partial_id,
                        delivery_tag=link.partial_tag,
                    )
                )
                link.reset_partial()
            elif frame.message_format is not None and frame.message_format != link.partial_format:
                # Spec 2.7.5: a continuation may omit message-format, but one that differs from the first
                # transfer's is an error. The delivery cannot be trusted to be in either format: the link
                # goes (as Qpid Broker-J does), with nothing of the delivery kept.
                self._link_error(
                    session,
                    link,
                    Condition.INVALID_FIELD,
                    f"a continuation transfer of delivery {link.partial_id} says message-format "
                    f"{frame.message_format}; its first transfer said {link.partial_format}",
                )
            elif not self._check_size(session, link, link.partial_size + len(payload)):
                pass  # the link is detached: nothing of this delivery stays buffered
            elif link.received_total > link.max_limit and not self._absorb_overrun(
                session, link, len(payload)
            ):
                pass  # a delivery beyond every limit we granted (no grant since): detached likewise
            else:
                link.partial_chunks.append(payload)
                link.partial_size += len(payload)
                if frame.settled:
                    link.partial_settled = True
                if frame.state is not None:
                    link.partial_state = frame.state
                if not frame.more:
                    settled = link.partial_settled
                    if not settled:
                        _check_delivery_id_free(session, link.partial_id)  # (another link's, meanwhile)
                        session.incoming_unsettled[link.partial_id] = link
                    events.append(
                        DeliveryReceived(
                            channel=session.channel,
                            handle=link.handle,
                            delivery_id=link.partial_id,
                            delivery_tag=link.partial_tag,
                            payload=b"".join(link.partial_chunks),
                            settled=settled,
                            message_format=link.partial_format,
                            state=link.partial_state,
                        )
                    )
                    link.reset_partial()
        self._refill_window(session)

    def _refill_window(self, session: Session) -> None:
        # Re-open the window when the output is next drained, not now: the peer cannot have seen a window
        # we have not sent, so frames beyond the advertised one in the same input are a window violation.
        if session.incoming_window * 2 <= session.incoming_window_config and not session.refill_pending:
            session.refill_pending = True
            self._refills.append(session)
            self._dispositions_dirty = True

    def _absorb_overrun(self, session: Session, link: Link, size: int) -> bool:
        """Count ``size`` payload bytes of a delivery beyond every limit we granted; detach if too many.

        Called before the frame's payload is kept: a link whose overrun would pass
        ``max_credit_overrun_bytes`` is detached (``transfer-limit-exceeded``) and nothing more is buffered.
        """
        total = link.overrun_bytes + size
        bound = self.config.max_credit_overrun_bytes
        if total <= bound:
            link.overrun_bytes = total
            return True
        self._link_error(
            session,
            link,
            Condition.TRANSFER_LIMIT_EXCEEDED,
            f"transfer frame beyond link credit: {total} bytes of deliveries past the {link.max_limit} we "
            f"granted on link {link.name!r} (we absorb {bound} bytes)",
        )
        return False

    def _check_size(self, session: Session, link: Link, size: int) -> bool:
        """Whether a delivery of (at least) ``size`` bytes fits our max-message-size; if not, detach.

        Called with the running size *before* a frame's payload is kept, so nothing beyond the limit is
        ever buffered.
        """
        limit = link.max_message_size
        if limit is None or size <= limit:
            return True
        self._too_big(session, link, size)
        link.reset_partial()
        return False

    def _too_big(self, session: Session, link: Link, size: int) -> None:
        """A delivery over our max-message-size: detach the link with message-size-exceeded (spec 2.7.3)."""
        self._link_error(
            session,
            link,
            Condition.MESSAGE_SIZE_EXCEEDED,
            f"delivery of at least {size} bytes exceeds our max-message-size {link.max_message_size} "
            f"on link {link.name!r}",
        )

    def _link_error(self, session: Session, link: Link, condition: Symbol, description: str) -> None:
        """Detach (only) ``link`` with an error; a link we have not answered yet is refused (spec 2.6.3)."""
        error = _error(condition, description)
        link.reset_partial()
        if link.state is LinkState.ATTACH_RCVD:
            self.refuse_link(session.channel, link.handle, error)
        else:
            self.detach(session.channel, link.handle, error=error, closed=True)
