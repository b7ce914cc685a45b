"""Frozen (SIGSTOP'd) processes in a real two-node exchange: a peer node, an out-of-process bridge.

A frozen process keeps its sockets open and answers nothing (a paused VM, a process stuck in swap): only
the AMQP idle timeout tells it from a slow one. It is set short here (``IDLE_TIMEOUT_SECONDS``, in the
children's acceptor, bridges and local endpoint and in the bridge processes' bridge.toml), and the freeze
lasts until the other side has logged giving the frozen one up, which must happen within that bound. The
ledger is the one of ``test_processes.py``: after the freeze the committed receipts are exactly the other
node's messages, each once, in order.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
import trio

from corda_trio import pki
from tests.bridge.test_processes import Child, _check_ledgers, _publish, two_nodes
from tests.p2p_harness import wait_until

pytestmark = pytest.mark.slow

N = 300
BATCH = 10
#: The AMQP idle timeout of every connection here (the default is 10 s): heartbeats every 0.5 s.
IDLE_TIMEOUT_SECONDS = 2.0
#: room, beyond the idle timeout, for a loaded 2-core machine to notice and log it
IDLE_MARGIN_SECONDS = 3.0
#: how long the traffic should last at least: through the longest freeze
FREEZE_SECONDS = IDLE_TIMEOUT_SECONDS + IDLE_MARGIN_SECONDS


def _gave_up(lines: list[str]) -> list[str]:
    """The logged lines of a connection ended by the idle timeout."""
    return [x for x in lines if x.startswith("log ") and "no frame received" in x]


async def _freeze_until_given_up(pid: int, watcher: Child) -> tuple[float, str]:
    """SIGSTOP ``pid`` until ``watcher`` logs a connection given up by its idle timeout, then SIGCONT; the
    seconds that took and the line."""
    mark = len(watcher.lines)
    os.kill(pid, signal.SIGSTOP)
    frozen_at = time.monotonic()
    try:
        with trio.fail_after(IDLE_TIMEOUT_SECONDS + IDLE_MARGIN_SECONDS):
            await wait_until(lambda: _gave_up(watcher.lines[mark:]), interval=0.05)
        return time.monotonic() - frozen_at, _gave_up(watcher.lines[mark:])[0]
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
    plan = {
        "batch": BATCH,
        "interval": interval,
        "trace": True,
        "log": True,
        "idle_timeout_seconds": IDLE_TIMEOUT_SECONDS,
    }
    async with two_nodes(tmp_path, network, alice, bob, N, **plan) as (a, b, nursery):
        await a.start(nursery, BATCH, external=external)
        await b.start(nursery, BATCH, external=external)
        _publish(tmp_path, [a, b])
        with trio.fail_after(30):
            await wait_until(lambda: a.last_sent() >= 3 * BATCH and b.last_sent() >= 3 * BATCH)
        victim = b.bridge_process if external else b.process
        assert victim is not None
        # Bob's node gives its frozen bridge process up (its local endpoint); Alice's node, frozen Bob
        noticed_after, line = await _freeze_until_given_up(victim.pid, b if external else a)
        # the configured timeout is the one the live connection used (not the default 10 s), and it was the
        # timeout that ended it, not something sooner
        assert f"(idle timeout {IDLE_TIMEOUT_SECONDS * 1000:.0f} ms," in line, line
        assert noticed_after >= IDLE_TIMEOUT_SECONDS - 0.5, (noticed_after, line)
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
