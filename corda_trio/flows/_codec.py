"""msgpack codecs: payloads (with the type registry), session messages (the wire) and checkpoints.

Never pickle. Bytes from a peer can only produce builtins (nil, bool, int, float, str, bin, array, map with
string keys) and instances of classes registered with :func:`payload_type`; anything else is a
:class:`PayloadError` naming what was wrong. Flows and :class:`FlowSession` appear only in checkpoints.

Extension types (msgpack ``ext``): ``1`` a registered payload: ``[name, version, {field: value}]``;
``2`` a FlowSession ``[index, counterparty]``, ``3`` a flow ``[flow name, version, {field: value}]`` and
``4`` a received payload that could not be read, not consumed yet (its reason, UTF-8) (2 to 4: checkpoints
only). The session message layout is in ``protocol_spec/flow-sessions.md``.

Nesting is bounded (``MAX_PAYLOAD_EXT_DEPTH``, ``MAX_CHECKPOINT_EXT_DEPTH``, ``MAX_PAYLOAD_NESTING``): each
ext level is a nested msgpack call on the C stack, and whatever a peer's payload holds must fit into a
checkpoint again.
"""

from __future__ import annotations

from typing import Any, Final

import attrs
import msgpack

from ._errors import PayloadError, SessionProtocolError
from ._logic import FlowLogic
from ._messages import (
    MAX_SESSION_ID,
    BadPayload,
    ConfirmPayload,
    DataPayload,
    EndPayload,
    ErrorPayload,
    ExistingSessionMessage,
    InitialSessionMessage,
    RejectPayload,
    SessionMessage,
)
from ._registry import payloads, registry
from ._requests import FlowSession, WaitReceive, WaitSleep, WaitSubFlow
from ._statemachine import FlowState, Frame, Outgoing, SessionState

__all__ = [
    "CHECKPOINT_FORMAT",
    "SESSION_FORMAT",
    "decode_checkpoint",
    "decode_outbox_record",
    "decode_payload",
    "decode_session_message",
    "decode_session_messages",
    "encode_checkpoint",
    "encode_outbox_record",
    "encode_payload",
    "encode_session_bundle",
    "encode_session_message",
]

EXT_PAYLOAD: Final = 1
EXT_SESSION: Final = 2
EXT_FLOW: Final = 3
EXT_BAD_PAYLOAD: Final = 4
#: The first element of every session message.
SESSION_FORMAT: Final = 1
CHECKPOINT_FORMAT: Final = 1
#: The first element of an outbox record (see :func:`encode_outbox_record`).
OUTBOX_FORMAT: Final = 1

INIT, CONFIRM, DATA, ERROR, REJECT, END, BUNDLE = range(7)
KIND_NAMES: Final = ("init", "confirm", "data", "error", "reject", "end", "bundle")


# ------------------------------------------------------------------------------------------------ values


def _fields(obj: Any) -> dict[str, Any]:
    return {f.name: getattr(obj, f.name) for f in attrs.fields(type(obj))}


#: Registered payloads (``ext 1``) a peer's payload may nest inside one another. Each level is a nested
#: msgpack call, whose frame on the C stack is about 40 KiB: about 200 levels (a 2 KB message) overflowed the
#: 8 MiB stack and killed the node with SIGSEGV before there was a limit.
MAX_PAYLOAD_EXT_DEPTH: Final = 32
#: The same for a checkpoint, which holds flows (``ext 3``) around payloads.
MAX_CHECKPOINT_EXT_DEPTH: Final = 64
#: Arrays and maps a peer's payload may nest within one ext level. msgpack reads 1024 and writes 1024, but a
#: checkpoint holds a received payload a few levels down: a deeper one could be read and never checkpointed.
MAX_PAYLOAD_NESTING: Final = 256


def _ext_limit(internal: bool) -> int:
    return MAX_CHECKPOINT_EXT_DEPTH if internal else MAX_PAYLOAD_EXT_DEPTH


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether ``value`` nests arrays and maps more than ``limit`` deep (ext values count as leaves: their
    contents were checked by their own call)."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if depth > limit:
            return True
        items = v if type(v) is list else v.values() if type(v) is dict else ()
        stack.extend((x, depth + 1) for x in items if type(x) is list or type(x) is dict)
    return False


def _default(internal: bool, depth: int) -> Any:
    """The packer's ``default`` at ext level ``depth`` (what it packs inside an ext is at ``depth + 1``)."""

    def default(obj: Any) -> Any:
        if isinstance(obj, tuple):
            return list(obj)
        cls = type(obj)
        entry = payloads.name_of(cls)
        if entry is not None:
            inner = [entry[0], entry[1], _fields(obj)]
            return msgpack.ExtType(EXT_PAYLOAD, _pack(inner, internal, depth + 1))
        if internal and cls is FlowSession:
            return msgpack.ExtType(EXT_SESSION, _pack([obj.index, obj.counterparty], True, depth + 1))
        if internal and isinstance(obj, FlowLogic):
            inner = [cls.flow_name, cls.flow_version, _fields(obj)]
            return msgpack.ExtType(EXT_FLOW, _pack(inner, True, depth + 1))
        if internal and cls is BadPayload:  # received, not consumed yet: its step fails with the reason
            return msgpack.ExtType(EXT_BAD_PAYLOAD, obj.reason.encode())
        raise PayloadError(
            f"a {cls.__module__}.{cls.__qualname__} cannot be sent or checkpointed: "
            "register it with @payload_type"
        )

    return default


#: Idle packers per (internal, ext level), reused: building one (its buffer) cost more than packing a
#: checkpoint. A packer is not re-entrant and ``default`` packs nested values (ext types), so each call takes
#: its own from the pool. msgpack empties a packer's buffer after each ``pack``, also when it raises.
#: (``None``: session messages, no ``default``.)
_PACKERS: Final[dict[tuple[bool, int] | None, list[msgpack.Packer]]] = {None: []}


def _pack(value: Any, internal: bool, depth: int = 0) -> bytes:
    if depth > _ext_limit(internal):
        raise PayloadError(f"registered payload types nested more than {_ext_limit(internal)} deep")
    pool = _PACKERS.setdefault((internal, depth), [])
    packer = (
        pool.pop()
        if pool
        else msgpack.Packer(default=_default(internal, depth), use_bin_type=True, strict_types=True)
    )
    try:
        return packer.pack(value)
    except PayloadError:
        raise
    except (TypeError, ValueError, OverflowError) as exc:
        raise PayloadError(f"cannot encode {type(value).__name__}: {exc}") from exc
    finally:
        pool.append(packer)


def _build(cls: type, fields: Any, what: str) -> Any:
    if not isinstance(fields, dict):
        raise PayloadError(f"{what}: fields must be a map")
    names = {f.name for f in attrs.fields(cls)}
    if set(fields) != names:
        missing, extra = sorted(names - set(fields)), sorted(set(fields) - names)
        raise PayloadError(f"{what}: fields do not match (missing {missing}, unexpected {extra})")
    obj = cls.__new__(cls)
    for name, value in fields.items():
        object.__setattr__(obj, name, value)
    return obj


def _ext_hook(internal: bool, depth: int) -> Any:
    """The unpacker's ``ext_hook`` at ext level ``depth`` (the ext's contents are at ``depth + 1``)."""

    def hook(code: int, data: bytes) -> Any:
        if code == EXT_PAYLOAD:
            name, version, fields = _unpack_list(data, internal, depth + 1, 3, "payload type")
            if not isinstance(name, str) or not isinstance(version, int):
                raise PayloadError("payload type: name and version must be a string and an integer")
            cls = payloads.lookup(name, version)
            try:
                return cls(**fields) if isinstance(fields, dict) else _build(cls, fields, name)
            except (TypeError, ValueError) as exc:
                raise PayloadError(f"payload type {name!r}: {exc}") from exc
        if internal and code == EXT_SESSION:
            index, counterparty = _unpack_list(data, True, depth + 1, 2, "session")
            return FlowSession(index, counterparty)
        if internal and code == EXT_FLOW:
            name, version, fields = _unpack_list(data, True, depth + 1, 3, "flow")
            cls = registry.by_name.get(name)
            if cls is None:
                raise PayloadError(f"checkpoint names flow class {name!r}, which is not registered")
            if version != cls.flow_version:  # type: ignore[attr-defined]
                raise PayloadError(
                    f"checkpoint of {name!r} version {version}, this code has version {cls.flow_version}"
                )  # type: ignore[attr-defined]
            return _build(cls, fields, name)
        if internal and code == EXT_BAD_PAYLOAD:
            return BadPayload(reason=data.decode(errors="replace"))
        raise PayloadError(f"unknown msgpack extension type {code}")

    return hook


_HOOKS: Final = {
    internal: [_ext_hook(internal, depth) for depth in range(_ext_limit(internal) + 1)]
    for internal in (False, True)
}


def _unpack(data: bytes, internal: bool, depth: int = 0) -> Any:
    """``data`` decoded at ext level ``depth``: a peer's (not ``internal``) nests at most
    ``MAX_PAYLOAD_EXT_DEPTH`` ext levels and ``MAX_PAYLOAD_NESTING`` arrays and maps in each; a checkpoint
    ``MAX_CHECKPOINT_EXT_DEPTH`` ext levels (msgpack's own bound on arrays)."""
    if depth > _ext_limit(internal):
        raise PayloadError(f"registered payload types nested more than {_ext_limit(internal)} deep")
    try:
        value = msgpack.unpackb(data, ext_hook=_HOOKS[internal][depth], raw=False, strict_map_key=True)
    except PayloadError:
        raise
    except msgpack.StackError:
        raise PayloadError("malformed msgpack: arrays and maps nested too deeply") from None
    except Exception as exc:  # msgpack raises several types for malformed input
        raise PayloadError(f"malformed msgpack: {type(exc).__name__}: {exc}") from exc
    # (nesting N takes at least N bytes: shorter data need not be looked at)
    if not internal and len(data) > MAX_PAYLOAD_NESTING and _deeper_than(value, MAX_PAYLOAD_NESTING):
        raise PayloadError(f"arrays and maps nested more than {MAX_PAYLOAD_NESTING} deep")
    return value


def _unpack_list(data: bytes, internal: bool, depth: int, n: int, what: str) -> list[Any]:
    value = _unpack(data, internal, depth)
    if not isinstance(value, list) or len(value) != n:
        raise PayloadError(f"{what}: expected a list of {n}")
    return value


def encode_payload(value: Any) -> bytes:
    """The bytes of a session payload.

    Raises:
        PayloadError: ``value`` holds something that is neither a builtin nor a registered payload type.
    """
    return _pack(value, False)


def decode_payload(data: bytes) -> Any:
    """Inverse of :func:`encode_payload`.

    Raises:
        PayloadError: malformed, or names an unregistered type or version, or fields that do not fit.
    """
    return _unpack(data, False)


# ------------------------------------------------------------------------------------------------ session


def _int(value: Any, field: str, *, top: int = MAX_SESSION_ID) -> int:
    if type(value) is not int or not 0 <= value <= top:
        raise SessionProtocolError(f"field {field!r} must be an integer in 0..{top}, got {value!r:.40}")
    return value


def _str(value: Any, field: str, *, optional: bool = False) -> Any:
    if optional and value is None:
        return None
    if type(value) is not str:
        raise SessionProtocolError(f"field {field!r} must be a string, got {type(value).__name__}")
    return value


def encode_session_message(message: SessionMessage) -> bytes:
    """The wire bytes of a session message (payloads encoded with :func:`encode_payload`).

    Raises:
        PayloadError: a payload cannot be encoded.
    """
    if isinstance(message, InitialSessionMessage):
        first = encode_payload(message.first_payload) if message.has_payload else None
        fields: list[Any] = [
            SESSION_FORMAT, INIT, message.initiator_session_id, message.initiation_entropy,
            message.initiator_flow_class_name, message.flow_version, message.app_name, first,
        ]  # fmt: skip
    else:
        head = [SESSION_FORMAT, 0, message.recipient_session_id, message.seq]
        p = message.payload
        if isinstance(p, ConfirmPayload):
            head[1] = CONFIRM
            fields = [*head, p.initiated_session_id, p.flow_version, p.app_name]
        elif isinstance(p, DataPayload):
            head[1] = DATA
            fields = [*head, encode_payload(p.payload)]
        elif isinstance(p, ErrorPayload):
            head[1] = ERROR
            fields = [*head, p.error_id, p.exception_type, p.message]
        elif isinstance(p, RejectPayload):
            head[1] = REJECT
            fields = [*head, p.error_id, p.message]
        elif isinstance(p, EndPayload):
            head[1] = END
            fields = head
        else:
            raise TypeError(f"not a session payload: {p!r}")
    pool = _PACKERS[None]
    packer = pool.pop() if pool else msgpack.Packer(use_bin_type=True)
    try:
        return packer.pack(fields)
    finally:
        pool.append(packer)


_LENGTHS: Final = {INIT: 8, CONFIRM: 7, DATA: 5, ERROR: 7, REJECT: 6, END: 4, BUNDLE: 3}


def encode_session_bundle(parts: list[bytes]) -> bytes:
    """Several session messages (their wire bytes, at least two, none a bundle) to one node as one P2P
    message: ``[1, 6, [message, ...]]``."""
    if len(parts) < 2:
        raise ValueError("a bundle holds at least two session messages")
    return msgpack.packb([SESSION_FORMAT, BUNDLE, parts], use_bin_type=True)


def _unpack_message(data: bytes) -> list[Any]:
    try:
        fields = msgpack.unpackb(data, raw=False, strict_map_key=True, use_list=True)
    except msgpack.StackError:
        raise SessionProtocolError("not msgpack: arrays and maps nested too deeply") from None
    except Exception as exc:
        detail = str(exc) or "a byte that begins no msgpack value"  # (FormatError carries no text)
        raise SessionProtocolError(f"not msgpack: {type(exc).__name__}: {detail}") from exc
    return fields  # type: ignore[no-any-return]


def decode_session_messages(data: bytes) -> list[tuple[SessionMessage, bytes]]:
    """Read a P2P message's body from a peer: one session message or a bundle of them; each with its own
    wire bytes.

    Raises:
        SessionProtocolError: not a session message or bundle of this format (the reason says which field;
            for a bundle, which part).
    """
    fields = _unpack_message(data)
    if not (
        isinstance(fields, list) and len(fields) == 3
        and type(fields[0]) is int and fields[0] == SESSION_FORMAT
        and type(fields[1]) is int and fields[1] == BUNDLE
    ):  # fmt: skip
        return [(_from_fields(fields), data)]
    parts = fields[2]
    if not isinstance(parts, list) or len(parts) < 2 or any(type(p) is not bytes for p in parts):
        raise SessionProtocolError("a bundle holds an array of at least two session messages (bin)")
    out = []
    for i, part in enumerate(parts):
        try:
            out.append((decode_session_message(part), part))
        except SessionProtocolError as exc:
            raise SessionProtocolError(f"bundle part {i}: {exc}") from exc
    return out


def decode_session_message(data: bytes) -> SessionMessage:
    """Read a session message from a peer (not a bundle: see :func:`decode_session_messages`).

    A payload that cannot be decoded does not fail the message: it becomes a :class:`BadPayload` with the
    reason (the receiving step fails with it, and the peer hears of it).

    Raises:
        SessionProtocolError: not a session message of this format (the reason says which field).
    """
    return _from_fields(_unpack_message(data))


def _from_fields(fields: Any) -> SessionMessage:
    if not isinstance(fields, list) or len(fields) < 2:
        raise SessionProtocolError("a session message is a msgpack array [format, kind, ...]")
    if fields[0] != SESSION_FORMAT or type(fields[0]) is not int:
        raise SessionProtocolError(f"unknown session message format {fields[0]!r:.20}")
    kind = fields[1]
    if type(kind) is not int or kind not in _LENGTHS:
        raise SessionProtocolError(f"unknown session message kind {kind!r:.20}")
    if len(fields) != _LENGTHS[kind]:
        raise SessionProtocolError(
            f"a {KIND_NAMES[kind]} message has {_LENGTHS[kind]} fields, not {len(fields)}"
        )
    if kind == BUNDLE:
        raise SessionProtocolError("a bundle is not a session message here (a bundle cannot hold one)")
    if kind == INIT:
        first = fields[7]
        if first is not None and type(first) is not bytes:
            raise SessionProtocolError("field 'first_payload' must be bytes or nil")
        return InitialSessionMessage(
            initiator_session_id=_int(fields[2], "initiator_session_id"),
            initiation_entropy=_int(fields[3], "initiation_entropy"),
            initiator_flow_class_name=_str(fields[4], "initiator_flow_class_name"),
            flow_version=_int(fields[5], "flow_version", top=2**31 - 1),
            app_name=_str(fields[6], "app_name"),
            first_payload=None if first is None else _payload(first),
            has_payload=first is not None,
            first_payload_size=0 if first is None else len(first),
        )
    recipient = _int(fields[2], "recipient_session_id")
    seq = _int(fields[3], "seq")
    payload: Any
    if kind == CONFIRM:
        payload = ConfirmPayload(
            initiated_session_id=_int(fields[4], "initiated_session_id"),
            flow_version=_int(fields[5], "flow_version", top=2**31 - 1),
            app_name=_str(fields[6], "app_name"),
        )
    elif kind == DATA:
        if type(fields[4]) is not bytes:
            raise SessionProtocolError("field 'payload' must be bytes")
        payload = DataPayload(payload=_payload(fields[4]), size=len(fields[4]))
    elif kind == ERROR:
        payload = ErrorPayload(
            error_id=_int(fields[4], "error_id"),
            exception_type=_str(fields[5], "exception_type", optional=True),
            message=_str(fields[6], "message", optional=True),
        )
    elif kind == REJECT:
        payload = RejectPayload(error_id=_int(fields[4], "error_id"), message=_str(fields[5], "message"))
    else:
        payload = EndPayload()
    return ExistingSessionMessage(recipient_session_id=recipient, seq=seq, payload=payload)


def _payload(data: bytes) -> Any:
    try:
        return decode_payload(data)
    except PayloadError as exc:
        return BadPayload(reason=str(exc))


# ------------------------------------------------------------------------------------------------ checkpoints


def _wait_out(wait: Any) -> Any:
    if wait is None:
        return None
    if isinstance(wait, WaitReceive):
        return ["receive", list(wait.sessions), wait.expected, wait.validate, wait.many]
    if isinstance(wait, WaitSleep):
        return ["sleep", wait.wake_at]
    return ["subflow"]


def _wait_in(value: Any) -> Any:
    if value is None:
        return None
    if value[0] == "receive":
        return WaitReceive(sessions=tuple(value[1]), expected=value[2], validate=value[3], many=value[4])
    if value[0] == "sleep":
        return WaitSleep(wake_at=value[1])
    return WaitSubFlow()


def _wire(o: Outgoing) -> bytes:
    return o.wire if o.wire is not None else encode_session_message(o.message)  # type: ignore[arg-type]


def encode_outbox(state: FlowState) -> None:
    """Replace the outbox's messages by their wire bytes (done once, before the checkpoint is written)."""
    state.outbox = [
        o if o.wire is not None else attrs.evolve(o, wire=_wire(o), message=None) for o in state.outbox
    ]


def encode_checkpoint(state: FlowState) -> bytes:
    """The checkpoint of ``state`` (its outbox is encoded in place first): a msgpack list of format,
    flow id, status, suspends, next session, stack, sessions, outbox, result, error, flow class and, for a
    flow with a recorded starter only, that starter (a flow without one encodes as before starters were
    recorded).

    Raises:
        PayloadError: a flow field, a buffered payload or the result cannot be encoded.
    """
    encode_outbox(state)
    sessions = [
        [
            s.index, s.counterparty, s.our_id, s.initiating, s.entropy, s.seed, s.flow_name, s.flow_version,
            s.app_name, s.peer_id, s.init_sent, s.send_seq, s.recv_seq, s.received,
            [[k, v] for k, v in s.buffered], s.peer_ended,
            None if s.peer_error is None else list(s.peer_error), s.closed,
        ]
        for s in state.sessions.values()
    ]  # fmt: skip
    fields = [
        CHECKPOINT_FORMAT, state.flow_id, state.status, state.suspends, state.next_session,
        [[f.flow, f.step, _wait_out(f.wait)] for f in state.stack], sessions,
        [[o.counterparty, o.dedup_id, o.wire, o.initial] for o in state.outbox],
        state.result, None if state.error is None else list(state.error), state.flow_class,
    ]  # fmt: skip
    if state.started_by is not None:  # (a 12th element: a flow without a starter keeps the 11 of before)
        fields.append(state.started_by)
    return _pack(fields, True)


def decode_checkpoint(data: bytes) -> FlowState:
    """Inverse of :func:`encode_checkpoint` (the outbox comes back as wire bytes).

    Raises:
        PayloadError: not a checkpoint of this format, or it names an unknown flow class / version / type.
    """
    try:
        value = _unpack(data, True)
    except PayloadError:
        _refuse_newer_checkpoint(data)
        raise
    if not isinstance(value, list) or len(value) not in (11, 12) or value[0] != CHECKPOINT_FORMAT:
        _refuse_newer_checkpoint(data)
        raise PayloadError(f"not a flow checkpoint of format {CHECKPOINT_FORMAT}")
    (_, flow_id, status, suspends, next_session, stack, sessions, outbox, result, error,
     flow_class) = value[:11]  # fmt: skip
    started_by = value[11] if len(value) == 12 else None
    if not (started_by is None or isinstance(started_by, str)):
        raise PayloadError(f"malformed flow checkpoint: its starter is a {type(started_by).__name__}")
    try:
        state = FlowState(
            flow_id=flow_id,
            stack=[Frame(flow=f, step=step, wait=_wait_in(w)) for f, step, w in stack],
            next_session=next_session,
            suspends=suspends,
            outbox=[Outgoing(counterparty=c, dedup_id=d, wire=w, initial=i) for c, d, w, i in outbox],
            status=status,
            result=result,
            error=None if error is None else (error[0], error[1]),
            flow_class=flow_class,
            started_by=started_by,
        )
        for s in sessions:
            (index, counterparty, our_id, initiating, entropy, seed, flow_name, flow_version, app_name,
             peer_id, init_sent, send_seq, recv_seq, received, buffered, peer_ended, peer_error,
             closed) = s  # fmt: skip
            state.sessions[index] = SessionState(
                index=index, counterparty=counterparty, our_id=our_id, initiating=initiating,
                entropy=entropy, seed=seed, flow_name=flow_name, flow_version=flow_version, app_name=app_name,
                peer_id=peer_id,
                init_sent=init_sent, send_seq=send_seq, recv_seq=recv_seq, received=received,
                received_sizes=[len(_pack(v, True)) for v in received],
                buffered=[(k, v) for k, v in buffered], peer_ended=peer_ended,
                peer_error=None if peer_error is None else (peer_error[0], peer_error[1]), closed=closed,
            )  # fmt: skip
    except (TypeError, ValueError, LookupError) as exc:  # (an error pair that is a map or a short string)
        raise PayloadError(f"malformed flow checkpoint: {type(exc).__name__}: {exc}") from exc
    return state


def _refuse_newer_checkpoint(data: bytes) -> None:
    """Raise the error of a checkpoint that a newer build wrote (its format number above this code's), if
    ``data`` is one: the flow is then listed with it and its checkpoint kept, not taken for a damaged one."""
    found = _peek_checkpoint(data)
    if isinstance(found, list) and found and type(found[0]) is int and found[0] > CHECKPOINT_FORMAT:
        raise PayloadError(
            f"flow checkpoint format {found[0]} was written by a newer build of corda-trio (this build reads "
            f"format {CHECKPOINT_FORMAT}): the checkpoint is kept as it is; run the newer build to resume it"
        )


def _peek_checkpoint(data: bytes) -> Any:
    """A checkpoint's top level with its flows and payloads (ext types) left undecoded as ``None``: what can
    be read of one this code cannot decode (a newer build's, or a flow class it lacks); ``None`` when it is
    not msgpack at all."""
    try:
        return msgpack.unpackb(data, ext_hook=lambda _code, _data: None, raw=False, strict_map_key=False)
    except Exception:  # (msgpack raises several types for malformed input)
        return None


def checkpoint_started_by(data: bytes) -> str | None:
    """The starter recorded in a checkpoint, read without decoding its flow or payloads (for a checkpoint
    :func:`decode_checkpoint` refuses: a flow class or version this code lacks); ``None`` when it records
    none or cannot be read."""
    value = _peek_checkpoint(data)
    if isinstance(value, list) and len(value) == 12 and value[0] == CHECKPOINT_FORMAT:
        return value[11] if isinstance(value[11], str) else None
    return None


def outgoing_wire(o: Outgoing) -> bytes:
    """The wire bytes of an outbox entry."""
    return _wire(o)


def encode_outbox_record(outbox: list[Outgoing]) -> tuple[bytes, list[Outgoing]]:
    """The record of one transition's outbox (kept beside the checkpoint until its messages are in the
    outbound queues), and the outbox with wire bytes: ``[OUTBOX_FORMAT, [[counterparty, dedup id, wire,
    initial], ...]]``."""
    wired = [
        o if o.wire is not None else Outgoing(counterparty=o.counterparty, dedup_id=o.dedup_id, wire=_wire(o),
                                              initial=o.initial)
        for o in outbox
    ]  # fmt: skip
    entries = [[o.counterparty, o.dedup_id, o.wire, o.initial] for o in wired]
    return msgpack.packb([OUTBOX_FORMAT, entries], use_bin_type=True), wired


def decode_outbox_record(data: bytes) -> list[Outgoing]:
    """Inverse of :func:`encode_outbox_record`.

    Raises:
        PayloadError: not an outbox record of this format.
    """
    try:
        value = msgpack.unpackb(data, raw=False)
        if not (isinstance(value, list) and len(value) == 2 and value[0] == OUTBOX_FORMAT):
            raise ValueError("not an outbox record of format 1")
        return [
            Outgoing(counterparty=str(c), dedup_id=str(d), wire=bytes(w), initial=bool(i))
            for c, d, w, i in value[1]
        ]
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise PayloadError(f"malformed flow outbox record: {exc}") from exc
