"""/metrics of real node processes against a ledger of what they were made to do, and checked by Prometheus'
own linter (``promtool check metrics``, from the ``prometheus`` Debian package).

The ledger: Alice starts ``PINGS`` PingPong flows of ``ROUNDS`` rounds with Bob, Bob starts ``CASTS``
Broadcasts to Alice, all at once over RPC. Once both nodes are quiet, every count on /metrics must equal
what that traffic is, not merely have moved: per PingPong the initiator sends its ``ROUNDS`` pings and its
end, the responder its ``ROUNDS`` pongs (the last one with its end); per Broadcast the initiator sends the
message and its end, the responder its answer (with its end).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import attrs
import pytest
import trio

from corda_trio import rpc
from corda_trio.node import _config
from corda_trio.node._processes import NodeProcess, open_node_processes, start_node_process
from tests.ports import free_port

from .netutil import PASSWORD, make_network
from .test_flows_e2e import (
    ALICE,
    BOB,
    CAROL,
    external_bridge_network,
    parse_exposition,
    scrape_text,
    total,
    wait_for_peers,
)

pytestmark = pytest.mark.slow

PINGS, ROUNDS, CASTS = 6, 3, 4
#: Messages the ledger's flows send each way (see the module docstring).
A_TO_B, B_TO_A = PINGS * (ROUNDS + 1) + CASTS * 1, PINGS * ROUNDS + CASTS * 2
ALICE_NAME, BOB_NAME = "O=Alice, L=London, C=GB", "O=Bob, L=Paris, C=FR"


def promtool_problems(text: str) -> str:
    """What ``promtool check metrics`` says about ``text`` (empty: nothing); skips the test without it."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus)")
    done = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60, check=False
    )
    return f"exit {done.returncode}: {done.stdout}{done.stderr}" if done.returncode else ""


async def run_the_ledger(alice: NodeProcess, bob: NodeProcess) -> None:
    """The ledger's flows, all at once, each checked for its result; then until both nodes are quiet."""
    async with (
        rpc.connect(alice.rpc_url, "ops", PASSWORD) as a,
        rpc.connect(bob.rpc_url, "ops", PASSWORD) as b,
    ):
        await wait_for_peers(a, 2)
        await wait_for_peers(b, 2)

        async def ping(flow: str) -> None:
            assert await a.start_flow(flow, recipient=BOB, rounds=ROUNDS) == ROUNDS

        async def cast() -> None:
            assert await b.start_flow("Broadcast", recipients=[ALICE], message="hi") == [
                f"{ALICE_NAME} got hi"
            ]

        with trio.fail_after(120):
            async with trio.open_nursery() as nursery:
                for i in range(PINGS):  # (by either of its names: one flow, one label)
                    nursery.start_soon(ping, "corda_trio.flows.PingPong" if i % 2 else "PingPong")
                for _ in range(CASTS):
                    nursery.start_soon(cast)
        await _wait_quiet(alice, bob)


async def _wait_quiet(alice: NodeProcess, bob: NodeProcess) -> None:
    """Until both nodes are quiet at once (see :func:`_quiet`)."""
    with trio.fail_after(120):
        while not (await _quiet(alice) and await _quiet(bob)):  # noqa: ASYNC110 (other processes)
            await trio.sleep(0.1)


async def _quiet(node: NodeProcess) -> bool:
    """No flow running and nothing waiting in an outbound queue or the inbox."""
    m = parse_exposition(await scrape_text(node))
    pending = total(m, "corda_trio_p2p_messages_pending")
    inbox = sum(v for k, v in m.items() if k.startswith("corda_trio_queue_depth_messages{queue=p2p.inbound."))
    return m["corda_trio_flows_running{}"] == 0 and pending == 0 and inbox == 0


def queue(m: dict[str, float], name: str, prefix: str) -> float:
    """``name{queue=<prefix>...}``: the one queue whose name starts with ``prefix``."""
    (value,) = [v for k, v in m.items() if k.startswith(f"{name}{{queue={prefix}")]
    return value


async def test_counters_equal_the_ledger_exactly(tmp_path: Path) -> None:
    """Found with a real Prometheus scraping two nodes: ``corda_trio_flows_session_messages_refused_total``
    rose by one for every flow that ended normally (the initiator's end reached a responder that had
    finished and left memory), so an alert on refusals fired on healthy traffic."""
    async with open_node_processes(make_network(tmp_path / "net", [ALICE, BOB])) as (alice, bob):
        await run_the_ledger(alice, bob)
        a_text = await scrape_text(alice)
        a = parse_exposition(a_text)
        b = parse_exposition(await scrape_text(bob))

    # docs/metrics.md "Label values and cardinality": the lines one peer and one flow class add (it said 20
    # per class after the *_created series had gone: 19)
    doc = " ".join((Path(__file__).parents[2] / "docs" / "metrics.md").read_text(encoding="utf-8").split())
    found = re.search(r"\((\d+) lines per peer: .*\((\d+) lines per class\)", doc)
    assert found, "docs/metrics.md no longer gives the lines per peer and per flow class"
    lines = a_text.splitlines()
    peer_lines = [line for line in lines if 'peer="' in line or 'queue="internal.peers.' in line]
    assert len(peer_lines) == int(found[1]), peer_lines  # (Alice has one peer)
    assert len([line for line in lines if 'flow="PingPong"' in line]) == int(found[2])

    # no ``*_created`` series (the client library's; Prometheus stored them as untyped series of their own)
    assert [k for m in (a, b) for k in m if "_created{" in k] == []
    a_to_b, b_to_a = A_TO_B, B_TO_A
    assert a[f"corda_trio_p2p_messages_sent_total{{peer={BOB_NAME}}}"] == a_to_b
    assert b[f"corda_trio_p2p_messages_received_total{{peer={ALICE_NAME}}}"] == a_to_b
    assert b[f"corda_trio_p2p_messages_sent_total{{peer={ALICE_NAME}}}"] == b_to_a
    assert a[f"corda_trio_p2p_messages_received_total{{peer={BOB_NAME}}}"] == b_to_a
    for m, sent, received in ((a, a_to_b, b_to_a), (b, b_to_a, a_to_b)):
        # the queues under the P2P counters: everything enqueued was acknowledged, nothing left or redelivered
        for prefix, count in (("internal.peers.", sent), ("p2p.inbound.", received)):
            for name in ("corda_trio_queue_enqueued_messages_total", "corda_trio_queue_acked_messages_total"):
                assert queue(m, name, prefix) == count, (name, prefix)
            assert queue(m, "corda_trio_queue_depth_messages", prefix) == 0
            assert queue(m, "corda_trio_queue_released_messages_total", prefix) == 0
        assert total(m, "corda_trio_p2p_messages_redelivered_total") == 0
        assert total(m, "corda_trio_p2p_messages_pending") == 0
        assert m["corda_trio_p2p_messages_rejected_total{}"] == 0
        # flows: each side initiated its own and answered the other's; none refused anything
        assert m["corda_trio_flows_started_total{}"] == PINGS + CASTS
        assert m["corda_trio_flows_finished_total{outcome=finished}"] == PINGS + CASTS
        assert m["corda_trio_flows_finished_total{outcome=failed}"] == 0
        assert m["corda_trio_flows_running{}"] == 0 and m["corda_trio_flows_responders{}"] == 0
        assert m["corda_trio_flows_session_messages_refused_total{}"] == 0
        # the summary's count is the counter it summarises
        for k, v in m.items():
            if k.startswith("corda_trio_store_group_commit_duration_seconds_count{"):
                assert v == m[k.replace("_duration_seconds_count", "s_total")], k
    # the flow latency histogram counts the flows started over RPC, each once, in its +Inf bucket too,
    # under the flow's short name however the RPC call spelled it (the full name made a second series)
    for m, flow, count in ((a, "PingPong", PINGS), (b, "Broadcast", CASTS)):
        assert m[f"corda_trio_flow_duration_seconds_count{{flow={flow}}}"] == count
        assert m[f"corda_trio_flow_duration_seconds_bucket{{flow={flow},le=+Inf}}"] == count
        assert m[f"corda_trio_flow_duration_seconds_sum{{flow={flow}}}"] > 0
        assert total(m, "corda_trio_flow_duration_seconds_count") == count  # (and no other flow)
        assert m["corda_trio_rpc_calls_total{method=start_flow,outcome=ok}"] == count


async def test_promtool_accepts_the_exposition_idle_under_load_and_after(tmp_path: Path) -> None:
    """Every family has HELP and TYPE, counters end in _total, units are base units: promtool's lint, on
    scrapes taken before, during and after the ledger's traffic."""
    async with open_node_processes(make_network(tmp_path / "net", [ALICE, BOB])) as (alice, bob):
        texts = [await scrape_text(alice)]
        under_load: list[str] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_the_ledger, alice, bob)
            for _ in range(4):
                await trio.sleep(0.2)
                under_load += [await scrape_text(alice), await scrape_text(bob)]
        texts += [*under_load, await scrape_text(alice), await scrape_text(bob)]
    assert 'corda_trio_flow_duration_seconds_bucket{flow="PingPong",le="+Inf"} 6.0' in texts[-2]
    for text in texts:
        assert promtool_problems(text) == "", text


async def test_a_node_whose_bridge_runs_in_its_own_process_counts_what_it_receives(tmp_path: Path) -> None:
    """With ``[bridge] mode = "external"`` the node's /metrics had no ``p2p_messages_received_total`` (nor
    ``p2p_messages_rejected_total``): those were the in-process acceptor's counters, and the bridge process
    serves no metrics, so what the node received from its peers was nowhere to be read."""
    async with external_bridge_network(tmp_path) as (alice, bob):
        await run_the_ledger(alice, bob)
        a = parse_exposition(await scrape_text(alice))
    assert a[f"corda_trio_p2p_messages_received_total{{peer={BOB_NAME}}}"] == B_TO_A
    assert a["corda_trio_p2p_messages_rejected_total{}"] == 0
    assert a[f"corda_trio_p2p_messages_sent_total{{peer={BOB_NAME}}}"] == A_TO_B
    assert queue(a, "corda_trio_queue_acked_messages_total", "p2p.inbound.") == B_TO_A


async def test_the_bridge_process_serves_its_own_series_under_the_nodes_names(tmp_path: Path) -> None:
    """``bridge start`` with ``[metrics] address``: the bridge process's bridges and acceptor on its own
    /metrics, under the names the node uses for the same things, equal to the ledger (before, the process
    served no /metrics: its bridges' states, what it sent and received, were only in its log)."""
    urls: list[str] = []
    async with external_bridge_network(tmp_path, bridge_metrics=urls) as (alice, bob):
        await run_the_ledger(alice, bob)
        (url,) = urls
        # an outsider on the P2P port the bridge process serves: not TLS, refused before it is served
        host, _, port = str(alice.addresses["p2p"]).rpartition(":")
        stream = await trio.open_tcp_stream(host.strip("[]"), int(port))
        async with stream:
            await stream.send_all(b"GET / HTTP/1.0\r\n\r\n")
            with trio.fail_after(30):
                while await stream.receive_some():  # (until the bridge closes it)
                    pass
        refused = "corda_trio_p2p_connections_refused_total{reason=tls}"
        with trio.fail_after(30):
            text = await scrape_text(url)
            while refused not in parse_exposition(text):
                await trio.sleep(0.1)
                text = await scrape_text(url)
        # the node's server: HEAD, gzip as Prometheus asks for it
        head = await trio.run_process(
            ["curl", "-sS", "-I", "-H", "Accept-Encoding: gzip", "--max-time", "10", url], capture_stdout=True
        )
        assert b"HTTP/1.1 200" in head.stdout and b"content-encoding: gzip" in head.stdout, head.stdout
        a = parse_exposition(await scrape_text(alice))
    b = parse_exposition(text)
    assert b[refused] == 1
    assert b[f"corda_trio_p2p_messages_sent_total{{peer={BOB_NAME}}}"] == A_TO_B
    assert b[f"corda_trio_p2p_messages_received_total{{peer={BOB_NAME}}}"] == B_TO_A
    assert b["corda_trio_p2p_messages_rejected_total{}"] == 0
    assert b["corda_trio_p2p_links_refused_total{}"] == 0
    # what the node counts of the same traffic (its outbound queue's acks, its endpoint's stores) agrees
    assert a[f"corda_trio_p2p_messages_sent_total{{peer={BOB_NAME}}}"] == A_TO_B
    assert a[f"corda_trio_p2p_messages_received_total{{peer={BOB_NAME}}}"] == B_TO_A
    states = {
        s: b[f"corda_trio_bridge_state{{peer={BOB_NAME},state={s}}}"] for s in ("connected", "resolving")
    }
    assert states == {"connected": 1, "resolving": 0}
    assert b[f"corda_trio_bridge_connects_total{{peer={BOB_NAME}}}"] == 1
    assert b[f"corda_trio_bridge_failures_total{{peer={BOB_NAME}}}"] == 0
    assert b[f"corda_trio_bridge_parked_addresses{{peer={BOB_NAME}}}"] == 0
    assert b["corda_trio_bridge_process_node_connected{}"] == 1
    assert b["corda_trio_bridge_process_node_sessions_total{}"] == 1
    (info,) = [k for k in b if k.startswith("corda_trio_bridge_process_info{")]
    assert b[info] == 1 and "bridge_id=bridge-" in info
    assert promtool_problems(text) == "", text


async def test_the_bridge_process_counts_across_its_sessions_with_a_restarted_node(tmp_path: Path) -> None:
    """Each session with the node runs new bridges, whose counters start at 0: the process's series sum its
    sessions, so a node restart under a running bridge process does not take its counters back."""
    endpoint_port = free_port()  # for Alice's endpoint, the same after her restart
    urls: list[str] = []
    async with external_bridge_network(tmp_path, bridge_metrics=urls, endpoint_port=endpoint_port) as (
        alice,
        bob,
    ):
        (url,) = urls
        async with rpc.connect(alice.rpc_url, "ops", PASSWORD) as a:
            assert await a.start_flow("PingPong", recipient=BOB, rounds=2) == 2
        await _wait_quiet(alice, bob)  # (Alice's end may still be on its way when her flow returns)
        assert await alice.stop() == 0
        restarted = await start_node_process(
            alice.config.base_directory / "node.toml",
            alice.config,
            env={"TEST_BRIDGE_PASSWORD": "bridge-secret"},
        )
        alice.process, alice.addresses = restarted.process, restarted.addresses  # (the fixture stops it)
        with trio.fail_after(60):
            b = parse_exposition(await scrape_text(url))
            while (
                b["corda_trio_bridge_process_node_sessions_total{}"],
                b["corda_trio_bridge_process_node_connected{}"],
            ) != (2, 1):
                await trio.sleep(0.1)
                b = parse_exposition(await scrape_text(url))
        async with rpc.connect(alice.rpc_url, "ops", PASSWORD) as a:
            await wait_for_peers(a, 2)
            assert await a.start_flow("PingPong", recipient=BOB, rounds=3) == 3
        await _wait_quiet(alice, bob)
        b = parse_exposition(await scrape_text(url))
        at_bob = parse_exposition(await scrape_text(bob))
    # The ledger across the processes: what the bridge process counts as accepted by Bob is what Bob counts
    # as received from Alice, and the other way round. Per PingPong of r rounds Alice sends r + 1 messages
    # and receives r; Bob may have received a message twice (the restarted node sends again what it had
    # not written as acked: Bob's deduplicator drops the copy), never fewer.
    sent = b[f"corda_trio_p2p_messages_sent_total{{peer={BOB_NAME}}}"]
    assert sent == at_bob[f"corda_trio_p2p_messages_received_total{{peer={ALICE_NAME}}}"] >= (2 + 1) + (3 + 1)
    received = b[f"corda_trio_p2p_messages_received_total{{peer={BOB_NAME}}}"]
    assert received == at_bob[f"corda_trio_p2p_messages_sent_total{{peer={ALICE_NAME}}}"] == 2 + 3
    assert b[f"corda_trio_bridge_connects_total{{peer={BOB_NAME}}}"] == 2
    assert b[f"corda_trio_bridge_failures_total{{peer={BOB_NAME}}}"] == 0


async def test_an_address_answered_by_another_node_is_parked_and_counted_until_its_node_answers(
    tmp_path: Path,
) -> None:
    """``bridge_parked_addresses`` at 1: Bob's address is answered by Carol (she listens on Bob's port and
    advertises her own), so Alice's bridge to Bob parks it, and the flow's message stays in her queue."""
    (alice_path, alice_cfg), (_, bob_cfg), (carol_path, carol_cfg) = make_network(
        tmp_path / "net", [ALICE, BOB, CAROL]
    )
    carol_path.write_text(
        _config.dump_node_config(attrs.evolve(carol_cfg, p2p_listen=bob_cfg.p2p_address), carol_path.parent),
        encoding="utf-8",
    )
    nodes = [(alice_path, alice_cfg), (carol_path, _config.load_node_config(carol_path))]
    async with (
        open_node_processes(nodes) as (alice, _carol),
        rpc.connect(alice.rpc_url, "ops", PASSWORD) as a,
    ):
        await a.launch_flow("PingPong", recipient=BOB, rounds=1)
        parked = f"corda_trio_bridge_parked_addresses{{peer={BOB_NAME}}}"
        with trio.fail_after(30):
            while (m := parse_exposition(await scrape_text(alice))).get(parked) != 1:  # noqa: ASYNC110
                await trio.sleep(0.2)
        assert m[f"corda_trio_p2p_messages_pending{{peer={BOB_NAME}}}"] == 1
        assert m[f"corda_trio_p2p_messages_sent_total{{peer={BOB_NAME}}}"] == 0
        assert m[f"corda_trio_bridge_connects_total{{peer={BOB_NAME}}}"] == 0
        assert f"{bob_cfg.p2p_address} failed the TLS identity check" in alice.config.log_path.read_text()
