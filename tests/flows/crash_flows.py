"""Flows for the kill -9 test: each side keeps, in its checkpointed fields, the ledger of payloads it
received."""

from __future__ import annotations

from typing import Any

import attrs

from corda_trio import flows


@flows.initiating_flow
@attrs.define
class LedgerPing(flows.FlowLogic[list[str]]):
    """``rounds`` round trips; returns the pongs it received, in order."""

    flow_name = "tests.LedgerPing"

    recipient: str
    tag: str = ""
    rounds: int = 3
    got: list[str] = attrs.field(factory=list)
    session: flows.FlowSession | None = None

    def call(self, ctx: Any) -> Any:
        self.session = ctx.initiate_flow(self.recipient)
        return self._ping(ctx)

    def _ping(self, ctx: Any) -> Any:
        ping = f"{self.tag} ping {len(self.got)}/{self.rounds}"
        return ctx.send_and_receive(self.session, ping, str, then=self.got_pong)

    def got_pong(self, ctx: Any, pong: str) -> Any:
        self.got.append(pong)
        if len(self.got) == self.rounds:
            return ctx.finish(self.got)
        return self._ping(ctx)


@flows.initiated_by(LedgerPing)
@attrs.define
class LedgerPong(flows.FlowLogic[list[str]]):
    """Answers each ping; returns every ping it received, in order. A ping out of order fails the flow."""

    flow_name = "tests.LedgerPong"

    session: flows.FlowSession
    got: list[str] = attrs.field(factory=list)

    def call(self, ctx: Any) -> Any:
        return ctx.receive(self.session, str, then=self.got_ping, validate=self.check)

    def check(self, ping: str) -> None:
        if not ping.split(" ")[-1].startswith(f"{len(self.got)}/"):
            raise flows.FlowException(f"ping out of order: {ping!r} after {len(self.got)}")

    def got_ping(self, ctx: Any, ping: str) -> Any:
        self.got.append(ping)
        tag, _, count = ping.split(" ")
        i, n = count.split("/")
        then = self.done if len(self.got) == int(n) else self.wait
        return ctx.send(self.session, f"{tag} pong {i}", then=then)

    def wait(self, ctx: Any, _: None) -> Any:
        return ctx.receive(self.session, str, then=self.got_ping, validate=self.check)

    def done(self, ctx: Any, _: None) -> Any:
        return ctx.finish(self.got)
