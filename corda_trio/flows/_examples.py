"""Example flows shipped with the node: ``PingPong``, ``Broadcast`` and ``FailingFlow``.

Start them by name with string arguments (``flow start PingPong recipient="O=Bob,L=Paris,C=FR" rounds=10``):
:func:`~._manager.build_flow` converts each argument to the field's declared type.
"""

from __future__ import annotations

from typing import Any

import attrs

from ._errors import FlowException
from ._logic import FlowLogic, initiated_by, initiating_flow
from ._requests import FlowSession

__all__ = [
    "Broadcast",
    "BroadcastResponder",
    "FailingFlow",
    "FailingResponder",
    "PingPong",
    "PingPongResponder",
]


@initiating_flow
@attrs.define
class PingPong(FlowLogic[int]):
    """``rounds`` round trips with ``recipient``: sends ``ping i/rounds``, expects ``pong i``; returns
    ``rounds``."""

    flow_name = "corda_trio.flows.PingPong"

    recipient: str
    rounds: int = 1
    # state, not arguments (init=False: start_flow does not accept them)
    done: int = attrs.field(default=0, init=False)
    session: FlowSession | None = attrs.field(default=None, init=False)

    def call(self, ctx: Any) -> Any:
        if self.rounds < 1:
            raise FlowException(f"rounds must be at least 1, got {self.rounds}")
        self.session = ctx.initiate_flow(self.recipient)
        return self._ping(ctx)

    def _ping(self, ctx: Any) -> Any:
        return ctx.send_and_receive(self.session, f"ping {self.done}/{self.rounds}", str, then=self.got_pong)

    def got_pong(self, ctx: Any, pong: str) -> Any:
        if pong != f"pong {self.done}":
            raise FlowException(f"expected 'pong {self.done}', got {pong!r:.40}")
        self.done += 1
        if self.done == self.rounds:
            return ctx.finish(self.done)
        return self._ping(ctx)


@initiated_by(PingPong)
@attrs.define
class PingPongResponder(FlowLogic[int]):
    """Answers ``ping i/n`` with ``pong i``; ends after the n-th."""

    flow_name = "corda_trio.flows.PingPongResponder"

    session: FlowSession
    answered: int = attrs.field(default=0, init=False)

    def call(self, ctx: Any) -> Any:
        return ctx.receive(self.session, str, then=self.got_ping, validate=self.check_ping)

    def check_ping(self, ping: str) -> None:
        head, _, rest = ping.partition(" ")
        i, _, n = rest.partition("/")
        numbers = f"{i}{n}".isascii() and i.isdigit() and n.isdigit()  # (isdigit takes '²'; int() not)
        if head != "ping" or not numbers or int(i) != self.answered:
            raise FlowException(f"expected 'ping {self.answered}/<rounds>', got {ping!r:.40}")

    def got_ping(self, ctx: Any, ping: str) -> Any:
        i, _, n = ping[5:].partition("/")
        self.answered += 1
        then = self.finished if self.answered >= int(n) else self.wait_next
        return ctx.send(self.session, f"pong {i}", then=then)

    def wait_next(self, ctx: Any, _: None) -> Any:
        return ctx.receive(self.session, str, then=self.got_ping, validate=self.check_ping)

    def finished(self, ctx: Any, _: None) -> Any:
        return ctx.finish(self.answered)


@initiating_flow
@attrs.define
class Broadcast(FlowLogic[list[str]]):
    """Sends ``message`` to each of ``recipients`` (a list, or one string with ``;`` between the names) and
    returns their answers in that order."""

    flow_name = "corda_trio.flows.Broadcast"

    recipients: list[str] = attrs.field(converter=lambda v: v.split(";") if isinstance(v, str) else list(v))
    message: str = "hello"
    sessions: list[FlowSession] = attrs.field(factory=list, init=False)

    def call(self, ctx: Any) -> Any:
        self.sessions = [ctx.initiate_flow(r) for r in self.recipients]
        return ctx.send_all([(s, self.message) for s in self.sessions], then=self.collect)

    def collect(self, ctx: Any, _: None) -> Any:
        return ctx.receive_all(self.sessions, str, then=self.done)

    def done(self, ctx: Any, answers: list[str]) -> Any:
        return ctx.finish(answers)


@initiated_by(Broadcast)
@attrs.define
class BroadcastResponder(FlowLogic[None]):
    flow_name = "corda_trio.flows.BroadcastResponder"

    session: FlowSession

    def call(self, ctx: Any) -> Any:
        return ctx.receive(self.session, str, then=self.answer)

    def answer(self, ctx: Any, message: str) -> Any:
        return ctx.send(self.session, f"{ctx.our_identity} got {message}", then=self.done)

    def done(self, ctx: Any, _: None) -> Any:
        return ctx.finish(None)


@initiating_flow
@attrs.define
class FailingFlow(FlowLogic[str]):
    """Asks ``recipient`` for an answer; its responder raises ``FlowException(reason)``, which this flow then
    fails with."""

    flow_name = "corda_trio.flows.FailingFlow"

    recipient: str
    reason: str = "the responder refuses"
    session: FlowSession | None = attrs.field(default=None, init=False)

    def call(self, ctx: Any) -> Any:
        self.session = ctx.initiate_flow(self.recipient)
        return ctx.send_and_receive(self.session, self.reason, str, then=self.done)

    def done(self, ctx: Any, answer: str) -> Any:
        return ctx.finish(answer)


@initiated_by(FailingFlow)
@attrs.define
class FailingResponder(FlowLogic[None]):
    flow_name = "corda_trio.flows.FailingResponder"

    session: FlowSession

    def call(self, ctx: Any) -> Any:
        return ctx.receive(self.session, str, then=self.fail)

    def fail(self, ctx: Any, reason: str) -> Any:
        raise FlowException(reason)
