"""Hung (SIGSTOP'd) processes around a real node: the commit helper of its store, a peer node.

A frozen process keeps its sockets and descriptors open and answers nothing, so only a timeout can tell it
from a slow one. These tests freeze real processes and check that the node neither hangs nor acknowledges
what is not on disk, and that everything acknowledged survives.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio

from corda_trio import rpc
from corda_trio.node._processes import NodeProcessError, start_node_process

from .cli_helpers import descendants, still_running
from .netutil import PASSWORD, make_network
from .test_flows_e2e import ALICE, BOB, wait_for_peers
from .test_store_failure import _commit_helpers

pytestmark = pytest.mark.slow

REPO = str(Path(__file__).resolve().parents[2])
#: PingPong round trips per flow: enough that flows are still running when a peer freezes.
ROUNDS = 200
#: node.toml ``[p2p] idle_timeout_seconds`` where a peer is frozen: short, so that the test need not wait the
#: default 10 s; the nodes still heartbeat every 0.5 s (a quarter of it), so a live one is not given up.
IDLE_TIMEOUT_SECONDS = 2.0
#: room, beyond the idle timeout, for a loaded 2-core machine to notice and log it
IDLE_MARGIN_SECONDS = 3.0


async def test_sigterm_stops_a_node_whose_commit_helper_is_frozen_and_a_restart_keeps_what_was_acked(
    tmp_path: Path,
) -> None:
    # A short [shutdown] timeout: it also bounds how long the store's close waits for the helper.
    nodes = make_network(tmp_path / "net", [ALICE, BOB], shutdown_timeout_seconds=1.0)
    (alice_path, alice_cfg), _ = nodes
    alice = await start_node_process(alice_path, alice_cfg)  # Bob never runs: Alice's flows wait for him
    try:
        async with rpc.connect(alice.rpc_url, "ops", PASSWORD) as a:
            await wait_for_peers(a, 2)
            before = await a.launch_flow("PingPong", recipient=BOB, rounds=1, client_id="before")
            children = descendants(alice.process.pid)
            (helper,) = _commit_helpers(alice.process.pid)
            os.kill(helper, signal.SIGSTOP)
            # Commits wait: a flow start is not answered (its checkpoint is not on disk) ...
            with trio.move_on_after(2) as waited:
                await a.launch_flow("PingPong", recipient=BOB, rounds=1, client_id="during")
            assert waited.cancelled_caught, "a flow start was answered while the store could not write"
            # ... while calls that need no commit are.
            with trio.fail_after(5):
                assert before in {f["flow_id"] for f in await a.list_flows()}
        started = time.monotonic()
        alice.process.send_signal(signal.SIGTERM)
        with trio.move_on_after(30):
            code = await alice.process.wait()
        stopped_after = time.monotonic() - started
        left = still_running(children)
    finally:
        for pid in still_running(descendants(alice.process.pid)) if alice.process.returncode is None else ():
            os.kill(pid, signal.SIGKILL)
        await alice.stop(signal.SIGKILL, timeout_seconds=5)
    assert alice.process.returncode is not None and stopped_after < 15, "SIGTERM did not stop the node"
    assert left == set(), "the frozen commit helper was left behind"
    assert code == 1
    console = alice.console_tail(5).splitlines()
    last = console[-1]
    assert last.startswith(f"corda-trio: error: {alice_cfg.legal_name}: fatal store error"), console
    assert f"commit helper process (pid {helper}) did not answer" in last, last
    assert not [ln for ln in console if "Traceback" in ln], console

    # The restart recovers what was acknowledged (the frozen helper's lock is gone with it).
    restarted = await start_node_process(alice_path, alice_cfg)
    try:
        async with rpc.connect(restarted.rpc_url, "ops", PASSWORD) as a:
            flows = {f["flow_id"]: f["state"] for f in await a.list_flows()}
            assert flows.get(before) == "running", flows
    finally:
        assert await restarted.stop() == 0


def _log_lines_since(path: Path, start: int) -> list[str]:
    return path.read_text(errors="replace").splitlines()[start:]


def _ended(lines: list[str]) -> list[str]:
    """The bridge's lines saying that its session with the peer ended."""
    return [ln for ln in lines if "corda_trio.bridge:" in ln and "session with" in ln]


async def test_a_frozen_peer_is_given_up_after_the_idle_timeout_in_one_line_and_its_flows_complete(
    tmp_path: Path,
) -> None:
    nodes = make_network(tmp_path / "net", [ALICE, BOB], p2p_idle_timeout_seconds=IDLE_TIMEOUT_SECONDS)
    (alice_path, alice_cfg), (bob_path, bob_cfg) = nodes
    assert alice_cfg.p2p_idle_timeout_seconds == IDLE_TIMEOUT_SECONDS  # it went through node.toml
    alice = await start_node_process(alice_path, alice_cfg)
    bob = await start_node_process(bob_path, bob_cfg)
    try:
        async with rpc.connect(alice.rpc_url, "ops", PASSWORD) as a:
            await wait_for_peers(a, 2)
            assert await a.start_flow("PingPong", recipient=BOB, rounds=2) == 2  # the bridge is up
            flows = [await a.launch_flow("PingPong", recipient=BOB, rounds=ROUNDS) for _ in range(4)]
            mark = len(alice_cfg.log_path.read_text().splitlines())
            # 1. Frozen: its sockets stay open (half-open), so only the AMQP idle timeout (2 s here) can tell.
            os.kill(bob.process.pid, signal.SIGSTOP)
            frozen_at = time.monotonic()
            try:
                running = {f["flow_id"] for f in await a.list_flows("running")}
                assert running & set(flows), "the flows ended before the freeze: nothing was tested"
                with trio.fail_after(IDLE_TIMEOUT_SECONDS + IDLE_MARGIN_SECONDS):
                    while not _ended(_log_lines_since(alice_cfg.log_path, mark)):
                        assert await a.list_flows() is not None  # RPC answers meanwhile
                        await trio.sleep(0.1)
                noticed_after = time.monotonic() - frozen_at
            finally:
                os.kill(bob.process.pid, signal.SIGCONT)
            during = _log_lines_since(alice_cfg.log_path, mark)
            ended = _ended(during)
            assert len(ended) == 1 and "no frame received" in ended[0] and " INFO " in ended[0], during
            # the configured timeout is the one the live connection used (not the default 10 s)
            assert f"(idle timeout {IDLE_TIMEOUT_SECONDS * 1000:.0f} ms," in ended[0], ended[0]
            assert noticed_after >= IDLE_TIMEOUT_SECONDS - 0.5, noticed_after  # by the timeout, not by chance
            # a silent peer is no protocol violation: no warning, no refusal counted (it was two warnings)
            assert not [ln for ln in during if "protocol violation" in ln or " WARNING " in ln], during

            # 2. Frozen again, then killed and restarted: it resumes from its checkpoints.
            os.kill(bob.process.pid, signal.SIGSTOP)
            await trio.sleep(1)
            os.kill(bob.process.pid, signal.SIGKILL)
            await bob.process.wait()
            bob = await start_node_process(bob_path, bob_cfg)
            with trio.fail_after(90):
                results = [await a.start_flow("PingPong", recipient=BOB, rounds=ROUNDS)]
                for flow_id in flows:
                    events = [e async for e in a.watch_flow(flow_id)]
                    results.append(events[-1]["result"])
            assert results == [ROUNDS] * 5, results  # every ping answered once: nothing lost, nothing doubled
    finally:
        for node in (alice, bob):
            if node.process.returncode is None:
                os.kill(node.process.pid, signal.SIGCONT)
        await alice.stop()
        await bob.stop()


#: An RPC client that asks for the flow list many times at once, then freezes itself (SIGSTOP): it reads none
#: of the answers, its socket stays open.
_FROZEN_CLIENT = """
import os, signal, sys, trio
from corda_trio import rpc

async def main():
    async with rpc.connect(sys.argv[1], "ops", sys.argv[2]) as client:
        async with trio.open_nursery() as nursery:
            for _ in range(2000):
                nursery.start_soon(client.list_flows)
            await trio.sleep(0.5)
            print("freezing", flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)

trio.run(main)
"""


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


async def test_a_frozen_rpc_client_costs_bounded_memory_and_does_not_hold_up_a_stop(tmp_path: Path) -> None:
    # (Bob never runs: the flows wait for him, and the stop gives them the 1 s [shutdown] timeout)
    nodes = make_network(tmp_path / "net", [ALICE, BOB], shutdown_timeout_seconds=1.0)
    alice = await start_node_process(*nodes[0])
    client: trio.Process | None = None
    try:
        async with rpc.connect(alice.rpc_url, "ops", PASSWORD) as a:
            await wait_for_peers(a, 2)
            for i in range(200):  # a flow list of ~100 KB per answer: 2000 answers would be ~200 MB
                await a.launch_flow("PingPong", recipient=BOB, rounds=1, client_id=f"waiting-for-bob-{i}")
            before = _rss_kib(alice.process.pid)
            client = await trio.lowlevel.open_process(
                [sys.executable, "-c", _FROZEN_CLIENT, alice.rpc_url, PASSWORD],
                stdout=subprocess.PIPE,
                env={**os.environ, "PYTHONPATH": REPO},
            )
            assert client.stdout is not None
            with trio.fail_after(30):
                assert b"freezing" in await client.stdout.receive_some(100)
            await trio.sleep(2)  # the node answers until the socket is full, then waits
            grown_kib = _rss_kib(alice.process.pid) - before
            with trio.fail_after(5):  # other clients are served meanwhile
                assert len(await a.list_flows()) == 200
        started = time.monotonic()
        code = await alice.stop(timeout_seconds=15)
        stopped_after = time.monotonic() - started
    finally:
        if client is not None:
            client.kill()
            await client.wait()
        await alice.stop(signal.SIGKILL)
    assert grown_kib < 50 * 1024, f"the node grew by {grown_kib} KiB for a client that reads nothing"
    # (held up by the client, the stop would run into its 15 s; 8 s of margin over the 1 s shutdown timeout
    # leave a busy machine room to close the store and exit)
    assert code == 0 and stopped_after < 1.0 + 8, (code, stopped_after)


async def test_a_node_killed_while_its_commit_helper_is_frozen_names_the_helper_at_the_next_start(
    tmp_path: Path,
) -> None:
    # The helper outlives its node only while it is frozen (it leaves as soon as it sees its parent gone),
    # and it still holds the store's lock: the next start must say which process holds it.
    nodes = make_network(tmp_path / "net", [ALICE, BOB])
    (alice_path, alice_cfg), _ = nodes
    alice = await start_node_process(alice_path, alice_cfg)
    async with rpc.connect(alice.rpc_url, "ops", PASSWORD) as a:
        await wait_for_peers(a, 2)
        before = await a.launch_flow("PingPong", recipient=BOB, rounds=1, client_id="before")
    (helper,) = _commit_helpers(alice.process.pid)
    os.kill(helper, signal.SIGSTOP)
    try:
        await alice.stop(signal.SIGKILL)
        with pytest.raises(NodeProcessError) as refused:
            await start_node_process(alice_path, alice_cfg)
        line = refused.value.args[0].splitlines()[-1]
        assert line.startswith(f"corda-trio: error: {alice_cfg.legal_name}: the store is in use"), line
        assert f"(pid {helper}, stopped (SIGSTOP: SIGCONT or kill it): " in line and "_commit_helper" in line
    finally:
        os.kill(helper, signal.SIGCONT)  # it sees its parent gone and leaves
    # (the start waits up to 2 s for the lock: the helper leaves within that)
    restarted = await start_node_process(alice_path, alice_cfg)
    try:
        async with rpc.connect(restarted.rpc_url, "ops", PASSWORD) as a:
            assert before in {f["flow_id"] for f in await a.list_flows()}
    finally:
        assert await restarted.stop() == 0


async def test_an_rpc_client_leaving_a_frozen_node_goes_on_without_an_error(tmp_path: Path) -> None:
    """The node freezes (SIGSTOP) after a call, and the client leaves ``rpc.connect``: its websocket close is
    never answered. That raised trio-websocket's ``DisconnectionTimeout`` (no ``RpcError``) out of the
    caller's ``async with`` after 5 s: a chaos run's driver, whose flow had just ended on a node frozen the
    moment after, died of it. The connection is now dropped after those 5 s, and the caller goes on."""
    [(path, cfg)] = make_network(tmp_path / "net", [ALICE])
    node = await start_node_process(path, cfg)
    try:
        with trio.fail_after(30):
            async with rpc.connect(node.rpc_url, "ops", PASSWORD) as client:
                assert await client.ping() == "pong"
                node.process.send_signal(signal.SIGSTOP)
                left = trio.current_time()
        assert 4 < trio.current_time() - left < 15  # (the 5 s the close is given, then dropped)
    finally:
        node.process.send_signal(signal.SIGCONT)
        await node.stop()
