"""Parked flows against real node processes: a user's responder with a bug a peer's input triggers
(``tests/node/parking_flows.py``) is parked by the hospital, and its messages wait unacknowledged in the
inbox. The inbox hands out ``inbox_credit`` (1,024) messages at a time: 1,100 parked responders used to
stop the node taking any P2P message at all."""

from __future__ import annotations

import signal
from pathlib import Path

import msgpack
import pytest
import trio

from corda_trio import amqp, rpc
from corda_trio.flows._messages import derive_id
from corda_trio.flows._statemachine import responder_flow_id
from corda_trio.node._processes import open_node_processes, start_node_process

from .netutil import PASSWORD, make_network
from .parking_flows import MODULE, AskDouble, node_env
from .test_hostile_peer import ALICE, BOB, MALLORY, flow_metrics, init, ping_pong, send_as, session_message

pytestmark = pytest.mark.slow

FLOOD = 1100


def bad_inits(count: int, base: int) -> list[amqp.Message]:
    """``count`` inits of ``AskDouble`` whose first payload, ``abc``, makes the responder raise ValueError."""
    payload = msgpack.packb("abc")
    return [
        session_message(init(base + i, payload, AskDouble.flow_name), f"bad-{base + i}", init=True)
        for i in range(count)
    ]


async def wait_parked(client: rpc.RpcClient, count: int, seconds: float = 120) -> list[dict[str, object]]:
    with trio.fail_after(seconds):
        while len(parked := await client.list_flows("parked")) < count:  # noqa: ASYNC110 (another process)
            await trio.sleep(0.2)
    return parked


async def wait_listed(client: rpc.RpcClient, state: str, flow_id: object) -> dict[str, object]:
    with trio.fail_after(30):
        while not (found := [f for f in await client.list_flows(state) if f["flow_id"] == flow_id]):  # noqa: ASYNC110 (another process)
            await trio.sleep(0.1)
    return found[0]


async def test_parked_responders_do_not_stop_the_inbox(tmp_path: Path) -> None:
    """Mallory's 1,100 inits park as many responders on Bob; Alice's flows to Bob still complete, the
    messages the parked flows hold are in /metrics, and a kill or retry of one works as before."""
    nodes = make_network(tmp_path / "net", [ALICE, BOB, MALLORY], flows_modules=(MODULE,))
    (_alice_path, _alice_cfg), (_bob_path, _bob_cfg), (_mallory_path, mallory_cfg) = nodes
    env = node_env()
    async with (
        open_node_processes(nodes[:2], env=env) as (alice, bob),
        rpc.connect(alice.rpc_url, "ops", PASSWORD) as a,
        rpc.connect(bob.rpc_url, "ops", PASSWORD) as b,
    ):
        await ping_pong(a)
        with trio.fail_after(120):
            assert await send_as(mallory_cfg, bob, bad_inits(FLOOD, 8_000_000)) == [amqp.Accepted()] * FLOOD
        parked = await wait_parked(b, FLOOD)
        assert all("ValueError: invalid literal for int()" in str(f["error"]) for f in parked), parked[0]
        await ping_pong(a)
        with trio.fail_after(60):
            assert await a.start_flow("AskDouble", recipient=BOB, first="2", second="5") == 10
        metrics = await flow_metrics(bob)
        assert metrics["parked"] == FLOOD and metrics["parked_messages"] == FLOOD, metrics
        # a retry parks it again (same bug), a kill ends it: it no longer holds its message
        flow_id = str(parked[0]["flow_id"])
        await b.retry_flow(flow_id)
        await b.kill_flow(flow_id)
        with trio.fail_after(30):
            while (await flow_metrics(bob))["parked_messages"] != FLOOD - 1:  # noqa: ASYNC110 (another process)
                await trio.sleep(0.1)
        assert (await wait_listed(b, "failed", flow_id))["error"] == "killed by RPC user ops"
        assert len(await b.list_flows("parked")) == FLOOD - 1
        await ping_pong(a)


async def test_a_killed_parked_responder_ends_its_initiator_cycle_after_cycle(tmp_path: Path) -> None:
    """Found by a soak of real nodes (tests/node/soak.py): Alice's AskDouble whose first value Bob's responder
    cannot read parks the responder before its confirm; ``flow kill`` on Bob sent the error ahead of the
    confirm, Alice refused it and her flow ran for ever, one more per park-and-kill cycle. Now each cycle
    ends on both nodes with ``counter-flow errored`` and nothing is left running or parked."""
    nodes = make_network(tmp_path / "net", [ALICE, BOB], flows_modules=(MODULE,))
    async with (
        open_node_processes(nodes, env=node_env()) as (alice, bob),
        rpc.connect(alice.rpc_url, "ops", PASSWORD) as a,
        rpc.connect(bob.rpc_url, "ops", PASSWORD) as b,
    ):
        for _ in range(3):
            flow_id = await a.launch_flow("AskDouble", recipient=BOB, first="abc")
            (parked,) = await wait_parked(b, 1)
            await b.kill_flow(parked["flow_id"])
            with trio.fail_after(30):
                events = [e async for e in a.watch_flow(flow_id)]
            assert (events[-1]["state"], events[-1]["error"]) == ("failed", "counter-flow errored"), events
        assert await a.list_flows("running") == [] and await a.list_flows("parked") == []
        assert await b.list_flows("running") == [] and await b.list_flows("parked") == []
        assert "not confirmed yet" not in nodes[0][1].log_path.read_text(encoding="utf-8")


async def test_parked_flows_survive_kill_9_and_a_retry_gets_its_message_once(tmp_path: Path) -> None:
    """Alice's AskDouble parks its responder on Bob at its second message (a service it calls is down),
    and Mallory's 1,100 inits park as many more. Bob is killed with -9 and started again: all are parked
    again with their messages, and Bob serves Alice meanwhile. Once the service is back, a retry delivers
    the held message: Alice gets her answer, and the responder received each message exactly once."""
    nodes = make_network(tmp_path / "net", [ALICE, BOB, MALLORY], flows_modules=(MODULE,))
    (_alice_path, _alice_cfg), (bob_path, bob_cfg), (_mallory_path, mallory_cfg) = nodes
    outage = tmp_path / "outage"
    outage.touch()
    env = node_env(outage)
    async with (
        open_node_processes(nodes[:2], env=env) as (alice, bob),
        rpc.connect(alice.rpc_url, "ops", PASSWORD) as a,
    ):
        flow_id = await a.launch_flow("AskDouble", recipient=BOB, first="1", second="21")
        async with rpc.connect(bob.rpc_url, "ops", PASSWORD) as b:
            (parked,) = await wait_parked(b, 1)
            assert parked["error"] == "ConnectionError: the doubling service is down", parked
            responder = parked["flow_id"]
            with trio.fail_after(120):
                assert (
                    await send_as(mallory_cfg, bob, bad_inits(FLOOD, 9_000_000)) == [amqp.Accepted()] * FLOOD
                )
            await wait_parked(b, FLOOD + 1)
        assert await bob.stop(signal.SIGKILL) == -signal.SIGKILL
        bob = await start_node_process(bob_path, bob_cfg, env=env)
        try:
            async with rpc.connect(bob.rpc_url, "ops", PASSWORD) as b:
                parked_now = await wait_parked(b, FLOOD + 1)
                assert responder in {f["flow_id"] for f in parked_now}
                await ping_pong(a)
                assert (await flow_metrics(bob))["parked_messages"] == FLOOD + 1
                outage.unlink()
                await b.retry_flow(responder)
                with trio.fail_after(60):
                    outcome = await a.flow_result(flow_id)
                assert outcome["result"] == 42, outcome
                done = await wait_listed(b, "finished", responder)
                assert done["result"] == ["1", "21"], done
                assert (await flow_metrics(bob))["parked_messages"] == FLOOD
        finally:
            await bob.stop()


async def test_a_draining_node_holding_a_flood_of_inits_still_finishes_its_flows(tmp_path: Path) -> None:
    """Draining (SIGTERM, `node drain`), a node holds peers' session inits unacknowledged until it is
    undrained. Mallory's 1,100 inits took the inbox window: Alice's PingPong, which Bob was draining for,
    stopped half-way (at 388 of 6,000 transitions, 60 s later) and Bob could never finish draining. Now it
    finishes, and after `undrain` the inits start their responders."""
    nodes = make_network(tmp_path / "net", [ALICE, BOB, MALLORY])
    (_alice_path, _alice_cfg), (_bob_path, _bob_cfg), (_mallory_path, mallory_cfg) = nodes
    async with (
        open_node_processes(nodes[:2]) as (alice, bob),
        rpc.connect(alice.rpc_url, "ops", PASSWORD) as a,
        rpc.connect(bob.rpc_url, "ops", PASSWORD) as b,
    ):
        rounds = 3000
        flow_id = await a.launch_flow("PingPong", recipient=BOB, rounds=rounds)
        with trio.fail_after(30):
            while not (await flow_metrics(bob))["responders"]:  # noqa: ASYNC110 (another process)
                await trio.sleep(0.05)
        await b.drain()
        payload = msgpack.packb("ping 0/1")
        inits = [session_message(init(10_000_000 + i, payload), f"d-{i}", init=True) for i in range(FLOOD)]
        with trio.fail_after(120):
            assert await send_as(mallory_cfg, bob, inits) == [amqp.Accepted()] * FLOOD
        (still,) = [f for f in await a.list_flows() if f["flow_id"] == flow_id]
        assert still["state"] == "running", still  # (the flood came while it ran)
        with trio.fail_after(120):
            assert (await a.flow_result(flow_id))["result"] == rounds
        assert (await flow_metrics(bob))["parked_messages"] == FLOOD
        await b.undrain()
        with trio.fail_after(60):
            while (await flow_metrics(bob))["started_total"] < FLOOD + 1:  # noqa: ASYNC110 (another process)
                await trio.sleep(0.1)
        assert (await flow_metrics(bob))["parked_messages"] == 0


async def test_flooding_a_parked_flows_session_does_not_stop_the_inbox(tmp_path: Path) -> None:
    """Mallory parks one of Bob's responders (an init whose payload hits its bug) and then sends 11,100
    data messages on that responder's session (it can compute the session id: it is derived from the init).
    The parked flow held them all unacknowledged: 10,000 lent credit (``max_parked_messages``), the rest
    took the inbox window (1,024), and Alice's PingPong to Bob hung. Now a parked flow holds at most a
    session's limit of data sent ahead (1,000 messages) and, beyond the lent credit, none: the rest goes into
    its checkpoint as data sent ahead, the session overflows at 1,000 as for a running flow (Mallory is told),
    acknowledged once that is durable. Bob serves Alice throughout; after a kill -9 the flow runs from that
    checkpoint and fails with the overflow."""
    nodes = make_network(tmp_path / "net", [ALICE, BOB, MALLORY], flows_modules=(MODULE,))
    (_alice_path, _alice_cfg), (bob_path, bob_cfg), (_mallory_path, mallory_cfg) = nodes
    env = node_env()
    flood = 11_100
    session = derive_id(responder_flow_id(MALLORY.replace(",", ", "), 4242, 1), "session", 0)
    messages = [session_message(init(4242, msgpack.packb("abc"), AskDouble.flow_name), "i-4242", init=True)]
    messages += [
        session_message(msgpack.packb([1, 2, session, seq, msgpack.packb("x")]), f"x-{seq}")
        for seq in range(1, flood + 1)
    ]
    async with open_node_processes(nodes[:2], env=env) as (alice, bob):
        async with rpc.connect(alice.rpc_url, "ops", PASSWORD) as a:
            await ping_pong(a)
            async with rpc.connect(bob.rpc_url, "ops", PASSWORD) as b:
                with trio.fail_after(300):
                    assert await send_as(mallory_cfg, bob, messages) == [amqp.Accepted()] * (flood + 1)
                (parked,) = await wait_parked(b, 1)
                assert "ValueError: invalid literal for int()" in str(parked["error"]), parked
                await ping_pong(a)
                metrics = await flow_metrics(bob)
                assert metrics["parked_messages"] <= 1_001, metrics
            assert await bob.stop(signal.SIGKILL) == -signal.SIGKILL
            bob = await start_node_process(bob_path, bob_cfg, env=env)
            try:
                async with rpc.connect(bob.rpc_url, "ops", PASSWORD) as b:
                    await ping_pong(a)
                    # restarted, the flow runs from its checkpoint: the session overflowed, so its first
                    # receive fails with the overflow (the data that hit the bug was dropped with it)
                    failed = await wait_listed(b, "failed", parked["flow_id"])
                    assert "more data on session" in str(failed["error"]), failed
                    assert "(1001 messages" in str(failed["error"]), failed
                    assert (await flow_metrics(bob))["parked_messages"] == 0
                    await ping_pong(a)
            finally:
                await bob.stop()
