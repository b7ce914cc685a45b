"""RPC client ids belong to the RPC user who first used them: real node processes, two RPC users allowed to
start PingPong, a node killed with -9 in between."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import trio

from corda_trio import rpc
from corda_trio.node._processes import start_node_process

from .netutil import _HASH, PASSWORD, USERS, make_network
from .test_flows_e2e import ALICE, BOB, wait_for_peers

pytestmark = pytest.mark.slow

APP_USERS = tuple(
    rpc.RpcUser(username=name, password_hash=_HASH, permissions=frozenset({"start_flow:PingPong"}))
    for name in ("app1", "app2")
)


async def _refused(client: rpc.RpcClient, client_id: str, *, wait: bool) -> str:
    """The error of another user's start with ``client_id``: ``forbidden``, nothing of the flow in it, and
    no event (no flow id) before it."""
    events = []
    with pytest.raises(rpc.RpcError) as info:
        async for frame in client.stream(
            "start_flow",
            flow="PingPong",
            args={"recipient": BOB, "rounds": 2},
            wait=wait,
            client_id=client_id,
        ):
            events.append(frame)
    assert info.value.code == "forbidden", info.value
    assert events == []
    assert f"C-{client_id}" not in info.value.message and "PingPong" not in info.value.message
    return info.value.message


async def test_a_client_id_is_its_users_across_a_kill_9(tmp_path: Path) -> None:
    """app1 starts PingPong with client id ``order-1``; app2, who may start PingPong too, reusing that id gets
    ``forbidden`` (no flow id, no result, no event), while it runs, after it finished and after Alice was
    killed with -9 and restarted; app1 follows its flow by the id every time. A flow killed -9 right after
    its id was answered keeps its owner too."""
    nodes = make_network(tmp_path / "net", [ALICE, BOB], rpc_users=(*USERS, *APP_USERS))
    alice = await start_node_process(*nodes[0])
    bob = await start_node_process(*nodes[1])
    try:
        async with (
            rpc.connect(alice.rpc_url, "app1", PASSWORD) as app1,
            rpc.connect(alice.rpc_url, "app2", PASSWORD) as app2,
            rpc.connect(alice.rpc_url, "ops", PASSWORD) as ops,
        ):
            await wait_for_peers(ops, 2)
            with trio.fail_after(60):
                assert await app1.launch_flow("PingPong", client_id="order-1", recipient=BOB, rounds=50) == (
                    "C-order-1"
                )
                message = await _refused(app2, "order-1", wait=True)
                assert message == (
                    "client id 'order-1' is taken: it names a flow that another user started; choose another "
                    "client id"
                )
                await _refused(app2, "order-1", wait=False)
                assert await app1.start_flow("PingPong", client_id="order-1", recipient=BOB, rounds=50) == 50
                await _refused(app2, "order-1", wait=True)
                # read users see every flow, and by whom it was started
                listed = {f["flow_id"]: f for f in await ops.list_flows()}
                assert listed["C-order-1"]["started_by"] == "app1"
                # one more, in flight (Bob is gone) when Alice is killed -9 (its checkpoint holds the owner)
                await bob.stop(signal.SIGKILL)
                assert await app1.launch_flow("PingPong", client_id="order-2", recipient=BOB, rounds=20) == (
                    "C-order-2"
                )
                assert {f["flow_id"]: f["state"] for f in await ops.list_flows()}["C-order-2"] == "running"
        alice.process.kill()
        await alice.process.wait()
        alice = await start_node_process(*nodes[0])
        bob = await start_node_process(*nodes[1])
        async with (
            rpc.connect(alice.rpc_url, "app1", PASSWORD) as app1,
            rpc.connect(alice.rpc_url, "app2", PASSWORD) as app2,
        ):
            with trio.fail_after(60):
                for client_id in ("order-1", "order-2"):
                    await _refused(app2, client_id, wait=True)
                    await _refused(app2, client_id, wait=False)
                assert await app1.start_flow("PingPong", client_id="order-2", recipient=BOB, rounds=20) == 20
                assert await app1.start_flow("PingPong", client_id="order-1", recipient=BOB, rounds=50) == 50
                await _refused(app2, "order-2", wait=True)
                # app2's own client ids are its own
                assert await app2.start_flow("PingPong", client_id="order-3", recipient=BOB, rounds=1) == 1
                await _refused(app1, "order-3", wait=True)
    finally:
        await alice.stop()
        await bob.stop()
