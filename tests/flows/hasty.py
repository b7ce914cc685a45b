"""Flows that end before their session is confirmed (shared by the pure and the network tests): ``Hasty``
sends ``notes`` payloads and finishes (or, with ``reason``, fails) in its first transition, so its end or
error can only go once the responder's confirm arrives."""

from __future__ import annotations

from typing import Any

import attrs

from corda_trio import flows


@flows.initiating_flow
@attrs.define
class Hasty(flows.FlowLogic[str]):
    peer: str
    notes: int = 1
    reason: str = ""

    def call(self, ctx: Any) -> Any:
        s = ctx.initiate_flow(self.peer)
        return ctx.send_all([(s, f"note {i}") for i in range(self.notes)], then=self.sent)

    def sent(self, ctx: Any, _: None) -> Any:
        if self.reason:
            raise flows.FlowException(self.reason)
        return ctx.finish(f"sent {self.notes}")


@flows.initiated_by(Hasty)
@attrs.define
class HastyResponder(flows.FlowLogic[None]):
    """Reads notes in order until the initiator's end or error fails its receive: its error tells which
    (``UnexpectedFlowEndError``, or the initiator's reason)."""

    session: flows.FlowSession
    seen: int = 0

    def call(self, ctx: Any) -> Any:
        return ctx.receive(self.session, str, then=self.got, validate=self.check)

    def check(self, note: str) -> None:
        if note != f"note {self.seen}":
            raise flows.FlowException(f"expected 'note {self.seen}', got {note!r:.40}")

    def got(self, ctx: Any, _: str) -> Any:
        self.seen += 1
        return ctx.receive(self.session, str, then=self.got, validate=self.check)


def ended_text(initiator: str) -> str:
    """The responder's error once the initiator's end arrived."""
    return f"{initiator} ended the session while this flow waited for data"
