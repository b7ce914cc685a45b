"""Frozen (SIGSTOP'd) processes in a real two-node exchange: a peer node, an out-of-process bridge.

A frozen process keeps its sockets open and answers nothing (a paused VM, a process stuck in swap): only
the AMQP idle timeout tells it from a slow one. The ledger is the one of ``test_processes.py``: after the
freeze the committed receipts are exactly the other node's messages, each once, in order.
"""

from __future__ import annotations

import os
import signal

import pytest
import trio

from corda_trio import pki
from tests.bridge.test_processes import _check_ledgers, _publish, two_nodes
from tests.p2p_harness import wait_until

pytestmark = pytest.mark.slow

N = 300
BATCH = 10
#: Longer than the AMQP idle timeout (10 s), so that the other side gives the frozen one up.
FREEZE_SECONDS = 13.0


async def _freeze(pid: int, seconds: float) -> None:
    os.kill(pid, signal.SIGSTOP)
    try:
        await trio.sleep(seconds)
    finally:
        os.kill(pid, signal.SIGCONT)


@pytest.mark.parametrize("frozen", ["peer node", "bridge process"])
async def test_a_frozen_process_mid_exchange_loses_and_duplicates_nothing(
    tmp_path,
    network: pki.NetworkCredentials,
    alice: pki.NodeCredentials,
    bob: pki.NodeCredentials,
    frozen: str,
) -> None:
    external = frozen == "bridge process"
    interval = 2 * FREEZE_SECONDS / (N / BATCH)  # traffic lasts through the freeze
    plan = {"batch": BATCH, "interval": interval, "trace": True}
    async with two_nodes(tmp_path, network, alice, bob, N, **plan) as (a, b, nursery):
        await a.start(nursery, BATCH, external=external)
        await b.start(nursery, BATCH, external=external)
        _publish(tmp_path, [a, b])
        with trio.fail_after(30):
            await wait_until(lambda: a.last_sent() >= 3 * BATCH and b.last_sent() >= 3 * BATCH)
        victim = b.bridge_process if external else b.process
        assert victim is not None
        await _freeze(victim.pid, FREEZE_SECONDS)
        assert not (a.done() and b.done()), "the exchange ended before the freeze did: nothing was tested"
        with trio.fail_after(120):
            await wait_until(lambda: a.done() and b.done(), interval=0.1)
        handled = {
            c.creds.legal_name.organisation: [x.split()[1] for x in c.lines if x.startswith("handled ")]
            for c in (a, b)
        }
        if external:
            for c in (a, b):
                assert await c.stop_bridge() == 0
        await a.kill()
        await b.kill()
    await _check_ledgers(a, b, N)
    assert handled["Alice"] == [f"Bob-{i}" for i in range(N)]  # each exactly once, in order
    assert handled["Bob"] == [f"Alice-{i}" for i in range(N)]
