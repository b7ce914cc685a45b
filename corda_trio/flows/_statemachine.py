"""The flow state machine (PURE): ``transition(state, event, env) -> Transition(state', actions)``.

Theory of operation
-------------------
*State.* :class:`FlowState` is everything a flow is: its frame stack (the flow objects, the step each runs
next and what it waits for), its sessions (ids, sequence numbers, data received and not yet consumed, whether
the peer ended or errored), the number of committed transitions (``suspends``) and the *outbox*: the messages
the latest transition produced. ``_codec`` turns it into the checkpoint and back.

*Transitions.* An event (start, a session message, a timer, a kill) is applied; if the top frame can then go
on (its receive has data, its sleep is over), steps run until the flow blocks again (a receive without data, a
sleep) or ends. Sends do not block: they collect in the outbox. The result lists the actions, in the order the
executor must perform them:

1. :class:`PersistCheckpoint` (the new state, outbox included, becomes durable together with the fact that the
   triggering messages were consumed: their sequence numbers are in it),
2. :class:`AcknowledgeMessages` (the inbox messages may go),
3. :class:`SendMessages` (the outbox; their dedup ids are deterministic, ``N-<seed>-<suspends>-<index>`` and
   ``E-<error id>-<session>``),
4. :class:`ScheduleTimer`, and :class:`CompleteFlow` / :class:`FailFlow` at the end.

A crash anywhere between 1 and 3 is repaired by resending the outbox of the last checkpoint: the receiver
drops the copies (dedup id, sequence number). A crash before 1 leaves the messages in the inbox: they come
again and the transition is recomputed, identically, because steps are deterministic and every id is derived
from the flow id and counters in the state.

*Errors.* A step raising a :class:`FlowException` ends the flow: each open session gets an error message with
its text. A :class:`RetryableFlowError` or any other exception gives one action, :class:`SendToHospital`; the
state passed in may then have been changed half-way and must be thrown away (the executor reloads the last
checkpoint). A message that breaks the protocol (unknown session, wrong sender, out of sequence, a confirm
twice) is acknowledged and dropped with :class:`RefuseMessage` naming the reason; the flow is unaffected.

*Data not received yet.* Data that arrives while the flow waits for something else is held in its session
(``received``, in the checkpoint: every transition writes all of it again). A session holds at most
``Environment.max_unconsumed_messages`` payloads and ``max_unconsumed_bytes`` (as received; a message that
arrives when nothing is held is always taken, whatever its size). Data beyond either *overflows* the
session: what it held is dropped, the peer gets an error naming the limit
(:data:`SESSION_OVERFLOW_ERROR_TYPE`), the session is closed, and the flow's next receive from it fails with
that error; the flow goes on meanwhile (it may never receive from that session again). A peer cannot make
a flow's checkpoint grow without bound, nor each of its writes slower.

*Unconfirmed sessions.* Messages for a session whose confirm has not arrived yet (data, the end of a flow
that finished, the error of one that failed) are held in the session (``buffered``, in the checkpoint) and
sent, in order, by the transition that applies the confirm; a reject drops them. This holds after the flow
finished too: a finished flow with held messages (:attr:`FlowState.unflushed`) still takes its sessions'
confirm or reject, so the responder always hears how the flow ended (unless an operator gives up on a peer
that never confirms: a :class:`Kill` of such a flow drops the held messages). The error's id is fixed when
the flow fails, so the error sent later, or again after a crash, is the same message.

*Ownership.* ``transition`` changes the state it is given (flows are mutable attrs objects); callers that may
need the old state keep its checkpoint bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final

import attrs

from ._errors import (
    COUNTER_FLOW_ERRORED,
    FlowException,
    FlowKilledError,
    RetryableFlowError,
    UnexpectedFlowEndError,
)
from ._logic import FlowLogic
from ._messages import (
    BadPayload,
    ConfirmPayload,
    DataPayload,
    EndPayload,
    ErrorPayload,
    ExistingSessionMessage,
    InitialSessionMessage,
    RejectPayload,
    SessionMessage,
    derive_id,
    error_dedup_id,
    normal_dedup_id,
)
from ._registry import registry, type_name, type_named
from ._requests import (
    CloseSessions,
    Finish,
    FlowSession,
    Receive,
    Send,
    Sleep,
    SubFlow,
    Waiting,
    WaitReceive,
    WaitSleep,
    WaitSubFlow,
)

__all__ = [
    "MAX_STEPS_PER_TRANSITION",
    "MAX_UNCONSUMED_BYTES",
    "MAX_UNCONSUMED_MESSAGES",
    "SESSION_OVERFLOW_ERROR_TYPE",
    "AcknowledgeMessages",
    "Action",
    "CompleteFlow",
    "Environment",
    "FailFlow",
    "FlowContext",
    "FlowState",
    "Frame",
    "Kill",
    "MessageArrived",
    "Outgoing",
    "PersistCheckpoint",
    "RefuseMessage",
    "ScheduleTimer",
    "SendMessages",
    "SendToHospital",
    "SessionState",
    "Start",
    "TimerFired",
    "Transition",
    "hold_messages",
    "new_initiator",
    "new_responder",
    "responder_flow_id",
    "transition",
]

#: A flow running more steps than this without blocking is a bug (a loop of sends): it goes to the hospital.
MAX_STEPS_PER_TRANSITION: Final = 10_000
#: Default of ``Environment.max_unconsumed_messages``: payloads one session holds before its flow receives
#: them. A flow takes what arrives on the session it waits for at once, so only data sent ahead of the flow
#: (while it waits on another session, sleeps or runs a sub-flow) is held; a thousand is far more than any
#: shipped or example flow sends ahead.
MAX_UNCONSUMED_MESSAGES: Final = 1_000
#: Default of ``Environment.max_unconsumed_bytes``: payload bytes one session holds (every checkpoint of the
#: flow writes them again: 16 MiB is about a second of disk bandwidth per transition, and far below the
#: store's 256 MiB record limit, which one checkpoint must fit into).
MAX_UNCONSUMED_BYTES: Final = 16 * 1024 * 1024
#: The exception type of the error a session that overflowed sends its peer.
SESSION_OVERFLOW_ERROR_TYPE: Final = "corda_trio.flows.SessionOverflowError"

RUNNING: Final = "running"
COMPLETED: Final = "completed"
FAILED: Final = "failed"


# ----------------------------------------------------------------------------------------------- state


@attrs.define(eq=False)
class SessionState:
    """One session of a flow. Sequence numbers count per direction from 0 (the init, or the confirm)."""

    index: int
    counterparty: str
    our_id: int
    initiating: bool
    entropy: int
    #: dedup seed: ``R-<our id>-<entropy>`` (initiator), ``D-<initiator id>-<entropy>`` (responder)
    seed: str
    #: initiating flow name, version and app name (sent in the init)
    flow_name: str = ""
    flow_version: int = 1
    app_name: str = ""
    peer_id: int | None = None
    init_sent: bool = False
    send_seq: int = 0
    recv_seq: int = 0
    #: payloads received and not consumed yet (values, or BadPayload), and their sizes in bytes (as received;
    #: from a checkpoint, as encoded there): change them with :meth:`hold` and :meth:`take`
    received: list[Any] = attrs.field(factory=list)
    received_sizes: list[int] = attrs.field(factory=list)
    #: (kind, value) to send once the peer's session id is known: ("data", payload), ("end", None),
    #: ("error", [error id, exception type, message]), ("confirm", None) (a responder's, owed first)
    buffered: list[tuple[str, Any]] = attrs.field(factory=list)
    peer_ended: bool = False
    #: (exception type or None, message) once the peer errored or rejected
    peer_error: tuple[str | None, str] | None = None
    closed: bool = False

    @property
    def open(self) -> bool:
        return not (self.closed or self.peer_ended or self.peer_error is not None)

    @property
    def received_bytes(self) -> int:
        return sum(self.received_sizes)

    def hold(self, payload: Any, size: int) -> None:
        self.received.append(payload)
        self.received_sizes.append(size)

    def take(self) -> Any:
        self.received_sizes.pop(0)
        return self.received.pop(0)


@attrs.define(eq=False)
class Frame:
    """A flow on the stack: the step it runs next, and what it waits for first (``None``: nothing)."""

    flow: FlowLogic[Any]
    step: str = "call"
    wait: Waiting | None = None


@attrs.frozen(kw_only=True)
class Outgoing:
    """A message to send: counterparty, dedup id and the message (``wire``: its encoding, once known)."""

    counterparty: str
    dedup_id: str
    message: SessionMessage | None = None
    wire: bytes | None = None
    initial: bool = False


@attrs.define(eq=False)
class FlowState:
    flow_id: str
    stack: list[Frame]
    sessions: dict[int, SessionState] = attrs.field(factory=dict)
    next_session: int = 0
    #: committed transitions (a checkpoint each)
    suspends: int = 0
    outbox: list[Outgoing] = attrs.field(factory=list)
    status: str = RUNNING
    result: Any = None
    #: (exception type, message) of a failed flow
    error: tuple[str | None, str] | None = None
    #: the top-level flow's name (kept after it finished)
    flow_class: str = ""
    #: who started it (the RPC user's name; ``None``: code in the node, a responder, or a checkpoint written
    #: before starters were recorded): a client id belongs to the flow's starter
    started_by: str | None = None

    @property
    def flow_name(self) -> str:
        return self.flow_class or (self.stack[0].flow.flow_name if self.stack else "")

    @property
    def finished(self) -> bool:
        return self.status != RUNNING

    def session_by_id(self, our_id: int) -> SessionState | None:
        for s in self.sessions.values():
            if s.our_id == our_id:
                return s
        return None

    @property
    def unflushed(self) -> bool:
        """Messages wait for a session's confirm. A finished flow in this state still needs its confirms (or
        rejects): its record must stay and session messages for it must still reach it."""
        return any(s.buffered for s in self.sessions.values())

    @property
    def wake_at(self) -> float | None:
        if self.stack and isinstance(self.stack[-1].wait, WaitSleep):
            return self.stack[-1].wait.wake_at
        return None


# ----------------------------------------------------------------------------------------------- events


@attrs.frozen(kw_only=True)
class Start:
    """Run the flow's first step (a new flow, or a responder created from a session init)."""

    now: float


@attrs.frozen(kw_only=True)
class MessageArrived:
    """A session message from ``sender`` (its validated, normalised X.500 name). ``token`` is the executor's
    handle for acknowledging the inbox message."""

    sender: str
    message: ExistingSessionMessage
    token: Any
    now: float


@attrs.frozen(kw_only=True)
class TimerFired:
    now: float


@attrs.frozen(kw_only=True)
class Kill:
    reason: str
    now: float


Event = Start | MessageArrived | TimerFired | Kill


@attrs.frozen(kw_only=True)
class Environment:
    """What the executor tells the machine about the world: our name, how to normalise a party name, and how
    much data not received yet a session may hold (see the module docstring)."""

    our_name: str
    normalize_party: Callable[[str], str] = str
    max_unconsumed_messages: int = attrs.field(
        default=MAX_UNCONSUMED_MESSAGES, validator=attrs.validators.ge(1)
    )
    max_unconsumed_bytes: int = attrs.field(default=MAX_UNCONSUMED_BYTES, validator=attrs.validators.ge(1))


# ----------------------------------------------------------------------------------------------- actions


@attrs.frozen
class PersistCheckpoint:
    """Write the returned state (for a finished flow: its final record)."""


@attrs.frozen
class AcknowledgeMessages:
    tokens: tuple[Any, ...]


@attrs.frozen
class SendMessages:
    messages: tuple[Outgoing, ...]


@attrs.frozen
class ScheduleTimer:
    wake_at: float


@attrs.frozen
class CompleteFlow:
    result: Any


@attrs.frozen
class FailFlow:
    exception_type: str | None
    message: str


@attrs.frozen
class RefuseMessage:
    """A message from ``sender`` was dropped (it is acknowledged too): ``reason`` says why."""

    token: Any
    reason: str
    sender: str = ""


@attrs.frozen
class SendToHospital:
    """A step failed with a non-FlowException: discard the state, reload the last checkpoint."""

    error: BaseException
    transient: bool


Action = (
    PersistCheckpoint | AcknowledgeMessages | SendMessages | ScheduleTimer | CompleteFlow | FailFlow
    | RefuseMessage | SendToHospital
)  # fmt: skip


@attrs.frozen
class Transition:
    state: FlowState
    actions: tuple[Action, ...]


# ----------------------------------------------------------------------------------------------- context


def _step_name(flow: FlowLogic[Any], then: Any) -> str:
    name = then if isinstance(then, str) else getattr(then, "__name__", None)
    if getattr(then, "__self__", flow) is not flow:
        raise TypeError(f"then= must be a method of the flow {type(flow).__qualname__} itself")
    if not isinstance(name, str) or not callable(getattr(flow, name, None)):
        raise TypeError(f"then= must name a method of {type(flow).__qualname__}, got {then!r}")
    return name


def _expected_name(expected: Any) -> str:
    if isinstance(expected, str):
        type_named(expected)  # checks it
        return expected
    if not isinstance(expected, type):
        raise TypeError(f"the expected type must be a type, got {expected!r}")
    return type_name(expected)


@attrs.define(eq=False)
class FlowContext:
    """What a step may use: ids, the time of the event, sessions, and the request builders."""

    _state: FlowState
    _env: Environment
    _machine: _Machine
    now: float

    @property
    def flow_id(self) -> str:
        return self._state.flow_id

    @property
    def our_identity(self) -> str:
        """This node's legal name."""
        return self._env.our_name

    def _flow(self) -> FlowLogic[Any]:
        return self._state.stack[-1].flow

    def initiate_flow(self, party: object) -> FlowSession:
        """Open a session with ``party`` (an X.500 name); the init goes with the first send or receive.

        Raises:
            TypeError: no flow on the stack is an ``@initiating_flow``.
        """
        state = self._state
        initiator = next(
            (
                f.flow
                for f in reversed(state.stack)
                if registry.initiating.get(f.flow.flow_name) is type(f.flow)
            ),
            None,
        )
        if initiator is None:
            raise TypeError(f"{type(self._flow()).__qualname__} is not (run by) an @initiating_flow")
        index = state.next_session
        state.next_session += 1
        our_id = derive_id(state.flow_id, "session", index)
        entropy = derive_id(state.flow_id, "entropy", index)
        try:
            counterparty = self._env.normalize_party(str(party))
        except ValueError as exc:
            raise FlowException(f"not a party name: {party!r:.80}: {exc}") from exc
        state.sessions[index] = SessionState(
            index=index, counterparty=counterparty, our_id=our_id, initiating=True, entropy=entropy,
            seed=f"R-{our_id}-{entropy}", flow_name=initiator.flow_name, flow_version=initiator.flow_version,
            app_name=initiator.app_name,
        )  # fmt: skip
        return FlowSession(index, counterparty)

    def _session(self, session: FlowSession) -> FlowSession:
        if not isinstance(session, FlowSession) or session.index not in self._state.sessions:
            raise TypeError(f"{session!r} is not a session of this flow")
        return session

    def _pairs(self, messages: Iterable[tuple[FlowSession, Any]]) -> tuple[tuple[FlowSession, Any], ...]:
        return tuple((self._session(s), p) for s, p in messages)

    def send(self, session: FlowSession, payload: Any, *, then: Any) -> Send:
        """Send ``payload`` on ``session`` and go on with ``then(ctx, None)``."""
        return Send(messages=self._pairs([(session, payload)]), then=_step_name(self._flow(), then))

    def send_all(self, messages: Iterable[tuple[FlowSession, Any]], *, then: Any) -> Send:
        """Send each ``(session, payload)`` in order and go on with ``then(ctx, None)``."""
        return Send(messages=self._pairs(messages), then=_step_name(self._flow(), then))

    def receive(self, session: FlowSession, expected: Any, *, then: Any, validate: Any = None) -> Receive:
        """Wait for one payload of type ``expected`` from ``session``; ``then(ctx, payload)``.

        ``validate``, a method of the flow, is called with the payload and raises a FlowException to refuse
        it.
        """
        flow = self._flow()
        return Receive(
            sessions=(self._session(session),), expected=_expected_name(expected),
            then=_step_name(flow, then), validate=None if validate is None else _step_name(flow, validate),
        )  # fmt: skip

    def receive_all(
        self, sessions: Sequence[FlowSession], expected: Any, *, then: Any, validate: Any = None
    ) -> Receive:
        """Wait for one payload from each of ``sessions``; ``then(ctx, [payloads in that order])``."""
        flow = self._flow()
        return Receive(
            sessions=tuple(self._session(s) for s in sessions), expected=_expected_name(expected),
            then=_step_name(flow, then), validate=None if validate is None else _step_name(flow, validate),
            many=True,
        )  # fmt: skip

    def send_and_receive(
        self, session: FlowSession, payload: Any, expected: Any, *, then: Any, validate: Any = None
    ) -> Receive:
        """``send`` then ``receive`` on one session, as one request."""
        flow = self._flow()
        return Receive(
            sends=self._pairs([(session, payload)]), sessions=(self._session(session),),
            expected=_expected_name(expected), then=_step_name(flow, then),
            validate=None if validate is None else _step_name(flow, validate),
        )  # fmt: skip

    def sleep(self, seconds: float, *, then: Any) -> Sleep:
        """Suspend for ``seconds`` (durably: a restart keeps the wake-up time); ``then(ctx, None)``."""
        if not seconds >= 0:
            raise ValueError(f"sleep needs a non-negative number of seconds, got {seconds!r}")
        return Sleep(seconds=float(seconds), then=_step_name(self._flow(), then))

    def sub_flow(self, flow: FlowLogic[Any], *, then: Any) -> SubFlow:
        """Run ``flow`` on top of this one; ``then(ctx, its result)``."""
        if not isinstance(flow, FlowLogic):
            raise TypeError(f"sub_flow needs a FlowLogic, got {flow!r}")
        return SubFlow(flow=flow, then=_step_name(self._flow(), then))

    def close_sessions(self, sessions: Sequence[FlowSession], *, then: Any) -> CloseSessions:
        """End these sessions; ``then(ctx, None)``."""
        return CloseSessions(
            sessions=tuple(self._session(s) for s in sessions), then=_step_name(self._flow(), then)
        )

    def finish(self, result: Any = None) -> Finish:
        """End this flow (or sub-flow) with ``result``."""
        return Finish(result=result)


# ----------------------------------------------------------------------------------------------- machine


def new_initiator(flow_id: str, flow: FlowLogic[Any], *, started_by: str | None = None) -> FlowState:
    """The state of a flow started locally (run it with a :class:`Start` event), by ``started_by``."""
    if not isinstance(flow, FlowLogic) or not attrs.has(type(flow)):
        raise TypeError(f"a flow must be an attrs FlowLogic, got {flow!r}")
    return FlowState(
        flow_id=flow_id, stack=[Frame(flow=flow)], flow_class=flow.flow_name, started_by=started_by
    )


def responder_flow_id(sender: str, initiator_session_id: int, entropy: int) -> str:
    """The deterministic flow id of the responder to a session init: a repeated init maps to the same flow."""
    return f"R-{derive_id('responder', sender, initiator_session_id, entropy):016x}"


def new_responder(
    sender: str, init: InitialSessionMessage, responder: type[FlowLogic[Any]], *, flow_id: str | None = None
) -> FlowState:
    """The state of the responder ``responder`` to ``init`` from ``sender`` (run it with :class:`Start`).

    The confirm is in the outbox of the first transition; the first payload, if any, is waiting as received.
    """
    flow_id = flow_id or responder_flow_id(sender, init.initiator_session_id, init.initiation_entropy)
    our_id = derive_id(flow_id, "session", 0)
    session = SessionState(
        index=0, counterparty=sender, our_id=our_id, initiating=False, entropy=init.initiation_entropy,
        seed=f"D-{init.initiator_session_id}-{init.initiation_entropy}",
        flow_name=init.initiator_flow_class_name,
        flow_version=responder.flow_version, app_name=responder.app_name, peer_id=init.initiator_session_id,
        init_sent=True, recv_seq=1,
    )  # fmt: skip
    if init.has_payload:
        session.hold(init.first_payload, init.first_payload_size)
    flow = responder(session=FlowSession(0, sender))  # type: ignore[call-arg]
    state = FlowState(
        flow_id=flow_id,
        stack=[Frame(flow=flow)],
        sessions={0: session},
        next_session=1,
        flow_class=flow.flow_name,
    )
    session.buffered.append(("confirm", None))  # owed first: the Start transition sends it
    return state


@attrs.define(eq=False)
class _Machine:
    state: FlowState
    env: Environment
    number: int  # the transition number (suspends after this transition)
    tokens: list[Any] = attrs.field(factory=list)
    actions: list[Action] = attrs.field(factory=list)
    changed: bool = False
    error_id: int | None = None

    # --- emitting ---------------------------------------------------------------------------------------

    def _out(self, session: SessionState, message: SessionMessage, *, dedup_id: str | None = None) -> None:
        outbox = self.state.outbox
        dedup = dedup_id or normal_dedup_id(session.seed, self.number, len(outbox))
        outbox.append(
            Outgoing(
                counterparty=session.counterparty, dedup_id=dedup, message=message,
                initial=isinstance(message, InitialSessionMessage),
            )
        )  # fmt: skip

    def _existing(self, session: SessionState, payload: Any, dedup_id: str | None = None) -> None:
        assert session.peer_id is not None
        seq = session.send_seq
        session.send_seq += 1
        self._out(
            session,
            ExistingSessionMessage(recipient_session_id=session.peer_id, seq=seq, payload=payload),
            dedup_id=dedup_id,
        )

    def _send_init(self, session: SessionState, payload: Any, has_payload: bool) -> None:
        session.init_sent = True
        session.send_seq = 1
        self._out(
            session,
            InitialSessionMessage(
                initiator_session_id=session.our_id, initiation_entropy=session.entropy,
                initiator_flow_class_name=session.flow_name, flow_version=session.flow_version,
                app_name=session.app_name, first_payload=payload, has_payload=has_payload,
            ),
        )  # fmt: skip

    def _emit(self, session: SessionState, kind: str, value: Any = None) -> None:
        """Send data / end / confirm on ``session``, opening or buffering as its state requires."""
        if session.initiating and not session.init_sent:
            if kind == "data":
                self._send_init(session, value, True)
                return
            if kind == "end":  # the peer never heard of it
                return
            self._send_init(session, None, False)
        if session.peer_id is None:
            session.buffered.append((kind, value))
            return
        if session.buffered:
            # What the session owes goes first: a responder parked by its first step still owes its confirm
            # (the Start transition that would have sent it went to the hospital), and a Kill sends the
            # error without running a Start. Sent after it, the error would take the confirm's sequence
            # number: the initiator refuses it ("not confirmed yet") and waits for ever, and the killed
            # responder, its confirm still held, stays unconfirmed for ever too.
            self._flush(session)
        if kind == "data":
            self._existing(session, DataPayload(payload=value))
        elif kind == "end":
            self._existing(session, EndPayload())
        elif kind == "error":
            error_id, exception_type, text = value
            self._existing(
                session, ErrorPayload(error_id=error_id, exception_type=exception_type, message=text),
                dedup_id=error_dedup_id(error_id, session.peer_id),
            )  # fmt: skip
        elif kind == "confirm":
            self._existing(
                session,
                ConfirmPayload(
                    initiated_session_id=session.our_id,
                    flow_version=session.flow_version,
                    app_name=session.app_name,
                ),
            )

    def _flush(self, session: SessionState) -> None:
        buffered, session.buffered = session.buffered, []
        for kind, value in buffered:
            self._emit(session, kind, value)

    def _send_error(self, session: SessionState, exception_type: str | None, message: str) -> None:
        """The error goes now, or (not confirmed yet) after the data held for the confirm; its id is fixed
        here, so that the error sent later, or again after a crash, is the same message."""
        if self.error_id is None:
            self.error_id = derive_id(self.state.flow_id, "error", self.number)
        self._emit(session, "error", [self.error_id, exception_type, message])

    # --- receiving --------------------------------------------------------------------------------------

    def apply_message(self, event: MessageArrived) -> None:
        message = event.message
        session = self.state.session_by_id(message.recipient_session_id)
        refuse = self._refuser(event)
        if session is None:
            return refuse(f"unknown session {message.recipient_session_id}")
        if event.sender != session.counterparty:
            return refuse(
                f"session {session.our_id} belongs to {session.counterparty}, "
                f"not to the sender {event.sender}"
            )
        if message.seq < session.recv_seq:
            self.tokens.append(event.token)  # a copy of one already consumed
            return None
        if message.seq > session.recv_seq:
            return refuse(
                f"out of sequence on session {session.our_id}: expected {session.recv_seq}, got {message.seq}"
            )
        payload = message.payload
        if isinstance(payload, ConfirmPayload):
            if not session.initiating or session.peer_id is not None:
                return refuse(f"session {session.our_id} is already confirmed")
            session.peer_id = payload.initiated_session_id
            self._flush(session)
        elif isinstance(payload, RejectPayload):
            if not session.initiating or session.peer_id is not None:
                return refuse(f"session {session.our_id} was confirmed: a reject is not allowed")
            session.peer_error = (None, f"{session.counterparty} rejected the session: {payload.message}")
            session.buffered.clear()  # nobody to send them to
        elif session.peer_id is None:
            return refuse(
                f"session {session.our_id} is not confirmed yet: {type(payload).__name__} not allowed"
            )
        elif isinstance(payload, DataPayload):
            if session.peer_ended or session.peer_error is not None:
                return refuse(f"session {session.our_id} was ended by the peer: data not allowed")
            if session.received and (
                len(session.received) >= self.env.max_unconsumed_messages
                or session.received_bytes + payload.size > self.env.max_unconsumed_bytes
            ):
                self._overflow(session, payload.size)
            else:
                session.hold(payload.payload, payload.size)
        elif isinstance(payload, ErrorPayload):
            message_text = payload.message if payload.exception_type is not None else None
            session.peer_error = (payload.exception_type, message_text or COUNTER_FLOW_ERRORED)
        elif isinstance(payload, EndPayload):
            session.peer_ended = True
        session.recv_seq += 1
        self.tokens.append(event.token)
        self.changed = True
        return None

    def _overflow(self, session: SessionState, size: int) -> None:
        """Data beyond what ``session`` may hold: drop what it holds, tell the peer, close the session; the
        flow's next receive from it fails (see the module docstring)."""
        env = self.env
        text = (
            f"{session.counterparty} sent more data on session {session.our_id} than {env.our_name} holds "
            f"before its flow receives it ({len(session.received) + 1} messages, "
            f"{session.received_bytes + size} bytes; at most {env.max_unconsumed_messages} messages and "
            f"{env.max_unconsumed_bytes} bytes): the session is closed"
        )
        session.received.clear()
        session.received_sizes.clear()
        session.peer_error = (SESSION_OVERFLOW_ERROR_TYPE, text)
        if not session.closed:  # (a session this flow closed already got its end)
            session.closed = True
            self._send_error(session, SESSION_OVERFLOW_ERROR_TYPE, text)

    def _refuser(self, event: MessageArrived) -> Callable[[str], None]:
        def refuse(reason: str) -> None:
            self.tokens.append(event.token)
            self.actions.append(RefuseMessage(event.token, reason, event.sender))

        return refuse

    def _take(self, wait: WaitReceive, flow: FlowLogic[Any]) -> tuple[bool, Any]:
        """``(True, result)`` if the receive can complete now; raises the FlowException a session holds."""
        sessions = [self.state.sessions[i] for i in wait.sessions]
        for s in sessions:
            if not s.received:
                if s.peer_error is not None:
                    _kind, text = s.peer_error
                    raise FlowException(text)
                if s.peer_ended:
                    raise UnexpectedFlowEndError(
                        f"{s.counterparty} ended the session while this flow waited for data"
                    )
                return False, None
        expected = type_named(wait.expected)
        values = []
        for s in sessions:
            value = s.take()
            if isinstance(value, BadPayload):
                raise FlowException(f"{s.counterparty} sent a payload that cannot be read: {value.reason}")
            if expected is not object and not (
                isinstance(value, expected) and not (expected is int and isinstance(value, bool))
            ):
                raise FlowException(
                    f"expected a {wait.expected} from {s.counterparty}, got a {type(value).__name__}"
                )
            if wait.validate is not None:
                getattr(flow, wait.validate)(value)
            values.append(value)
        return True, values if wait.many else values[0]

    # --- running ----------------------------------------------------------------------------------------

    def resume(self, now: float) -> None:
        """Run steps while the top frame can go on."""
        state = self.state
        ctx = FlowContext(state, self.env, self, now)
        result: Any = None
        ready = False  # run the top frame's step with ``result`` now (its sub-flow just finished)
        for _ in range(MAX_STEPS_PER_TRANSITION):
            if not state.stack:
                return
            frame = state.stack[-1]
            if not ready:
                wait = frame.wait
                if isinstance(wait, WaitReceive):
                    done, result = self._take(wait, frame.flow)
                    if not done:
                        for i in wait.sessions:
                            s = state.sessions[i]
                            if s.initiating and not s.init_sent:
                                self._send_init(s, None, False)
                                self.changed = True
                        return
                elif isinstance(wait, WaitSleep):
                    if now < wait.wake_at:
                        return
                    result = None
                elif isinstance(wait, WaitSubFlow):
                    return  # the sub-flow's Finish resumes this frame
                else:
                    result = None
            ready = False
            frame.wait = None
            self.changed = True
            method = getattr(frame.flow, frame.step, None)
            if method is None:
                raise TypeError(f"{type(frame.flow).__qualname__} has no step {frame.step!r}")
            request = method(ctx) if frame.step == "call" else method(ctx, result)
            if isinstance(request, Send):
                for session, payload in request.messages:
                    self._emit(state.sessions[session.index], "data", payload)
                frame.step = request.then
            elif isinstance(request, Receive):
                for session, payload in request.sends:
                    self._emit(state.sessions[session.index], "data", payload)
                frame.step = request.then
                frame.wait = WaitReceive(
                    sessions=tuple(s.index for s in request.sessions), expected=request.expected,
                    validate=request.validate, many=request.many,
                )  # fmt: skip
            elif isinstance(request, Sleep):
                frame.step = request.then
                frame.wait = WaitSleep(wake_at=now + request.seconds)
                self.actions.append(ScheduleTimer(frame.wait.wake_at))
            elif isinstance(request, SubFlow):
                frame.step = request.then
                frame.wait = WaitSubFlow()
                state.stack.append(Frame(flow=request.flow))
            elif isinstance(request, CloseSessions):
                for session in request.sessions:
                    s = state.sessions[session.index]
                    if s.open:
                        self._emit(s, "end")
                    s.closed = True
                frame.step = request.then
            elif isinstance(request, Finish):
                state.stack.pop()
                if not state.stack:
                    self._complete(request.result)
                    return
                state.stack[-1].wait = None
                result = request.result
                ready = True
            else:
                raise TypeError(
                    f"step {type(frame.flow).__qualname__}.{frame.step} returned {request!r}, not a request"
                )
        raise RuntimeError(f"more than {MAX_STEPS_PER_TRANSITION} steps without blocking (a loop of sends?)")

    def _complete(self, result: Any) -> None:
        state = self.state
        for s in state.sessions.values():
            if s.open:
                s.closed = True
                self._emit(s, "end")
        state.status = COMPLETED
        state.result = result
        self.changed = True
        self.actions.append(CompleteFlow(result))

    def fail(self, exc: BaseException) -> None:
        """End the flow with ``exc``: each open session is told (FlowException: its message)."""
        state = self.state
        if isinstance(exc, FlowException) and not isinstance(exc, FlowKilledError):
            kind: str | None = f"{type(exc).__module__}.{type(exc).__qualname__}"
            text = str(exc)
        else:
            kind, text = None, COUNTER_FLOW_ERRORED
        for s in state.sessions.values():
            if s.open and s.init_sent:
                s.closed = True
                self._send_error(s, kind, text)
        state.stack.clear()
        state.status = FAILED
        own_type = f"{type(exc).__module__}.{type(exc).__qualname__}"
        state.error = (own_type, str(exc) or own_type)
        self.changed = True
        self.actions.append(FailFlow(own_type, str(exc)))


def transition(state: FlowState, event: Event, env: Environment) -> Transition:
    """Apply ``event`` to ``state`` and run the flow as far as it can go; see the module docstring."""
    m = _Machine(state, env, number=state.suspends + 1)
    state.outbox = []
    if state.finished:
        if isinstance(event, MessageArrived):
            session = state.session_by_id(event.message.recipient_session_id)
            if session is not None and session.buffered:
                # the flow ended before this session's confirm: its end / error (and held data) wait for it
                m.apply_message(event)
            elif isinstance(event.message.payload, EndPayload):
                m.tokens.append(event.token)  # the peer's end crossed ours: nothing to do
            else:
                sid = event.message.recipient_session_id
                m._refuser(event)(f"unknown session {sid}: its flow has finished")
        elif isinstance(event, Kill) and state.unflushed:
            # an operator gives up on the confirms: the held messages are dropped (a confirm that still
            # comes is refused as for an unknown session)
            for s in state.sessions.values():
                s.buffered.clear()
            m.changed = True
        return _result(m)
    try:
        if isinstance(event, Start):
            for s in state.sessions.values():
                if s.peer_id is not None and s.buffered:
                    m.changed = True
                    m._flush(s)
            m.resume(event.now)
        elif isinstance(event, MessageArrived):
            m.apply_message(event)
            if m.changed:
                m.resume(event.now)
        elif isinstance(event, TimerFired):
            m.resume(event.now)
        elif isinstance(event, Kill):
            m.fail(FlowKilledError(event.reason))
        else:
            raise TypeError(f"not an event: {event!r}")
    except FlowException as exc:
        m.fail(exc)
    except RetryableFlowError as exc:
        return Transition(state, (SendToHospital(exc, True),))
    except Exception as exc:
        return Transition(state, (SendToHospital(exc, False),))
    return _result(m)


def hold_messages(state: FlowState, events: Sequence[MessageArrived], env: Environment) -> Transition:
    """Apply ``events`` to the last checkpoint ``state`` of a flow that cannot run now (it is in the
    hospital) without running any of its steps: data is held in its session as data sent ahead (a session
    beyond ``max_unconsumed_messages`` / ``max_unconsumed_bytes`` overflows, as for a running flow), ends,
    errors and confirms are recorded, what breaks the protocol is refused; messages owed to confirmed
    sessions go, as :class:`Start` sends them (a responder's confirm). The flow takes what is held when it
    next runs (any event: the executor posts a :class:`TimerFired`)."""
    if state.finished:
        raise ValueError(f"flow {state.flow_id} has finished: its messages go to transition()")
    m = _Machine(state, env, number=state.suspends + 1)
    state.outbox = []
    for s in state.sessions.values():
        if s.peer_id is not None and s.buffered:
            m.changed = True
            m._flush(s)
    for event in events:
        m.apply_message(event)
    return _result(m)


def _result(m: _Machine) -> Transition:
    state = m.state
    actions: list[Action] = []
    if m.changed:
        state.suspends = m.number
        actions.append(PersistCheckpoint())
    if m.tokens:
        actions.append(AcknowledgeMessages(tuple(m.tokens)))
    if state.outbox:
        actions.append(SendMessages(tuple(state.outbox)))
    actions.extend(m.actions)
    return Transition(state, tuple(actions))
