"""The bridge control protocol (PURE): message codec, the bridge side's state machine, the node side's diff.

Theory of operation
-------------------
A bridge that runs in its own process learns from the node which queues to serve over two non-durable
addresses of the node's local endpoint: it sends on ``internal.bridge.control`` (bridge -> node) and receives
on ``internal.bridge.notify`` (node -> bridge). Control messages are sent pre-settled and never stored: their
content is derived from durable state (the outbound queues and the network map), so a lost one is recovered
by asking again.

* bridge -> node :class:`QueueQuery` (query id, bridge id), repeated every ``QUERY_INTERVAL_SECONDS`` until
  answered;
* node -> bridge :class:`QueueSnapshot` (the query id it answers, or ``None`` when broadcast unsolicited at
  node start; the node's inboxes and every outbound queue that has a reachable peer);
* node -> bridge :class:`BridgeRequest` (legal name, queue name, addresses) when an outbound queue is declared
  or the network map changes the peer's entry, and :class:`BridgeDelete` when the peer leaves the map.

Wire form: an AMQP message with no header (not durable) whose body is one ``amqp-value`` holding a described
list; the descriptor names the message and its version (``corda-trio:bridge-control:<name>:v1``) and the list
holds the fields in the order given in ``protocol_spec/bridge-control.md``. Extensible: a decoder ignores
trailing fields it does not know (a later minor version appends fields) and reports a message with an unknown
descriptor as :class:`UnknownControlMessage`, which receivers ignore; an incompatible change takes a new
descriptor. The float (issue 18) adds its messages this way.

The bridge side is :class:`ControlClient`, a table-driven state machine (no clock: ``now`` is an argument, ids
are given by the caller). The node side is :func:`diff_entries`: what to broadcast when the wanted bridges
change.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, TypeAlias, final

import attrs

from corda_trio import amqp

__all__ = [
    "CONTROL_ADDRESS",
    "NOTIFY_ADDRESS",
    "QUERY_INTERVAL_SECONDS",
    "BridgeDelete",
    "BridgeEntry",
    "BridgeRequest",
    "ControlClient",
    "ControlInput",
    "ControlMessage",
    "ControlProtocolError",
    "ControlState",
    "QueueEntry",
    "QueueQuery",
    "QueueSnapshot",
    "UnknownControlMessage",
    "decode_control",
    "diff_entries",
    "encode_control",
]

#: bridge -> node (the node's endpoint receives here).
CONTROL_ADDRESS: Final = "internal.bridge.control"
#: node -> bridge (a bridge attaches a receiver here).
NOTIFY_ADDRESS: Final = "internal.bridge.notify"
#: How often an unanswered ``QueueQuery`` is sent again.
QUERY_INTERVAL_SECONDS: Final = 1.0

_PREFIX: Final = "corda-trio:bridge-control:"


class ControlProtocolError(ValueError):
    """A control message that cannot be decoded, or one that is not legal in the receiver's state."""

    condition = "amqp:decode-error"


Address: TypeAlias = tuple[str, int]


def _addresses(value: Iterable[Iterable[Any]]) -> tuple[Address, ...]:
    return tuple((str(h), int(p)) for h, p in value)


@final
@attrs.frozen(kw_only=True)
class QueueEntry:
    """A queue and the legal name it belongs to (an inbox: this node; an outbound queue: the peer)."""

    legal_name: str
    queue_name: str


@final
@attrs.frozen(kw_only=True)
class BridgeEntry:
    """An outbound queue the bridge must serve: the peer's legal name, the queue and the peer's addresses."""

    legal_name: str
    queue_name: str
    addresses: tuple[Address, ...] = attrs.field(converter=_addresses)


@final
@attrs.frozen(kw_only=True)
class QueueQuery:
    """bridge -> node: which queues are there? Repeated (same ``query_id``) until answered."""

    query_id: str
    bridge_id: str


@final
@attrs.frozen(kw_only=True)
class QueueSnapshot:
    """node -> bridge: every inbox and every outbound queue with a reachable peer.

    ``correlation_id`` is the ``query_id`` answered, or ``None`` when the node broadcasts it unsolicited (at
    start): either way it replaces everything the bridge knew.
    """

    correlation_id: str | None
    inbox_queues: tuple[QueueEntry, ...] = attrs.field(converter=tuple)
    outbound_queues: tuple[BridgeEntry, ...] = attrs.field(converter=tuple)


@final
@attrs.frozen(kw_only=True)
class BridgeRequest:
    """node -> bridge: serve (or re-dial, the addresses changed) this outbound queue."""

    entry: BridgeEntry


@final
@attrs.frozen(kw_only=True)
class BridgeDelete:
    """node -> bridge: stop serving this outbound queue (its peer left the map; the queue keeps its data)."""

    legal_name: str
    queue_name: str


@final
@attrs.frozen(kw_only=True)
class UnknownControlMessage:
    """A control message with a descriptor this version does not know (a newer peer): ignored."""

    descriptor: str


ControlMessage: TypeAlias = QueueQuery | QueueSnapshot | BridgeRequest | BridgeDelete


# --- codec -------------------------------------------------------------------------------------------------


def _str(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise ControlProtocolError(f"{what} must be a string, got {type(value).__name__}")
    return value


def _opt_str(value: Any, what: str) -> str | None:
    return None if value is None else _str(value, what)


def _list(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise ControlProtocolError(f"{what} must be a list, got {type(value).__name__}")
    return value


def _wire_addresses(addresses: tuple[Address, ...]) -> list[list[Any]]:
    return [[host, amqp.UInt(port)] for host, port in addresses]


def _read_addresses(value: Any, what: str) -> tuple[Address, ...]:
    out = []
    for i, item in enumerate(_list(value, what)):
        pair = _list(item, f"{what}[{i}]")
        if len(pair) < 2 or not isinstance(pair[1], int) or not 0 <= pair[1] <= 65535:
            raise ControlProtocolError(f"{what}[{i}] must be [host string, port 0..65535]")
        out.append((_str(pair[0], f"{what}[{i}].host"), int(pair[1])))
    return tuple(out)


def _entry_fields(e: BridgeEntry) -> list[Any]:
    return [e.legal_name, e.queue_name, _wire_addresses(e.addresses)]


def _read_entry(value: Any, what: str) -> BridgeEntry:
    f = _fields(value, what, 3)
    return BridgeEntry(
        legal_name=_str(f[0], f"{what}.legal_name"),
        queue_name=_str(f[1], f"{what}.queue_name"),
        addresses=_read_addresses(f[2], f"{what}.addresses"),
    )


def _fields(value: Any, what: str, needed: int) -> list[Any]:
    """The first ``needed`` fields (trailing ones a later version appended are ignored)."""
    fields = _list(value, what)
    if len(fields) < needed:
        raise ControlProtocolError(f"{what} has {len(fields)} fields, needs at least {needed}")
    return fields[:needed]


_ENCODERS: Final[dict[type, tuple[str, Callable[[Any], list[Any]]]]] = {
    QueueQuery: ("queue-query:v1", lambda m: [m.query_id, m.bridge_id]),
    QueueSnapshot: (
        "queue-snapshot:v1",
        lambda m: [
            m.correlation_id,
            [[q.legal_name, q.queue_name] for q in m.inbox_queues],
            [_entry_fields(e) for e in m.outbound_queues],
        ],
    ),
    BridgeRequest: ("bridge-request:v1", lambda m: _entry_fields(m.entry)),
    BridgeDelete: ("bridge-delete:v1", lambda m: [m.legal_name, m.queue_name]),
}


def _decode_query(v: Any) -> QueueQuery:
    f = _fields(v, "queue-query", 2)
    return QueueQuery(query_id=_str(f[0], "query_id"), bridge_id=_str(f[1], "bridge_id"))


def _decode_snapshot(v: Any) -> QueueSnapshot:
    f = _fields(v, "queue-snapshot", 3)
    inboxes = []
    for i, item in enumerate(_list(f[1], "inbox_queues")):
        pair = _fields(item, f"inbox_queues[{i}]", 2)
        inboxes.append(
            QueueEntry(legal_name=_str(pair[0], "legal_name"), queue_name=_str(pair[1], "queue_name"))
        )
    outbound = [_read_entry(e, f"outbound_queues[{i}]") for i, e in enumerate(_list(f[2], "outbound_queues"))]
    return QueueSnapshot(
        correlation_id=_opt_str(f[0], "correlation_id"), inbox_queues=inboxes, outbound_queues=outbound
    )


def _decode_delete(v: Any) -> BridgeDelete:
    f = _fields(v, "bridge-delete", 2)
    return BridgeDelete(legal_name=_str(f[0], "legal_name"), queue_name=_str(f[1], "queue_name"))


_DECODERS: Final[dict[str, Callable[[Any], ControlMessage]]] = {
    "queue-query:v1": _decode_query,
    "queue-snapshot:v1": _decode_snapshot,
    "bridge-request:v1": lambda v: BridgeRequest(entry=_read_entry(v, "bridge-request")),
    "bridge-delete:v1": _decode_delete,
}


def encode_control(message: ControlMessage) -> bytes:
    """The AMQP message (bytes) carrying ``message``."""
    name, fields = _ENCODERS[type(message)]
    body = amqp.AmqpValue(amqp.Described(amqp.Symbol(_PREFIX + name), fields(message)))
    return amqp.Message(body=body).encode()


def decode_control(payload: bytes) -> ControlMessage | UnknownControlMessage:
    """Decode a control message.

    Raises:
        ControlProtocolError: not an AMQP message with one described amqp-value body, or a known message
            whose fields are missing or mistyped (a misbehaving or buggy peer).
    """
    try:
        message = amqp.Message.decode(payload)
    except amqp.DecodeError as exc:
        raise ControlProtocolError(f"undecodable control message: {exc}") from None
    body = message.body
    if not isinstance(body, amqp.AmqpValue) or not isinstance(body.value, amqp.Described):
        raise ControlProtocolError("a control message's body must be one amqp-value holding a described list")
    descriptor = body.value.descriptor
    if not isinstance(descriptor, str):
        raise ControlProtocolError(f"control message descriptor must be a symbol, got {descriptor!r}")
    decode = _DECODERS.get(descriptor[len(_PREFIX) :]) if descriptor.startswith(_PREFIX) else None
    if decode is None:
        return UnknownControlMessage(descriptor=str(descriptor))
    return decode(body.value.value)


# --- node side ---------------------------------------------------------------------------------------------


def diff_entries(
    old: Mapping[str, BridgeEntry], new: Mapping[str, BridgeEntry]
) -> list[BridgeRequest | BridgeDelete]:
    """What the node broadcasts when its wanted bridges (by queue name) go from ``old`` to ``new``:
    a delete per queue gone, a request per queue new or changed (in queue-name order, so deterministic)."""
    out: list[BridgeRequest | BridgeDelete] = [
        BridgeDelete(legal_name=old[name].legal_name, queue_name=name)
        for name in sorted(old)
        if name not in new
    ]
    out += [BridgeRequest(entry=new[name]) for name in sorted(new) if old.get(name) != new[name]]
    return out


# --- bridge side -------------------------------------------------------------------------------------------


class ControlState(enum.Enum):
    DISCONNECTED = "disconnected"
    QUERYING = "querying"
    SYNCED = "synced"


class ControlInput(enum.Enum):
    CONNECTED = "connected"
    TIMER = "timer"
    SNAPSHOT_ANSWER = "snapshot-answer"  # correlated to our outstanding query
    SNAPSHOT_STALE = "snapshot-stale"  # correlated to another query (an older connection's, another bridge's)
    SNAPSHOT_UNSOLICITED = "snapshot-unsolicited"  # node start
    REQUEST = "request"
    DELETE = "delete"
    DISCONNECTED = "disconnected"


class _Do(enum.Enum):
    QUERY = "send query"
    RESET = "replace table"
    UPSERT = "upsert entry"
    REMOVE = "remove entry"
    CLEAR = "clear table"
    NOTHING = "-"


S, In = ControlState, ControlInput

#  DISCONNECTED --CONNECTED/query--> QUERYING --TIMER/query--> QUERYING
#  QUERYING --SNAPSHOT_ANSWER | SNAPSHOT_UNSOLICITED / replace--> SYNCED
#  SYNCED --REQUEST/upsert | DELETE/remove | SNAPSHOT_UNSOLICITED/replace--> SYNCED
#  any --DISCONNECTED/clear--> DISCONNECTED
# Requests and deletes that reach a QUERYING bridge are ignored: the node sends them in order on one link,
# so the snapshot that follows already includes them. A missing pair is a ControlProtocolError.
TRANSITIONS: Final[dict[tuple[ControlState, ControlInput], tuple[_Do, ControlState]]] = {
    (S.DISCONNECTED, In.CONNECTED): (_Do.QUERY, S.QUERYING),
    (S.DISCONNECTED, In.TIMER): (_Do.NOTHING, S.DISCONNECTED),
    (S.DISCONNECTED, In.DISCONNECTED): (_Do.CLEAR, S.DISCONNECTED),
    (S.QUERYING, In.TIMER): (_Do.QUERY, S.QUERYING),
    (S.QUERYING, In.SNAPSHOT_ANSWER): (_Do.RESET, S.SYNCED),
    (S.QUERYING, In.SNAPSHOT_UNSOLICITED): (_Do.RESET, S.SYNCED),
    (S.QUERYING, In.SNAPSHOT_STALE): (_Do.NOTHING, S.QUERYING),
    (S.QUERYING, In.REQUEST): (_Do.NOTHING, S.QUERYING),
    (S.QUERYING, In.DELETE): (_Do.NOTHING, S.QUERYING),
    (S.QUERYING, In.DISCONNECTED): (_Do.CLEAR, S.DISCONNECTED),
    (S.SYNCED, In.TIMER): (_Do.NOTHING, S.SYNCED),
    (S.SYNCED, In.SNAPSHOT_ANSWER): (_Do.NOTHING, S.SYNCED),  # an answer to a repeated query
    (S.SYNCED, In.SNAPSHOT_STALE): (_Do.NOTHING, S.SYNCED),
    (S.SYNCED, In.SNAPSHOT_UNSOLICITED): (_Do.RESET, S.SYNCED),
    (S.SYNCED, In.REQUEST): (_Do.UPSERT, S.SYNCED),
    (S.SYNCED, In.DELETE): (_Do.REMOVE, S.SYNCED),
    (S.SYNCED, In.DISCONNECTED): (_Do.CLEAR, S.DISCONNECTED),
}
del S, In


@attrs.define(eq=False)
class ControlClient:
    """The bridge side of the control protocol: what to send, and the table of queues to serve.

    The driver calls :meth:`connected` once both control links are attached, :meth:`tick` at
    :attr:`deadline`, :meth:`receive` for every notify message, :meth:`disconnected` when the connection is
    lost; it sends what they return and serves :attr:`bridges` (by queue name) and :attr:`inboxes`.
    :attr:`version` increases whenever either changes.
    """

    bridge_id: str
    state: ControlState = ControlState.DISCONNECTED
    query_id: str | None = None
    deadline: float | None = None
    bridges: dict[str, BridgeEntry] = attrs.field(factory=dict)
    inboxes: tuple[QueueEntry, ...] = ()
    version: int = 0
    #: Messages with an unknown descriptor that were ignored.
    ignored: int = 0

    def _step(self, event: ControlInput) -> _Do:
        try:
            action, self.state = TRANSITIONS[(self.state, event)]
        except KeyError:
            raise ControlProtocolError(
                f"control input {event.value} is not legal in state {self.state.value}"
            ) from None
        return action

    def _query(self, now: float) -> list[ControlMessage]:
        assert self.query_id is not None
        self.deadline = now + QUERY_INTERVAL_SECONDS
        return [QueueQuery(query_id=self.query_id, bridge_id=self.bridge_id)]

    def connected(self, query_id: str, now: float) -> list[ControlMessage]:
        """The control links are up: start querying with a fresh ``query_id``."""
        self._step(ControlInput.CONNECTED)
        self.query_id = query_id
        return self._query(now)

    def tick(self, now: float) -> list[ControlMessage]:
        """Call at :attr:`deadline`: repeats the query while unanswered."""
        if self.deadline is None or now < self.deadline:
            return []
        self.deadline = None
        if self._step(ControlInput.TIMER) is _Do.QUERY:
            return self._query(now)
        return []

    def receive(self, message: ControlMessage | UnknownControlMessage) -> None:
        """Apply a message from the node.

        Raises:
            ControlProtocolError: a message only a bridge sends (``QueueQuery``), or any while disconnected.
        """
        if isinstance(message, UnknownControlMessage):
            self.ignored += 1
            return
        if isinstance(message, QueueSnapshot):
            if message.correlation_id is None:
                event = ControlInput.SNAPSHOT_UNSOLICITED
            elif message.correlation_id == self.query_id:
                event = ControlInput.SNAPSHOT_ANSWER
            else:
                event = ControlInput.SNAPSHOT_STALE
        elif isinstance(message, BridgeRequest):
            event = ControlInput.REQUEST
        elif isinstance(message, BridgeDelete):
            event = ControlInput.DELETE
        else:
            raise ControlProtocolError(f"a node does not send {type(message).__name__}")
        action = self._step(event)
        if action is _Do.RESET:
            assert isinstance(message, QueueSnapshot)
            self.bridges = {e.queue_name: e for e in message.outbound_queues}
            self.inboxes = message.inbox_queues
            self.deadline = None
        elif action is _Do.UPSERT:
            assert isinstance(message, BridgeRequest)
            if self.bridges.get(message.entry.queue_name) == message.entry:
                return
            self.bridges[message.entry.queue_name] = message.entry
        elif action is _Do.REMOVE:
            assert isinstance(message, BridgeDelete)
            if self.bridges.pop(message.queue_name, None) is None:
                return
        else:
            return
        self.version += 1

    def disconnected(self) -> None:
        """The connection to the node is gone: nothing is served until the next snapshot."""
        self._step(ControlInput.DISCONNECTED)
        self.query_id = None
        self.deadline = None
        if self.bridges or self.inboxes:
            self.bridges = {}
            self.inboxes = ()
            self.version += 1
