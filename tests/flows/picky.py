"""A responder whose first step has a bug a peer's input triggers (shared by the pure and the network tests):
``AskNumber`` sends ``value`` in its session init and waits for the answer; ``NumberResponder`` answers
``2 * int(value)``, so a ``value`` that is not a number (``"abc"``) raises ValueError in the step that would
send its confirm, and the responder is parked still owing it."""

from __future__ import annotations

from typing import Any

import attrs

from corda_trio import flows


@flows.initiating_flow
@attrs.define
class AskNumber(flows.FlowLogic[str]):
    """Sends ``value`` in its session init and waits for the answer."""

    peer: str
    value: str

    def call(self, ctx: Any) -> Any:
        s = ctx.initiate_flow(self.peer)
        return ctx.send_and_receive(s, self.value, str, then=self.done)

    def done(self, ctx: Any, answer: str) -> Any:
        return ctx.finish(answer)


@flows.initiated_by(AskNumber)
@attrs.define
class NumberResponder(flows.FlowLogic[None]):
    session: flows.FlowSession

    def call(self, ctx: Any) -> Any:
        return ctx.receive(self.session, str, then=self.got)

    def got(self, ctx: Any, value: str) -> Any:
        return ctx.send(self.session, str(2 * int(value)), then=self.sent)

    def sent(self, ctx: Any, _: Any) -> Any:
        return ctx.finish(None)
