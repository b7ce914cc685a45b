"""A fatal store error stops a real node process cleanly: ``kill -9`` of its store's commit helper process
while flows run. The node logs one line saying so, leaves no child behind and exits non-zero; a restart
recovers every flow that was durable, and they all complete, none twice."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import msgpack
import pytest
import trio
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from corda_trio import rpc
from corda_trio.node._processes import open_node_processes, start_node_process

from .cli_helpers import descendants, still_running
from .netutil import PASSWORD, make_network
from .test_flows_e2e import ALICE, BOB, wait_for_peers

pytestmark = pytest.mark.slow

FLOWS = 60
ROUNDS = 10


def _commit_helpers(pid: int) -> list[int]:
    found = []
    for child in descendants(pid):
        try:
            with open(f"/proc/{child}/cmdline", "rb") as f:
                if b"_commit_helper" in f.read():
                    found.append(child)
        except OSError:
            pass
    return found


async def _wait_until_idle(client: rpc.RpcClient) -> None:
    with trio.fail_after(120):
        while await client.list_flows("running"):  # noqa: ASYNC110 (another process's state)
            await trio.sleep(0.2)


async def test_killing_the_store_commit_helper_stops_the_node_and_a_restart_completes_the_flows(
    tmp_path: Path,
) -> None:
    nodes = make_network(tmp_path / "net", [ALICE, BOB], shutdown_timeout_seconds=0.5)
    (alice_path, alice_cfg), _ = nodes
    async with open_node_processes(nodes) as (alice, bob):
        async with rpc.connect(alice.rpc_url, "ops", PASSWORD) as a:
            await wait_for_peers(a, 2)
            launched = [await a.launch_flow("PingPong", recipient=BOB, rounds=ROUNDS) for _ in range(FLOWS)]
            with trio.fail_after(60):  # some have finished (durably), the others are running
                while len(await a.list_flows("finished")) < 3:  # noqa: ASYNC110
                    await trio.sleep(0.02)
            finished_before = {f["flow_id"] for f in await a.list_flows("finished")}
            children = descendants(alice.process.pid)
            (helper,) = _commit_helpers(alice.process.pid)
            os.kill(helper, signal.SIGKILL)
            with trio.fail_after(30):
                code = await alice.process.wait()
        assert code == 1
        assert still_running(children) == set(), "the node left a child process behind"
        console = alice.console_log.read_text().strip().splitlines()
        last = console[-1]
        assert last.startswith(f"corda-trio: error: {alice_cfg.legal_name}: fatal store error"), console
        assert f"commit helper process (pid {helper}) exited" in last
        stopped = [ln for ln in alice_cfg.log_path.read_text().splitlines() if "fatal store error" in ln]
        assert len(stopped) == 1 and "CRITICAL" in stopped[0], stopped
        assert len(finished_before) < FLOWS, "every flow finished before the kill: nothing was tested"

        # Bob never stopped; Alice restarts on the same store.
        restarted = await start_node_process(alice_path, alice_cfg)
        try:
            async with (
                rpc.connect(restarted.rpc_url, "ops", PASSWORD) as a,
                rpc.connect(bob.rpc_url, "ops", PASSWORD) as b,
            ):
                await _wait_until_idle(a)
                await _wait_until_idle(b)
                finished = {f["flow_id"]: f for f in await a.list_flows("finished")}
                assert finished_before <= finished.keys() <= set(launched)
                assert all(f["result"] == ROUNDS for f in finished.values())
                assert await a.list_flows("failed") == [] and await a.list_flows("parked") == []
                # One responder per flow Alice finished: each flow Bob answered is complete on Alice (it was
                # durable before its first message left), and none ran twice.
                responders = await b.list_flows("finished")
                assert len(responders) == len({f["flow_id"] for f in responders}) == len(finished)
                assert all(f["result"] == ROUNDS for f in responders)
        finally:
            assert await restarted.stop() == 0


async def test_rpc_clients_are_told_that_the_node_stops_because_its_store_failed(tmp_path: Path) -> None:
    """RPC clients of a node whose store failed saw only ``the server closed the connection (code 1001:
    server going away)``. Now the close reason says why the node stops, for our client and for another
    websocket library (``websockets``) alike."""
    logged_in = trio.Event()

    def other_client(url: str) -> tuple[int | None, str | None]:
        with connect(url, open_timeout=20, close_timeout=5) as ws:
            login = {"id": 1, "method": "login", "args": {"user": "ops", "password": PASSWORD}}
            ws.send(msgpack.packb(login))
            assert "ok" in msgpack.unpackb(ws.recv(timeout=20))
            trio.from_thread.run_sync(logged_in.set)
            try:
                ws.recv(timeout=60)
            except ConnectionClosed as closed:
                return (closed.rcvd.code, closed.rcvd.reason) if closed.rcvd else (None, None)
            return None, None

    nodes = make_network(tmp_path / "net", [ALICE])
    async with open_node_processes(nodes) as (alice,):
        async with rpc.connect(alice.rpc_url, "ops", PASSWORD) as a, trio.open_nursery() as nursery:
            seen: list[tuple[int | None, str | None]] = []

            async def run_other_client() -> None:
                seen.append(await trio.to_thread.run_sync(other_client, alice.rpc_url))

            nursery.start_soon(run_other_client)
            with trio.fail_after(30):
                await logged_in.wait()
            (helper,) = _commit_helpers(alice.process.pid)
            os.kill(helper, signal.SIGKILL)
            with trio.fail_after(30), pytest.raises(rpc.RpcConnectionError) as raised:
                while True:
                    await a.ping()
                    await trio.sleep(0.05)
            with trio.fail_after(30):
                assert await alice.process.wait() == 1
    why = f"node stopping: the store failed: the store's commit helper process (pid {helper}) exited"
    assert f"the server closed the connection (code 1001: {why}" in str(raised.value)
    ((code, reason),) = seen
    assert code == 1001 and reason is not None and reason.startswith(why), seen
    assert len(reason.encode()) <= 123
