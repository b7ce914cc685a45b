"""The flow session protocol's messages (PURE): Corda's shapes plus a per-session sequence number.

See ``protocol_spec/flow-sessions.md`` for the wire form (``_codec`` encodes it) and the rules. Payloads here
are already-decoded values (or :class:`BadPayload` when a peer's bytes could not be decoded): the state
machine never sees bytes.
"""

from __future__ import annotations

import hashlib
from typing import Any, Final

import attrs

__all__ = [
    "MAX_SESSION_ID",
    "SESSION_TOPIC",
    "BadPayload",
    "ConfirmPayload",
    "DataPayload",
    "EndPayload",
    "ErrorPayload",
    "ExistingSessionMessage",
    "InitialSessionMessage",
    "RejectPayload",
    "SessionMessage",
    "derive_id",
    "error_dedup_id",
    "normal_dedup_id",
]

#: The P2P topic of every session message.
SESSION_TOPIC: Final = "platform.session"
#: Session ids, entropy and error ids are non-negative signed 64-bit integers (Corda uses Java longs).
MAX_SESSION_ID: Final = 2**63 - 1


def derive_id(*parts: object) -> int:
    """A deterministic id in ``0 .. MAX_SESSION_ID`` from ``parts`` (BLAKE2b, first 8 bytes, top bit off).

    Session ids, entropy and error ids are derived from the flow id and counters kept in the checkpoint, so a
    flow replayed from its checkpoint produces the same ones.
    """
    data = "\x1f".join(str(p) for p in parts).encode()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big") >> 1


def normal_dedup_id(session_seed: str, suspends: int, index: int) -> str:
    """``N-<session seed>-<suspends>-<index>``: the dedup id of a message a flow sends."""
    return f"N-{session_seed}-{suspends}-{index}"


def error_dedup_id(error_id: int, session_id: int) -> str:
    """``E-<error id>-<session>``: the dedup id of an error (or reject) sent to session ``session_id``."""
    return f"E-{error_id}-{session_id}"


@attrs.frozen(kw_only=True)
class BadPayload:
    """A payload a peer sent that could not be decoded; receiving it fails the waiting step
    with ``reason``."""

    reason: str


@attrs.frozen(kw_only=True)
class InitialSessionMessage:
    """Opens a session (Corda ``InitialSessionMessage``); its sequence number is 0."""

    initiator_session_id: int
    initiation_entropy: int
    initiator_flow_class_name: str
    flow_version: int
    app_name: str
    #: the first payload, if ``has_payload`` (the initiator may open the session before sending anything)
    first_payload: Any = None
    has_payload: bool = False
    #: the bytes of the first payload as received (0 for one built here); not part of the message's identity
    first_payload_size: int = attrs.field(default=0, eq=False)


@attrs.frozen(kw_only=True)
class ConfirmPayload:
    """The responder accepted the session: its own session id and flow info."""

    initiated_session_id: int
    flow_version: int
    app_name: str


@attrs.frozen(kw_only=True)
class DataPayload:
    payload: Any
    #: the payload's bytes as received (0 for one built here); not part of the message's identity
    size: int = attrs.field(default=0, eq=False)


@attrs.frozen(kw_only=True)
class ErrorPayload:
    """The sender's flow failed. ``exception_type`` is ``None`` for anything but a FlowException,
    whose message is then ``errors.COUNTER_FLOW_ERRORED``."""

    error_id: int
    exception_type: str | None
    message: str | None


@attrs.frozen(kw_only=True)
class RejectPayload:
    """The session init was refused (unknown initiating flow, draining...)."""

    error_id: int
    message: str


@attrs.frozen(kw_only=True)
class EndPayload:
    """The sender closed its end of the session."""


SessionPayload = ConfirmPayload | DataPayload | ErrorPayload | RejectPayload | EndPayload


@attrs.frozen(kw_only=True)
class ExistingSessionMessage:
    """A message on an open session (Corda ``ExistingSessionMessage``), with our sequence number."""

    recipient_session_id: int
    seq: int
    payload: SessionPayload


SessionMessage = InitialSessionMessage | ExistingSessionMessage
