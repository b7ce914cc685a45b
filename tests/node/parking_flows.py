"""A user's flows with a bug a peer's input triggers, for the parked-flow tests on real node processes.

A node loads them as any user's flows: its ``node.toml`` names this module in ``[flows] modules``
(:data:`MODULE`; ``make_network(..., flows_modules=(MODULE,))``) and the repository is on its Python path
(:func:`node_env`).

``AskDouble`` sends ``first`` and then ``second`` to ``recipient``; ``DoubleResponder`` answers each: the
first with ``ok`` (``int(first)``: a string that is not a number raises ``ValueError``, a bug, so the flow
is parked), the second with ``2 * int(second)``, and returns what it received. While the file named by
``CORDA_TRIO_TEST_OUTAGE`` exists, its second step raises ``ConnectionError`` (a service it calls is down):
parked, and retried once the file is gone.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import attrs

from corda_trio import flows

OUTAGE_ENV = "CORDA_TRIO_TEST_OUTAGE"
#: the module a node's ``[flows] modules`` names to load these flows
MODULE = "tests.node.parking_flows"


@flows.initiating_flow
@attrs.define
class AskDouble(flows.FlowLogic[int]):
    flow_name = "tests.parking.AskDouble"

    recipient: str
    first: str = "1"
    second: str = "21"
    session: flows.FlowSession | None = attrs.field(default=None, init=False)

    def call(self, ctx: Any) -> Any:
        self.session = ctx.initiate_flow(self.recipient)
        return ctx.send_and_receive(self.session, self.first, str, then=self.got_ok)

    def got_ok(self, ctx: Any, _ok: str) -> Any:
        return ctx.send_and_receive(self.session, self.second, int, then=self.got_double)

    def got_double(self, ctx: Any, double: int) -> Any:
        return ctx.finish(double)


@flows.initiated_by(AskDouble)
@attrs.define
class DoubleResponder(flows.FlowLogic[list[str]]):
    flow_name = "tests.parking.DoubleResponder"

    session: flows.FlowSession
    received: list[str] = attrs.field(factory=list, init=False)

    def call(self, ctx: Any) -> Any:
        return ctx.receive(self.session, str, then=self.got_first)

    def got_first(self, ctx: Any, first: str) -> Any:
        self.received.append(first)
        int(first)  # the bug: a peer's "abc" raises ValueError
        return ctx.send_and_receive(self.session, "ok", str, then=self.got_second)

    def got_second(self, ctx: Any, second: str) -> Any:
        self.received.append(second)
        outage = os.environ.get(OUTAGE_ENV)
        if outage and os.path.exists(outage):
            raise ConnectionError("the doubling service is down")
        return ctx.send(self.session, 2 * int(second), then=self.done)

    def done(self, ctx: Any, _: Any) -> Any:
        return ctx.finish(self.received)


def node_env(outage: Path | None = None) -> dict[str, str]:
    """The environment of a node process that loads these flows (with :data:`MODULE` in its ``node.toml``):
    the repository on its Python path, and the outage file's name."""
    repo = Path(__file__).resolve().parents[2]
    env = {"PYTHONPATH": os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")])}
    if outage is not None:
        env[OUTAGE_ENV] = str(outage)
    return env
