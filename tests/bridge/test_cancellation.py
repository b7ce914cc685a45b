"""Cancelling a bridge after its k-th scheduling step, for many k: nothing is lost, nothing acked early.

A trio instrument counts task steps from the moment the bridge starts and cancels it after ``k`` of them, so
the cancellation lands at every point of a session in turn: during the dial, the TLS and AMQP handshakes, the
attach, between taking a message from the queue and sending it, while waiting for outcomes, during the WAL
ack. After each cancellation: every message the sender's queue acked is durable in the receiver's inbox.
At the end, a bridge left to run delivers the rest; the inbox holds every message, first copies in order.
"""

from __future__ import annotations

import os
from pathlib import Path

import trio

from corda_trio import amqp, bridge, messaging, pki, store
from tests.p2p_harness import running_node, wait_until

#: Where to cancel: every 7th scheduling step up to 1500 (``P2P_CANCEL_STRIDE=1``: every step, ~20 s).
#: A bridge that has sent everything is cancelled when its queue is empty: an idle bridge takes steps only
#: at its heartbeats, so waiting for its k-th step would wait minutes for nothing.
STEPS = range(1, 1500, int(os.environ.get("P2P_CANCEL_STRIDE", "7")))


class CancelAfterSteps(trio.abc.Instrument):
    def __init__(self, scope: trio.CancelScope, steps: int, queue: store.Queue) -> None:
        self.scope = scope
        self.left = steps
        self.queue = queue

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.left -= 1
        if self.left == 0 or self.queue.statistics().depth == 0:
            self.scope.cancel()


async def test_cancel_at_every_step_loses_nothing_and_acks_nothing_early(
    alice: pki.NodeCredentials, bob: pki.NodeCredentials, network: pki.NetworkCredentials, tmp_path: Path
) -> None:
    root = network.root.cert
    n = 400
    peers = messaging.PeerDirectory()  # what our bridges resolve; the nodes' own managers see nobody
    config = bridge.BridgeConfig(credit=8, initial_backoff_seconds=0.001, max_backoff_seconds=0.001)
    async with (
        running_node(alice, root, tmp_path / "a", run_service=False) as a,
        running_node(bob, root, tmp_path / "b", run_service=False) as b,
    ):
        bob_peer = b.as_peer()
        peers.put(bob_peer)
        queue = await a.service.outbound_queue_for(bob_peer.key_hash)
        await a.service.send_many(
            [a.service.create_message("t", b"%d" % i, dedup_id=f"id-{i:04d}") for i in range(n)], bob_peer
        )
        assert a.manager.bridges() == {}
        ids = {f"id-{i:04d}" for i in range(n)}

        async def inbox_ids() -> list[str]:
            return [
                messaging.from_amqp(amqp.Message.decode(d.payload)).dedup_id
                async for d in b.service.inbox.browse()
            ]

        async def remaining() -> set[str]:
            return {
                messaging.from_amqp(amqp.Message.decode(d.payload)).dedup_id async for d in queue.browse()
            }

        cancelled_in_session = 0
        ctx = a.manager.ssl_context
        for k in STEPS:
            the_bridge = bridge.Bridge(queue=queue, resolver=peers, ssl_context=ctx, config=config)
            with trio.CancelScope() as scope:
                instrument = CancelAfterSteps(scope, k, queue)
                trio.lowlevel.add_instrument(instrument)
                try:
                    await the_bridge.run()
                finally:
                    trio.lowlevel.remove_instrument(instrument)
            cancelled_in_session += the_bridge.connects
            acked = ids - await remaining()
            assert acked <= set(await inbox_ids()), f"acked before durable at the peer (k={k})"
            assert queue.statistics().in_flight == 0  # everything held went back
            if not await remaining():
                break
        # let one bridge finish the job
        final = bridge.Bridge(queue=queue, resolver=peers, ssl_context=ctx, config=config)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(final.run)
            with trio.fail_after(120):
                await wait_until(lambda: queue.statistics().depth == 0)
            nursery.cancel_scope.cancel()
        got = await inbox_ids()
        first_copies = list(dict.fromkeys(got))
        assert first_copies == sorted(ids)  # each message arrived, first copies in send order
        assert cancelled_in_session >= 4  # many cancellations hit an established session
