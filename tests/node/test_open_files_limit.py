"""A real node under a low open-file limit (``ulimit -n 64``, the child's ``RLIMIT_NOFILE``) whose listeners
are flooded with idle TCP connections, many more than the limit, while its RPC user starts flows to peers it
never sent to (each needs a new durable queue: a directory and a segment file, and a bridge socket).

Before the node planned its listeners' caps for the limit (``corda_trio.node._descriptors``), the flood took
every descriptor (RPC alone allowed 256 connections, and refused 32 more at a time) and the first new queue
failed with ``EMFILE``: the node stopped (``error: ...: Too many open files: .../store``). Now it warns at
start, naming the limit, its listeners take what the limit leaves after a reserve for the store, the flows
finish and the node keeps serving."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import trio

from corda_trio import rpc
from corda_trio.node._processes import open_node_processes, start_node_process

from .netutil import PASSWORD, make_network
from .test_flows_e2e import ALICE, BOB, CAROL, wait_for_peers

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(sys.platform != "linux", reason="counts the node's descriptors in /proc"),
]

LIMIT = 64


def _host_port(url: str) -> tuple[str, int]:
    host, port = url.split("//", 1)[-1].split("/", 1)[0].rsplit(":", 1)
    return host, int(port)


async def test_a_flood_of_connections_under_ulimit_64_leaves_descriptors_to_the_store(tmp_path: Path) -> None:
    nodes = make_network(tmp_path / "net", [ALICE, BOB, CAROL], shutdown_timeout_seconds=0.5)
    (alice_path, alice_cfg), *others = nodes
    console = tmp_path / "alice.stderr"
    async with open_node_processes(others, stop_timeout_seconds=5):
        alice = await start_node_process(alice_path, alice_cfg, console=console, open_files_limit=LIMIT)
        try:
            warning, *_ = console.read_text().splitlines()
            assert f"the open-file limit (ulimit -n) is {LIMIT}, below the " in warning, warning
            assert "its listeners take at most p2p " in warning, warning
            async with rpc.connect(alice.rpc_url, "ops", PASSWORD) as a:
                await wait_for_peers(a, 3)
                assert alice.metrics_url is not None
                targets = [_host_port(u) for u in (alice.rpc_url, alice.addresses["p2p"], alice.metrics_url)]
                flood: list[trio.SocketStream] = []
                try:
                    for _ in range(2 * LIMIT):
                        for host, port in targets:
                            flood.append(await trio.open_tcp_stream(host, port))
                    await trio.sleep(1)  # (accepted or refused as far as the node goes)
                    with trio.fail_after(30):
                        ids = [await a.launch_flow("PingPong", recipient=p, rounds=2) for p in (CAROL, BOB)]
                        results = [await a.flow_result(i) for i in ids]
                    assert [(r["state"], r["result"]) for r in results] == [("finished", 2)] * 2, results
                    assert alice.process.returncode is None
                    held = len(os.listdir(f"/proc/{alice.process.pid}/fd"))
                    assert held < LIMIT, held
                finally:
                    for stream in flood:
                        await stream.aclose()
            # the flood gone, a new client is served
            with trio.fail_after(30):
                async with rpc.connect(alice.rpc_url, "ops", PASSWORD) as again:
                    assert await again.ping() == "pong"
        finally:
            code = await alice.stop()
    assert code == 0, console.read_text()
    text = console.read_text()
    assert "error:" not in text and "Too many open files" not in text, text
    assert "Traceback" not in alice_cfg.log_path.read_text()
