"""Connection, session and link state machines of AMQP 1.0 part 2, as transition tables.

Theory of operation
-------------------
The rules are symmetric: a table does not know which side is local. Each input is "we sent
X" or "we received X"; :meth:`StateMachine.process` looks the pair ``(state, input)`` up and either moves to
the next state or raises :class:`LocalProtocolError`. The engine calls ``process`` *before* it queues a frame
(so a bad local call raises and nothing is sent) and *after* it decoded a frame from the peer (where the error
becomes a ``close`` with the condition the spec asks for, see ``_connection.py``).

The SASL layer (spec part 5.3) runs before the connection's own header exchange and lives in
``_sasl_engine.py``; the connection machine below starts when the AMQP (not SASL) header is exchanged.

Connection (spec 2.4.6, figure 2.23; the states a TCP socket cannot reach are left out)::

    START --H:send--> HDR_SENT --H:recv--> HDR_EXCH --O:send--> OPEN_SENT --O:recv--> OPENED
      |                 |                    |                                       |   |
      H:recv            O:send               O:recv                          C:send  |   | C:recv
      v                 v                    v                                       v   v
    HDR_RCVD          OPEN_PIPE            OPEN_RCVD --O:send--> OPENED      CLOSE_SENT  CLOSE_RCVD
      | H:send          | H:recv                                               | C:recv   | C:send
      v                 v                                                      v          v
    HDR_EXCH          OPEN_SENT                                               END        END

A ``close`` with an error after a protocol violation moves to DISCARDING: every frame but ``close`` is
ignored until the peer's ``close`` (or EOF) arrives.

Session (spec 2.5.5, figure 2.30)::

    UNMAPPED --B:send--> BEGIN_SENT --B:recv--> MAPPED --E:send--> END_SENT --E:recv--> UNMAPPED
    UNMAPPED --B:recv--> BEGIN_RCVD --B:send--> MAPPED --E:recv--> END_RCVD --E:send--> UNMAPPED

Link (spec 2.6.3; attach/detach are symmetric, as for sessions)::

    DETACHED --A:send--> ATTACH_SENT --A:recv--> ATTACHED --D:send--> DETACH_SENT --D:recv--> DETACHED
    DETACHED --A:recv--> ATTACH_RCVD --A:send--> ATTACHED --D:recv--> DETACH_RCVD --D:send--> DETACHED

A peer that refuses a link answers the attach (with a null source or target) and detaches at once, so the
machine needs no extra edge for it; ATTACH_SENT also accepts ``D:send`` for a local abort.
"""

from __future__ import annotations

import enum
from typing import Final, Generic, TypeVar

from ._engine_errors import LocalProtocolError
from ._errors import Condition

__all__ = [
    "CONNECTION_TRANSITIONS",
    "LINK_TRANSITIONS",
    "SESSION_TRANSITIONS",
    "ConnectionInput",
    "ConnectionState",
    "LinkInput",
    "LinkState",
    "SessionInput",
    "SessionState",
    "StateMachine",
    "transition_table_markdown",
]


class ConnectionState(enum.Enum):
    """Spec 2.4.6 connection states (names as in the spec)."""

    START = "START"
    HDR_RCVD = "HDR_RCVD"
    HDR_SENT = "HDR_SENT"
    HDR_EXCH = "HDR_EXCH"
    OPEN_PIPE = "OPEN_PIPE"
    OPEN_RCVD = "OPEN_RCVD"
    OPEN_SENT = "OPEN_SENT"
    OPENED = "OPENED"
    CLOSE_RCVD = "CLOSE_RCVD"
    CLOSE_SENT = "CLOSE_SENT"
    DISCARDING = "DISCARDING"
    END = "END"


class ConnectionInput(enum.Enum):
    """What happened to the connection: a header or performative sent or received."""

    SEND_HEADER = "H:send"
    RECV_HEADER = "H:recv"
    SEND_OPEN = "O:send"
    RECV_OPEN = "O:recv"
    SEND_CLOSE = "C:send"
    SEND_CLOSE_ERROR = "C:send(error)"
    RECV_CLOSE = "C:recv"


class SessionState(enum.Enum):
    """Spec 2.5.5 session states."""

    UNMAPPED = "UNMAPPED"
    BEGIN_SENT = "BEGIN_SENT"
    BEGIN_RCVD = "BEGIN_RCVD"
    MAPPED = "MAPPED"
    END_SENT = "END_SENT"
    END_RCVD = "END_RCVD"
    DISCARDING = "DISCARDING"


class SessionInput(enum.Enum):
    """``begin`` / ``end`` sent or received."""

    SEND_BEGIN = "B:send"
    RECV_BEGIN = "B:recv"
    SEND_END = "E:send"
    SEND_END_ERROR = "E:send(error)"
    RECV_END = "E:recv"


class LinkState(enum.Enum):
    """Spec 2.6.3 link endpoint states."""

    DETACHED = "DETACHED"
    ATTACH_SENT = "ATTACH_SENT"
    ATTACH_RCVD = "ATTACH_RCVD"
    ATTACHED = "ATTACHED"
    DETACH_SENT = "DETACH_SENT"
    DETACH_RCVD = "DETACH_RCVD"


class LinkInput(enum.Enum):
    """``attach`` / ``detach`` sent or received."""

    SEND_ATTACH = "A:send"
    RECV_ATTACH = "A:recv"
    SEND_DETACH = "D:send"
    RECV_DETACH = "D:recv"


_C = ConnectionState
_CI = ConnectionInput
CONNECTION_TRANSITIONS: Final[dict[tuple[ConnectionState, ConnectionInput], ConnectionState]] = {
    (_C.START, _CI.SEND_HEADER): _C.HDR_SENT,
    (_C.START, _CI.RECV_HEADER): _C.HDR_RCVD,
    (_C.HDR_RCVD, _CI.SEND_HEADER): _C.HDR_EXCH,
    (_C.HDR_SENT, _CI.RECV_HEADER): _C.HDR_EXCH,
    (_C.HDR_SENT, _CI.SEND_OPEN): _C.OPEN_PIPE,
    (_C.OPEN_PIPE, _CI.RECV_HEADER): _C.OPEN_SENT,
    (_C.HDR_EXCH, _CI.SEND_OPEN): _C.OPEN_SENT,
    (_C.HDR_EXCH, _CI.RECV_OPEN): _C.OPEN_RCVD,
    (_C.OPEN_RCVD, _CI.SEND_OPEN): _C.OPENED,
    (_C.OPEN_SENT, _CI.RECV_OPEN): _C.OPENED,
    (_C.OPEN_SENT, _CI.SEND_CLOSE): _C.CLOSE_SENT,
    (_C.OPEN_SENT, _CI.SEND_CLOSE_ERROR): _C.DISCARDING,
    (_C.OPENED, _CI.SEND_CLOSE): _C.CLOSE_SENT,
    (_C.OPENED, _CI.SEND_CLOSE_ERROR): _C.DISCARDING,
    (_C.OPENED, _CI.RECV_CLOSE): _C.CLOSE_RCVD,
    (_C.CLOSE_RCVD, _CI.SEND_CLOSE): _C.END,
    (_C.CLOSE_RCVD, _CI.SEND_CLOSE_ERROR): _C.END,
    (_C.CLOSE_SENT, _CI.RECV_CLOSE): _C.END,
    (_C.CLOSE_SENT, _CI.RECV_OPEN): _C.CLOSE_SENT,  # the peer's open crossed our close
    (_C.DISCARDING, _CI.RECV_CLOSE): _C.END,
    (_C.DISCARDING, _CI.RECV_OPEN): _C.DISCARDING,
}

_S = SessionState
_SI = SessionInput
SESSION_TRANSITIONS: Final[dict[tuple[SessionState, SessionInput], SessionState]] = {
    (_S.UNMAPPED, _SI.SEND_BEGIN): _S.BEGIN_SENT,
    (_S.UNMAPPED, _SI.RECV_BEGIN): _S.BEGIN_RCVD,
    (_S.BEGIN_SENT, _SI.RECV_BEGIN): _S.MAPPED,
    (_S.BEGIN_SENT, _SI.SEND_END): _S.END_SENT,
    (_S.BEGIN_SENT, _SI.SEND_END_ERROR): _S.DISCARDING,
    (_S.BEGIN_RCVD, _SI.SEND_BEGIN): _S.MAPPED,
    (_S.MAPPED, _SI.SEND_END): _S.END_SENT,
    (_S.MAPPED, _SI.SEND_END_ERROR): _S.DISCARDING,
    (_S.MAPPED, _SI.RECV_END): _S.END_RCVD,
    (_S.END_SENT, _SI.RECV_END): _S.UNMAPPED,
    (_S.END_SENT, _SI.RECV_BEGIN): _S.END_SENT,  # the peer's begin crossed our end
    (_S.END_RCVD, _SI.SEND_END): _S.UNMAPPED,
    (_S.END_RCVD, _SI.SEND_END_ERROR): _S.UNMAPPED,
    (_S.DISCARDING, _SI.RECV_END): _S.UNMAPPED,
    (_S.DISCARDING, _SI.RECV_BEGIN): _S.DISCARDING,
}

_L = LinkState
_LI = LinkInput
LINK_TRANSITIONS: Final[dict[tuple[LinkState, LinkInput], LinkState]] = {
    (_L.DETACHED, _LI.SEND_ATTACH): _L.ATTACH_SENT,
    (_L.DETACHED, _LI.RECV_ATTACH): _L.ATTACH_RCVD,
    (_L.ATTACH_SENT, _LI.RECV_ATTACH): _L.ATTACHED,
    (_L.ATTACH_SENT, _LI.SEND_DETACH): _L.DETACH_SENT,
    (_L.ATTACH_RCVD, _LI.SEND_ATTACH): _L.ATTACHED,
    (_L.ATTACHED, _LI.SEND_DETACH): _L.DETACH_SENT,
    (_L.ATTACHED, _LI.RECV_DETACH): _L.DETACH_RCVD,
    (_L.DETACH_SENT, _LI.RECV_DETACH): _L.DETACHED,
    (_L.DETACH_SENT, _LI.RECV_ATTACH): _L.DETACH_SENT,  # the peer's attach crossed our detach
    (_L.DETACH_RCVD, _LI.SEND_DETACH): _L.DETACHED,
}

S = TypeVar("S", bound=enum.Enum)
I = TypeVar("I", bound=enum.Enum)  # noqa: E741


class StateMachine(Generic[S, I]):
    """A state plus its transition table; :meth:`process` is the only way to change the state."""

    __slots__ = ("name", "state", "table")

    def __init__(self, name: str, table: dict[tuple[S, I], S], initial: S) -> None:
        self.name = name
        self.table = table
        self.state = initial

    def can(self, event: I) -> bool:
        """Whether ``event`` is legal now."""
        return (self.state, event) in self.table

    def process(self, event: I) -> S:
        """Apply ``event``; raise :class:`LocalProtocolError` (``amqp:illegal-state``) if illegal."""
        try:
            self.state = self.table[(self.state, event)]
        except KeyError:
            raise LocalProtocolError(
                f"{self.name}: {event.value} is not allowed in state {self.state.value}",
                condition=Condition.ILLEGAL_STATE,
            ) from None
        return self.state


def transition_table_markdown(table: dict[tuple[S, I], S]) -> str:
    """Render a table as Markdown (used to generate ``protocol_spec/amqp-engine.md``)."""
    lines = ["| state | input | next state |", "|---|---|---|"]
    for (state, event), nxt in table.items():
        lines.append(f"| {state.value} | `{event.value}` | {nxt.value} |")
    return "\n".join(lines)
