"""RPC benchmark: small calls per second from one client over one websocket, against a real node process.

    python -m bench.rpc [--seconds 5] [--in-flight 32]

A throwaway one-node network is bootstrapped and ``corda-trio node start`` runs it in its own process. The
client (this process) logs in once and calls ``ping`` (a logged-in call with permission check, msgpack
frames both ways) in two patterns, each for ``--seconds``:

* **sequential**: one call at a time, each waits for its answer (round-trip bound);
* **pipelined**: ``--in-flight`` tasks share the one connection, so that many calls are in flight.

Reference, side by side: the same two patterns against a bare trio-websocket echo server in its own
process (no msgpack, no login, no dispatch), so the ratio is what our protocol and server cost on top of the
websocket library. Also reported for the node: CPU microseconds per call in the client and in the node
process, which a busy machine inflates much less than it cuts the calls per second (a sequential call is
a round trip between two processes: on a loaded machine each side waits for a CPU). The machine may be
shared: the JSON carries the load average, and ``reference_cpu_ms``, the CPU time of a fixed pure-Python
workload before and after (a virtual CPU can run slower on one day than on another). The last line printed
is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio
import trio_websocket

from corda_trio import rpc
from corda_trio.testing import cpu_with_helpers, reference_cpu_ms

from ._nodes import NodeProcess, bootstrap

PASSWORD = "bench-password"

ECHO_SERVER = """
import sys, trio, trio_websocket
async def handler(request):
    ws = await request.accept()
    try:
        while True:
            await ws.send_message(await ws.get_message())
    except trio_websocket.ConnectionClosed:
        pass
async def main():
    async with trio.open_nursery() as n:
        server = await n.start(trio_websocket.serve_websocket, handler, "127.0.0.1", 0, None)
        print(server.port, flush=True)
trio.run(main)
"""


async def _measure(call: Any, seconds: float, in_flight: int) -> float:
    """Calls per second of ``call()`` with ``in_flight`` concurrent callers for ``seconds``."""
    count = 0
    deadline = trio.current_time() + seconds

    async def worker() -> None:
        nonlocal count
        while trio.current_time() < deadline:
            await call()
            count += 1

    started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(in_flight):
            nursery.start_soon(worker)
    return count / (time.perf_counter() - started)


async def _bench_node(directory: Path, seconds: float, in_flight: int) -> dict[str, float]:
    (node_dir,) = bootstrap(directory / "net", ["O=Bench,L=London,C=GB"], user="bench", password=PASSWORD)
    node = await NodeProcess.start(node_dir)
    out: dict[str, float] = {}
    calls = 0

    async def ping() -> None:
        nonlocal calls
        await client.ping()
        calls += 1

    try:
        async with rpc.connect(node.rpc_url, "bench", PASSWORD) as client:
            await _measure(client.ping, 0.5, 1)  # warm-up
            for pattern, width in (("sequential", 1), ("pipelined", in_flight)):
                calls = 0
                client_cpu, node_cpu = time.process_time(), cpu_with_helpers(node.process.pid)
                out[pattern] = await _measure(ping, seconds, width)
                out[f"client_cpu_us_{pattern}"] = (time.process_time() - client_cpu) / calls * 1e6
                out[f"node_cpu_us_{pattern}"] = (cpu_with_helpers(node.process.pid) - node_cpu) / calls * 1e6
    finally:
        await node.stop()
    return out


async def _bench_echo(seconds: float, in_flight: int) -> dict[str, float]:
    proc = await trio.lowlevel.open_process([sys.executable, "-c", ECHO_SERVER], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        line = b""
        while not line.endswith(b"\n"):
            line += await proc.stdout.receive_some(64)
        port = int(line)
        async with trio_websocket.open_websocket_url(f"ws://127.0.0.1:{port}", message_queue_size=1024) as ws:
            lock = trio.Lock()
            waiting: list[trio.Event] = []

            # One reader for the shared connection, as the RPC client has.
            async def call() -> None:
                done = trio.Event()
                async with lock:
                    waiting.append(done)
                    await ws.send_message(b"\x81\xa4ping\x00")
                await done.wait()

            async def reader() -> None:
                while True:
                    await ws.get_message()
                    waiting.pop(0).set()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(reader)
                await _measure(call, 0.5, 1)
                sequential = await _measure(call, seconds, 1)
                pipelined = await _measure(call, seconds, in_flight)
                nursery.cancel_scope.cancel()
    finally:
        proc.kill()
        await proc.wait()
    return {"sequential": sequential, "pipelined": pipelined}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--in-flight", type=int, default=32)
    args = parser.parse_args(argv)
    load_before, speed_before = os.getloadavg()[0], reference_cpu_ms()
    with tempfile.TemporaryDirectory(prefix="bench-rpc-") as tmp:
        node = trio.run(_bench_node, Path(tmp), args.seconds, args.in_flight)
    echo = trio.run(_bench_echo, args.seconds, args.in_flight)
    summary = {
        "bench": "rpc",
        "rpc_calls_per_s_sequential": round(node["sequential"]),
        "rpc_calls_per_s_pipelined": round(node["pipelined"]),
        "in_flight": args.in_flight,
        "rpc_client_cpu_us_per_call_sequential": round(node["client_cpu_us_sequential"]),
        "rpc_node_cpu_us_per_call_sequential": round(node["node_cpu_us_sequential"]),
        "rpc_client_cpu_us_per_call_pipelined": round(node["client_cpu_us_pipelined"]),
        "rpc_node_cpu_us_per_call_pipelined": round(node["node_cpu_us_pipelined"]),
        "ws_echo_per_s_sequential": round(echo["sequential"]),
        "ws_echo_per_s_pipelined": round(echo["pipelined"]),
        "ratio_sequential": round(node["sequential"] / echo["sequential"], 3),
        "ratio_pipelined": round(node["pipelined"] / echo["pipelined"], 3),
        "target_calls_per_s": 2000,
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg()[0],
        # how fast the CPU ran Python, before and after (corda_trio.testing.reference_cpu_ms; lower is faster)
        "reference_cpu_ms": [speed_before, reference_cpu_ms()],
    }
    print(
        f"RPC ping, one client, one websocket: {summary['rpc_calls_per_s_sequential']:,} calls/s sequential, "
        f"{summary['rpc_calls_per_s_pipelined']:,} calls/s with {args.in_flight} in flight "
        f"(bare websocket echo: {summary['ws_echo_per_s_sequential']:,} / "
        f"{summary['ws_echo_per_s_pipelined']:,})"
    )
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
