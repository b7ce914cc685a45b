"""Per-session bookkeeping: channels, windows, handles, unsettled deliveries (spec 2.5).

Theory of operation
-------------------
Session flow control counts *transfer frames* (spec 2.5.6). We keep the spec's variables by name:

* ``next_outgoing_id``: transfer-id of our next transfer frame; ``remote_incoming_window``: how many more
  frames the peer lets us send, recomputed from each ``flow`` as
  ``flow.next_incoming_id + flow.incoming_window - next_outgoing_id``.
* ``next_incoming_id``: transfer-id we expect next; ``incoming_window``: how many more frames we accept. A
  transfer that arrives when it is 0 is a ``window-violation``. When it falls to half of the configured
  window we send a ``flow`` that opens it again, so the peer never stalls while we keep up.

Frames that do not fit the peer's window wait in ``blocked`` (already encoded, in order) and go out as
soon as a ``flow`` opens the window: the caller never has to know about session windows, only link credit.

Delivery ids are a separate per-session counter (``next_delivery_id``); ``outgoing_unsettled`` and
``incoming_unsettled`` map them to links so a (ranged) ``disposition`` finds its deliveries.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from ._link import Link
from ._state import SESSION_TRANSITIONS, SessionInput, SessionState, StateMachine

__all__ = ["Session"]


class Session:
    """One session endpoint (identity object owned by the engine)."""

    __slots__ = (
        "blocked",
        "channel",
        "handle_max",
        "incoming_unsettled",
        "incoming_window",
        "incoming_window_config",
        "links",
        "links_by_name",
        "links_by_remote",
        "machine",
        "next_delivery_id",
        "next_incoming_id",
        "next_outgoing_id",
        "outgoing_unsettled",
        "outgoing_window",
        "pending_dispositions",
        "refill_pending",
        "remote_begin",
        "remote_channel",
        "remote_handle_max",
        "remote_incoming_window",
        "remote_outgoing_window",
    )

    def __init__(self, *, channel: int, incoming_window: int, outgoing_window: int, handle_max: int) -> None:
        self.channel = channel
        self.remote_channel: int | None = None
        self.machine: StateMachine[SessionState, SessionInput] = StateMachine(
            f"session {channel}", SESSION_TRANSITIONS, SessionState.UNMAPPED
        )
        self.remote_begin: Any = None
        self.next_outgoing_id = 0
        self.next_delivery_id = 0
        self.incoming_window_config = incoming_window
        self.incoming_window = incoming_window
        self.outgoing_window = outgoing_window
        self.next_incoming_id: int | None = None
        self.remote_incoming_window = 0
        self.remote_outgoing_window = 0
        self.handle_max = handle_max
        self.remote_handle_max = 4_294_967_295
        self.links: dict[int, Link] = {}
        self.links_by_remote: dict[int, Link] = {}
        self.links_by_name: dict[tuple[str, bool], Link] = {}
        self.outgoing_unsettled: dict[int, Link] = {}
        self.incoming_unsettled: dict[int, Link] = {}
        # encoded transfer frames waiting for the peer's incoming window
        self.blocked: deque[bytes] = deque()
        # (delivery_id, role, settled, state) queued by settle(); coalesced into ranges on flush
        self.pending_dispositions: list[tuple[int, bool, bool, Any]] = []
        self.refill_pending = False

    @property
    def state(self) -> SessionState:
        """The session's state (spec 2.5.5)."""
        return self.machine.state

    def free_handle(self) -> int:
        """The lowest handle not in use (spec 2.6.2 lets us pick any up to handle-max)."""
        handle = 0
        while handle in self.links:
            handle += 1
        return handle
