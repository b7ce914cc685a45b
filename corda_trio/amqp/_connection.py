"""The sans-IO AMQP 1.0 connection engine (h2-shaped): bytes in -> events, calls -> bytes out, ``tick(now)``.

Theory of operation
-------------------
:class:`Connection` never touches a socket or a clock. The driver (``corda_trio.transport``) feeds it what it
reads (``receive_data``; ``b""`` means EOF), sends whatever ``data_to_send()`` returns, and calls
``tick(now)`` after every read and write and at the deadline ``tick`` returned. Application calls
(``begin_session``, ``attach``, ``send_transfer``, ``settle``, ``flow``, ``detach``, ``close``...)
validate, update state and *queue* frames; nothing is written until ``data_to_send()``.

Layers, in the order bytes meet them:

1. protocol headers. The client sends the SASL header (or the AMQP header when SASL is off); the server
   answers. A header we do not speak is answered with the one we do, and the connection ends (spec 2.2).
2. SASL (``_sasl_engine.py``) until ``sasl-outcome``; then the AMQP header exchange starts over.
3. frames. ``FrameBuffer`` checks each frame's size against *our* max-frame-size before buffering its body.
   Performatives are dispatched by class to ``_on_<name>``. Channels and handles in received frames are the
   peer's numbers and are mapped to our :class:`Session` / :class:`Link` objects; everything we send uses our
   own numbers.

State machines are the tables of ``_state.py``. Protocol violations are raised inside the handlers as
:class:`LocalProtocolError` carrying the AMQP condition; ``receive_data`` catches them, queues ``open`` (if
ours was not sent yet: spec 2.4.1 demands it before ``close``) and ``close`` with that condition and an
explanatory description, moves to DISCARDING and raises :class:`RemoteProtocolError` (with the events that
came before the violation). The driver flushes the ``close`` and drops the transport.

This module is the dispatcher and the lifecycle (headers, SASL, open/begin/attach/detach/end/close). The
moving parts have their own modules, mixed into :class:`Connection`: ``_transfers.py`` (sending and
receiving deliveries, link credit and its overrun, session windows, flows) and ``_settlement.py``
(dispositions out, grouped and ranged when the output is drained; dispositions in). The bookkeeping they
share is on :class:`Session` (``_session.py``) and :class:`Link` (``_link.py``).

Idle timeout (spec 2.4.5): we advertise half our real threshold; we send an empty frame when we have sent
nothing for half the peer's advertised value; a peer that sends us nothing for our full threshold gets
``close`` with ``amqp:resource-limit-exceeded``. What counts as hearing from the peer: a whole frame, or
:data:`RX_PROGRESS_BYTES` (an empty frame's size) more bytes of one still arriving. A frame can take longer
than the idle timeout to cross a slow link (a 128 KiB transfer frame needs 2.6 s at 400 kbit/s), and no
keep-alive can overtake it: counting whole frames only, a 2 s timeout closed such a connection in the
middle of every large message, for ever (found with two node processes on a 400 kbit/s link). A peer
dribbling bytes still cannot hold the connection more cheaply than with the empty frames the spec asks for:
fewer than 8 bytes per idle period is silence. A layer below that hands over whole units only (TLS records)
reports the bytes it has read of one with ``receive_progress``. Activity is sampled by ``tick``: the driver
calls it right after each ``receive_data`` and each write, so the timestamps are exact to within one call.
"""

from __future__ import annotations

import enum
from typing import Any, Final

import attrs

from . import _performatives as P
from ._config import MIN_MAX_FRAME_SIZE_BYTES, UINT_MAX, ConnectionConfig
from ._engine_errors import ConnectionClosedError, IdleTimeoutError, LocalProtocolError, RemoteProtocolError
from ._errors import AmqpError, Condition
from ._events import (
    ConnectionClosed,
    ConnectionOpened,
    Event,
    LinkAttached,
    LinkAttachRequested,
    LinkDetached,
    SaslCompleted,
    SessionBegun,
    SessionEnded,
)
from ._frames import (
    AMQP_HEADER,
    EMPTY_FRAME,
    SASL_HEADER,
    FrameBuffer,
    encode_empty_frame,
    encode_frame,
    encode_frame_within,
)
from ._link import SERIAL_MOD, Link
from ._sasl_engine import SaslClient, SaslResult, SaslServer
from ._session import Session
from ._settlement import SettlementMixin
from ._state import (
    CONNECTION_TRANSITIONS,
    ConnectionInput,
    ConnectionState,
    LinkInput,
    LinkState,
    SessionInput,
    SessionState,
    StateMachine,
)
from ._transfers import TransferMixin, error
from ._types import Symbol

__all__ = ["Connection"]

_CI = ConnectionInput
_CS = ConnectionState

# States in which our open is on the wire and our close is not.
_OPEN_SENT_STATES: Final = frozenset({_CS.OPEN_PIPE, _CS.OPEN_SENT, _CS.OPENED})
_TERMINAL_STATES: Final = frozenset({_CS.END, _CS.DISCARDING})
#: Default of the per-link ``max_message_size`` arguments: take ``ConnectionConfig.max_message_size``.
FROM_CONFIG: Final[Any] = object()
#: Bytes of a frame still arriving that count as hearing from the peer (idle timeout): as many as the empty
#: frame a keep-alive costs (spec 2.4.5), so that dribbling is no cheaper way to hold a connection open.
RX_PROGRESS_BYTES: Final = len(EMPTY_FRAME)
MAX_ULONG: Final = 2**64 - 1


class _Phase(enum.Enum):
    """Which layer the next bytes from the peer belong to."""

    HEADER = "awaiting the client's protocol header"  # server only
    SASL_HEADER = "awaiting the SASL header"
    SASL = "SASL exchange"
    AMQP_HEADER = "awaiting the AMQP header"
    AMQP = "AMQP frames"
    CLOSED = "closed"


_error = error


class Connection(TransferMixin, SettlementMixin):
    """One AMQP 1.0 connection endpoint, client or server, without I/O.

    Args:
        config: our limits, identity and SASL settings (defaults: Corda's P2P profile, see ``_config.py``).
        client: ``True`` for the side that opened the transport (it speaks first).

    Every method that takes ``channel`` / ``handle`` expects *our* numbers, as returned by
    :meth:`begin_session` / :meth:`attach` or reported in events.
    """

    def __init__(self, config: ConnectionConfig | None = None, *, client: bool) -> None:
        self.config = config if config is not None else ConnectionConfig()
        self.client = client
        self._machine: StateMachine[ConnectionState, ConnectionInput] = StateMachine(
            "connection", CONNECTION_TRANSITIONS, _CS.START
        )
        self._buffer = FrameBuffer(self.config.max_frame_size)
        self._out: list[bytes] = []
        self._events: list[Event] = []
        self._sessions: dict[int, Session] = {}
        self._sessions_by_remote: dict[int, Session] = {}
        self._dispositions_dirty = False
        self._refills: list[Session] = []
        self.remote_open: Any = None
        self.remote_max_frame_size = MIN_MAX_FRAME_SIZE_BYTES
        self.remote_channel_max = 65_535
        self.remote_idle_timeout_ms: int | None = None
        self.sasl_result: SaslResult | None = None
        self.close_error: Any = None
        # idle-timeout bookkeeping (seconds, the driver's clock)
        self._rx_flag = False
        #: bytes received since _rx_flag was last raised by bytes (RX_PROGRESS_BYTES raise it)
        self._rx_progress = 0
        self._tx_flag = False
        self._last_rx: float | None = None
        self._last_tx: float | None = None
        self._sasl_client: SaslClient | None = None
        self._sasl_server: SaslServer | None = None
        cfg = self.config
        if client:
            if cfg.sasl:
                self._sasl_client = SaslClient(
                    mechanisms=cfg.sasl_mechanisms,
                    username=cfg.sasl_username,
                    password=cfg.sasl_password,
                    hostname=cfg.hostname,
                )
                self._out.append(SASL_HEADER)
                self._phase = _Phase.SASL_HEADER
            else:
                self._start_amqp()
                self._phase = _Phase.AMQP_HEADER
        else:
            self._phase = _Phase.HEADER
        self._dispatch = {
            P.Open: self._on_open,
            P.Begin: self._on_begin,
            P.Attach: self._on_attach,
            P.Flow: self._on_flow,
            P.Transfer: self._on_transfer,
            P.Disposition: self._on_disposition,
            P.Detach: self._on_detach,
            P.End: self._on_end,
            P.Close: self._on_close,
        }

    # ------------------------------------------------------------------------------------------------
    # introspection

    @property
    def state(self) -> ConnectionState:
        """The connection state (spec 2.4.6); START until the SASL layer is done."""
        return self._machine.state

    @property
    def closed(self) -> bool:
        """Whether the connection is finished (nothing more will be sent or accepted)."""
        return self._phase is _Phase.CLOSED or self._machine.state in _TERMINAL_STATES

    @property
    def opened(self) -> bool:
        """Whether both ``open`` frames have been exchanged and no ``close`` yet."""
        return self._machine.state is _CS.OPENED

    def session(self, channel: int) -> Session:
        """Our session on ``channel`` (raises :class:`LocalProtocolError` if there is none)."""
        try:
            return self._sessions[channel]
        except KeyError:
            raise LocalProtocolError(f"no session on channel {channel}") from None

    def link(self, channel: int, handle: int) -> Link:
        """Our link ``handle`` in the session on ``channel``."""
        return self._session_link(channel, handle)[1]

    def _session_link(
        self, channel: int, handle: int, *, sending: bool | None = None, state: LinkState | None = None
    ) -> tuple[Session, Link]:
        """(session, link) of our link ``handle`` on ``channel``: the one look-up of every link-level call.

        Raises:
            LocalProtocolError: no such link, or (when asked) it is not a sending (``sending=True``) or
                receiving (``False``) link, or not in ``state``: the caller's mistake, nothing is sent.
        """
        session = self._sessions.get(channel)
        link = session.links.get(handle) if session is not None else None
        if link is None or session is None:
            raise LocalProtocolError(f"no link with handle {handle} on channel {channel}")
        if sending is not None and link.is_sender is not sending:
            kind = "sending" if sending else "receiving"
            raise LocalProtocolError(f"link {link.name!r} is not a {kind} link")
        if state is not None and link.machine.state is not state:
            raise LocalProtocolError(f"link {link.name!r} is {link.machine.state.value}, not {state.value}")
        return session, link

    def credit(self, channel: int, handle: int) -> int:
        """The link's current credit (sender: how many deliveries we may start)."""
        return self.link(channel, handle).link_credit

    # ------------------------------------------------------------------------------------------------
    # bytes in / bytes out / time

    def receive_data(self, data: bytes) -> list[Event]:
        """Feed bytes read from the transport; ``b""`` means the peer closed it (EOF).

        Returns:
            The events the bytes produced, in order.

        Raises:
            RemoteProtocolError: the peer broke the protocol. A ``close`` carrying the condition is queued
                (flush ``data_to_send()``, then drop the transport); ``exc.events`` holds the events that
                preceded the violation, the last of them a :class:`ConnectionClosed`.
        """
        events: list[Event] = []
        self._events = events
        if not data:
            self._on_eof()
            return events
        if self.closed:
            if self._machine.state is _CS.DISCARDING:
                self._discard(data)
            return events
        self.receive_progress(len(data))
        try:
            self._buffer.feed(data)
            self._process()
        except AmqpError as exc:
            condition = exc.condition
            description = exc.description
            self._fail(condition, description)
            raise RemoteProtocolError(description, condition=condition, events=events) from exc
        return events

    def receive_progress(self, nbytes: int) -> None:
        """Count ``nbytes`` that arrived for us without being fed yet against the idle timeout, as bytes of a
        frame still arriving (see the top): a layer below that hands over only whole units of its own (TLS
        records, up to 16 KiB: 2.6 s at 50 kbit/s) reports what it has read of one. ``receive_data`` counts
        its bytes itself."""
        self._rx_progress += nbytes
        if self._rx_progress >= RX_PROGRESS_BYTES:  # a frame still arriving is no silence
            self._rx_flag = True
            self._rx_progress = 0

    @property
    def wants_write(self) -> bool:
        """Whether ``data_to_send()`` would return bytes (cheap; lets a driver skip an empty flush)."""
        return bool(self._out) or self._dispositions_dirty

    def data_to_send(self) -> bytes:
        """Everything queued for the peer since the last call (``b""`` if nothing)."""
        if self._dispositions_dirty:
            self._flush_dispositions()
        if not self._out:
            return b""
        out = self._out[0] if len(self._out) == 1 else b"".join(self._out)
        self._out.clear()
        self._tx_flag = True
        return out

    def tick(self, now: float) -> float | None:
        """Account for the passage of time; send heartbeats; enforce our idle timeout.

        Args:
            now: the driver's clock in seconds (any monotonic origin, the same on every call).

        Returns:
            When ``tick`` must be called next at the latest, or ``None`` if no timer runs.

        Raises:
            IdleTimeoutError: the peer has been silent longer than our idle timeout (a
                :class:`RemoteProtocolError`); a ``close`` with ``amqp:resource-limit-exceeded`` is queued.
        """
        if self._rx_flag or self._last_rx is None:
            self._last_rx = now
            self._rx_flag = False
        if self._tx_flag or self._last_tx is None:
            self._last_tx = now
            self._tx_flag = False
        if self.closed:
            return None
        deadline: float | None = None
        state = self._machine.state
        timeout_ms = self.config.idle_timeout_ms
        if timeout_ms and state in _OPEN_SENT_STATES:
            limit = self._last_rx + timeout_ms / 1000
            if now >= limit:
                # (the description goes into our close: worded so that it is true on either side)
                description = (
                    f"no frame received for {now - self._last_rx:.3f} s (idle timeout {timeout_ms} ms, "
                    f"advertised {self.config.idle_time_out_field} ms)"
                )
                self._events = []
                self._fail(Condition.RESOURCE_LIMIT_EXCEEDED, description)
                raise IdleTimeoutError(description, events=self._events)
            deadline = limit
        peer_ms = self.remote_idle_timeout_ms
        if peer_ms and state in (_CS.OPENED, _CS.CLOSE_RCVD):
            interval = peer_ms / 2000
            due = self._last_tx + interval
            if now >= due:
                self._out.append(encode_empty_frame())
                self._last_tx = now
                due = now + interval
            deadline = due if deadline is None else min(deadline, due)
        return deadline

    # ------------------------------------------------------------------------------------------------
    # connection-level calls

    def close(self, error: P.ErrorCondition | None = None) -> None:
        """Queue our ``close`` (with ``error`` if given). Closing twice is a no-op."""
        if self.closed or self._machine.state in (_CS.CLOSE_SENT,):
            return
        if self._phase is not _Phase.AMQP:
            # Before the AMQP header exchange there is no close frame: just stop.
            self._phase = _Phase.CLOSED
            self.close_error = error
            return
        self._ensure_open_sent()
        self._machine.process(_CI.SEND_CLOSE)
        self.close_error = error
        self._out.append(encode_frame_within(P.Close(error=error), 0, self.remote_max_frame_size))
        if self._machine.state is _CS.END:
            self._phase = _Phase.CLOSED

    def begin_session(self, *, incoming_window: int | None = None, handle_max: int | None = None) -> int:
        """Queue a ``begin`` for a new session; returns its (our) channel number."""
        self._check_can_send()
        channel = 0
        while channel in self._sessions:
            channel += 1
        if channel > self.remote_channel_max:
            raise LocalProtocolError(
                f"the peer's channel-max {self.remote_channel_max} is used up",
                condition=Condition.RESOURCE_LIMIT_EXCEEDED,
            )
        session = self._new_session(channel, incoming_window, handle_max)
        session.machine.process(SessionInput.SEND_BEGIN)
        self._send_begin(session)
        return channel

    def end_session(self, channel: int, error: P.ErrorCondition | None = None) -> None:
        """Queue an ``end`` for the session on ``channel``."""
        session = self.session(channel)
        self._flush_dispositions()
        session.machine.process(SessionInput.SEND_END)
        self._out.append(encode_frame_within(P.End(error=error), channel, self.remote_max_frame_size))
        if session.state is SessionState.UNMAPPED:
            self._drop_session(session, error=error, by_peer=True)

    # ------------------------------------------------------------------------------------------------
    # link-level calls

    def attach(
        self,
        channel: int,
        role: bool,
        *,
        name: str,
        source: Any = None,
        target: Any = None,
        snd_settle_mode: int | None = None,
        rcv_settle_mode: int | None = None,
        properties: dict[Symbol, Any] | None = None,
        max_message_size: int | None = FROM_CONFIG,
    ) -> int:
        """Queue an ``attach`` for a link in the session on ``channel``; returns its handle.

        Args:
            role: :attr:`Role.SENDER <corda_trio.amqp.Role>` (we send to ``target``) or ``Role.RECEIVER``
                (we receive from ``source``; no credit yet: call :meth:`flow`).
            source / target: addresses (``str``) or :class:`~corda_trio.amqp.Source` /
                :class:`~corda_trio.amqp.Target` objects.
            snd_settle_mode / rcv_settle_mode: default: the config's.
            max_message_size: receiving links only: the largest delivery we take (bytes, ``None`` = no
                limit; default: the config's); advertised in the attach, and a larger delivery detaches the
                link with ``amqp:link:message-size-exceeded``.

        Raises:
            LocalProtocolError: the session cannot attach (not begun, handle-max used up), a link with this
                name and role exists, ``max_message_size`` was given for a sending link, or the attach would
                be larger than the peer's max-frame-size (``amqp:frame-size-too-small``; nothing is sent).
        """
        self._check_can_send()
        session = self.session(channel)
        if session.state not in (SessionState.BEGIN_SENT, SessionState.MAPPED):
            raise LocalProtocolError(f"session {channel} is {session.state.value}; cannot attach")
        role = bool(role)
        if not role and max_message_size is not FROM_CONFIG:
            raise LocalProtocolError("max_message_size is for receiving links")
        if (name, role) in session.links_by_name:
            raise LocalProtocolError(
                f"a link named {name!r} with this role is already attached", condition=Condition.NOT_ALLOWED
            )
        handle = session.free_handle()
        if handle > session.remote_handle_max:
            raise LocalProtocolError(
                f"the peer's handle-max {session.remote_handle_max} is used up",
                condition=Condition.RESOURCE_LIMIT_EXCEEDED,
            )
        link = Link(handle=handle, name=name, role=role)
        link.source, link.target = _source(source), _target(target)
        cfg = self.config
        link.snd_settle_mode = cfg.snd_settle_mode if snd_settle_mode is None else snd_settle_mode
        link.rcv_settle_mode = cfg.rcv_settle_mode if rcv_settle_mode is None else rcv_settle_mode
        if role:
            link.max_message_size = (
                cfg.max_message_size
                if max_message_size is FROM_CONFIG
                else _check_max_message_size(max_message_size)
            )
        self._send_attach(session, link, properties)  # (raises before the link is registered)
        session.links[handle] = link
        session.links_by_name[(name, role)] = link
        return handle

    def accept_link(
        self,
        channel: int,
        handle: int,
        *,
        source: Any = None,
        target: Any = None,
        properties: dict[Symbol, Any] | None = None,
        max_message_size: int | None = FROM_CONFIG,
        rcv_settle_mode: int | None = None,
    ) -> None:
        """Answer a :class:`LinkAttachRequested` with our ``attach`` (source/target default to the peer's).

        ``max_message_size``: for a link on which we receive, the largest delivery we take (bytes, ``None``
        = no limit; default: the config's); advertised in our attach and enforced as frames arrive.
        ``rcv_settle_mode``: for a link on which we receive, the policy we state and keep (spec 2.7.3: the
        receiver's attach says how it settles; the sender only proposes): ``0`` (first) if we settle as we
        report an outcome, ``1`` (second) if we report with ``settle(..., settled=False)`` and settle once
        the sender has; default: the peer's proposal.

        The engine hands the application only attaches whose default answer (the peer's source and target
        echoed) fits the peer's max-frame-size; other ones it refuses itself (see ``_on_attach``).

        Raises:
            LocalProtocolError: ``amqp:frame-size-too-small``: the ``source`` / ``target`` / ``properties``
                given make our attach larger than the peer's max-frame-size; nothing is sent and the link
                still waits for an answer (refuse it).
        """
        session, link = self._session_link(channel, handle, state=LinkState.ATTACH_RCVD)
        if link.role and max_message_size is not FROM_CONFIG:
            link.max_message_size = _check_max_message_size(max_message_size)
        if link.role and rcv_settle_mode is not None:
            if rcv_settle_mode not in (0, 1):
                raise LocalProtocolError(f"rcv_settle_mode must be 0 or 1, got {rcv_settle_mode}")
            link.rcv_settle_mode = rcv_settle_mode
        remote = link.remote_attach
        link.source = _source(source) if source is not None else remote.source
        link.target = _target(target) if target is not None else remote.target
        self._send_attach(session, link, properties)

    def refuse_link(self, channel: int, handle: int, error: P.ErrorCondition) -> None:
        """Refuse a peer's attach: answer with a null terminus, then detach with ``error`` (spec 2.6.3).

        The other terminus echoes the peer's, unless that would take our attach past the peer's
        max-frame-size: then both are null (a refusal needs no echo).
        """
        session, link = self._session_link(channel, handle, state=LinkState.ATTACH_RCVD)
        self._send_null_attach(session, link)
        self.detach(channel, handle, error=error, closed=True)

    def _send_null_attach(self, session: Session, link: Link) -> None:
        """Answer the peer's attach with a null terminus (a refusal, or a link it detached unanswered)."""
        if link.is_sender:  # the peer wants to receive from a source we refuse
            link.source, link.target = None, link.remote_attach.target
        else:
            link.source, link.target = link.remote_attach.source, None
        if len(self._attach_frame(session, link, None)) > self.remote_max_frame_size:
            link.source = link.target = None
        self._send_attach(session, link, None)

    def detach(
        self, channel: int, handle: int, *, error: P.ErrorCondition | None = None, closed: bool = True
    ) -> None:
        """Queue a ``detach`` for our link ``handle``."""
        session, link = self._session_link(channel, handle)
        self._flush_dispositions()
        link.machine.process(LinkInput.SEND_DETACH)
        link.detach_error = error
        self._out.append(
            encode_frame_within(
                P.Detach(handle=link.handle, closed=closed, error=error),
                session.channel,
                self.remote_max_frame_size,
            )
        )
        if link.state is LinkState.DETACHED:
            self._drop_link(session, link, error=error, closed=closed, by_peer=True)

    # ------------------------------------------------------------------------------------------------
    # internals: output helpers

    def _check_can_send(self) -> None:
        if self.closed or self._machine.state in (_CS.CLOSE_SENT, _CS.CLOSE_RCVD):
            raise ConnectionClosedError("the connection is closed or closing")
        if self._phase is not _Phase.AMQP and self._machine.state not in _OPEN_SENT_STATES:
            raise LocalProtocolError("the connection is not open yet (SASL or header exchange running)")

    def _start_amqp(self) -> None:
        """Send the AMQP header and our open (client after SASL, or without SASL)."""
        self._machine.process(_CI.SEND_HEADER)
        self._out.append(AMQP_HEADER)
        self._send_open()

    def _send_open(self) -> None:
        cfg = self.config
        self._machine.process(_CI.SEND_OPEN)
        self._out.append(
            encode_frame(
                P.Open(
                    container_id=cfg.container_id,
                    hostname=cfg.hostname,
                    max_frame_size=cfg.max_frame_size,
                    channel_max=cfg.channel_max,
                    idle_time_out=cfg.idle_time_out_field,
                    properties=cfg.properties,
                )
            )
        )

    def _ensure_open_sent(self) -> None:
        if self._machine.state in (_CS.HDR_EXCH, _CS.OPEN_RCVD):
            self._send_open()

    def _new_session(self, channel: int, incoming_window: int | None, handle_max: int | None) -> Session:
        cfg = self.config
        session = Session(
            channel=channel,
            incoming_window=incoming_window or cfg.incoming_window,
            outgoing_window=cfg.outgoing_window,
            handle_max=cfg.handle_max if handle_max is None else handle_max,
        )
        self._sessions[channel] = session
        return session

    def _send_begin(self, session: Session) -> None:
        self._out.append(
            encode_frame(
                P.Begin(
                    remote_channel=session.remote_channel,
                    next_outgoing_id=session.next_outgoing_id,
                    incoming_window=session.incoming_window,
                    outgoing_window=session.outgoing_window,
                    handle_max=session.handle_max,
                ),
                session.channel,
            )
        )

    def _attach_frame(
        self, session: Session, link: Link, properties: dict[Symbol, Any] | None, *, widest: bool = False
    ) -> bytes:
        """Our ``attach`` for ``link``, encoded. ``widest``: with the widest values an answer may still be
        given (a max-message-size as a full ulong, an explicit rcv-settle-mode): what the engine checks
        against the peer's max-frame-size before handing a peer's attach to the application."""
        attach = P.Attach(
            name=link.name,
            handle=link.handle,
            role=link.role,
            snd_settle_mode=link.snd_settle_mode,
            rcv_settle_mode=link.rcv_settle_mode,
            source=link.source,
            target=link.target,
            initial_delivery_count=None if link.role else link.delivery_count,
            max_message_size=link.max_message_size if link.role else None,
            properties=properties,
        )
        if widest:
            attach = attrs.evolve(
                attach, rcv_settle_mode=1, max_message_size=MAX_ULONG if link.role else None
            )
        return encode_frame(attach, session.channel)

    def _send_attach(self, session: Session, link: Link, properties: dict[Symbol, Any] | None) -> None:
        """Queue our ``attach``; it must fit the peer's max-frame-size (checked before any state changes).

        Raises:
            LocalProtocolError: ``amqp:frame-size-too-small``: the attach is larger than the peer takes
                (a frame above its max-frame-size would be a framing error there, ending the connection).
        """
        frame = self._attach_frame(session, link, properties)
        limit = self.remote_max_frame_size
        if len(frame) > limit:
            raise LocalProtocolError(
                f"the attach of link {_short(link.name)} would be {len(frame)} bytes, above the peer's "
                f"max-frame-size {limit}",
                condition=Condition.FRAME_SIZE_TOO_SMALL,
            )
        link.machine.process(LinkInput.SEND_ATTACH)
        self._out.append(frame)

    # ------------------------------------------------------------------------------------------------
    # internals: failure

    def _fail(self, condition: Symbol, description: str) -> None:
        """Stop after a protocol violation: queue open (if needed) and close(error), or just stop."""
        error = _error(condition, description)
        self.close_error = error
        if self._phase is _Phase.AMQP and self._machine.state not in _TERMINAL_STATES:
            if self._machine.state in (_CS.HDR_RCVD,):
                self._machine.process(_CI.SEND_HEADER)
                self._out.append(AMQP_HEADER)
            self._ensure_open_sent()
            if self._machine.can(_CI.SEND_CLOSE_ERROR):
                self._machine.process(_CI.SEND_CLOSE_ERROR)
                self._out.append(encode_frame_within(P.Close(error=error), 0, self.remote_max_frame_size))
            else:
                self._phase = _Phase.CLOSED
        else:
            if self._phase is _Phase.HEADER:  # not even a protocol header: answer with ours (spec 2.2)
                self._out.append(SASL_HEADER if self.config.sasl else AMQP_HEADER)
            elif self._phase is _Phase.SASL and self._sasl_server is not None:
                # A malformed or unexpected SASL frame: the client still learns the outcome (sys) first.
                self._out.extend(encode_frame(f) for f in self._sasl_server.fail())
            self._phase = _Phase.CLOSED
        self._events.append(ConnectionClosed(error=error, by_peer=False))

    def _discard(self, data: bytes) -> None:
        """DISCARDING: read frames only to find the peer's close; anything broken just ends it."""
        try:
            self._buffer.feed(data)
            while (frame := self._buffer.next_frame()) is not None:
                if isinstance(frame.performative, P.Close):
                    self._machine.process(_CI.RECV_CLOSE)
                    self._phase = _Phase.CLOSED
                    return
        except AmqpError:
            self._phase = _Phase.CLOSED

    def _on_eof(self) -> None:
        if self._phase is _Phase.CLOSED or self._machine.state is _CS.END:
            return
        if self._machine.state is _CS.DISCARDING:
            self._phase = _Phase.CLOSED
            return
        pending = self._buffer.buffered_bytes
        where = self._phase.value if self._phase is not _Phase.AMQP else f"state {self._machine.state.value}"
        detail = f" with {pending} bytes of an incomplete frame buffered" if pending else ""
        error = _error(
            Condition.CONNECTION_FORCED,
            f"the peer closed the transport without a close frame ({where}){detail}",
        )
        self._phase = _Phase.CLOSED
        self.close_error = error
        self._events.append(ConnectionClosed(error=error, by_peer=True))

    # ------------------------------------------------------------------------------------------------
    # internals: input

    def _process(self) -> None:
        buffer = self._buffer
        dispatch = self._dispatch
        while True:
            phase = self._phase
            if phase is _Phase.AMQP:
                frame = buffer.next_frame()
                if frame is None:
                    return
                self._rx_flag = True  # (a heartbeat split across reads counts once whole)
                if frame.type != 0:
                    raise LocalProtocolError(
                        f"SASL frame (type {frame.type}) after the AMQP header",
                        condition=Condition.FRAMING_ERROR,
                    )
                performative = frame.performative
                if performative is None:
                    continue  # heartbeat (empty frame)
                handler = dispatch.get(type(performative))
                if handler is None:
                    raise LocalProtocolError(
                        f"unexpected frame body {type(performative).__name__} in an AMQP frame",
                        condition=Condition.NOT_IMPLEMENTED,
                    )
                if self.remote_open is None and type(performative) is not P.Open:
                    raise LocalProtocolError(
                        f"{type(performative).__name__.lower()} frame (channel {frame.channel}) before "
                        "the open frame: open must be the first frame of a connection (spec 2.4.1)",
                        condition=Condition.ILLEGAL_STATE,
                    )
                handler(frame.channel, performative, frame.payload)
                if self._phase is not _Phase.AMQP:
                    return
            elif phase is _Phase.CLOSED:
                return
            elif phase is _Phase.SASL:
                frame = buffer.next_frame()
                if frame is None:
                    return
                self._rx_flag = True
                self._on_sasl_frame(frame)
            else:
                header = buffer.next_protocol_header()
                if header is None:
                    return
                self._rx_flag = True
                self._on_header(bytes(header))

    def _on_header(self, header: bytes) -> None:
        phase = self._phase
        cfg = self.config
        if phase is _Phase.HEADER:  # server, first bytes from the client
            if header == SASL_HEADER and cfg.sasl:
                self._sasl_server = SaslServer(
                    mechanisms=cfg.sasl_mechanisms, plain_check=cfg.sasl_plain_check
                )
                # Spec 5.3.1: SASL frames are at most MIN-MAX-FRAME-SIZE; a bigger one is a framing error.
                self._buffer.max_frame_size = MIN_MAX_FRAME_SIZE_BYTES
                self._out.append(SASL_HEADER)
                self._out.extend(encode_frame(f) for f in self._sasl_server.start())
                self._phase = _Phase.SASL
                return
            if header == AMQP_HEADER and (not cfg.sasl or cfg.allow_bare_amqp):
                self._machine.process(_CI.RECV_HEADER)
                self._machine.process(_CI.SEND_HEADER)
                self._out.append(AMQP_HEADER)
                self._send_open()
                self._phase = _Phase.AMQP
                return
            ours = SASL_HEADER if cfg.sasl else AMQP_HEADER
            self._out.append(ours)
            self._phase = _Phase.CLOSED
            if header == AMQP_HEADER:
                raise LocalProtocolError(
                    "this server requires SASL: the client sent the bare AMQP header",
                    condition=Condition.NOT_ALLOWED,
                )
            raise LocalProtocolError(
                f"unsupported protocol header {header!r}; we speak {ours!r}",
                condition=Condition.FRAMING_ERROR,
            )
        if phase is _Phase.SASL_HEADER:  # client
            if header != SASL_HEADER:
                self._phase = _Phase.CLOSED
                raise LocalProtocolError(
                    f"the server answered protocol header {header!r} to our SASL header",
                    condition=Condition.FRAMING_ERROR,
                )
            self._phase = _Phase.SASL
            return
        # AMQP_HEADER
        if header != AMQP_HEADER:
            if not self.client and self._machine.state is _CS.START:
                self._out.append(AMQP_HEADER)
            self._phase = _Phase.CLOSED
            raise LocalProtocolError(
                f"expected the AMQP header, got {header!r}", condition=Condition.FRAMING_ERROR
            )
        self._machine.process(_CI.RECV_HEADER)
        if not self.client:
            self._machine.process(_CI.SEND_HEADER)
            self._out.append(AMQP_HEADER)
            self._send_open()
        self._phase = _Phase.AMQP

    def _on_sasl_frame(self, frame: Any) -> None:
        if frame.type != 1:
            raise LocalProtocolError("AMQP frame during the SASL exchange", condition=Condition.FRAMING_ERROR)
        engine = self._sasl_client or self._sasl_server
        assert engine is not None
        to_send, result = engine.on_frame(frame.performative)
        self._out.extend(encode_frame(f) for f in to_send)
        if result is None:
            return
        self.sasl_result = result
        self._buffer.max_frame_size = self.config.max_frame_size
        if result.ok:
            self._events.append(SaslCompleted(mechanism=result.mechanism, username=result.username))
            if self.client:
                self._start_amqp()
            self._phase = _Phase.AMQP_HEADER
            return
        self._phase = _Phase.CLOSED
        error = _error(Condition.UNAUTHORIZED_ACCESS, result.description)
        self.close_error = error
        # The client learns it from the server (by_peer); the server decided itself.
        self._events.append(ConnectionClosed(error=error, by_peer=self.client))

    # --- connection performatives --------------------------------------------------------------------

    def _on_open(self, channel: int, frame: P.Open, payload: bytes) -> None:
        if channel != 0:
            raise LocalProtocolError(f"open on channel {channel}", condition=Condition.FRAMING_ERROR)
        if self.remote_open is not None:
            raise LocalProtocolError(
                "second open frame: the connection is already open (spec 2.4.1)",
                condition=Condition.ILLEGAL_STATE,
            )
        self._machine.process(_CI.RECV_OPEN)
        self.remote_open = frame
        mfs = frame.max_frame_size if frame.max_frame_size is not None else UINT_MAX
        if mfs < MIN_MAX_FRAME_SIZE_BYTES:
            raise LocalProtocolError(
                f"peer max-frame-size {mfs} is below the minimum 512 (spec 2.7.1)",
                condition=Condition.INVALID_FIELD,
            )
        self.remote_max_frame_size = mfs
        self.remote_channel_max = frame.channel_max if frame.channel_max is not None else 65_535
        self.remote_idle_timeout_ms = frame.idle_time_out or None
        if (
            self.remote_idle_timeout_ms is not None
            and self.remote_idle_timeout_ms < self.config.min_peer_idle_timeout_ms
        ):
            raise LocalProtocolError(
                f"peer idle-time-out {self.remote_idle_timeout_ms} ms is below the "
                f"{self.config.min_peer_idle_timeout_ms} ms we support (spec 2.4.5)",
                condition=Condition.RESOURCE_LIMIT_EXCEEDED,
            )
        if self._machine.state is _CS.OPEN_RCVD:
            self._send_open()
        self._events.append(ConnectionOpened(remote_open=frame))

    def _on_close(self, channel: int, frame: P.Close, payload: bytes) -> None:
        self._machine.process(_CI.RECV_CLOSE)
        if self._machine.state is _CS.CLOSE_RCVD:
            self._flush_dispositions()
            self._machine.process(_CI.SEND_CLOSE)
            self._out.append(encode_frame(P.Close()))
            self.close_error = frame.error
            self._events.append(
                ConnectionClosed(error=frame.error, by_peer=True, error_from_peer=frame.error is not None)
            )
        else:  # our close is answered
            self._events.append(ConnectionClosed(error=self.close_error, by_peer=False))
        self._phase = _Phase.CLOSED

    # --- sessions ------------------------------------------------------------------------------------

    def _remote_session(self, channel: int, what: str) -> Session:
        session = self._sessions_by_remote.get(channel)
        if session is None:
            raise LocalProtocolError(
                f"{what} frame on channel {channel}, which has no session (no begin received on it)",
                condition=Condition.NOT_ALLOWED,
            )
        return session

    def _on_begin(self, channel: int, frame: P.Begin, payload: bytes) -> None:
        if channel > self.config.channel_max:
            raise LocalProtocolError(
                f"begin on channel {channel} above our channel-max {self.config.channel_max}",
                condition=Condition.FRAMING_ERROR,
            )
        if channel in self._sessions_by_remote:
            raise LocalProtocolError(
                f"begin on channel {channel}, which is already in use", condition=Condition.NOT_ALLOWED
            )
        if frame.remote_channel is not None:
            session = self._sessions.get(frame.remote_channel)
            if session is None or session.state is not SessionState.BEGIN_SENT:
                raise LocalProtocolError(
                    f"begin answers our channel {frame.remote_channel}, where we began no session",
                    condition=Condition.NOT_ALLOWED,
                )
            initiated_by_peer = False
        else:
            local = 0
            while local in self._sessions:
                local += 1
            session = self._new_session(local, None, None)
            initiated_by_peer = True
        session.machine.process(SessionInput.RECV_BEGIN)
        session.remote_channel = channel
        session.remote_begin = frame
        session.next_incoming_id = frame.next_outgoing_id
        session.remote_incoming_window = frame.incoming_window
        session.remote_outgoing_window = frame.outgoing_window
        session.remote_handle_max = frame.handle_max if frame.handle_max is not None else UINT_MAX
        self._sessions_by_remote[channel] = session
        if initiated_by_peer:
            session.machine.process(SessionInput.SEND_BEGIN)
            self._send_begin(session)
        self._events.append(
            SessionBegun(channel=session.channel, remote_begin=frame, initiated_by_peer=initiated_by_peer)
        )

    def _on_end(self, channel: int, frame: P.End, payload: bytes) -> None:
        session = self._remote_session(channel, "end")
        session.machine.process(SessionInput.RECV_END)
        if session.state is SessionState.END_RCVD:
            self._flush_dispositions()
            session.machine.process(SessionInput.SEND_END)
            self._out.append(encode_frame(P.End(), session.channel))
            self._drop_session(session, error=frame.error, by_peer=True)
        else:
            self._drop_session(session, error=frame.error, by_peer=False)

    def _drop_session(self, session: Session, *, error: Any, by_peer: bool) -> None:
        for link in list(session.links.values()):
            self._drop_link(session, link, error=error, closed=False, by_peer=by_peer)
        self._sessions.pop(session.channel, None)
        if session.remote_channel is not None:
            self._sessions_by_remote.pop(session.remote_channel, None)
        self._events.append(SessionEnded(channel=session.channel, error=error, by_peer=by_peer))

    # --- links ---------------------------------------------------------------------------------------

    def _on_attach(self, channel: int, frame: P.Attach, payload: bytes) -> None:
        session = self._remote_session(channel, "attach")
        if frame.handle > session.handle_max:
            raise LocalProtocolError(
                f"attach with handle {frame.handle} above our handle-max {session.handle_max}",
                condition=Condition.FRAMING_ERROR,
            )
        if frame.handle in session.links_by_remote:
            raise LocalProtocolError(
                f"attach with handle {frame.handle}, which is already in use",
                condition=Condition.HANDLE_IN_USE,
            )
        our_role = not frame.role
        link = session.links_by_name.get((frame.name, our_role))
        if (
            link is not None
            and link.state in (LinkState.ATTACH_SENT, LinkState.DETACH_SENT)
            and link.remote_handle is None
        ):
            link.machine.process(LinkInput.RECV_ATTACH)
            self._bind_remote(session, link, frame)
            if not our_role:  # we send: the receiver chooses rcv-settle-mode
                link.rcv_settle_mode = frame.rcv_settle_mode
            if link.state is LinkState.ATTACHED:
                self._events.append(
                    LinkAttached(channel=session.channel, handle=link.handle, remote_attach=frame)
                )
            return
        if our_role and frame.initial_delivery_count is None:
            raise LocalProtocolError(
                "a sender's attach must carry initial-delivery-count (spec 2.7.3)",
                condition=Condition.INVALID_FIELD,
            )
        self._steal(frame.name, our_role)
        link = Link(handle=session.free_handle(), name=frame.name, role=our_role)
        link.machine.process(LinkInput.RECV_ATTACH)
        link.snd_settle_mode = frame.snd_settle_mode
        link.rcv_settle_mode = frame.rcv_settle_mode
        link.source, link.target = frame.source, frame.target
        if our_role:
            link.max_message_size = self.config.max_message_size
        session.links[link.handle] = link
        session.links_by_name[(frame.name, our_role)] = link
        self._bind_remote(session, link, frame)
        size = len(self._attach_frame(session, link, None, widest=True))
        if size > self.remote_max_frame_size:
            # The answer echoes the peer's source and target, which may be as large as *our* max-frame-size
            # allows; sent above the peer's own it would be a framing error there and end the connection.
            # Refused here with a short reason, before the application sees it. (A name too long for even
            # the bare refusal leaves no answer within the peer's limit: then the connection closes with
            # amqp:frame-size-too-small, raised by _send_attach.)
            self.refuse_link(
                session.channel,
                link.handle,
                _error(
                    Condition.FRAME_SIZE_TOO_SMALL,
                    f"the answer to this attach, echoing its source and target, would be {size} bytes; "
                    f"your max-frame-size is {self.remote_max_frame_size}",
                ),
            )
            return
        self._events.append(LinkAttachRequested(channel=session.channel, handle=link.handle, attach=frame))

    def _steal(self, name: str, our_role: bool) -> None:
        """The peer attaches a link whose name (and direction) an attached link of this connection has:
        detach the old one with ``amqp:link:stolen`` (spec 2.6.1, 2.8.15: a link name is one link between
        two containers; attaching it again moves it), in any session of the connection.

        Real clients do this within one session: Qpid Proton, asked to detach a link and attach one of the
        same name, sends the new ``attach`` before the old ``detach``. The old link stays known by its
        handles until the peer answers our ``detach`` (which its own ``detach`` may already be); only its
        name is freed at once. One we have not answered yet is refused; one we are detaching already keeps
        waiting for the peer's answer.
        """
        for session in self._sessions.values():
            old = session.links_by_name.get((name, our_role))
            if old is None:
                continue
            del session.links_by_name[(name, our_role)]
            if old.state is LinkState.DETACH_SENT:
                continue
            stolen = _error(
                Condition.STOLEN, f"link {_short(name)} was attached again: this attachment is detached"
            )
            if old.state is LinkState.ATTACH_RCVD:
                self.refuse_link(session.channel, old.handle, stolen)
            else:
                self.detach(session.channel, old.handle, error=stolen, closed=False)

    @staticmethod
    def _bind_remote(session: Session, link: Link, frame: P.Attach) -> None:
        link.remote_handle = frame.handle
        link.remote_attach = frame
        session.links_by_remote[frame.handle] = link
        if link.role:  # we receive: the sender's count is the start
            link.delivery_count = (frame.initial_delivery_count or 0) % SERIAL_MOD
        else:
            link.remote_max_message_size = frame.max_message_size or None

    def _on_detach(self, channel: int, frame: P.Detach, payload: bytes) -> None:
        session = self._remote_session(channel, "detach")
        link = session.links_by_remote.get(frame.handle)
        if link is None:
            raise LocalProtocolError(
                f"detach of handle {frame.handle}, which is not attached",
                condition=Condition.UNATTACHED_HANDLE,
            )
        if link.state is LinkState.ATTACH_RCVD:
            # The peer detaches a link we have not answered yet: an attach and a detach pipelined, as Qpid
            # Proton sends them for a link opened and closed at once (it was an illegal-state close of the
            # whole connection). Our answer comes first, with a null terminus, then the detach's.
            self._send_null_attach(session, link)
        link.machine.process(LinkInput.RECV_DETACH)
        if link.state is LinkState.DETACH_RCVD:
            self._flush_dispositions()
            link.machine.process(LinkInput.SEND_DETACH)
            self._out.append(encode_frame(P.Detach(handle=link.handle, closed=frame.closed), session.channel))
            self._drop_link(session, link, error=frame.error, closed=frame.closed, by_peer=True)
        else:  # the peer answers our detach: report our reason if we gave one (message too big, overrun)
            error = frame.error if frame.error is not None else link.detach_error
            self._drop_link(session, link, error=error, closed=frame.closed, by_peer=False)

    def _drop_link(self, session: Session, link: Link, *, error: Any, closed: bool, by_peer: bool) -> None:
        session.links.pop(link.handle, None)
        if session.links_by_name.get((link.name, link.role)) is link:  # (a stolen link's name is taken)
            del session.links_by_name[(link.name, link.role)]
        if link.remote_handle is not None:
            session.links_by_remote.pop(link.remote_handle, None)
        unsettled = tuple(sorted(link.unsettled))
        for did in unsettled:
            session.outgoing_unsettled.pop(did, None)
        link.unsettled.clear()
        if link.role:
            for did in [d for d, lk in session.incoming_unsettled.items() if lk is link]:
                del session.incoming_unsettled[did]
        self._events.append(
            LinkDetached(
                channel=session.channel,
                handle=link.handle,
                error=error,
                closed=closed,
                by_peer=by_peer,
                unsettled=unsettled,
            )
        )


def _short(name: str) -> str:
    """A link name for a description: quoted, at most 40 characters of it (a peer's name may be huge)."""
    return repr(name) if len(name) <= 40 else repr(name[:40]) + f"... ({len(name)} characters)"


def _check_max_message_size(value: int | None) -> int | None:
    if value is not None and not 0 < value <= MAX_ULONG:
        raise LocalProtocolError(f"max_message_size must be a positive ulong or None, got {value!r}")
    return value


def _source(value: Any) -> Any:
    if value is None or isinstance(value, P.Source):
        return value
    if isinstance(value, str):
        return P.Source(address=value)
    raise TypeError(f"source must be an address (str) or amqp.Source, not {type(value).__name__}")


def _target(value: Any) -> Any:
    if value is None or isinstance(value, P.Target):
        return value
    if isinstance(value, str):
        return P.Target(address=value)
    raise TypeError(f"target must be an address (str) or amqp.Target, not {type(value).__name__}")
