"""Example flows shipped with the node: ``PingPong``, ``Broadcast`` and ``FailingFlow``.

Start them by name with string arguments (``flow start PingPong recipient="O=Bob,L=Paris,C=FR" rounds=10``):
:func:`~._manager.build_flow` converts each argument to the field's declared type. Every argument is bounded
(``MAX_*`` below), so that no start can make a flow that runs for ever or carries megabytes to every
counterparty: a value out of bounds is refused when the flow is built (``ValueError`` naming the argument and
the limit; over RPC ``bad-arguments``), before anything runs.
"""

from __future__ import annotations

from typing import Any, Final

import attrs

from ._errors import FlowException
from ._logic import FlowLogic, initiated_by, initiating_flow
from ._requests import FlowSession

__all__ = [
    "MAX_BROADCAST_RECIPIENTS",
    "MAX_EXAMPLE_TEXT_CHARS",
    "MAX_PING_PONG_ROUNDS",
    "Broadcast",
    "BroadcastResponder",
    "FailingFlow",
    "FailingResponder",
    "PingPong",
    "PingPongResponder",
]

#: Most round trips of one PingPong (each is a round trip between two nodes: this bounds how long one runs).
MAX_PING_PONG_ROUNDS: Final = 10_000
#: Most recipients of one Broadcast (a session each, all opened by its first step).
MAX_BROADCAST_RECIPIENTS: Final = 100
#: Longest Broadcast ``message`` and FailingFlow ``reason``, in characters: the text goes to every
#: counterparty and stays in checkpoints and in the records of finished flows.
MAX_EXAMPLE_TEXT_CHARS: Final = 10_000


def _in_range(low: int, high: int) -> Any:
    """An attrs validator: an integer argument from ``low`` to ``high``."""

    def check(flow: Any, attribute: Any, value: int) -> None:
        if not low <= value <= high:
            raise ValueError(
                f"{type(flow).__name__} argument {attribute.name} must be {low} to {high}, got {value!r:.40}"
            )

    return check


def _at_most(limit: int, unit: str) -> Any:
    """An attrs validator: a string or list argument of at most ``limit`` characters or items."""

    def check(flow: Any, attribute: Any, value: Any) -> None:
        if len(value) > limit:
            raise ValueError(
                f"{type(flow).__name__} argument {attribute.name} must be at most {limit} {unit}, got "
                f"{len(value)}"
            )

    return check


@initiating_flow
@attrs.define
class PingPong(FlowLogic[int]):
    """``rounds`` round trips (1 to :data:`MAX_PING_PONG_ROUNDS`) with ``recipient``: sends ``ping
    i/rounds``, expects ``pong i``; returns ``rounds``."""

    flow_name = "corda_trio.flows.PingPong"

    recipient: str
    rounds: int = attrs.field(default=1, validator=_in_range(1, MAX_PING_PONG_ROUNDS))
    # state, not arguments (init=False: start_flow does not accept them)
    done: int = attrs.field(default=0, init=False)
    session: FlowSession | None = attrs.field(default=None, init=False)

    def call(self, ctx: Any) -> Any:
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
    """Answers ``ping i/n`` with ``pong i``; ends after the n-th. A ping that does not read so (``n`` above
    :data:`MAX_PING_PONG_ROUNDS` included) fails it with a :class:`FlowException`."""

    flow_name = "corda_trio.flows.PingPongResponder"

    session: FlowSession
    answered: int = attrs.field(default=0, init=False)

    def call(self, ctx: Any) -> Any:
        return ctx.receive(self.session, str, then=self.got_ping, validate=self.check_ping)

    def check_ping(self, ping: str) -> None:
        head, _, rest = ping.partition(" ")
        i, _, n = rest.partition("/")
        # (isdigit takes '²', int() not; the length first: int() refuses thousands of digits with ValueError,
        # a bug that would park this flow rather than refuse the peer's ping)
        digits = len(str(MAX_PING_PONG_ROUNDS))
        numbers = all(x.isascii() and x.isdigit() and len(x) <= digits for x in (i, n))
        if head != "ping" or not numbers or int(i) != self.answered or not 0 < int(n) <= MAX_PING_PONG_ROUNDS:
            raise FlowException(
                f"expected 'ping {self.answered}/<rounds, at most {MAX_PING_PONG_ROUNDS}>', got {ping!r:.40}"
            )

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
    """Sends ``message`` (at most :data:`MAX_EXAMPLE_TEXT_CHARS` characters) to each of ``recipients`` (a
    list, or one string with ``;`` between the names; at most :data:`MAX_BROADCAST_RECIPIENTS`) and returns
    their answers in that order."""

    flow_name = "corda_trio.flows.Broadcast"

    recipients: list[str] = attrs.field(
        converter=lambda v: v.split(";") if isinstance(v, str) else list(v),
        validator=_at_most(MAX_BROADCAST_RECIPIENTS, "names"),
    )
    message: str = attrs.field(default="hello", validator=_at_most(MAX_EXAMPLE_TEXT_CHARS, "characters"))
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
        return ctx.receive(self.session, str, then=self.answer, validate=self.check_message)

    def check_message(self, message: str) -> None:
        # (a message that long from the peer: its echo could exceed the network's max_message_size, which
        # would park this flow, and a parked flow keeps its messages unacked in the inbox, taking its credit)
        if len(message) > MAX_EXAMPLE_TEXT_CHARS:
            limit = MAX_EXAMPLE_TEXT_CHARS
            raise FlowException(f"a broadcast message has at most {limit} characters, got {len(message)}")

    def answer(self, ctx: Any, message: str) -> Any:
        return ctx.send(self.session, f"{ctx.our_identity} got {message}", then=self.done)

    def done(self, ctx: Any, _: None) -> Any:
        return ctx.finish(None)


@initiating_flow
@attrs.define
class FailingFlow(FlowLogic[str]):
    """Asks ``recipient`` for an answer; its responder raises ``FlowException(reason)`` (``reason``: at most
    :data:`MAX_EXAMPLE_TEXT_CHARS` characters), which this flow then fails with."""

    flow_name = "corda_trio.flows.FailingFlow"

    recipient: str
    reason: str = attrs.field(
        default="the responder refuses", validator=_at_most(MAX_EXAMPLE_TEXT_CHARS, "characters")
    )
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
