"""The I/O requests a flow step returns (PURE), and what a suspended flow waits for.

A step never performs I/O: it returns one request naming the step to run next (by method name, so that a
checkpoint written by one process resumes in another). Build requests with the :class:`FlowContext` methods
(``ctx.send(...)``, ``ctx.receive(...)``...), which check their arguments.
"""

from __future__ import annotations

from typing import Any

import attrs

__all__ = [
    "CloseSessions",
    "Finish",
    "FlowSession",
    "Receive",
    "Request",
    "Send",
    "Sleep",
    "SubFlow",
    "WaitReceive",
    "WaitSleep",
    "WaitSubFlow",
    "Waiting",
]


@attrs.frozen
class FlowSession:
    """A session with a counterparty, as a flow holds it (in its fields, hence in its checkpoint).

    ``index`` numbers the sessions of one flow; ``counterparty`` is the peer's X.500 name.
    """

    index: int
    counterparty: str


@attrs.frozen(kw_only=True)
class Send:
    """Send each ``(session, payload)`` in order, then run ``then`` (with ``None``) without suspending."""

    messages: tuple[tuple[FlowSession, Any], ...]
    then: str


@attrs.frozen(kw_only=True)
class Receive:
    """Send ``sends`` first (maybe none), then wait for one payload of type ``expected`` from each session;
    ``then`` gets the payload (``many``: the list, in ``sessions`` order). ``validate`` names a method called
    with each payload, which raises (a FlowException) to refuse it."""

    sends: tuple[tuple[FlowSession, Any], ...] = ()
    sessions: tuple[FlowSession, ...]
    expected: str
    then: str
    validate: str | None = None
    many: bool = False


@attrs.frozen(kw_only=True)
class Sleep:
    seconds: float
    then: str


@attrs.frozen(kw_only=True)
class SubFlow:
    """Run ``flow`` to its end; ``then`` gets its result."""

    flow: Any
    then: str


@attrs.frozen(kw_only=True)
class CloseSessions:
    """End these sessions (an end message to each still open), then run ``then`` without suspending."""

    sessions: tuple[FlowSession, ...]
    then: str


@attrs.frozen(kw_only=True)
class Finish:
    """The flow (or sub-flow) is done with ``result``."""

    result: Any = None


Request = Send | Receive | Sleep | SubFlow | CloseSessions | Finish


@attrs.frozen(kw_only=True)
class WaitReceive:
    """Suspended in a receive (kept in the checkpoint: session indices, type name, validator, many)."""

    sessions: tuple[int, ...]
    expected: str
    validate: str | None = None
    many: bool = False


@attrs.frozen(kw_only=True)
class WaitSleep:
    wake_at: float


@attrs.frozen(kw_only=True)
class WaitSubFlow:
    """The frame above this one is running."""


Waiting = WaitReceive | WaitSleep | WaitSubFlow
