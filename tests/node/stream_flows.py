"""A user's flow that streams numbered messages to a peer, for failover tests on real node processes.

A node loads it as any user's flows: its ``node.toml`` names :data:`MODULE` in ``[flows] modules`` and the
repository is on its Python path (``parking_flows.node_env()``).

``Stream`` sends ``count`` P2P messages ``[i, flag]`` (``i`` = 0..count-1) to ``recipient`` in batches of
``batch``, sleeping ``pause`` seconds after each acknowledgement (so that a test can act mid-stream); the
last of each batch asks for an acknowledgement. With ``pad`` each message carries that many more bytes
(``[i, flag, b"\\0" * pad]``: large messages). ``StreamResponder`` is the ledger: it takes
each message once, in order (anything else, a number missing, repeated or out of order, fails it with the
number it expected), answers each acknowledgement with how many it has taken, and finishes after the last.
``Stream`` returns the responder's final count, so ``count`` back means every message was handled exactly
once.
"""

from __future__ import annotations

from typing import Any

import attrs

from corda_trio import flows

#: the module a node's ``[flows] modules`` names to load these flows
MODULE = "tests.node.stream_flows"

MORE, ACK, LAST = 0, 1, 2


@flows.initiating_flow
@attrs.define
class Stream(flows.FlowLogic[int]):
    flow_name = "tests.stream.Stream"

    recipient: str
    count: int = 2000
    batch: int = 100
    pause: float = 0.0
    pad: int = 0
    sent: int = attrs.field(default=0, init=False)
    session: flows.FlowSession | None = attrs.field(default=None, init=False)

    def call(self, ctx: Any) -> Any:
        self.session = ctx.initiate_flow(self.recipient)
        return self.next_batch(ctx, 0)

    def next_batch(self, ctx: Any, taken: int) -> Any:
        if taken != self.sent:
            raise flows.FlowException(f"the responder took {taken} of the {self.sent} messages sent")
        if self.sent == self.count:
            return ctx.finish(taken)
        if self.sent and self.pause:
            return ctx.sleep(self.pause, then=self.send_batch)
        return self.send_batch(ctx, None)

    def send_batch(self, ctx: Any, _: None) -> Any:
        n = min(self.batch, self.count - self.sent)
        last = self.sent + n == self.count
        extra = [bytes(self.pad)] if self.pad else []
        pairs = [(self.session, [self.sent + i, MORE, *extra]) for i in range(n - 1)]
        pairs.append((self.session, [self.sent + n - 1, LAST if last else ACK, *extra]))
        self.sent += n
        return ctx.send_all(pairs, then=self.wait_ack)

    def wait_ack(self, ctx: Any, _: None) -> Any:
        return ctx.receive(self.session, int, then=self.next_batch)


@flows.initiated_by(Stream)
@attrs.define
class StreamResponder(flows.FlowLogic[int]):
    flow_name = "tests.stream.StreamResponder"

    session: flows.FlowSession
    taken: int = attrs.field(default=0, init=False)

    def call(self, ctx: Any) -> Any:
        return ctx.receive(self.session, list, then=self.got)

    def got(self, ctx: Any, message: list[Any]) -> Any:
        number, flag = message[:2]
        if number != self.taken:
            raise flows.FlowException(f"expected message {self.taken}, got {number}")
        self.taken += 1
        if flag == MORE:
            return ctx.receive(self.session, list, then=self.got)
        if flag == ACK:
            return ctx.send(self.session, self.taken, then=self.more)
        return ctx.send(self.session, self.taken, then=self.done)

    def more(self, ctx: Any, _: None) -> Any:
        return ctx.receive(self.session, list, then=self.got)

    def done(self, ctx: Any, _: None) -> Any:
        return ctx.finish(self.taken)
