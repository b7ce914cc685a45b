"""Node start-up benchmark: time from ``corda-trio node start`` to its ready line, with a loaded store.

    python -m bench.node_start [--messages 10000] [--flows 1000] [--runs 3]

A throwaway two-node network (Alice, Bob; directory mode) is bootstrapped; only Alice ever runs, so what
she sends to Bob stays queued. Alice's store is loaded with:

* ``--messages`` P2P messages of 1 KiB durable in her outbound queue to Bob (written through
  ``MessagingService.send_many``, as the node writes them);
* ``--flows`` checkpointed flows: Alice is started, ``--flows`` PingPong flows to Bob are launched over RPC
  (each checkpoints once it has sent its first ping and waits for Bob's answer), and Alice is stopped with
  SIGTERM (the flows stay checkpointed).

Measured, ``--runs`` times each and side by side: process start to ready line for the **empty** node (the
reference: Python start-up, key decryption, TLS contexts, an empty store) and for the **loaded** node (store
recovery of every queue and the checkpoint log, the flow manager resuming the flows). The ratio is the cost
of the load. Target: loaded start to ready within 2 s. The node's modules are compiled once into a
bytecode cache in the run's directory (an installed node has them compiled; the first empty start fills
the cache), so compiling sources is not measured. Also reported: the CPU seconds the node process used up
to its ready line, which a busy machine inflates much less than the wall time. The machine may be shared:
the JSON carries the load average, and ``reference_cpu_ms``, the CPU time of a fixed pure-Python workload
before and after (a virtual CPU can run slower on one day than on another). The last line printed is one
JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from corda_trio import messaging, pki, rpc, store
from corda_trio.testing import cpu_with_helpers, reference_cpu_ms

from ._nodes import NodeProcess, bootstrap

PASSWORD = "bench-password"
ALICE = "O=Alice,L=London,C=GB"
BOB = "O=Bob,L=Paris,C=FR"


def _network(directory: Path) -> tuple[Path, str]:
    alice, bob = bootstrap(directory, [ALICE, BOB], user="bench", password=PASSWORD)
    bob_hash = pki.key_hash(
        pki.read_certificates(bob / "certificates" / "identity.chain.pem")[0].public_key()
    )
    return alice, bob_hash


async def _time_start(node_dir: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the node process) from exec to its ready line."""
    started = time.perf_counter()
    node = await NodeProcess.start(node_dir, bytecode_cache=node_dir.parent.parent / "bytecode")
    elapsed = time.perf_counter() - started
    cpu = cpu_with_helpers(node.process.pid)
    code = await node.stop()
    if code != 0:
        raise SystemExit(f"node exited with {code}")
    return elapsed, cpu


async def _queue_messages(node_dir: Path, bob_hash: str, count: int) -> None:
    name = pki.CordaX500Name.parse(ALICE)
    key_hash = pki.key_hash(
        pki.read_certificates(node_dir / "certificates" / "identity.chain.pem")[0].public_key()
    )
    peers = messaging.PeerDirectory.of(
        [messaging.Peer(legal_name=pki.CordaX500Name.parse(BOB), key_hash=bob_hash, addresses=[])]
    )
    async with store.open_broker(node_dir / "store") as broker:
        service = await messaging.MessagingService.open(
            broker, messaging.MessagingConfig(legal_name=name, key_hash=key_hash), peers
        )
        body = bytes(1024)
        for start in range(0, count, 500):
            batch = [
                service.create_message("bench.start", body, dedup_id=f"bench-{i}")
                for i in range(start, min(count, start + 500))
            ]
            await service.send_many(batch, bob_hash)


async def _checkpoint_flows(node_dir: Path, count: int) -> int:
    node = await NodeProcess.start(node_dir)
    try:
        async with rpc.connect(node.rpc_url, "bench", PASSWORD) as client:
            async with trio.open_nursery() as nursery:
                for _ in range(count):
                    nursery.start_soon(lambda: client.launch_flow("PingPong", recipient=BOB, rounds=1))
            with trio.fail_after(120):
                while len(await client.list_flows("running")) < count:  # noqa: ASYNC110
                    await trio.sleep(0.2)
            running = len(await client.list_flows("running"))
    finally:
        await node.stop()
    return running


async def _run(directory: Path, args: argparse.Namespace) -> dict[str, Any]:
    alice, bob_hash = _network(directory)
    await _time_start(alice)  # fills the bytecode cache (not counted)
    empty = [await _time_start(alice) for _ in range(args.runs)]
    await _queue_messages(alice, bob_hash, args.messages)
    flows = await _checkpoint_flows(alice, args.flows) if args.flows else 0
    loaded = [await _time_start(alice) for _ in range(args.runs)]
    async with store.open_broker(alice / "store") as broker:
        depth = sum(s.depth for s in broker.statistics(messaging.OUTBOUND_PREFIX))
    return {"empty": empty, "loaded": loaded, "flows": flows, "queued": depth}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--flows", type=int, default=1_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    load_before, speed_before = os.getloadavg()[0], reference_cpu_ms()
    with tempfile.TemporaryDirectory(prefix="bench-node-start-") as tmp:
        r = trio.run(_run, Path(tmp), args)
    empty = statistics.median(w for w, _ in r["empty"])
    loaded = statistics.median(w for w, _ in r["loaded"])
    loaded_cpu = statistics.median(c for _, c in r["loaded"])
    summary = {
        "bench": "node_start",
        "queued_messages": r["queued"],
        "checkpointed_flows": r["flows"],
        "ready_seconds_empty_median": round(empty, 3),
        "ready_seconds_loaded_median": round(loaded, 3),
        "ready_seconds_loaded_max": round(max(w for w, _ in r["loaded"]), 3),
        "ready_cpu_seconds_empty_median": round(statistics.median(c for _, c in r["empty"]), 3),
        "ready_cpu_seconds_loaded_median": round(loaded_cpu, 3),
        "ratio_loaded_to_empty": round(loaded / empty, 3),
        "target_seconds": 2.0,
        "runs": args.runs,
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg()[0],
        # how fast the CPU ran Python, before and after (corda_trio.testing.reference_cpu_ms; lower is faster)
        "reference_cpu_ms": [speed_before, reference_cpu_ms()],
    }
    print(
        f"node start to ready: empty {empty:.2f} s, with {r['queued']:,} queued messages and "
        f"{r['flows']:,} checkpointed flows {loaded:.2f} s, {loaded_cpu:.2f} CPU s (median of {args.runs})"
    )
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
