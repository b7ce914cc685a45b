"""Per-link bookkeeping of the engine: state machine, credit, delivery-count, partial transfers (spec 2.6).

Theory of operation
-------------------
A :class:`Link` is one endpoint of a link, seen from our side: ``role`` is *our* role (``False`` = we send,
``True`` = we receive, the wire encoding of spec 2.8.1). Credit follows spec 2.6.7:

* sender: ``link_credit = flow.delivery_count + flow.link_credit - delivery_count`` (mod 2^32) when the
  receiver's ``flow`` arrives; each delivery we send uses one credit and advances ``delivery_count``.
* receiver: we grant credit (``flow`` with our ``delivery_count`` and ``link_credit``); each delivery that
  arrives consumes one. A delivery beyond every limit we granted is a credit overrun: some clients ignore
  credit while sending, so the engine absorbs up to ``ConnectionConfig.max_credit_overrun`` of them
  (counted in ``overrun_total``; the excess is ``received_total - max_limit``, and it returns to zero with
  the next grant) and detaches only this link with ``transfer-limit-exceeded`` beyond that. The bytes of
  those deliveries are bounded too (``ConnectionConfig.max_credit_overrun_bytes``): ``overrun_bytes`` counts
  the payload of every frame of a delivery beyond the last limit, and returns to zero with the next grant.

Partial (multi-frame) deliveries are collected in ``partial_chunks`` until a frame with ``more=False``. The
size is checked as the frames arrive, never after, so a hostile sender cannot make us buffer more than
``max_message_size`` (plus one frame).
"""

from __future__ import annotations

from typing import Any, Final

from ._state import LINK_TRANSITIONS, LinkInput, LinkState, StateMachine

__all__ = ["SERIAL_MOD", "Link"]

# Spec 2.8.4: sequence-no is an RFC-1982 serial number (32 bits).
SERIAL_MOD: Final = 1 << 32


class Link:
    """One link endpoint (identity object; the engine owns it, applications see only handles)."""

    __slots__ = (
        "available",
        "delivery_count",
        "detach_error",
        "drain",
        "flow_sent",
        "handle",
        "link_credit",
        "machine",
        "max_limit",
        "max_message_size",
        "name",
        "next_tag",
        "overrun_bytes",
        "overrun_total",
        "partial_chunks",
        "partial_format",
        "partial_id",
        "partial_settled",
        "partial_size",
        "partial_state",
        "partial_tag",
        "rcv_settle_mode",
        "received_total",
        "remote_attach",
        "remote_handle",
        "remote_max_message_size",
        "role",
        "snd_settle_mode",
        "source",
        "target",
        "unsettled",
    )

    def __init__(self, *, handle: int, name: str, role: bool) -> None:
        self.handle = handle
        self.name = name
        self.role = role
        self.remote_handle: int | None = None
        self.machine: StateMachine[LinkState, LinkInput] = StateMachine(
            f"link {name!r}", LINK_TRANSITIONS, LinkState.DETACHED
        )
        self.source: Any = None
        self.target: Any = None
        self.snd_settle_mode = 0
        self.rcv_settle_mode = 0
        self.remote_attach: Any = None
        self.max_message_size: int | None = None
        self.remote_max_message_size: int | None = None
        # the error of the detach we sent (reported when the peer answers it)
        self.detach_error: Any = None
        # flow control (spec 2.6.7)
        self.delivery_count = 0
        self.link_credit = 0
        self.available: int | None = None
        self.drain = False
        # receiver: deliveries received (plus credit the sender drained), unbounded, and the highest
        # received_total + credit we ever granted. A grant we lower may cross transfers the sender sent under
        # the old one (spec 2.6.7): only a delivery beyond every limit we granted is a credit overrun.
        self.received_total = 0
        self.max_limit = 0
        # receiver: deliveries that arrived beyond every limit we granted (absorbed, see the module doc)
        self.overrun_total = 0
        # receiver: payload bytes of the deliveries beyond the last limit we granted (0 again with a grant)
        self.overrun_bytes = 0
        # (delivery_count, link_credit) of the last flow we sent for this link: a flow that refills the
        # session window also carries the link state of every receiving link whose credit changed since
        self.flow_sent: tuple[int, int] | None = None
        # sender: our unsettled deliveries on this link, delivery-id -> tag
        self.unsettled: dict[int, bytes] = {}
        self.next_tag = 0
        # receiver: the delivery being reassembled
        self.partial_chunks: list[bytes] | None = None
        self.partial_id = 0
        self.partial_tag = b""
        self.partial_settled = False
        self.partial_size = 0
        self.partial_format = 0
        self.partial_state: Any = None

    @property
    def state(self) -> LinkState:
        """The link's state (spec 2.6.3)."""
        return self.machine.state

    @property
    def is_sender(self) -> bool:
        """Whether we are the sending end."""
        return not self.role

    def apply_sender_flow(self, delivery_count: int | None, link_credit: int | None) -> None:
        """Recompute our credit from the receiver's ``flow`` (spec 2.6.7, sender side)."""
        if link_credit is None:
            return
        if delivery_count is None:
            delivery_count = 0  # the receiver has not seen our attach yet: initial-delivery-count is 0
        credit = (delivery_count + link_credit - self.delivery_count) % SERIAL_MOD
        # A receiver that lowers credit below what we already used would give a huge modular value.
        self.link_credit = credit if credit < SERIAL_MOD // 2 else 0

    def apply_receiver_flow(self, delivery_count: int | None) -> None:
        """Account for the sender's ``delivery_count`` (it advances when the sender drains credit)."""
        if delivery_count is None:
            return
        limit = (self.delivery_count + self.link_credit) % SERIAL_MOD
        advanced = (delivery_count - self.delivery_count) % SERIAL_MOD
        if advanced < SERIAL_MOD // 2:
            self.received_total += advanced  # credit the sender used up without sending (drain)
        self.delivery_count = delivery_count % SERIAL_MOD
        remaining = (limit - self.delivery_count) % SERIAL_MOD
        self.link_credit = remaining if remaining < SERIAL_MOD // 2 else 0

    def grant(self, credit: int) -> None:
        """Receiver: set our credit to ``credit`` (the ``flow`` is sent by the engine)."""
        self.link_credit = credit
        self.max_limit = max(self.max_limit, self.received_total + credit)
        self.overrun_bytes = 0  # every delivery received so far is within the new limit

    def reset_partial(self) -> None:
        """Forget the delivery being reassembled."""
        self.partial_chunks = None
        self.partial_size = 0
        self.partial_state = None
        self.partial_settled = False
