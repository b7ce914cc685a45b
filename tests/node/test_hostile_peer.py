"""A legitimate but hostile network member (Mallory) against real node processes: it dials a victim's P2P
port with its own TLS identity (so every transport and legal-name check passes), attaches to the victim's
inbox and sends hand-made session messages with valid P2P headers, while the victims run flows."""

from __future__ import annotations

import contextlib
import signal
from pathlib import Path
from typing import Any

import msgpack
import pytest
import trio

from corda_trio import amqp, flows, messaging, rpc
from corda_trio.node import _config
from corda_trio.node._processes import NodeProcess, open_node_processes, start_node_process

from .netutil import PASSWORD, make_network, open_inbox_sender
from .test_flows_e2e import scrape

pytestmark = pytest.mark.slow

ALICE, BOB, MALLORY = "O=Alice,L=London,C=GB", "O=Bob,L=Paris,C=FR", "O=Mallory,L=Rome,C=IT"
PING_PONG = "corda_trio.flows.PingPong"


def session_message(body: bytes, dedup_id: str, *, init: bool = False) -> amqp.Message:
    """A P2P message as a node's bridge sends it (every header the victim requires)."""
    headers = {messaging.HEADER_MESSAGE_TYPE: "session_init"} if init else {}
    out = messaging.OutgoingMessage(topic=flows.SESSION_TOPIC, data=body, dedup_id=dedup_id, headers=headers)
    return messaging.to_amqp(out, platform_version=1, release_version="0.1.0", sender_uuid="m", send_seq_no=0)


async def send_as(config: _config.NodeConfig, victim: NodeProcess, messages: list[amqp.Message]) -> list[Any]:
    """Dial ``victim``'s P2P port as the node of ``config``, send ``messages`` to its inbox; the outcomes."""
    async with open_inbox_sender(config, victim) as sender:
        return [await sender.send(m) for m in messages]


def nested_ext(levels: int) -> bytes:
    """A payload of ``levels`` registered-payload levels, each inside the previous one's fields."""
    inner = msgpack.packb(None)
    for _ in range(levels):
        inner = msgpack.packb(msgpack.ExtType(1, msgpack.packb(["x", 1, msgpack.ExtType(1, inner)])))
    return inner


def init(session_id: int, payload: bytes, flow: str = PING_PONG) -> bytes:
    """A session init of ``flow`` (its initiating class's ``flow_name``) carrying ``payload``."""
    return msgpack.packb([1, 0, session_id, 1, flow, 1, "", payload])


async def ping_pong(client: rpc.RpcClient, rounds: int = 3) -> None:
    with trio.fail_after(60):
        assert await client.start_flow("PingPong", recipient=BOB, rounds=rounds) == rounds


async def test_deeply_nested_payloads_neither_crash_the_victim_nor_its_restart(tmp_path: Path) -> None:
    """A 2 KB payload nesting 100 ext levels killed the victim with SIGSEGV, and again at every restart (the
    message waited in its inbox); arrays nested 1024 deep were read but could not be checkpointed. Now each
    is a bad payload (the responder fails with the reason) or a refusal, and the victim serves on."""
    nodes = make_network(tmp_path / "net", [ALICE, BOB, MALLORY])
    (alice_path, alice_cfg), (bob_path, bob_cfg), (_mallory_path, mallory_cfg) = nodes
    deep_lists: Any = None
    for _ in range(1024):
        deep_lists = [deep_lists]
    async with open_node_processes([(alice_path, alice_cfg), (bob_path, bob_cfg)]) as (alice, bob):
        async with rpc.connect(alice.rpc_url, "ops", PASSWORD) as a:
            await ping_pong(a)
            outcomes = await send_as(mallory_cfg, bob, [
                session_message(msgpack.packb([1, 2, 77, 0, nested_ext(100)]), "m-1"),
                session_message(init(1001, nested_ext(100)), "m-2", init=True),
                session_message(init(1002, msgpack.packb(deep_lists)), "m-3", init=True),
                session_message(b"\x91" * 5000 + b"\xc0", "m-4"),
            ])  # fmt: skip
            assert outcomes == [amqp.Accepted()] * 4
            await ping_pong(a)
            assert bob.process.returncode is None
            async with rpc.connect(bob.rpc_url, "ops", PASSWORD) as b:
                with trio.fail_after(30):
                    while len(failed := await b.list_flows("failed")) < 2:  # noqa: ASYNC110 (another process)
                        await trio.sleep(0.1)
            errors = sorted(f["error"] for f in failed)
            assert errors == [
                f"{MALLORY.replace(',', ', ')} sent a payload that cannot be read: arrays and maps nested "
                "more than 256 deep",
                f"{MALLORY.replace(',', ', ')} sent a payload that cannot be read: registered payload types "
                "nested more than 32 deep",
            ], failed
            log = bob_cfg.log_path.read_text()
            # (Mallory's first refusal is a warning in full, the next ones of the minute are counted)
            assert "refused: unknown session 77" in log
            assert (await flow_metrics(bob))["session_messages_refused_total"] >= 2
            # kill -9 and start again: nothing of Mallory's is left to replay, the flows go on
            assert await bob.stop(signal.SIGKILL) == -signal.SIGKILL
            bob = await start_node_process(bob_path, bob_cfg)
            try:
                await ping_pong(a)
            finally:
                await bob.stop()


async def flow_metrics(node: NodeProcess) -> dict[str, float]:
    """The node's unlabelled flow metrics from /metrics: {name without prefix and suffix: value}."""
    return {
        k.removeprefix("corda_trio_flows_").removesuffix("{}"): v
        for k, v in (await scrape(node)).items()
        if k.startswith("corda_trio_flows_") and k.endswith("{}")
    }


async def test_an_init_flood_is_bounded_per_peer_and_the_victim_serves_on(tmp_path: Path) -> None:
    """Mallory's 5,000 inits left the victim 5,000 responders waiting for ever (60 -> 102 MB, nothing capped
    it). Beyond ``[flows] max_responders_per_peer`` live responders of one peer its inits are rejected: the
    victim's other peers are served, Mallory's own initiating flow fails with the reason, the refusals are in
    /metrics, one warning sums them up, and after a kill -9 the count comes back from the checkpoints."""
    nodes = make_network(tmp_path / "net", [ALICE, BOB, MALLORY], flows_max_responders_per_peer=40)
    (_alice_path, _alice_cfg), (bob_path, bob_cfg), (_mallory_path, mallory_cfg) = nodes
    async with (
        open_node_processes(nodes) as (alice, bob, mallory),
        rpc.connect(alice.rpc_url, "ops", PASSWORD) as a,
        rpc.connect(mallory.rpc_url, "ops", PASSWORD) as m,
    ):
        await ping_pong(a)
        flood = [
            session_message(
                msgpack.packb([1, 0, 5_000_000 + i, 1, PING_PONG, 1, "", None]), f"f-{i}", init=True
            )
            for i in range(300)
        ]
        with trio.fail_after(60):
            assert await send_as(mallory_cfg, bob, flood) == [amqp.Accepted()] * 300
            while (await flow_metrics(bob)).get("inits_refused_total", 0) < 260:  # noqa: ASYNC110 (another process)
                await trio.sleep(0.1)
        metrics = await flow_metrics(bob)
        assert metrics["inits_refused_total"] == 260 and metrics["responders"] == 40, metrics
        assert metrics["session_messages_refused_total"] >= 260, metrics
        # the victim serves others, several at once
        async with trio.open_nursery() as nursery:
            for _ in range(5):
                nursery.start_soon(ping_pong, a)
        # Mallory's own initiating flow is rejected with the reason, at once
        limit = "too many flows from one peer: 40 started by O=Mallory, L=Rome, C=IT are running here"
        with trio.fail_after(30), pytest.raises(rpc.RpcError, match=limit):
            await m.start_flow("PingPong", recipient=BOB)
        log = bob_cfg.log_path.read_text()
        warnings = [line for line in log.splitlines() if "session message from O=Mallory" in line]
        assert len(warnings) == 1 and "refused: too many flows from one peer" in warnings[0], warnings
        # kill -9: the 40 responders resume and still count
        assert await bob.stop(signal.SIGKILL) == -signal.SIGKILL
        bob = await start_node_process(bob_path, bob_cfg)
        try:
            assert (await flow_metrics(bob))["responders"] == 40
            with trio.fail_after(30), pytest.raises(rpc.RpcError, match=limit):
                await m.start_flow("PingPong", recipient=BOB)
            await ping_pong(a)
            # (1, or 2: an init refused just before the kill -9 may come again, its id not committed yet)
            assert (await flow_metrics(bob))["inits_refused_total"] >= 1
        finally:
            await bob.stop()


async def test_a_member_cannot_park_responders_to_take_the_inbox_credit(tmp_path: Path) -> None:
    """A parked flow's messages stay unacknowledged in the inbox, and the inbox hands out 1,024 at a time.
    A PingPong init counting 5,000-digit rounds parked its responder (int() refuses more than 4,300 digits):
    1,100 of them stopped the victim taking any P2P message, Alice's flows included. Now each fails with a
    reason."""
    nodes = make_network(tmp_path / "net", [ALICE, BOB, MALLORY])
    (_alice_path, _alice_cfg), (_bob_path, _bob_cfg), (_mallory_path, mallory_cfg) = nodes
    async with (
        open_node_processes(nodes[:2]) as (alice, bob),
        rpc.connect(alice.rpc_url, "ops", PASSWORD) as a,
        rpc.connect(bob.rpc_url, "ops", PASSWORD) as b,
    ):
        await ping_pong(a)
        payload = msgpack.packb("ping 0/" + "9" * 5000)
        inits = [session_message(init(6_000_000 + i, payload), f"p-{i}", init=True) for i in range(1100)]
        with trio.fail_after(120):
            assert await send_as(mallory_cfg, bob, inits) == [amqp.Accepted()] * 1100
        await ping_pong(a)
        with trio.fail_after(60):
            # (finished flows are remembered for the last 1,000)
            while len(failed := await b.list_flows("failed")) < 990:  # noqa: ASYNC110 (another process)
                await trio.sleep(0.2)
        assert not await b.list_flows("parked")
        assert "expected 'ping 0/<rounds, at most 10000>'" in failed[-1]["error"]


async def test_a_flood_of_bad_session_messages_is_counted_but_not_a_flood_of_log_lines(
    tmp_path: Path,
) -> None:
    """Every refused session message was a warning line: Mallory's 2,000 messages for sessions that do not
    exist were 2,000 lines in the victim's log (and on its stderr), and a member can send thousands a second.
    Now the first is logged in full and the rest of the minute only counted: the log grows by a handful of
    lines, /metrics counts all 2,000."""
    nodes = make_network(tmp_path / "net", [ALICE, BOB, MALLORY])
    (_alice_path, _alice_cfg), (bob_path, bob_cfg), (_mallory_path, mallory_cfg) = nodes
    async with open_node_processes([(bob_path, bob_cfg)]) as (bob,):
        before = len(bob_cfg.log_path.read_text().splitlines())
        flood = [
            session_message(msgpack.packb([1, 2, 7_000_000 + i, 1, msgpack.packb("x")]), f"u-{i}")
            for i in range(2000)
        ]
        with trio.fail_after(120):
            assert await send_as(mallory_cfg, bob, flood) == [amqp.Accepted()] * 2000
            while (await flow_metrics(bob)).get("session_messages_refused_total", 0) < 2000:  # noqa: ASYNC110 (another process)
                await trio.sleep(0.1)
        assert (await flow_metrics(bob))["session_messages_refused_total"] == 2000
        lines = bob_cfg.log_path.read_text().splitlines()[before:]
        refused = [line for line in lines if "refused" in line]
        assert len(refused) == 1 and "refused: unknown session 7000000" in refused[0], refused
        assert len(lines) <= 10, lines


async def test_anyone_who_can_connect_is_counted_but_not_a_flood_of_log_lines(tmp_path: Path) -> None:
    """Not even a member: 2,000 connections to the P2P port sending plain-TCP garbage were 2,000 warning
    lines in the victim's log and on its stderr, and 2,000 wrong RPC passwords 2,000 lines in its log. Now
    each source address gets its first refusal in full (with the reason) and the rest of the minute counted:
    /metrics counts all of them. (100 wrong passwords here: each costs the node an argon2 check, ~0.1 s of
    CPU, and the lines are counted as they are for 2,000.)"""
    nodes = make_network(tmp_path / "net", [BOB])
    (bob_path, bob_cfg) = nodes[0]
    async with open_node_processes([(bob_path, bob_cfg)]) as (bob,):
        before = len(bob_cfg.log_path.read_text().splitlines())
        console_before = len(bob.console_log.read_text().splitlines())
        host, port = bob.addresses["p2p"].rsplit(":", 1)
        limit = trio.CapacityLimiter(20)

        async def garbage() -> None:
            async with limit, await trio.open_tcp_stream(host, int(port)) as stream:
                await stream.send_all(b"GET / HTTP/1.1\r\n\r\n")
                with contextlib.suppress(trio.BrokenResourceError):
                    while await stream.receive_some(4096):
                        pass

        async def wrong_password(i: int) -> None:
            async with limit:
                with pytest.raises(rpc.RpcError, match="wrong user name or password"):
                    async with rpc.connect(bob.rpc_url, "ops", f"wrong-{i}"):
                        pass

        started = trio.current_time()
        with trio.fail_after(240):
            async with trio.open_nursery() as nursery:
                for _ in range(2000):
                    nursery.start_soon(garbage)
                for i in range(100):
                    nursery.start_soon(wrong_password, i)
            while (await scrape(bob)).get("corda_trio_p2p_connections_refused_total{reason=tls}", 0) < 2000:  # noqa: ASYNC110 (another process)
                await trio.sleep(0.1)
        metrics = await scrape(bob)
        assert metrics["corda_trio_p2p_connections_refused_total{reason=tls}"] == 2000
        assert metrics["corda_trio_rpc_failed_logins_total{}"] == 100
        # one line in full per kind, then (on a slow machine the flood outlasts a minute) a summary a minute
        minutes = int((trio.current_time() - started) // 60) + 1
        lines = bob_cfg.log_path.read_text().splitlines()[before:]
        summaries = [line for line in lines if " more " in line and " in the last " in line]
        full = [line for line in lines if line not in summaries]
        assert len(full) == 2 and len(summaries) <= 2 * minutes, lines[:10]
        (refused,) = [line for line in full if "refused" in line]
        assert "WARNING corda_trio.transport: inbound 127.0.0.1:" in refused, refused
        assert "refused: TLS handshake failed: [SSL: HTTP_REQUEST] http request" in refused, refused
        (failed,) = [line for line in full if "RPC login" in line]
        assert "failed for user 'ops'" in failed, failed
        console = len(bob.console_log.read_text().splitlines()) - console_before
        assert console <= 2 + 2 * minutes
