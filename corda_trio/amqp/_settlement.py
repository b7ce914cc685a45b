"""Settlement in the connection engine: dispositions out (grouped, sorted, ranged) and in (spec 2.6.12).

Theory of operation
-------------------
:class:`SettlementMixin` is the part of :class:`~corda_trio.amqp.Connection` that settles deliveries.
``settle`` only queues ``(delivery-id, role, settled, state)`` on the session; when the output is drained,
``_flush_dispositions`` groups the queue by (role, settled, state), sorts each group and sends one
``disposition`` per contiguous id range, so settlements completing in any order cost a handful of frames (it
also sends pending session-window refills, which go out with the same output). Received dispositions are
expanded to one event per delivery: ``DeliverySettled`` (settled, or a terminal outcome under
receiver-settle-mode second, which we then settle) or ``DeliveryStateChanged``.
"""

from __future__ import annotations

from typing import Any, Final

from . import _performatives as P
from ._engine_errors import LocalProtocolError
from ._errors import Condition
from ._events import (
    DeliverySettled,
    DeliveryStateChanged,
    Event,
)
from ._frames import encode_frame, encode_frame_within
from ._session import Session
from ._state import SessionState

__all__ = ["SettlementMixin"]

_ACCEPTED: Final = P.Accepted()
_TERMINAL_OUTCOMES: Final = (P.Accepted, P.Rejected, P.Released, P.Modified)


class SettlementMixin:
    """Settlement of :class:`~corda_trio.amqp.Connection` (see the module docstring)."""

    # provided by Connection
    _out: list[bytes]
    _events: list[Event]
    _sessions: dict[int, Session]
    _dispositions_dirty: bool
    _refills: list[Session]
    remote_max_frame_size: int

    def settle(self, channel: int, delivery_id: int, state: Any = _ACCEPTED, *, settled: bool = True) -> None:
        """Queue a ``disposition`` for a delivery we received (coalesced into ranges on output).

        Args:
            state: the outcome: ``Accepted()`` (default), ``Rejected(error=...)``, ``Released()``,
                ``Modified(...)``, or ``None`` to settle without one.
            settled: ``False`` reports ``state`` without settling (receiver-settle-mode second).
        """
        session = self.session(channel)
        if delivery_id not in session.incoming_unsettled:
            raise LocalProtocolError(f"delivery {delivery_id} on channel {channel} is unknown or settled")
        if settled:
            del session.incoming_unsettled[delivery_id]
        session.pending_dispositions.append((delivery_id, True, settled, state))
        self._dispositions_dirty = True

    def _flush_dispositions(self) -> None:
        """Coalesce queued settlements into ranged ``disposition`` frames; send pending window refills."""
        self._dispositions_dirty = False
        if self._refills:
            refills, self._refills = self._refills, []
            for session in refills:
                session.refill_pending = False
                if session.channel in self._sessions and session.state is SessionState.MAPPED:
                    session.incoming_window = session.incoming_window_config
                    self._send_window_flows(session)
        for session in self._sessions.values():
            pending = session.pending_dispositions
            if not pending:
                continue
            session.pending_dispositions = []
            self._send_dispositions(session.channel, pending)

    def _send_dispositions(self, channel: int, pending: list[tuple[int, bool, bool, Any]]) -> None:
        """Group settlements by (role, settled, state), sort each group, send one frame per id range.

        Settlements that complete out of order (consumers finishing at different speeds) would otherwise
        break every range; grouping first makes 1,000 of them a handful of ranged frames. Groups go out in
        the order of their first settlement, so a state reported unsettled before it is settled stays first.
        """
        groups: list[tuple[bool, bool, Any, list[int]]] = []
        current: tuple[bool, bool, Any, list[int]] | None = None
        for did, role, settled, state in pending:
            if current is None or not (current[0] == role and current[1] == settled and current[2] == state):
                for group in groups:
                    if group[0] == role and group[1] == settled and group[2] == state:
                        current = group
                        break
                else:
                    current = (role, settled, state, [])
                    groups.append(current)
            current[3].append(did)
        out = self._out
        for role, settled, state, ids in groups:
            ids.sort()
            first = last = ids[0]
            for did in ids[1:]:
                if did <= last + 1:
                    last = did
                    continue
                out.append(self._encode_disposition(channel, role, first, last, settled, state))
                first = last = did
            out.append(self._encode_disposition(channel, role, first, last, settled, state))

    def _encode_disposition(
        self, channel: int, role: bool, first: int, last: int, settled: bool, state: Any
    ) -> bytes:
        disposition = P.Disposition(
            role=role, first=first, last=last if last != first else None, settled=settled, state=state
        )
        if isinstance(state, P.Rejected):  # (its description may quote the peer: it must fit its frames)
            return encode_frame_within(disposition, channel, self.remote_max_frame_size)
        return encode_frame(disposition, channel)

    def _on_disposition(self, channel: int, frame: P.Disposition, payload: bytes) -> None:
        session = self._remote_session(channel, "disposition")
        first = frame.first
        last = frame.last if frame.last is not None else first
        if last < first:
            raise LocalProtocolError(
                f"disposition range {first}..{last} is reversed", condition=Condition.INVALID_FIELD
            )
        from_receiver = bool(frame.role)
        table = session.outgoing_unsettled if from_receiver else session.incoming_unsettled
        if last - first + 1 <= len(table):
            ids: Any = range(first, last + 1)
        else:
            ids = sorted(d for d in table if first <= d <= last)
        settled = frame.settled
        state = frame.state
        events = self._events
        ch = session.channel
        for did in ids:
            link = table.get(did)
            if link is None:
                continue
            if not from_receiver:
                if settled:
                    del table[did]
                    events.append(
                        DeliverySettled(
                            channel=ch, handle=link.handle, delivery_id=did, delivery_tag=b"", state=state
                        )
                    )
                continue
            tag = link.unsettled.get(did, b"")
            if settled:
                del table[did]
                link.unsettled.pop(did, None)
                events.append(
                    DeliverySettled(
                        channel=ch, handle=link.handle, delivery_id=did, delivery_tag=tag, state=state
                    )
                )
            elif link.rcv_settle_mode == 1 and isinstance(state, _TERMINAL_OUTCOMES):
                # receiver-settle-mode second: the receiver waits for us to settle first (spec 3.8.3)
                del table[did]
                link.unsettled.pop(did, None)
                session.pending_dispositions.append((did, False, True, state))
                self._dispositions_dirty = True
                events.append(
                    DeliverySettled(
                        channel=ch, handle=link.handle, delivery_id=did, delivery_tag=tag, state=state
                    )
                )
            else:
                events.append(
                    DeliveryStateChanged(
                        channel=ch, handle=link.handle, delivery_id=did, delivery_tag=tag, state=state
                    )
                )
