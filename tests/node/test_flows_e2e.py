"""Real node processes from their configs running flows over RPC; /metrics; SIGTERM in the middle of flows."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import urllib.parse
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from corda_trio import rpc
from corda_trio.node import _config
from corda_trio.node._processes import NodeProcess, open_node_processes, start_node_process

from .netutil import PASSWORD, make_network, stop

pytestmark = pytest.mark.slow

ALICE, BOB, CAROL = "O=Alice,L=London,C=GB", "O=Bob,L=Paris,C=FR", "O=Carol,L=New York,C=US"


async def scrape(node: NodeProcess) -> dict[str, float]:
    """The node's /metrics parsed with prometheus_client's text parser: {name{labels}: value}."""
    return parse_exposition(await scrape_text(node))


def parse_exposition(text: str) -> dict[str, float]:
    """An exposition parsed with prometheus_client's text parser: {name{labels}: value}."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}"] = s.value
    return out


async def scrape_text(node: NodeProcess | str) -> str:
    """The body of the node's (or this URL's) ``GET /metrics`` (asserting a 200 in the text format)."""
    metrics_url = node if isinstance(node, str) else node.metrics_url
    assert metrics_url is not None
    url = urllib.parse.urlsplit(metrics_url)
    assert url.hostname is not None and url.port is not None
    stream = await trio.open_tcp_stream(url.hostname, url.port)
    async with stream:
        await stream.send_all(b"GET /metrics HTTP/1.1\r\nhost: test\r\n\r\n")
        data = b""
        while chunk := await stream.receive_some(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"text/plain" in head, head
    return body.decode()


def total(samples: dict[str, float], name: str) -> float:
    return sum(v for k, v in samples.items() if k.startswith(name + "{"))


async def wait_for_peers(client: rpc.RpcClient, count: int) -> None:
    with trio.fail_after(60):
        while len(await client.network_map()) < count:  # noqa: ASYNC110 (another process's state)
            await trio.sleep(0.2)


async def test_three_nodes_run_flows_over_rpc_and_metrics_move(tmp_path: Path) -> None:
    nodes = make_network(tmp_path / "net", [ALICE, BOB, CAROL])
    async with open_node_processes(nodes) as (alice, bob, carol):
        async with (
            rpc.connect(alice.rpc_url, "ops", PASSWORD) as a,
            rpc.connect(bob.rpc_url, "ops", PASSWORD) as b,
            rpc.connect(carol.rpc_url, "ops", PASSWORD) as c,
        ):
            for client in (a, b, c):
                await wait_for_peers(client, 3)
            before = {n: await scrape(p) for n, p in (("a", alice), ("b", bob))}
            assert "PingPong" in await a.registered_flows()

            # Flows across every pair, concurrently.
            results: dict[str, Any] = {}

            async def run(key: str, client: rpc.RpcClient, flow: str, **args: Any) -> None:
                results[key] = await client.start_flow(flow, **args)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(lambda: run("ab", a, "PingPong", recipient=BOB, rounds=3))
                nursery.start_soon(lambda: run("bc", b, "PingPong", recipient=CAROL, rounds="4"))
                nursery.start_soon(lambda: run("ca", c, "PingPong", recipient=ALICE, rounds=2))
                nursery.start_soon(lambda: run("cast", c, "Broadcast", recipients=[ALICE, BOB], message="hi"))
            assert results["ab"] == 3 and results["bc"] == 4 and results["ca"] == 2
            assert results["cast"] == [
                "O=Alice, L=London, C=GB got hi", "O=Bob, L=Paris, C=FR got hi",
            ]  # fmt: skip

            # A flow that fails at the counterparty: its error comes back as flow-failed.
            with pytest.raises(rpc.RpcError) as failed:
                await a.start_flow("FailingFlow", recipient=BOB, reason="no thanks")
            assert failed.value.code == "flow-failed" and "no thanks" in failed.value.message
            for bad, code in (
                (a.start_flow("NoSuchFlow"), "not-found"),
                (a.start_flow("PingPong", recipient=BOB, colour="red"), "bad-arguments"),
                (a.start_flow("PingPong", recipient=BOB, rounds="many"), "bad-arguments"),
            ):
                with pytest.raises(rpc.RpcError) as info:
                    await bad
                assert info.value.code == code, info.value
            # Arguments of the shipped flows are bounded: PingPong rounds=2**63 ran for ever.
            with pytest.raises(rpc.RpcError) as unbounded:
                await a.launch_flow("PingPong", recipient=BOB, rounds=2**63)
            assert (unbounded.value.code, unbounded.value.message) == (
                "bad-arguments",
                "PingPong argument rounds must be 1 to 10000, got 9223372036854775808",
            )

            # Launch, then follow: progress events, then the final state.
            flow_id = await a.launch_flow("PingPong", recipient=CAROL, rounds=5)
            events = [e async for e in a.watch_flow(flow_id)]
            assert events[-1]["state"] == "finished" and events[-1]["result"] == 5
            assert all(e["flow_id"] == flow_id for e in events)
            listed = {f["flow_id"]: f for f in await a.list_flows("finished")}
            assert listed[flow_id]["flow"] == "PingPong" and listed[flow_id]["result"] == 5
            # kill leaves a flow that already ended as it is and says how it ended; retry refuses, saying so
            ended = await a.kill_flow(flow_id)
            assert (ended["flow_id"], ended["state"], ended["result"]) == (flow_id, "finished", 5), ended
            with pytest.raises(rpc.RpcError) as not_running:
                await a.retry_flow(flow_id)
            assert not_running.value.code == "not-found"
            assert "it has ended (finished)" in str(not_running.value)
            assert any(f["state"] == "failed" for f in await a.list_flows("failed"))

            # A client id makes the start idempotent: the same id names the same flow, started once.
            first = await a.launch_flow("PingPong", client_id="order-17", recipient=BOB, rounds=3)
            assert first == "C-order-17"
            assert await a.start_flow("PingPong", client_id="order-17", recipient=BOB, rounds=3) == 3
            assert await a.launch_flow("PingPong", client_id="order-17", recipient=BOB, rounds=3) == first
            assert [f["flow_id"] for f in await a.list_flows()].count(first) == 1
            with pytest.raises(rpc.RpcError) as bad_id:
                await a.call("start_flow", flow="PingPong", args={"recipient": BOB}, client_id=17)
            assert bad_id.value.code == "bad-arguments"

            # A client that vanishes mid-call leaves its flow running.
            async with rpc.connect(alice.rpc_url, "ops", PASSWORD) as gone:
                with trio.move_on_after(0.05):
                    await gone.start_flow("PingPong", recipient=BOB, rounds=20)
            with trio.fail_after(60):
                while not [f for f in await a.list_flows("finished") if f["result"] == 20]:  # noqa: ASYNC110
                    await trio.sleep(0.2)

            # Kill a running flow (it waits for a peer that will not answer in time: many rounds).
            long_id = await a.launch_flow("PingPong", recipient=CAROL, rounds=10_000)
            killed = await a.kill_flow(long_id)
            assert killed["flow_id"] == long_id and killed["state"] == "failed", killed
            with pytest.raises(rpc.RpcError) as gone_flow:
                await a.kill_flow("no-such-flow")
            assert gone_flow.value.code == "not-found"

            # The operator's flow commands.
            env = {**os.environ, "CORDA_TRIO_RPC_PASSWORD": PASSWORD}
            cli = [sys.executable, "-m", "corda_trio", "flow"]
            started = await trio.run_process(
                [*cli, "start", "--node", alice.rpc_url, "--user", "ops", "PingPong", f"recipient={BOB}",
                 "rounds=2"],
                capture_stdout=True, capture_stderr=True, env=env, check=False,
            )  # fmt: skip
            assert started.returncode == 0 and started.stdout.decode().strip() == "2", started.stderr
            for _ in range(2):  # with a client id: run twice, one flow (the second run follows the first's)
                again = await trio.run_process(
                    [*cli, "start", "--node", alice.rpc_url, "--user", "ops", "--client-id", "cli-1",
                     "PingPong", f"recipient={BOB}", "rounds=2"],
                    capture_stdout=True, capture_stderr=True, env=env, check=False,
                )  # fmt: skip
                assert again.returncode == 0 and again.stdout.decode().strip() == "2", again.stderr
            assert [f["flow_id"] for f in await a.list_flows()].count("C-cli-1") == 1
            listing = await trio.run_process(
                [*cli, "list", "--node", alice.rpc_url, "--user", "ops", "--state", "failed", "--json"],
                capture_stdout=True, capture_stderr=True, env=env, check=False,
            )  # fmt: skip
            assert long_id in {f["flow_id"] for f in json.loads(listing.stdout)}, listing.stderr

            # Drain: no new flows; undrain: flows again.
            drained = await a.drain()
            assert drained["draining"] is True and isinstance(drained["running_flows"], int), drained
            with pytest.raises(rpc.RpcError) as draining:
                await a.start_flow("PingPong", recipient=BOB)
            assert draining.value.code == "draining"
            undrained = await a.undrain()  # the spec: both answer {draining, running_flows}
            assert undrained["draining"] is False and isinstance(undrained["running_flows"], int), undrained
            assert await a.start_flow("PingPong", recipient=BOB) == 1

            after = {n: await scrape(p) for n, p in (("a", alice), ("b", bob))}
        for name in ("corda_trio_p2p_messages_sent_total", "corda_trio_p2p_messages_received_total",
                     "corda_trio_flows_started_total"):  # fmt: skip
            for n in ("a", "b"):
                assert total(after[n], name) > total(before[n], name), (n, name)
        assert total(after["a"], "corda_trio_flow_duration_seconds_count") >= 5
        assert after["a"]["corda_trio_flows_finished_total{outcome=failed}"] >= 1
        assert after["a"]["corda_trio_rpc_calls_total{method=start_flow,outcome=flow-failed}"] == 1
        assert after["a"]["corda_trio_bridge_state{peer=O=Bob, L=Paris, C=FR,state=connected}"] == 1
        for peer in ("O=Bob, L=Paris, C=FR", "O=Carol, L=New York, C=US"):  # per peer, both ways
            assert after["a"][f"corda_trio_p2p_messages_received_total{{peer={peer}}}"] > 0
            assert after["a"][f"corda_trio_p2p_messages_sent_total{{peer={peer}}}"] > 0
        # Group commits and their latency moved with the messages (count and sum of the summary).
        for n in ("a", "b"):
            commits = total(after[n], "corda_trio_store_group_commit_duration_seconds_count")
            assert commits > total(before[n], "corda_trio_store_group_commit_duration_seconds_count")
            assert 0 < total(after[n], "corda_trio_store_group_commit_duration_seconds_sum") < commits


async def test_sigterm_during_200_flows_then_restart_all_complete_none_twice(tmp_path: Path) -> None:
    nodes = make_network(tmp_path / "net", [ALICE, BOB], shutdown_timeout_seconds=0.5)
    count = 200
    async with open_node_processes(nodes) as (alice, bob):
        async with rpc.connect(alice.rpc_url, "ops", PASSWORD) as a:
            await wait_for_peers(a, 2)
            ids = [await a.launch_flow("PingPong", recipient=BOB, rounds=10) for _ in range(count)]
            assert len(set(ids)) == count
            with trio.fail_after(60):  # some have finished, most are still running
                while len(await a.list_flows("finished")) < 5:  # noqa: ASYNC110
                    await trio.sleep(0.05)
            running_at_stop = len(await a.list_flows("running"))
        with trio.fail_after(30):  # bounded: the drain timeout, then a clean stop
            codes = [await alice.stop(signal.SIGTERM), await bob.stop(signal.SIGTERM)]
        assert codes == [0, 0]
    assert running_at_stop > 0, "every flow finished before SIGTERM: the test did not test a stop"
    for _, cfg in nodes:
        assert "node stopped cleanly" in cfg.log_path.read_text()

    restarted = [await start_node_process(p, c) for p, c in nodes]
    try:
        async with (
            rpc.connect(restarted[0].rpc_url, "ops", PASSWORD) as a,
            rpc.connect(restarted[1].rpc_url, "ops", PASSWORD) as b,
        ):
            with trio.fail_after(120):
                while len(await a.list_flows("finished")) < count:  # noqa: ASYNC110
                    await trio.sleep(0.2)
            finished = await a.list_flows("finished")
            assert sorted(f["flow_id"] for f in finished) == sorted(ids)  # all of them, each once
            assert all(f["result"] == 10 for f in finished)
            assert await a.list_flows("failed") == [] and await a.list_flows("parked") == []
            with trio.fail_after(60):
                while len(await b.list_flows("finished")) < count:  # noqa: ASYNC110
                    await trio.sleep(0.2)
            responders = await b.list_flows("finished")
            # One responder per initiated flow: none ran twice, none answered twice.
            assert len(responders) == count and len({f["flow_id"] for f in responders}) == count
            assert all(f["result"] == 10 for f in responders)
            assert await b.list_flows("running") == []
    finally:
        for n in restarted:
            await n.stop()


@pytest.mark.parametrize("after", [1, 25])
async def test_a_flow_id_the_rpc_answered_survives_a_kill_9_right_after(tmp_path: Path, after: int) -> None:
    """``launch_flow`` (``flow start --no-wait``) answers with the flow id only once the start is durable:
    300 concurrent launches, Alice killed (-9) right after the ``after``-th id came back; restarted, every
    flow whose id a client had finishes (the id was answered before the first checkpoint was committed, and
    a kill then lost 1 in 3 to 6 in 20 of them: the node no longer knew the flow)."""
    nodes = make_network(tmp_path / "net", [ALICE, BOB])
    acked: list[str] = []
    async with open_node_processes(nodes) as (alice, _bob):
        async with rpc.connect(alice.rpc_url, "ops", PASSWORD) as a:
            await wait_for_peers(a, 2)

            async def launch(i: int) -> None:
                try:
                    flow_id = await a.launch_flow("PingPong", recipient=BOB, rounds=2, client_id=f"k{i}")
                except (rpc.RpcError, rpc.RpcConnectionError, trio.BrokenResourceError):
                    return  # the kill broke the call: not acknowledged
                if alice.process.returncode is None and len(acked) < after:
                    acked.append(flow_id)
                    if len(acked) == after:
                        alice.process.kill()  # synchronous: no later answer is counted

            with trio.fail_after(120):
                async with trio.open_nursery() as nursery:
                    for i in range(300):
                        nursery.start_soon(launch, i)
        await alice.process.wait()
        assert len(acked) == after
        again = await start_node_process(*nodes[0])
        try:
            async with rpc.connect(again.rpc_url, "ops", PASSWORD) as a:
                with trio.fail_after(120):
                    for flow_id in acked:
                        final = await a.flow_result(flow_id)
                        assert final["state"] == "finished" and final["result"] == 2, (flow_id, final)
        finally:
            await again.stop()


@contextlib.asynccontextmanager
async def external_bridge_network(
    tmp_path: Path, *, bridge_metrics: list[str] | None = None, endpoint_port: int = 0
) -> AsyncIterator[tuple[NodeProcess, NodeProcess]]:
    """Alice with her bridge in its own ``corda-trio bridge start`` process, and Bob (in-process bridge),
    both knowing each other; every process is stopped on the way out. With ``bridge_metrics`` (a list), the
    bridge process serves /metrics on a free port and its URL is appended to the list. ``endpoint_port``:
    Alice's bridge endpoint (0: any free one; a fixed one lets a restarted Alice meet the same bridge)."""
    (alice_path, alice_cfg), (bob_path, bob_cfg) = make_network(tmp_path / "net", [ALICE, BOB])
    alice_cfg = attrs.evolve(
        alice_cfg,
        bridge_mode=_config.BridgeMode.EXTERNAL,
        bridge_password=_config.KeyPassphrase(env="TEST_BRIDGE_PASSWORD"),
        bridge_endpoint=("127.0.0.1", endpoint_port),
    )
    alice_path.write_text(_config.dump_node_config(alice_cfg, alice_cfg.base_directory), encoding="utf-8")
    env = {"TEST_BRIDGE_PASSWORD": "bridge-secret"}
    alice = await start_node_process(alice_path, _config.load_node_config(alice_path), env=env)
    bob = await start_node_process(bob_path, bob_cfg)
    certs = alice_cfg.base_directory / "certificates"
    bridge_toml = tmp_path / "bridge.toml"
    bridge_toml.write_text(
        f'[node]\nendpoint = "{alice.addresses["bridge_endpoint"]}"\nusername = "bridge"\n'
        'password_env = "TEST_BRIDGE_PASSWORD"\n'
        f'[p2p]\nlisten = "{alice_cfg.p2p_address}"\n'
        f'[tls]\ncert_chain = "{certs / "tls.chain.pem"}"\nkey = "{certs / "tls.key.pem"}"\n'
        f'trust_root = "{certs / "network-root.cert.pem"}"\npassphrase_file = "{certs / "passphrase"}"\n'
        + ('[metrics]\naddress = "127.0.0.1:0"\n' if bridge_metrics is not None else ""),
        encoding="utf-8",
    )
    bridge = await trio.lowlevel.open_process(
        [sys.executable, "-m", "corda_trio", "bridge", "start", "--config", str(bridge_toml)],
        stdout=subprocess.DEVNULL if bridge_metrics is None else subprocess.PIPE,
        stderr=subprocess.DEVNULL, env={**os.environ, **env},
    )  # fmt: skip
    try:
        if bridge_metrics is not None:  # the ready line: "... for INBOX  metrics http://HOST:PORT/metrics"
            assert bridge.stdout is not None
            line = b""
            with trio.fail_after(60):
                while not line.endswith(b"\n"):
                    chunk = await bridge.stdout.receive_some(1)
                    assert chunk, line
                    line += chunk
            bridge_metrics.append(line.decode().split("  metrics ")[1].strip())
        assert alice.addresses["bridge_endpoint"].startswith("127.0.0.1:")
        async with (
            rpc.connect(alice.rpc_url, "ops", PASSWORD) as a,
            rpc.connect(bob.rpc_url, "ops", PASSWORD) as b,
        ):
            await wait_for_peers(a, 2)
            await wait_for_peers(b, 2)
        yield alice, bob
    finally:
        await stop(bridge, timeout_seconds=30)
        for n in (alice, bob):
            assert await n.stop() == 0


async def test_a_node_with_an_external_bridge_process_runs_flows(tmp_path: Path) -> None:
    async with external_bridge_network(tmp_path) as (alice, bob):
        async with (
            rpc.connect(alice.rpc_url, "ops", PASSWORD) as a,
            rpc.connect(bob.rpc_url, "ops", PASSWORD) as b,
        ):
            with trio.fail_after(60):
                assert await a.start_flow("PingPong", recipient=BOB, rounds=3) == 3
                assert await b.start_flow("PingPong", recipient=ALICE, rounds=2) == 2


async def test_second_ctrl_c_stops_at_once_and_the_flows_survive(tmp_path: Path) -> None:
    nodes = make_network(tmp_path / "net", [ALICE, BOB], shutdown_timeout_seconds=120.0)
    alice_path, alice_cfg = nodes[0]
    alice = await start_node_process(alice_path, alice_cfg)  # Bob never runs: the flows wait for him
    try:
        async with rpc.connect(alice.rpc_url, "ops", PASSWORD) as a:
            await wait_for_peers(a, 2)
            ids = {await a.launch_flow("PingPong", recipient=BOB, rounds=2) for _ in range(20)}
            with trio.fail_after(30):
                while len(await a.list_flows("running")) < 20:  # noqa: ASYNC110
                    await trio.sleep(0.1)
        alice.process.send_signal(signal.SIGINT)
        with trio.move_on_after(2):
            await alice.process.wait()
        assert alice.process.returncode is None, "the first Ctrl-C waits for running flows"
        alice.process.send_signal(signal.SIGINT)
        with trio.fail_after(15):
            assert await alice.process.wait() == 130
        console = alice.console_tail()
        assert "SIGINT: stopping (Ctrl-C again to stop at once)" in console
        assert "stopping at once" in console and "Traceback" not in console
    finally:
        await alice.stop()
    again = await start_node_process(alice_path, alice_cfg)
    try:
        async with rpc.connect(again.rpc_url, "ops", PASSWORD) as a:
            assert {f["flow_id"] for f in await a.list_flows("running")} == ids
    finally:
        again.process.send_signal(signal.SIGINT)  # the flows still wait for Bob: stop at once
        await trio.sleep(0.5)
        await again.stop(signal.SIGINT)


async def test_a_flow_whose_checkpoint_cannot_be_loaded_is_neither_killed_nor_retried_in_silence(
    tmp_path: Path,
) -> None:
    """Such a flow is listed as parked with the reason. kill_flow answered its unchanged parked summary as if
    it had ended (the CLI exited 0, nothing was killed); retry_flow said it had 'ended (parked)' and that
    a parked flow can be retried. Both now say what the flow is, and it stays listed, untouched."""
    from corda_trio import flows, store

    (path, cfg), _ = make_network(tmp_path / "net", [ALICE, BOB])
    async with store.open_broker(cfg.store_directory) as broker:
        checkpoints = await broker.open_keyed_log(flows.CHECKPOINT_LOG)
        await checkpoints.put(b"F-unreadable", b"not a checkpoint")
    node = await start_node_process(path, cfg)
    try:
        async with rpc.connect(node.rpc_url, "ops", PASSWORD) as a:
            (parked,) = await a.list_flows("parked")
            assert parked["flow_id"] == "F-unreadable" and "malformed msgpack" in parked["error"]
            for call, what in ((a.kill_flow, "killed"), (a.retry_flow, "retried")):
                with pytest.raises(rpc.RpcError) as info:
                    await call("F-unreadable")
                assert info.value.code == "not-found"
                assert info.value.message.startswith(
                    f"flow F-unreadable cannot be {what}: its checkpoint could not be loaded at start ("
                ), info.value.message
            assert await a.list_flows("parked") == [parked]
            assert await a.list_flows("failed") == []
    finally:
        await node.stop()
