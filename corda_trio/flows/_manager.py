"""The flow manager: runs flows over the store and the messaging service (the executor of the state machine).

Public API (what the node exposes over RPC)::

    manager = await FlowManager.open(messaging, config=FlowManagerConfig())
    await nursery.start(manager.run)              # handles platform.session, resumes checkpoints
    handle = await manager.start_flow("PingPong", recipient="O=Bob, L=Paris, C=FR", rounds="10")
    result = await handle.result()                # raises FlowException if the flow failed
    manager.flows()             # [FlowInfo]: running, parked (with error), finished recently
    await manager.retry(flow_id); await manager.kill(flow_id)
    manager.drain(); await manager.wait_drained(); manager.undrain()
    version = await manager.wait_changed(since)   # progress: bumps on every status change

Theory of operation
-------------------
*One task per flow.* Every live flow has a runner task in the manager's nursery with a queue of events
(session messages, timers, kill). The task takes whatever events have queued, feeds them one by one to the
pure ``transition``, and performs the actions of the whole batch in the required order: (1) the checkpoint
and the batch's outbox become durable together: **one** atomic record of the keyed log ``flows.checkpoints``
puts the checkpoint under the flow id and the outbox under ``<flow id> NUL <transition number>`` (thousands
of flows share one group commit); (2) the consumed inbox messages are acknowledged; (3) the outbox is handed
to the *outbound pump* of each counterparty, synchronously (so per flow and counterparty the order is the
transition order), and the runner goes on at once: it waits for one durable commit per batch (the inbox
acks and the outbound appends follow on their own); (4) timers are armed and the handle completed.

*Outbound pumps.* One task per counterparty appends whatever the flows handed over to that peer's outbound
queue in one ``send_many`` (one group commit), in hand-over order, and only then hands over the next lot. A
peer the network map does not know yet is retried with jittered backoff (its flows show as ``retrying``),
and at once when the node's view of the network changes (the send that failed asked the node to poll the
map early: the peer may have joined since its last poll).
Once every part of an outbox is durable in the outbound queues its record is deleted, in the next checkpoint
write of any flow or, when none comes within ``outbox_flush_seconds``, in a write of its own. At start every
outbox record still there is handed over again, in order, before its flow takes any event: exactly the
messages that may not have reached the outbound queues (a crash between (1) and (3)), none of the others;
receivers drop copies (dedup id, sequence number).

*Receiving.* The manager's handler for ``platform.session`` decodes the message (refusing malformed ones with
the reason), routes it by recipient session id to its runner and returns a *deferred receipt*: the messaging
service acks the inbox message only when the runner has made the transition that consumed it durable. A
message for an unknown session is acked and dropped (logged and counted as refused; an end for one only
at debug, uncounted: it is the peer's end crossing ours after our flow ended, a normal event). A session
init starts the responder registered with ``@initiated_by`` (flow id derived from the init, so a copy of an
init maps to the same flow and is dropped); an init for an unknown flow is answered with a reject carrying
the reason.

*Responders per peer.* Every init a peer sends starts a responder, which lives until its flow ends: a
member of the network could send thousands of inits and never go on (each responder waits for ever for its
next message, about 8 KB of memory and a checkpoint). So the live (not finished; parked ones count)
responders each peer initiated are counted (again at start, from the checkpoints), and an init beyond
``max_responders_per_peer`` is refused like one for an unknown flow: a reject naming the limit goes back, so
the initiating flow fails at once with that reason. Each refusal is counted (``statistics().refused_inits``)
and logged like every refused session message. There is
no idle timeout for a responder waiting for a message (Corda has none either): an initiator may sleep for
days between two sends, and the limit already bounds what a peer can hold.

*Refusals in the log.* Every refused session message (unknown session, wrong sender, out of sequence,
malformed, too many responders, ...) is counted (``statistics().refused``, ``refusals()``), but a peer can
send thousands a second: per sender, the first is logged as a warning in full, the rest of the minute at
debug, and one summary warning per minute counts them (``corda_trio.logs.PeerWarnings``).

*Hospital.* A step raising :class:`RetryableFlowError` is retried from the last checkpoint with jittered
exponential backoff. Any other failure parks the flow
(status ``parked`` with its error; its messages stay unacknowledged in the inbox): :meth:`FlowManager.retry`
runs it again from its checkpoint, :meth:`FlowManager.kill` ends it (counterparties are told, after the
messages it had already handed over; the messages it did not consume are acknowledged with the kill's
checkpoint, like those of any transition).

*Parked messages and the inbox window.* The messaging service hands out at most ``inbox_credit`` inbox
messages not acknowledged yet, and a flow in the hospital holds the ones it did not consume: 1,024 parked
responders (a user's responder with a bug a peer's input triggers) stopped the inbox, every flow with it. So
while a runner is in the hospital the manager lends the inbox consumer one unit of credit per inbox message it
holds (``held`` receipts, the events of its batch, and messages posted to it meanwhile:
``MessagingService.lend_inbox_credit``) and takes them back when it leaves (retry or kill:
``return_inbox_credit``), and so for each init held while draining until the manager is undrained; the
messages themselves stay unacknowledged in the inbox, their dedup ids uncommitted, so nothing about delivery,
retry, kill or restart changes. (A bundle whose parts go to one parked flow counts once per part: the lent
credit can exceed the messages held, never fall short.) The lent total is bounded by ``max_parked_messages``
and ``max_parked_bytes`` (the wire bytes of the session messages); beyond, an init for a responder that has
flows in the hospital is rejected like one beyond ``max_responders_per_peer`` (a reject naming the limits;
counted in ``refused_inits``), and an init that comes while draining is rejected ("... is draining ...").

*Folding a parked flow's messages.* A flow in the hospital consumes nothing, so what arrives for it is data
sent ahead and is bounded like it: per session, the messages queued since its checkpoint (``_Runner.queued``)
plus what that checkpoint holds may not exceed ``max_unconsumed_messages`` / ``max_unconsumed_bytes``. Once
they would, or a message gets no lent credit (the limits above), the runner, still waiting in the hospital,
*folds* its queued messages into its last checkpoint with the pure ``hold_messages`` (no step runs: data is
held in its session, a session beyond the limit overflows as for a running flow and its peer gets the
``SessionOverflowError``, what breaks the protocol is refused, a responder's owed confirm goes), writes it
(one record, as for any transition, outbox included), and only then acknowledges them and returns their
lent credit. A responder parked before its first checkpoint is persisted by the fold (its init acknowledged
with it); its ``Start`` stays queued. When the flow runs again (retry, or a restart: a resumed flow gets a
``TimerFired`` first) it takes what is held. So a peer that parks a flow and floods its sessions holds at most
a session's limit of the inbox through it, nothing is acknowledged before it is durable, and a crash at any
point leaves either the messages in the inbox or the checkpoint holding them. Writing each message that
arrives while parked into the checkpoint at once was the alternative: a write per message, for the same
guarantees.

*Finished flows* keep their record (status, result or error) until ``finished_retain`` newer
ones finished: repeated inits are recognised, and ``flows()`` lists them. A flow that finished before one of
its sessions was confirmed still owes that session its held messages and its end or error (the state machine
keeps them in the checkpoint): its runner stays (``_lingering``, routed to by session id, resumed after a
restart) until the confirm (the messages go) or a reject (they are dropped) arrives; its record is not
retired meanwhile. Its handle completed when the flow did.
"""

from __future__ import annotations

import collections
import functools
import logging
import random
import time
import traceback
import types
import typing
import unicodedata
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final

import attrs
import trio

from corda_trio import logs, messaging, pki, store

from ._codec import (
    checkpoint_started_by,
    decode_checkpoint,
    decode_outbox_record,
    decode_session_message,
    decode_session_messages,
    encode_checkpoint,
    encode_outbox_record,
    encode_session_bundle,
    encode_session_message,
    outgoing_wire,
)
from ._errors import (
    ClientIdTakenError,
    FlowException,
    FlowManagerDrainingError,
    PayloadError,
    SessionProtocolError,
    UnknownFlowError,
)
from ._logic import FlowLogic
from ._messages import (
    SESSION_TOPIC,
    EndPayload,
    ExistingSessionMessage,
    InitialSessionMessage,
    RejectPayload,
    SessionMessage,
    derive_id,
    error_dedup_id,
)
from ._registry import registry
from ._statemachine import (
    MAX_UNCONSUMED_BYTES,
    MAX_UNCONSUMED_MESSAGES,
    AcknowledgeMessages,
    CompleteFlow,
    Environment,
    FailFlow,
    FlowState,
    Kill,
    MessageArrived,
    Outgoing,
    PersistCheckpoint,
    RefuseMessage,
    ScheduleTimer,
    SendMessages,
    SendToHospital,
    Start,
    TimerFired,
    hold_messages,
    new_initiator,
    new_responder,
    responder_flow_id,
    transition,
)

__all__ = [
    "CHECKPOINT_LOG",
    "DEFAULT_MAX_RESPONDERS_PER_PEER",
    "FlowHandle",
    "FlowInfo",
    "FlowManager",
    "FlowManagerConfig",
    "FlowManagerStatistics",
    "build_flow",
    "checkpoint_records",
    "outbox_key",
    "split_outbox_key",
]

log = logging.getLogger("corda_trio.flows")

CHECKPOINT_LOG: Final = "flows.checkpoints"
SESSION_INIT_TYPE: Final = "session_init"
#: a P2P message's headers and framing around its session bytes stay well below this many bytes: session
#: bytes closer than this to ``max_message_size`` get their exact encoded size checked before the checkpoint
ENVELOPE_ROOM: Final = 64 * 1024
#: Default of ``FlowManagerConfig.max_responders_per_peer`` (and the node's ``[flows]
#: max_responders_per_peer``): the largest number of flows the benchmark harness runs at once
#: (``bench._harness.MAX_CONCURRENCY``, its ``max_in_flight``), far above what the demo (8 per node) and the
#: flow benchmark (256) keep running per peer. At about 8 KB of memory and 1.4 KB of checkpoint each, one
#: peer can hold at most about 80 MB and 14 MB of them.
DEFAULT_MAX_RESPONDERS_PER_PEER: Final = 10_000
#: Defaults of ``FlowManagerConfig.max_parked_messages`` / ``max_parked_bytes``: inbox messages (and their
#: bytes) the flows in the hospital may hold beyond the inbox's own window (see "Parked messages and the
#: inbox window" in the module docstring): as many as one peer may have responders.
DEFAULT_MAX_PARKED_MESSAGES: Final = DEFAULT_MAX_RESPONDERS_PER_PEER
DEFAULT_MAX_PARKED_BYTES: Final = 64 * 1024 * 1024


@attrs.frozen(kw_only=True)
class FlowManagerConfig:
    #: finished flows whose records (and list entries) are kept
    finished_retain: int = attrs.field(default=1000, validator=attrs.validators.ge(1))
    #: hospital backoff for transient failures: first delay and cap (seconds), each with +-50 % jitter
    retry_initial_seconds: float = 0.2
    retry_max_seconds: float = 30.0
    #: refusals kept for ``refusals()``
    refusals_retain: int = 1000
    #: how long the record of an outbox that reached the outbound queues waits for a checkpoint write to
    #: delete it with, before a write of its own does (seconds)
    outbox_flush_seconds: float = 0.05
    #: send the messages one transition has for one node as one P2P message (a bundle: one inbox record, one
    #: dedup record, one acknowledgement at the receiver instead of one each)
    bundle: bool = True
    #: live (not finished) responders one peer may have started here; its inits beyond are rejected (see the
    #: module docstring)
    max_responders_per_peer: int = attrs.field(
        default=DEFAULT_MAX_RESPONDERS_PER_PEER, validator=attrs.validators.ge(1)
    )
    #: data a session holds before its flow receives it; beyond, the session overflows (its peer gets an
    #: error; see ``_statemachine``)
    max_unconsumed_messages: int = attrs.field(
        default=MAX_UNCONSUMED_MESSAGES, validator=attrs.validators.ge(1)
    )
    max_unconsumed_bytes: int = attrs.field(default=MAX_UNCONSUMED_BYTES, validator=attrs.validators.ge(1))
    #: inbox messages (and bytes) that flows in the hospital may hold outside the inbox window; beyond, the
    #: inits for a responder that has flows in the hospital are rejected (see the module docstring)
    max_parked_messages: int = attrs.field(
        default=DEFAULT_MAX_PARKED_MESSAGES, validator=attrs.validators.ge(1)
    )
    max_parked_bytes: int = attrs.field(default=DEFAULT_MAX_PARKED_BYTES, validator=attrs.validators.ge(1))


@attrs.frozen(kw_only=True)
class FlowInfo:
    """A flow as ``FlowManager.flows()`` lists it.

    ``status``: ``running`` (working or waiting for messages), ``sleeping``, ``retrying`` (transient failure,
    backing off), ``parked`` (failed; ``error`` says why; retry or kill it), ``completed``, ``failed``.
    """

    flow_id: str
    flow_name: str
    status: str
    error: str | None = None
    result: Any = None
    #: transitions committed so far
    suspends: int = 0
    #: the initiating party, for a responder
    initiator: str | None = None
    #: who started it (``start_flow``'s ``started_by``: over RPC, the RPC user's name)
    started_by: str | None = None


@attrs.frozen(kw_only=True)
class FlowManagerStatistics:
    running: int
    parked: int
    finished: int
    started: int
    completed: int
    failed: int
    transitions: int
    checkpoint_writes: int
    refused: int
    draining: bool
    #: finished flows whose end or error waits for a session's confirm
    unconfirmed: int = 0
    #: messages handed to the outbound pumps and not yet durable in an outbound queue
    outbound_waiting: int = 0
    #: messages handed over again at start (outbox records found: they may not have reached the queues)
    resent: int = 0
    #: outbox records in the checkpoint log (their messages are not known to be in the outbound queues)
    outbox_records: int = 0
    #: session inits rejected because their sender had ``max_responders_per_peer`` live responders here
    #: (also counted in ``refused``)
    refused_inits: int = 0
    #: live (not finished) responders, all peers together
    responders: int = 0
    #: inbox messages held by flows in the hospital, and inits held while draining, outside the inbox window
    #: (inbox credit lent for them), and their bytes
    parked_messages: int = 0
    parked_message_bytes: int = 0


@attrs.define(eq=False)
class _Receipt:
    """The deferred receipt of one inbox message: resolved once its consumption is durable."""

    #: bytes of the session message it stands for
    size: int = 0
    #: the inbox was lent a unit of credit for it (its flow is in the hospital)
    lent: bool = False
    _done: trio.Event = attrs.field(factory=trio.Event)
    _error: BaseException | None = None

    def resolve(self, error: BaseException | None = None) -> None:
        if not self._done.is_set():
            self._error = error
            self._done.set()

    async def wait(self) -> bytes | None:
        # Resolved already: no checkpoint (trio's Event.wait makes one even then), so that a cancellation
        # arriving now (the node stopping once its flows are drained) cannot lose a consumption that is
        # durable. A bundle's receipt awaits its parts one after the other: cancelled on the second part,
        # the inbox message was handed over again after the restart, and its flow had finished (refused as
        # for an unknown session).
        if not self._done.is_set():
            await self._done.wait()
        if self._error is not None:
            raise self._error
        return None


@attrs.define(eq=False)
class _Runner:
    flow_id: str
    state: FlowState
    #: the last durable checkpoint (or the encoded initial state of a flow not persisted yet)
    checkpoint: bytes | None
    persisted: bool = False
    #: builds the initial state again (a flow not persisted yet whose first transition went to the hospital),
    #: when ``checkpoint`` is None
    initial: Callable[[], FlowState] | None = None
    events: collections.deque[Any] = attrs.field(factory=collections.deque)
    wakeup: trio.Event = attrs.field(factory=trio.Event)
    #: receipts to resolve with the next checkpoint (the init that created a responder)
    held: list[_Receipt] = attrs.field(factory=list)
    status: str = "running"
    error: str | None = None
    retry: trio.Event = attrs.field(factory=trio.Event)
    done: trio.Event = attrs.field(factory=trio.Event)
    timer: trio.CancelScope | None = None
    initiator: str | None = None
    #: resumed from a checkpoint at start: arm its timer first
    resumed: bool = False
    retries: int = 0
    #: outboxes found at start, to hand over again before anything else: (record key, messages)
    pending_out: list[tuple[bytes | None, list[Outgoing]]] = attrs.field(factory=list)
    #: why the outbound pump cannot send this flow's messages yet (unknown peer), shown as ``retrying``
    send_error: str | None = None
    #: a responder counted among its initiator's live responders (until it finishes)
    counted: bool = False
    #: in the hospital (parked or backing off), and the inbox credit lent for the messages it holds meanwhile
    in_hospital: bool = False
    lent: int = 0
    lent_bytes: int = 0
    #: in the hospital: messages (and their bytes) queued per recipient session id since the flow's last
    #: checkpoint; ``fold_due`` once a session's exceed what it may hold, or a message was lent no credit
    #: (see "Folding a parked flow's messages" in the module docstring); ``nudge`` wakes it while it waits
    queued: dict[int, list[int]] = attrs.field(factory=dict)
    fold_due: bool = False
    nudge: trio.Event | None = None

    def post(self, event: Any) -> None:
        self.events.append(event)
        self.wakeup.set()

    def wake(self) -> None:
        """Wake the runner if it waits in the hospital (to retry, or to fold what it holds)."""
        if self.nudge is not None:
            self.nudge.set()


@attrs.define(eq=False)
class _Handover:
    """One outbox handed to the pumps: its record is deleted once all ``parts`` (one per counterparty) are
    durable in the outbound queues."""

    key: bytes | None
    parts: int


@attrs.define(eq=False)
class _Pump:
    """What waits for one counterparty's outbound queue: (hand-over, runner or None, messages), in order."""

    party: str
    entries: collections.deque[tuple[_Handover, _Runner | None, list[Outgoing]]] = attrs.field(
        factory=collections.deque
    )
    wakeup: trio.Event = attrs.field(factory=trio.Event)
    retry: trio.Event = attrs.field(factory=trio.Event)


def _shown_status(runner: _Runner) -> tuple[str, str | None]:
    """A live flow's status and error as :meth:`FlowManager.flows` shows them: ``running`` split into
    ``retrying`` (its messages cannot go yet) and ``sleeping`` (waiting for its timer)."""
    status, error = runner.status, runner.error
    if status == "running" and runner.send_error is not None:
        return "retrying", runner.send_error
    if status == "running" and runner.state.wake_at is not None:
        return "sleeping", error
    return status, error


def outbox_key(flow_id: str, number: int) -> bytes:
    """The key of the outbox record of transition ``number`` of ``flow_id`` (beside its checkpoint)."""
    return b"%s\x00%d" % (flow_id.encode(), number)


def split_outbox_key(key: bytes) -> tuple[str, int] | None:
    """``(flow id, transition number)`` of an outbox record's key; ``None`` for a checkpoint's key."""
    flow_id, sep, number = key.partition(b"\x00")
    if not sep:
        return None
    return flow_id.decode(), int(number)


def _responder_of(state: FlowState) -> str | None:
    """The peer whose init started the flow of ``state`` if it is a responder (its first session is the one
    the init opened), else ``None``."""
    first = state.sessions.get(0)
    return first.counterparty if first is not None and not first.initiating else None


def checkpoint_records(log: store.KeyedLog) -> list[tuple[str, bytes]]:
    """``(flow id, checkpoint)`` of every flow in a checkpoint log (not the outbox records beside them)."""
    return [(key.decode(), data) for key, data in log.items() if b"\x00" not in key]


@attrs.frozen(kw_only=True)
class _Finished:
    flow_id: str
    flow_name: str
    status: str
    result: Any
    error: tuple[str | None, str] | None
    suspends: int
    initiator: str | None
    started_by: str | None


@attrs.define(eq=False)
class FlowHandle:
    """A started flow: its id, and :meth:`result` to wait for its outcome. ``started`` is false when a
    ``client_id`` found the flow already there (this call started nothing)."""

    flow_id: str
    _manager: FlowManager
    started: bool = True

    async def result(self) -> Any:
        """The flow's result once it completed.

        Raises:
            FlowException: the flow failed (message: its error), or was killed.
            UnknownFlowError: the flow is not known (any more).
        """
        return await self._manager.wait_result(self.flow_id)

    async def durable(self) -> None:
        """Wait until a crash can no longer lose the start: see :meth:`FlowManager.wait_durable`."""
        await self._manager.wait_durable(self.flow_id)


#: Longest ``client_id`` :meth:`FlowManager.start_flow` takes (it becomes part of the flow id and its keys).
MAX_CLIENT_ID: Final = 200


def _check_client_id(client_id: str) -> None:
    """1 to :data:`MAX_CLIENT_ID` characters, none of them a control character (a NUL, a newline, an escape:
    the id becomes part of the flow id, which logs, the CLI and the metrics show)."""
    control = next((i for i, c in enumerate(client_id) if unicodedata.category(c) == "Cc"), None)
    if 0 < len(client_id) <= MAX_CLIENT_ID and control is None:
        return
    got = (
        f"got {len(client_id)} characters"
        if control is None
        else f"got U+{ord(client_id[control]):04X} at character {control + 1}"
    )
    raise ValueError(f"a client id is 1 to {MAX_CLIENT_ID} characters without control characters, {got}")


async def _first_of(waiters: trio.Nursery, wait: Callable[[], Awaitable[object]]) -> None:
    """``await wait()``, then end the other waits of ``waiters``."""
    await wait()
    waiters.cancel_scope.cancel()


@functools.lru_cache(maxsize=4096)
def _party(name: str) -> pki.CordaX500Name:
    return pki.CordaX500Name.parse(name)


@functools.lru_cache(maxsize=4096)
def normalize_party(name: str) -> str:
    """``O=Bob,L=Paris,C=FR`` -> ``O=Bob, L=Paris, C=FR`` (raises ValueError for a bad name)."""
    return str(_party(name))


def build_flow(flow: str | type[FlowLogic[Any]], args: Mapping[str, Any]) -> FlowLogic[Any]:
    """An instance of ``flow`` (a startable flow's name or class) from named arguments; string values are
    converted to the field's declared type (``int``, ``float``, ``bool``, ``str``, ``list[str]`` split on
    ``;``), so ``rounds="10"`` works from a command line. Every value must then be of the declared type
    (an ``int`` field takes no ``2.5``, no ``True`` and no ``[1]``): a flow never starts with an argument its
    author did not declare, to fail or be parked at its first step.

    Raises:
        UnknownFlowError: no such startable flow.
        ValueError: an argument is unknown, missing or cannot be converted (the message names it).
    """
    cls = registry.startable(flow) if isinstance(flow, str) else flow
    if not (isinstance(cls, type) and issubclass(cls, FlowLogic) and attrs.has(cls)):
        raise UnknownFlowError(f"{flow!r} is not a flow class")
    attrs.resolve_types(cls)
    fields = {f.name: f for f in attrs.fields(cls) if f.init}
    kwargs: dict[str, Any] = {}
    for name, value in args.items():
        field = fields.get(name)
        if field is None:
            takes = f"arguments: {', '.join(fields)}" if fields else "it takes none"
            raise ValueError(f"{cls.__name__} has no argument {name!r} ({takes})")
        kwargs[name] = converted = _convert(cls.__name__, name, field.type, value)
        if not _is_a(converted, field.type):
            raise ValueError(
                f"{cls.__name__} argument {name}: expected {_type_text(field.type)}, got "
                f"{type(converted).__name__} {converted!r:.40}"
            )
    missing = [n for n, f in fields.items() if n not in kwargs and f.default is attrs.NOTHING]
    if missing:
        names = " and ".join(repr(n) for n in missing)
        raise ValueError(f"{cls.__name__} needs the argument{'s' if len(missing) > 1 else ''} {names}")
    try:
        return cls(**kwargs)
    except TypeError as exc:  # (the flow's own __attrs_post_init__ or validator, say)
        raise ValueError(f"{cls.__name__}: {exc}") from exc


def _convert(cls_name: str, name: str, kind: Any, value: Any) -> Any:
    if not isinstance(value, str):
        if kind is int and isinstance(value, float) and value.is_integer():
            return int(value)  # a client whose numbers are all doubles (JSON's) sends 3 as 3.0
        return value
    text = str(kind)
    try:
        if kind is int or text == "int":
            return int(value)
        if kind is float or text == "float":
            return float(value)
        if kind is bool or text == "bool":
            if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(f"not a boolean: {value!r}")
            return value.lower() in ("true", "1", "yes")
        if text.startswith("list["):
            return [v.strip() for v in value.split(";") if v.strip()]
    except ValueError as exc:
        raise ValueError(f"{cls_name} argument {name}={value!r}: {exc}") from exc
    return value


def _is_a(value: Any, kind: Any) -> bool:
    """Whether ``value`` is of the declared field type ``kind`` (builtins, ``X | None``, ``list[X]``,
    ``dict[K, V]``, classes such as payload types; what cannot be told, such as ``Any``, passes)."""
    if kind is Any or kind is object:
        return True
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is None or kind is type(None):
        return value is None
    origin, params = typing.get_origin(kind), typing.get_args(kind)
    if origin is typing.Union or origin is types.UnionType:
        return any(_is_a(value, p) for p in params)
    if origin in (list, tuple, set, frozenset, Sequence):
        # (a msgpack array arrives as a list, whichever collection the field declares)
        if not isinstance(value, (list, tuple, set, frozenset)):
            return False
        if origin is tuple and params and params[-1] is not Ellipsis:
            return len(value) == len(params) and all(_is_a(v, p) for v, p in zip(value, params, strict=True))
        return not params or all(_is_a(v, params[0]) for v in value)
    if origin is dict or origin is Mapping:
        return isinstance(value, dict) and (
            not params or all(_is_a(k, params[0]) and _is_a(v, params[1]) for k, v in value.items())
        )
    if origin is None and isinstance(kind, type):
        return isinstance(value, kind)
    return True


def _type_text(kind: Any) -> str:
    return kind.__name__ if isinstance(kind, type) and typing.get_origin(kind) is None else str(kind)


_IMMUTABLE: Final = (str, int, float, bool, type(None))


#: At most this much of a failed step's error message is kept (shown as a flow's ``error``), and of its
#: formatted traceback logged, per parked flow: a peer's input may make a step raise with a huge message.
MAX_ERROR_TEXT_CHARS: Final = 2_000
MAX_TRACEBACK_LOG_CHARS: Final = 16_384


def _failure(flow_id: str, error: BaseException, transient: bool) -> tuple[str, bool]:
    """What the hospital keeps of a failed step: the text shown for the flow (type and message, bounded)
    and whether it is transient. A bug is logged here, once, with its formatted traceback (bounded);
    nothing keeps the exception, whose traceback holds every frame of the step with its locals (about 20 KB
    per parked flow, for as long as it is parked)."""
    text = f"{type(error).__name__}: {error}"
    if len(text) > MAX_ERROR_TEXT_CHARS:
        text = text[: MAX_ERROR_TEXT_CHARS - 40] + f"... ({len(text)} characters)"
    if not transient:
        trace = "".join(traceback.format_exception(error))
        if len(trace) > MAX_TRACEBACK_LOG_CHARS:
            trace = "...\n" + trace[-MAX_TRACEBACK_LOG_CHARS:]
        log.error("flow %s parked: %s\n%s", flow_id, text, trace.rstrip())
    return text, transient


def _new_responder(sender: str, data: bytes, responder: type[FlowLogic[Any]], flow_id: str) -> FlowState:
    init = decode_session_message(data)
    assert isinstance(init, InitialSessionMessage)
    return new_responder(sender, init, responder, flow_id=flow_id)


def _new_initiator(
    flow_id: str, flow: str | type[FlowLogic[Any]], args: Mapping[str, Any], started_by: str | None
) -> FlowState:
    return new_initiator(flow_id, build_flow(flow, args), started_by=started_by)


@attrs.define(eq=False)
class FlowManager:
    """See the module docstring. Build it with :meth:`open`, then ``await nursery.start(manager.run)``."""

    messaging: messaging.MessagingService
    checkpoints: store.KeyedLog
    config: FlowManagerConfig
    env: Environment
    _runners: dict[str, _Runner] = attrs.field(factory=dict)
    #: finished flows whose held messages wait for a session's confirm (see the module docstring)
    _lingering: dict[str, _Runner] = attrs.field(factory=dict)
    _sessions: dict[int, _Runner] = attrs.field(factory=dict)
    _finished: dict[str, _Finished] = attrs.field(factory=dict)
    _finished_order: collections.deque[str] = attrs.field(factory=collections.deque)
    #: flows whose checkpoint could not be decoded at start: flow id -> (error, starter if readable)
    _unresumable: dict[str, tuple[str, str | None]] = attrs.field(factory=dict)
    _nursery: trio.Nursery | None = None
    _draining: bool = False
    _undrained: trio.Event = attrs.field(factory=trio.Event)
    _changed: trio.Event = attrs.field(factory=trio.Event)
    _version: int = 0
    _refusals: collections.deque[tuple[str, str]] = attrs.field(factory=collections.deque)
    _stats: collections.Counter[str] = attrs.field(factory=collections.Counter)
    _finished_waiters: dict[str, trio.Event] = attrs.field(factory=dict)
    _pumps: dict[str, _Pump] = attrs.field(factory=dict)
    #: keys of outbox records whose messages are durable in the outbound queues: to delete
    _confirmed: list[bytes] = attrs.field(factory=list)
    _confirmed_added: trio.Event = attrs.field(factory=trio.Event)
    _outbound_waiting: int = 0
    _outbox_records: int = 0
    #: outboxes of finished (or unreadable) flows found at start: (record key, messages)
    _pending_resend: list[tuple[bytes | None, list[Outgoing]]] = attrs.field(factory=list)
    #: live responders per initiating peer (see the module docstring)
    _responders: collections.Counter[str] = attrs.field(factory=collections.Counter)
    #: flows in the hospital by flow name, and the inbox credit lent for their messages (see the module
    #: docstring)
    _in_hospital: collections.Counter[str] = attrs.field(factory=collections.Counter)
    _lent: int = 0
    _lent_bytes: int = 0
    #: the log lines of refused session messages, bounded per sender (see the module docstring)
    _refusal_warnings: logs.PeerWarnings = attrs.field(
        factory=lambda: logs.PeerWarnings(log, "session messages from %s refused")
    )

    @classmethod
    async def open(
        cls, service: messaging.MessagingService, *, config: FlowManagerConfig | None = None
    ) -> FlowManager:
        """Open the checkpoint log and load every checkpoint (they resume when :meth:`run` starts).

        A checkpoint that cannot be decoded (a flow class or version this code lacks) is listed with its error
        and kept; it never stops the others.
        """
        checkpoints = await service.broker.open_keyed_log(CHECKPOINT_LOG)
        config = config or FlowManagerConfig()
        env = Environment(
            our_name=str(service.config.legal_name), normalize_party=normalize_party,
            max_unconsumed_messages=config.max_unconsumed_messages,
            max_unconsumed_bytes=config.max_unconsumed_bytes,
        )  # fmt: skip
        manager = cls(service, checkpoints, config, env)
        outboxes: dict[str, list[tuple[int, bytes, bytes]]] = {}
        for key, data in checkpoints.items():
            try:
                parsed = split_outbox_key(key)
                flow_id = key.decode()
            except ValueError as exc:  # (not UTF-8, or not a transition number: no key the manager writes)
                shown = key.decode(errors="backslashreplace")
                manager._unresumable[shown] = (f"unreadable checkpoint key {key!r}: {exc}", None)
                log.error("checkpoint record %r left alone: its key is unreadable: %s", key, exc)
                continue
            if parsed is not None:
                outboxes.setdefault(parsed[0], []).append((parsed[1], key, data))
                continue
            try:
                state = decode_checkpoint(data)
            except PayloadError as exc:
                manager._unresumable[flow_id] = (str(exc), checkpoint_started_by(data))
                log.error("flow %s cannot be resumed: %s", flow_id, exc)
                continue
            # (a checkpoint written before outboxes had records of their own holds its outbox)
            pending: list[tuple[bytes | None, list[Outgoing]]] = (
                [(None, state.outbox)] if state.outbox else []
            )
            state.outbox = []
            initiator = _responder_of(state)
            if state.finished and not state.unflushed:
                manager._add_finished(state, initiator)
                manager._pending_resend += pending
                continue
            runner = _Runner(
                flow_id, state, data, persisted=True, resumed=True, pending_out=pending, initiator=initiator
            )
            if state.finished:
                manager._add_finished(state, initiator)
                manager._lingering[flow_id] = runner
            else:
                manager._runners[flow_id] = runner
                manager._count_responder(runner)
            manager._register_sessions(runner)
        for flow_id, records in outboxes.items():
            found = []
            for _number, key, data in sorted(records):
                try:
                    found.append((key, decode_outbox_record(data)))
                except PayloadError as exc:
                    log.error("flow %s: outbox record %r left alone: %s", flow_id, key, exc)
            manager._outbox_records += len(records)
            runner = manager._runners.get(flow_id) or manager._lingering.get(flow_id)
            if runner is not None:
                runner.pending_out += found
            else:  # finished: its last messages
                manager._pending_resend += found
        return manager

    # --- lifecycle ----------------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Handle session messages and run flows until cancelled."""
        registration = self.messaging.add_message_handler(SESSION_TOPIC, self._on_message)
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._delete_confirmed)
                for key, outbox in self._pending_resend:
                    self._hand_over(None, outbox, key)
                    self._stats["resent"] += len(outbox)
                self._pending_resend = []
                for runner in [*self._runners.values(), *self._lingering.values()]:
                    for key, outbox in runner.pending_out:  # before the flow takes any event
                        self._hand_over(runner, outbox, key)
                        self._stats["resent"] += len(outbox)
                    runner.pending_out = []
                    nursery.start_soon(self._drive, runner)
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery = None
            self.messaging.remove_message_handler(registration)
            for runner in [*self._runners.values(), *self._lingering.values()]:
                for receipt in runner.held:
                    receipt.resolve(trio.ClosedResourceError("flow manager stopped"))
                for event in runner.events:
                    if isinstance(event, MessageArrived):
                        event.token.resolve(trio.ClosedResourceError("flow manager stopped"))

    # --- starting -----------------------------------------------------------------------------------------

    async def start_flow(
        self,
        flow: FlowLogic[Any] | str | type[FlowLogic[Any]],
        flow_args: Mapping[str, Any] | None = None,
        /,
        *,
        client_id: str | None = None,
        started_by: str | None = None,
        **args: Any,
    ) -> FlowHandle:
        """Start a flow: an instance, or a startable flow's name or class with named arguments (see
        :func:`build_flow`), given as keywords or as one mapping ``flow_args`` (for an argument named like a
        keyword of this method, ``client_id`` say), not both. Returns once the flow is running; it is durable
        after its first transition (:meth:`FlowHandle.durable` waits for that: a crash before it loses the
        start).

        ``started_by`` names who starts it (the node's RPC passes the RPC user's name); it is kept in the
        flow's checkpoints. ``client_id`` makes the start idempotent (Corda's client id): the flow id is
        ``C-<client_id>``, and if that flow exists (running, parked, or finished and still remembered) and
        was started by the same ``started_by``, its handle is returned and nothing starts. A client id
        belongs to the flow's starter: the same client id with another ``started_by`` (or a flow whose
        checkpoint records no starter, written before starters were recorded, with any ``started_by`` but
        ``None``) raises :class:`ClientIdTakenError`. After a crash, starting again with the same client id
        either finds the flow or starts it afresh (a start that never reached its first checkpoint left
        nothing behind, not even a message).

        Raises:
            FlowManagerDrainingError: the manager is draining.
            ClientIdTakenError: the client id names a flow someone else started.
            UnknownFlowError / ValueError: see :func:`build_flow`.
        """
        await trio.lowlevel.checkpoint()
        if flow_args is not None:
            if args:
                raise TypeError("give the flow's arguments as keywords or as one mapping, not both")
            args = dict(flow_args)
        if isinstance(flow, FlowLogic) and args:
            raise TypeError("arguments are given with a flow name or class, not with an instance")
        if client_id is not None:
            _check_client_id(client_id)
        flow_id = str(uuid.uuid4()) if client_id is None else f"C-{client_id}"
        if flow_id in self._runners or flow_id in self._finished or flow_id in self._unresumable:
            self._check_same_flow(flow_id, flow, started_by)
            return FlowHandle(flow_id, self, started=False)
        if self._draining:
            raise FlowManagerDrainingError("the node is draining: no new flows are started")
        if self._nursery is None:
            raise RuntimeError("the flow manager is not running")
        if isinstance(flow, FlowLogic) or not all(isinstance(v, _IMMUTABLE) for v in args.values()):
            instance = flow if isinstance(flow, FlowLogic) else build_flow(flow, args)
            state = new_initiator(flow_id, instance, started_by=started_by)
            runner = _Runner(flow_id, state, encode_checkpoint(state))
        else:  # the initial state can be built again, should the first transition go to the hospital
            initial = functools.partial(_new_initiator, flow_id, flow, args, started_by)
            runner = _Runner(flow_id, initial(), None, initial=initial)
        runner.post(Start(now=time.time()))
        self._runners[flow_id] = runner
        self._stats["started"] += 1
        self._nursery.start_soon(self._drive, runner)
        self._bump()
        return FlowHandle(flow_id, self)

    def _check_same_flow(
        self, flow_id: str, flow: FlowLogic[Any] | str | type[FlowLogic[Any]], started_by: str | None
    ) -> None:
        """A client id names an existing flow: ``started_by`` must have started it (else
        ``ClientIdTakenError``, which says nothing about that flow), and it must be of the kind asked for (the
        caller's permission was checked for that kind), else ``ValueError``."""
        runner = self._runners.get(flow_id)
        finished = self._finished.get(flow_id)
        if runner is not None:
            existing, owner = runner.state.flow_name, runner.state.started_by
        elif finished is not None:
            existing, owner = finished.flow_name, finished.started_by
        else:  # (a checkpoint that could not be loaded: its kind is unknown, its starter read if it can be)
            existing, owner = None, self._unresumable[flow_id][1]
        if owner != started_by:
            raise ClientIdTakenError(
                f"client id {flow_id[2:]!r} is taken: it names a flow that "
                + ("was started before starters were recorded" if owner is None else "another user started")
                + "; choose another client id"
            )
        if existing is None:
            return
        if isinstance(flow, str):
            flow = registry.startable(flow)
        wanted = (flow if isinstance(flow, type) else type(flow)).flow_name
        if wanted != existing:
            raise ValueError(f"client id of flow {flow_id} names a {existing} flow, not a {wanted}")

    # --- receiving ----------------------------------------------------------------------------------------

    def _refuse(self, sender: str, reason: str, *, quiet: bool = False) -> None:
        self._stats["refused"] += 1
        self._refusals.append((sender, reason))
        while len(self._refusals) > self.config.refusals_retain:
            self._refusals.popleft()
        if quiet:
            log.debug("session message from %s refused: %s", sender, reason)
        else:
            self._refusal_warnings.warning(
                sender, reason, "session message from %s refused: %s", sender, reason
            )
        self._bump()

    def refusals(self) -> list[tuple[str, str]]:
        """Recent refused session messages: (sender, reason), oldest first."""
        return list(self._refusals)

    async def _on_message(self, message: messaging.ReceivedMessage) -> Any:
        try:
            sender = normalize_party(message.validated_user or self.env.our_name)
        except ValueError:
            sender = str(message.validated_user)
        try:
            parts = decode_session_messages(message.data)
        except SessionProtocolError as exc:
            self._refuse(sender, str(exc))
            return None
        if len(parts) == 1:
            return await self._on_part(sender, parts[0][0], message.dedup_id, parts[0][1])
        # a bundle: its parts in order; the inbox message goes once every part's consumption is durable
        deferred = []
        for i, (part, data) in enumerate(parts):
            receipt = await self._on_part(sender, part, f"{message.dedup_id}/{i}", data)
            if receipt is not None:
                deferred.append(receipt)
        if not deferred:
            return None

        async def all_durable() -> bytes | None:
            for receipt in deferred:
                await receipt()
            return None

        return all_durable

    async def _on_part(self, sender: str, decoded: SessionMessage, dedup_id: str, data: bytes) -> Any:
        if isinstance(decoded, InitialSessionMessage):
            if self._draining:
                return self._deferred_init(sender, decoded, dedup_id, data)
            return await self._on_init(sender, decoded, dedup_id, data)
        runner = self._sessions.get(decoded.recipient_session_id)
        if runner is None:
            if isinstance(decoded.payload, EndPayload):
                # the peer's end crossed ours and our flow has ended (and left memory): what the state
                # machine does for a finished flow still loaded. Not a refusal: every flow whose two sides end
                # together sends one, and counting it made the refusal counter rise with healthy traffic.
                log.debug(
                    "end from %s for session %s dropped: its flow has ended",
                    sender,
                    decoded.recipient_session_id,
                )
                return None
            self._refuse(sender, f"unknown session {decoded.recipient_session_id}")
            return None
        receipt = _Receipt(size=len(data))
        runner.post(MessageArrived(sender=sender, message=decoded, token=receipt, now=time.time()))
        if runner.in_hospital:
            unlent = self._lend_for(runner, [receipt])
            if self._queue_in_hospital(runner, decoded.recipient_session_id, len(data)) or unlent:
                runner.fold_due = True
                runner.wake()
        return receipt.wait

    def _deferred_init(self, sender: str, init: InitialSessionMessage, dedup_id: str, data: bytes) -> Any:
        """An init that came while draining: it waits (unacknowledged) until :meth:`undrain`, the inbox lent a
        unit of credit for it meanwhile; beyond ``max_parked_messages`` / ``max_parked_bytes`` it is rejected
        (see the module docstring)."""

        async def when_undrained() -> bytes | None:
            if not self._undrained.is_set():
                count, size = self._lend([len(data)])
                if not count:
                    reason = (
                        f"{self.env.our_name} is draining (no new flows) and holds {self._lent} session "
                        f"inits and messages of parked flows already ({self._lent_bytes} bytes; "
                        f"max_parked_messages = {self.config.max_parked_messages}, max_parked_bytes = "
                        f"{self.config.max_parked_bytes}); try again when it is back"
                    )
                    self._refuse_init(sender, reason)
                    await self._reject(sender, init, dedup_id, reason)
                    return None
                try:
                    await self._undrained.wait()
                finally:
                    self._take_back(count, size)
            deferred = await self._on_init(sender, init, dedup_id, data)
            return await deferred() if deferred is not None else None

        return when_undrained

    async def _on_init(self, sender: str, init: InitialSessionMessage, dedup_id: str, data: bytes) -> Any:
        responder = registry.responders.get(init.initiator_flow_class_name)
        if responder is None:
            reason = f"no responder is registered for flow {init.initiator_flow_class_name!r}"
            self._refuse(sender, reason)
            await self._reject(sender, init, dedup_id, reason)
            return None
        flow_id = responder_flow_id(sender, init.initiator_session_id, init.initiation_entropy)
        if flow_id in self._runners or flow_id in self._finished:
            log.debug("copy of the init of %s dropped", flow_id)
            return None
        live, limit = self._responders[sender], self.config.max_responders_per_peer
        if live >= limit:
            reason = (
                f"too many flows from one peer: {live} started by {sender} are running here "
                f"(max_responders_per_peer = {limit}); try again when some have finished"
            )
            self._refuse_init(sender, reason)
            await self._reject(sender, init, dedup_id, reason)
            return None
        parked = self._in_hospital[responder.flow_name]
        if parked and not self._can_lend(len(data)):
            reason = (
                f"{responder.flow_name} is failing here: {parked} of its flows are parked or retrying, and "
                f"such flows hold {self._lent} messages ({self._lent_bytes} bytes; max_parked_messages = "
                f"{self.config.max_parked_messages}, max_parked_bytes = {self.config.max_parked_bytes}); "
                "try again when they were retried or killed"
            )
            self._refuse_init(sender, reason)
            await self._reject(sender, init, dedup_id, reason)
            return None
        state = new_responder(sender, init, responder, flow_id=flow_id)
        receipt = _Receipt(size=len(data))
        # (from the wire bytes again, should the first transition go to the hospital: a step may have changed
        # the first payload in place)
        initial = functools.partial(_new_responder, sender, data, responder, flow_id)
        runner = _Runner(flow_id, state, None, initial=initial, held=[receipt], initiator=sender)
        runner.post(Start(now=time.time()))
        self._runners[flow_id] = runner
        self._count_responder(runner)
        self._register_sessions(runner)
        self._stats["started"] += 1
        assert self._nursery is not None
        self._nursery.start_soon(self._drive, runner)
        self._bump()
        return receipt.wait

    async def _reject(self, sender: str, init: InitialSessionMessage, dedup_id: str, reason: str) -> None:
        """Answer a refused init with a reject carrying ``reason`` (its initiating flow fails with it)."""
        error_id = derive_id("reject", dedup_id)
        reject = ExistingSessionMessage(
            recipient_session_id=init.initiator_session_id, seq=0,
            payload=RejectPayload(error_id=error_id, message=reason),
        )  # fmt: skip
        out = self.messaging.create_message(
            SESSION_TOPIC, encode_session_message(reject),
            dedup_id=error_dedup_id(error_id, init.initiator_session_id),
        )  # fmt: skip
        await self.messaging.send(out, pki.CordaX500Name.parse(sender))

    def _refuse_init(self, sender: str, reason: str) -> None:
        """Count an init refused for its sender's live responders (and refuse it like any other)."""
        self._stats["refused_inits"] += 1
        self._refuse(sender, reason)

    def _count_responder(self, runner: _Runner) -> None:
        if runner.initiator is not None and not runner.counted:
            runner.counted = True
            self._responders[runner.initiator] += 1

    def _uncount_responder(self, runner: _Runner) -> None:
        if runner.counted:
            assert runner.initiator is not None
            runner.counted = False
            self._responders[runner.initiator] -= 1
            if not self._responders[runner.initiator]:
                del self._responders[runner.initiator]

    def _register_sessions(self, runner: _Runner) -> None:
        for s in runner.state.sessions.values():
            self._sessions[s.our_id] = runner

    # --- running ------------------------------------------------------------------------------------------

    async def _drive(self, runner: _Runner) -> None:
        if runner.resumed:
            runner.resumed = False
            self._arm_timer(runner)
            if not runner.state.finished:  # it may hold what it can take now (messages folded while parked)
                runner.post(TimerFired(now=time.time()))
        while not runner.done.is_set():
            while not runner.events:
                runner.wakeup = trio.Event()
                await runner.wakeup.wait()
            batch = list(runner.events)
            runner.events.clear()
            failure = await self._step(runner, batch)
            if failure is not None:  # (the step's frame, the exception and its traceback are gone)
                await self._hospital(runner, batch, *failure)

    async def _step(self, runner: _Runner, batch: list[Any]) -> tuple[str, bool] | None:
        """Run ``batch`` through the state machine and perform its actions; returns ``(error text,
        transient)`` when the flow goes to the hospital instead (see :func:`_failure`)."""
        state = runner.state
        actions: list[Any] = []
        for event in batch:
            t = transition(state, event, self.env)
            self._stats["transitions"] += 1
            hospital = next((a for a in t.actions if isinstance(a, SendToHospital)), None)
            if hospital is not None:
                return _failure(runner.flow_id, hospital.error, hospital.transient)
            actions.extend(t.actions)
        persist = any(isinstance(a, PersistCheckpoint) for a in actions)
        # The messages of the whole batch (each transition started a fresh outbox): stored beside the
        # checkpoint under a key of their own, in the same record, not in the checkpoint.
        outbox = [o for a in actions if isinstance(a, SendMessages) for o in a.messages]
        state.outbox = []
        out_key = None
        if persist:
            try:
                data = encode_checkpoint(state)
                if outbox:
                    record, outbox = encode_outbox_record(outbox)
                    self._check_sizes(outbox)
            except (PayloadError, messaging.MessageTooLargeError) as exc:
                # never: a message that no peer may take, or state that cannot be stored (parked, and
                # nothing of this batch is committed: the flow can be killed, its counterparties told)
                return _failure(runner.flow_id, exc, False)
            out_key = await self._commit(runner, data, record if outbox else None)
        self._acknowledge_and_refuse(actions)
        if outbox:
            self._hand_over(runner, outbox, out_key)
        for action in actions:
            if isinstance(action, ScheduleTimer):
                self._arm_timer(runner)
            elif isinstance(action, (CompleteFlow, FailFlow)):
                self._finish(runner)
        if runner.flow_id in self._lingering and not state.unflushed:
            self._release(runner)
        if runner.status != "running" and not state.finished:
            runner.retries = 0
            runner.status = "running"
            runner.error = None
            self._bump()
        return None

    async def _commit(self, runner: _Runner, data: bytes, record: bytes | None) -> bytes | None:
        """Write ``runner``'s checkpoint ``data`` (encoded from ``runner.state``) and its transition's outbox
        ``record`` in one record of the keyed log; resolve the receipts it held. Returns the outbox key."""
        state = runner.state
        out_key = None
        puts = [(runner.flow_id.encode(), data)]
        if record is not None:
            out_key = outbox_key(runner.flow_id, state.suspends)
            puts.append((out_key, record))
        deletes = []
        if state.finished and runner.flow_id not in self._lingering:
            kept = []  # still waiting for a confirm: their records stay
            while len(self._finished_order) >= self.config.finished_retain:
                old = self._finished_order.popleft()
                if old in self._lingering:
                    kept.append(old)
                    continue
                self._finished.pop(old, None)
                deletes.append(old.encode())
            self._finished_order.extendleft(reversed(kept))
        confirmed = len(self._confirmed)  # outbox records whose messages are in the outbound queues
        if confirmed:
            deletes += self._confirmed
            self._confirmed = []
        await self.checkpoints.write(puts, deletes)
        self._outbox_records += len(puts) - 1 - confirmed
        self._stats["checkpoint_writes"] += 1
        runner.checkpoint = data
        runner.initial = None
        runner.persisted = True
        self._bump()
        self._register_sessions(runner)
        for receipt in runner.held:
            receipt.resolve()
        runner.held = []
        return out_key

    # --- sending ------------------------------------------------------------------------------------------

    def _acknowledge_and_refuse(self, actions: Sequence[Any]) -> None:
        """Resolve the receipts a transition consumed (once its checkpoint is written) and count and log the
        messages it refused."""
        for action in actions:
            if isinstance(action, AcknowledgeMessages):
                for token in action.tokens:
                    token.resolve()
            elif isinstance(action, RefuseMessage):
                self._refuse(action.sender, action.reason, quiet=action.reason.startswith("unknown"))

    def _hand_over(self, runner: _Runner | None, outbox: list[Outgoing], key: bytes | None) -> None:
        """Queue ``outbox`` for the outbound pumps (per counterparty, in order); ``key``, its record, is
        deleted once every part is durable in the outbound queues."""
        parts: dict[str, list[Outgoing]] = {}
        for o in outbox:
            parts.setdefault(o.counterparty, []).append(o)
        handover = _Handover(key, len(parts))
        for party, messages in parts.items():
            pump = self._pumps.get(party)
            if pump is None:
                pump = self._pumps[party] = _Pump(party)
                assert self._nursery is not None
                self._nursery.start_soon(self._pump, pump)
            pump.entries.append((handover, runner, messages))
            pump.wakeup.set()
        self._outbound_waiting += len(outbox)

    def _check_sizes(self, outbox: list[Outgoing]) -> None:
        """Raise ``MessageTooLargeError`` for a message of ``outbox`` (with wire bytes) that the network's
        ``max_message_size`` refuses: exactly, for those whose session bytes come near the limit."""
        near = self.messaging.config.max_message_size - ENVELOPE_ROOM
        for o in outbox:
            if len(o.wire or b"") > near:
                self.messaging.check_size(self._outgoing(o), o.counterparty)

    def _outgoing(self, o: Outgoing) -> messaging.OutgoingMessage:
        headers = {messaging.HEADER_MESSAGE_TYPE: SESSION_INIT_TYPE} if o.initial else None
        return self.messaging.create_message(
            SESSION_TOPIC, outgoing_wire(o), dedup_id=o.dedup_id, headers=headers
        )

    def _bundle(self, outbox: list[Outgoing]) -> messaging.OutgoingMessage:
        """One P2P message for one transition's messages to one node: the same bundle (bytes and dedup id)
        whenever that outbox is sent again."""
        initial = any(o.initial for o in outbox)
        headers = {messaging.HEADER_MESSAGE_TYPE: SESSION_INIT_TYPE} if initial else None
        wire = encode_session_bundle([outgoing_wire(o) for o in outbox])
        dedup_id = f"B-{outbox[0].dedup_id}-{len(outbox)}"
        return self.messaging.create_message(SESSION_TOPIC, wire, dedup_id=dedup_id, headers=headers)

    async def _pump(self, pump: _Pump) -> None:
        """Append what the flows handed over for ``pump.party`` to its outbound queue: everything waiting in
        one ``send_many`` (one group commit), lot after lot, in hand-over order."""
        while True:
            while not pump.entries:
                pump.wakeup = trio.Event()
                await pump.wakeup.wait()
            entries = list(pump.entries)
            pump.entries.clear()
            await self._send_lot(pump, entries)
            for handover, runner, messages in entries:
                self._outbound_waiting -= len(messages)
                handover.parts -= 1
                if handover.parts == 0 and handover.key is not None:
                    self._confirmed.append(handover.key)
                    self._confirmed_added.set()
                if runner is not None and runner.send_error is not None:
                    runner.send_error = None
                    self._bump()

    async def _send_lot(
        self,
        pump: _Pump,
        entries: list[tuple[_Handover, _Runner | None, list[Outgoing]]],
        *,
        gather: bool = True,
    ) -> None:
        """Send one lot; a peer the network map does not know yet is retried with backoff (its flows show as
        ``retrying``; with ``gather``, what is handed over meanwhile joins ``entries``). A message above the
        network's size limit can never go: it is dropped (logged), the others go (a last resort: ``_step``
        parks a flow that makes one before its checkpoint)."""
        delay = self.config.retry_initial_seconds
        party = _party(pump.party)
        while True:
            peers_seen = self.messaging.resolver.version  # (a change after the attempt may bring the peer)
            messages = []
            for _h, _r, outbox in entries:
                if len(outbox) > 1 and self.config.bundle:
                    messages.append(self._bundle(outbox))
                else:
                    messages += [self._outgoing(o) for o in outbox]
            try:
                await self.messaging.send_many(messages, party)
                return
            except messaging.UnknownRecipientError as exc:
                if gather:  # what was handed over meanwhile joins this lot (in order): all of it waits
                    entries.extend(pump.entries)
                    pump.entries.clear()
                text = str(exc)
                for _h, runner, _o in entries:
                    if runner is not None and runner.send_error != text:
                        runner.send_error = text
                        self._bump()
                log.info(
                    "messages to %s wait: %s; retrying in about %.1f s, or when the network map changes",
                    pump.party, exc, delay,
                )  # fmt: skip
                with trio.move_on_after(delay * random.uniform(0.5, 1.5)):
                    async with trio.open_nursery() as waiters:
                        changed = functools.partial(self.messaging.resolver.wait_changed, peers_seen)
                        waiters.start_soon(_first_of, waiters, pump.retry.wait)
                        waiters.start_soon(_first_of, waiters, changed)
                pump.retry = trio.Event()
                delay = min(delay * 2, self.config.retry_max_seconds)
                if gather:
                    entries.extend(pump.entries)
                    pump.entries.clear()
            except messaging.MessageTooLargeError as exc:
                if sum(len(outbox) for _h, _r, outbox in entries) == 1:
                    log.error("flow message %s to %s dropped: %s", entries[0][2][0].dedup_id, pump.party, exc)
                    return
                for entry in entries:  # find the culprit: the others go
                    for o in entry[2]:
                        await self._send_lot(pump, [(entry[0], entry[1], [o])], gather=False)
                return

    async def _delete_confirmed(self) -> None:
        """Delete the records of outboxes whose messages are in the outbound queues, unless a checkpoint write
        takes them first."""
        while True:
            await self._confirmed_added.wait()
            await trio.sleep(self.config.outbox_flush_seconds)
            self._confirmed_added = trio.Event()
            if self._confirmed:
                keys, self._confirmed = self._confirmed, []
                await self.checkpoints.write([], keys)
                self._outbox_records -= len(keys)
                self._bump()

    def _arm_timer(self, runner: _Runner) -> None:
        wake_at = runner.state.wake_at
        if runner.timer is not None:
            runner.timer.cancel()
            runner.timer = None
        if wake_at is None or self._nursery is None:
            return
        scope = trio.CancelScope()
        runner.timer = scope

        async def fire() -> None:
            with scope:
                await trio.sleep(max(0.0, wake_at - time.time()))
                runner.post(TimerFired(now=max(time.time(), wake_at)))

        self._nursery.start_soon(fire)

    async def _hospital(self, runner: _Runner, batch: list[Any], text: str, transient: bool) -> None:
        """Throw the in-memory state away, reload the last checkpoint and retry the batch: after a backoff
        (transient) or when an operator says so (parked). ``text`` is the error shown (:func:`_failure`)."""
        if runner.checkpoint is not None:
            runner.state = decode_checkpoint(runner.checkpoint)
        else:
            assert runner.initial is not None
            runner.state = runner.initial()
        runner.events.extendleft(reversed(batch))
        self._enter_hospital(runner)
        try:
            if transient:
                delay = self.config.retry_initial_seconds * 2 ** min(runner.retries, 10)
                runner.retries += 1
                self._set_status(runner, "retrying", text)
                log.info("flow %s: transient failure (%s); retrying", runner.flow_id, text)
                seconds = min(delay, self.config.retry_max_seconds) * random.uniform(0.5, 1.5)
                await self._wait_in_hospital(runner, trio.current_time() + seconds)
            else:
                self._set_status(runner, "parked", text)
                await self._wait_in_hospital(runner, float("inf"))
        finally:
            self._leave_hospital(runner)
        runner.retry = trio.Event()
        kills = [e for e in runner.events if isinstance(e, Kill)]
        if kills:  # a kill jumps the queue; what the flow did not consume is dropped, acknowledged only
            # with the kill's checkpoint (acknowledged before, a crash left the flow at its last checkpoint,
            # not killed, waiting for messages that were gone)
            runner.held += [e.token for e in runner.events if isinstance(e, MessageArrived)]
            runner.events.clear()
            runner.events.append(kills[0])

    async def _wait_in_hospital(self, runner: _Runner, deadline: float) -> None:
        """Wait until ``runner`` is retried or killed, or ``deadline`` (trio time); meanwhile fold what it
        holds into its checkpoint whenever that is due (see the module docstring)."""
        while not runner.retry.is_set() and trio.current_time() < deadline:
            if runner.fold_due:
                await self._fold(runner)
                continue
            runner.nudge = trio.Event()
            with trio.move_on_at(deadline):
                await runner.nudge.wait()
        runner.nudge = None

    def _enter_hospital(self, runner: _Runner) -> None:
        """``runner`` waits in the hospital: lend the inbox credit for the messages it holds (see the module
        docstring)."""
        runner.in_hospital = True
        self._in_hospital[runner.state.flow_name] += 1
        arrived = [e for e in runner.events if isinstance(e, MessageArrived)]
        unlent = self._lend_for(runner, [*runner.held, *(e.token for e in arrived)])
        over = [
            self._queue_in_hospital(runner, e.message.recipient_session_id, e.token.size) for e in arrived
        ]
        runner.fold_due = bool(unlent) or any(over)

    def _queue_in_hospital(self, runner: _Runner, session_id: int, size: int) -> bool:
        """Count a message of ``size`` bytes queued for ``session_id`` of ``runner`` (in the hospital).
        Returns whether that session now has more than its last checkpoint may hold for it (with what it
        holds already: ``max_unconsumed_messages`` / ``max_unconsumed_bytes``, the limit on data sent ahead),
        or can take no data at all (unknown to that checkpoint, ended or failed by the peer, overflowed)."""
        queued = runner.queued.setdefault(session_id, [0, 0])
        queued[0] += 1
        queued[1] += size
        session = runner.state.session_by_id(session_id)
        if session is None or session.peer_ended or session.peer_error is not None:
            return True
        return (
            len(session.received) + queued[0] > self.env.max_unconsumed_messages
            or session.received_bytes + queued[1] > self.env.max_unconsumed_bytes
        )

    async def _fold(self, runner: _Runner) -> None:
        """Fold the messages ``runner`` (in the hospital) holds into its last checkpoint as data sent ahead
        (``hold_messages``: nothing of the flow runs), write it and acknowledge them once it is durable,
        giving back the inbox credit lent for them; the flow stays where it is (see the module docstring)."""
        runner.fold_due = False
        state = runner.state
        arrived = [e for e in runner.events if isinstance(e, MessageArrived)]
        if state.finished or not arrived:
            return
        t = hold_messages(state, arrived, self.env)
        outbox = [o for a in t.actions if isinstance(a, SendMessages) for o in a.messages]
        state.outbox = []
        held = runner.held
        out_key = None
        if any(isinstance(a, PersistCheckpoint) for a in t.actions):
            try:
                data = encode_checkpoint(state)
                record = None
                if outbox:
                    record, outbox = encode_outbox_record(outbox)
                    self._check_sizes(outbox)
            except (PayloadError, messaging.MessageTooLargeError) as exc:  # (never: what it received)
                log.error("flow %s: the messages it holds cannot be checkpointed: %s", runner.flow_id, exc)
                runner.state = decode_checkpoint(runner.checkpoint) if runner.checkpoint else runner.initial()
                return
            out_key = await self._commit(runner, data, record)
        else:
            held = []
        done = {id(e) for e in arrived}
        remaining = [e for e in runner.events if id(e) not in done]
        if not any(isinstance(e, (Start, TimerFired)) for e in remaining):
            remaining.append(TimerFired(now=time.time()))  # (it takes what is held when it next runs)
        runner.events = collections.deque(remaining)
        self._acknowledge_and_refuse(t.actions)
        if outbox:
            self._hand_over(runner, outbox, out_key)
        given = [r for r in [*held, *(e.token for e in arrived)] if r.lent]
        for receipt in given:
            receipt.lent = False
        size = sum(r.size for r in given)
        runner.lent -= len(given)
        runner.lent_bytes -= size
        self._take_back(len(given), size)
        runner.queued = {}
        for e in remaining:
            if isinstance(e, MessageArrived):
                if self._queue_in_hospital(runner, e.message.recipient_session_id, e.token.size):
                    runner.fold_due = True

    def _leave_hospital(self, runner: _Runner) -> None:
        """``runner`` goes on with its messages (retried or killed): take the credit lent for them back."""
        runner.in_hospital = False
        name = runner.state.flow_name
        self._in_hospital[name] -= 1
        if not self._in_hospital[name]:
            del self._in_hospital[name]
        self._take_back(runner.lent, runner.lent_bytes)
        runner.lent = runner.lent_bytes = 0
        runner.queued = {}
        runner.fold_due = False

    def _lend_for(self, runner: _Runner, receipts: list[_Receipt]) -> int:
        """Lend credit for ``receipts`` (in order, while the limits allow); returns how many got none."""
        count, size = self._lend([r.size for r in receipts])
        for receipt in receipts[:count]:
            receipt.lent = True
        runner.lent += count
        runner.lent_bytes += size
        return len(receipts) - count

    def _can_lend(self, size: int) -> bool:
        return (
            self._lent < self.config.max_parked_messages
            and self._lent_bytes + size <= self.config.max_parked_bytes
        )

    def _lend(self, sizes: list[int]) -> tuple[int, int]:
        """Lend the inbox a unit of credit for each of the inbox messages of ``sizes`` (bytes) that the
        manager holds for long, while ``max_parked_messages`` and ``max_parked_bytes`` allow; returns the
        messages and bytes lent for (give them to :meth:`_take_back` when the messages go on)."""
        count = total = 0
        for size in sizes:
            if not self._can_lend(size):
                break
            count += 1
            total += size
            self._lent += 1
            self._lent_bytes += size
        if count:
            self.messaging.lend_inbox_credit(count)
            self._bump()
        return count, total

    def _take_back(self, count: int, size: int) -> None:
        if count:
            self.messaging.return_inbox_credit(count)
            self._lent -= count
            self._lent_bytes -= size
            self._bump()

    def _set_status(self, runner: _Runner, status: str, error: str | None) -> None:
        runner.status, runner.error = status, error
        self._bump()

    def _finish(self, runner: _Runner) -> None:
        state = runner.state
        self._stats["completed" if state.status == "completed" else "failed"] += 1
        if runner.timer is not None:
            runner.timer.cancel()
        self._runners.pop(runner.flow_id, None)
        self._uncount_responder(runner)
        self._add_finished(state, runner.initiator)
        if state.unflushed:  # a session's confirm is still owed: keep taking its messages
            runner.status = "running"
            self._lingering[runner.flow_id] = runner
            self._bump()
            return
        self._release(runner)

    def _release(self, runner: _Runner) -> None:
        """A finished flow owes nothing any more: forget its sessions and stop its runner."""
        for s in runner.state.sessions.values():
            if self._sessions.get(s.our_id) is runner:
                del self._sessions[s.our_id]
        self._lingering.pop(runner.flow_id, None)
        for event in runner.events:  # arrived after the end: nothing will consume them
            if isinstance(event, MessageArrived):
                event.token.resolve()
        runner.events.clear()
        runner.done.set()
        self._bump()

    def _add_finished(self, state: FlowState, initiator: str | None) -> None:
        self._finished[state.flow_id] = _Finished(
            flow_id=state.flow_id, flow_name=state.flow_name, status=state.status, result=state.result,
            error=state.error, suspends=state.suspends, initiator=initiator, started_by=state.started_by,
        )  # fmt: skip
        self._finished_order.append(state.flow_id)
        waiter = self._finished_waiters.pop(state.flow_id, None)
        if waiter is not None:
            waiter.set()

    def _bump(self) -> None:
        self._version += 1
        self._changed.set()
        self._changed = trio.Event()

    # --- operator API -------------------------------------------------------------------------------------

    async def wait_result(self, flow_id: str) -> Any:
        """See :meth:`FlowHandle.result`."""
        while flow_id not in self._finished:
            if flow_id not in self._runners:
                raise UnknownFlowError(f"no flow {flow_id}")
            event = self._finished_waiters.setdefault(flow_id, trio.Event())
            await event.wait()
        await trio.lowlevel.checkpoint()
        finished = self._finished[flow_id]
        if finished.status == "completed":
            return finished.result
        assert finished.error is not None
        raise FlowException(finished.error[1])

    def flows(self) -> list[FlowInfo]:
        """Running and parked flows, then the finished ones still remembered (oldest first)."""
        out = []
        for runner in self._runners.values():
            status, error = _shown_status(runner)
            out.append(
                FlowInfo(
                    flow_id=runner.flow_id,
                    flow_name=runner.state.flow_name,
                    status=status,
                    error=error,
                    suspends=runner.state.suspends,
                    initiator=runner.initiator,
                    started_by=runner.state.started_by,
                )
            )
        for flow_id, (error, started_by) in self._unresumable.items():
            out.append(
                FlowInfo(flow_id=flow_id, flow_name="?", status="parked", error=error, started_by=started_by)
            )
        for flow_id in self._finished_order:
            f = self._finished.get(flow_id)
            if f is not None:
                out.append(
                    FlowInfo(
                        flow_id=f.flow_id,
                        flow_name=f.flow_name,
                        status=f.status,
                        result=f.result,
                        error=None if f.error is None else f.error[1],
                        suspends=f.suspends,
                        initiator=f.initiator,
                        started_by=f.started_by,
                    )
                )
        return out

    async def retry(self, flow_id: str) -> None:
        """Run a parked (or retrying) flow again from its last checkpoint now.

        Raises:
            UnknownFlowError: no such running flow.
        """
        await trio.lowlevel.checkpoint()
        runner = self._runners.get(flow_id)
        if runner is None:
            raise UnknownFlowError(f"no running flow {flow_id}")
        runner.retry.set()
        runner.wake()
        if runner.send_error is not None:
            for pump in self._pumps.values():
                pump.retry.set()

    async def kill(self, flow_id: str, reason: str = "killed by an operator") -> None:
        """End a flow: its counterparties are told ("counter-flow errored"), its result is a FlowKilledError.

        A flow that finished before one of its sessions was confirmed (``statistics().unconfirmed``) keeps
        its result; killing it drops the end (or error) it still held for that session, and its record is
        released (a confirm arriving later is refused as for an unknown session).

        Raises:
            UnknownFlowError: no such running or unconfirmed flow.
        """
        await trio.lowlevel.checkpoint()
        runner = self._runners.get(flow_id) or self._lingering.get(flow_id)
        if runner is None:
            raise UnknownFlowError(f"no running or unconfirmed flow {flow_id}")
        runner.events.appendleft(Kill(reason=reason, now=time.time()))
        runner.wakeup.set()
        runner.retry.set()
        runner.wake()

    def drain(self) -> None:
        """Refuse new flows (``start_flow`` raises; peers' session inits wait in the inbox); running flows go
        on."""
        self._draining = True
        self._undrained = trio.Event()
        self._bump()

    def undrain(self) -> None:
        self._draining = False
        self._undrained.set()
        self._bump()

    @property
    def draining(self) -> bool:
        return self._draining

    async def wait_drained(self) -> None:
        """Wait until no flow is running: parked flows, flows waiting out a retry (a counterparty not in the
        network map, say: nothing they can finish soon) and sleeping ones do not count; they resume from
        their checkpoints."""
        while any(_shown_status(r)[0] == "running" for r in self._runners.values()):
            await self.wait_changed(self._version)
        await trio.lowlevel.checkpoint()

    async def wait_durable(self, flow_id: str) -> None:
        """Wait until the flow's first checkpoint is durable (from then on a crash resumes it), or until it
        has left the running state without one (finished, or parked by the hospital with its first step:
        either way it is listed as such). Returns at once for a flow that is not running."""
        while True:
            runner = self._runners.get(flow_id)
            if runner is None or runner.persisted or runner.status != "running":
                break
            await self.wait_changed(self._version)
        await trio.lowlevel.checkpoint()

    @property
    def version(self) -> int:
        return self._version

    async def wait_changed(self, since: int) -> int:
        """Wait until a flow started, made a transition, changed status or finished after ``version`` was
        ``since``."""
        while self._version <= since:
            await self._changed.wait()
        return self._version

    def statistics(self) -> FlowManagerStatistics:
        s = self._stats
        return FlowManagerStatistics(
            running=sum(r.status != "parked" for r in self._runners.values()),
            parked=sum(r.status == "parked" for r in self._runners.values()) + len(self._unresumable),
            finished=len(self._finished), started=s["started"], completed=s["completed"], failed=s["failed"],
            transitions=s["transitions"], checkpoint_writes=s["checkpoint_writes"], refused=s["refused"],
            draining=self._draining, unconfirmed=len(self._lingering),
            outbound_waiting=self._outbound_waiting, resent=s["resent"], outbox_records=self._outbox_records,
            refused_inits=s["refused_inits"], responders=sum(self._responders.values()),
            parked_messages=self._lent, parked_message_bytes=self._lent_bytes,
        )  # fmt: skip
