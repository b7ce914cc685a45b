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
of the load. Target: loaded start to ready within 2 s. The machine may be shared: the JSON carries the load
average. The last line printed is one JSON object.
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

import attrs
import trio

from corda_trio import messaging, pki, rpc, store
from corda_trio.node import _config
from corda_trio.node._cli_network import create_network
from corda_trio.node._processes import open_node_processes, start_node_process

PASSWORD = "bench-password"
ALICE = "O=Alice,L=London,C=GB"
BOB = "O=Bob,L=Paris,C=FR"


def _network(directory: Path) -> tuple[Path, _config.NodeConfig, str]:
    net = create_network(directory, [pki.CordaX500Name.parse(n) for n in (ALICE, BOB)], map_port=None)
    alice, bob = net.nodes
    path = alice.directory / "node.toml"
    user = rpc.RpcUser(
        username="bench", password_hash=rpc.hash_password(PASSWORD), permissions=frozenset({"admin"})
    )
    cfg = attrs.evolve(_config.load_node_config(path), rpc_users=(user,), shutdown_timeout_seconds=2.0)
    path.write_text(_config.dump_node_config(cfg, alice.directory), encoding="utf-8")
    return path, _config.load_node_config(path), bob.identity_key_hash


async def _time_start(path: Path, cfg: _config.NodeConfig) -> float:
    started = time.perf_counter()
    proc = await start_node_process(path, cfg)
    elapsed = time.perf_counter() - started
    code = await proc.stop()
    if code != 0:
        raise SystemExit(f"node exited with {code}:\n{proc.console_tail()}")
    return elapsed


async def _queue_messages(cfg: _config.NodeConfig, bob_hash: str, count: int) -> None:
    key_hash = pki.key_hash(pki.read_certificates(cfg.identity_cert_chain)[0].public_key())
    peers = messaging.PeerDirectory.of(
        [messaging.Peer(legal_name=pki.CordaX500Name.parse(BOB), key_hash=bob_hash, addresses=[])]
    )
    async with store.open_broker(cfg.store_directory) as broker:
        service = await messaging.MessagingService.open(
            broker, messaging.MessagingConfig(legal_name=cfg.legal_name, key_hash=key_hash), peers
        )
        body = bytes(1024)
        for start in range(0, count, 500):
            batch = [
                service.create_message("bench.start", body, dedup_id=f"bench-{i}")
                for i in range(start, min(count, start + 500))
            ]
            await service.send_many(batch, bob_hash)


async def _checkpoint_flows(path: Path, cfg: _config.NodeConfig, count: int) -> int:
    async with open_node_processes([(path, cfg)]) as (proc,):
        async with rpc.connect(proc.rpc_url, "bench", PASSWORD) as client:
            async with trio.open_nursery() as nursery:
                for _ in range(count):
                    nursery.start_soon(lambda: client.launch_flow("PingPong", recipient=BOB, rounds=1))
            with trio.fail_after(120):
                while len(await client.list_flows("running")) < count:  # noqa: ASYNC110
                    await trio.sleep(0.2)
            running = len(await client.list_flows("running"))
    return running


async def _run(directory: Path, args: argparse.Namespace) -> dict[str, Any]:
    path, cfg, bob_hash = _network(directory)
    empty = [await _time_start(path, cfg) for _ in range(args.runs)]
    await _queue_messages(cfg, bob_hash, args.messages)
    flows = await _checkpoint_flows(path, cfg, args.flows) if args.flows else 0
    loaded = [await _time_start(path, cfg) for _ in range(args.runs)]
    async with store.open_broker(cfg.store_directory) as broker:
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
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-node-start-") as tmp:
        r = trio.run(_run, Path(tmp), args)
    empty, loaded = statistics.median(r["empty"]), statistics.median(r["loaded"])
    summary = {
        "bench": "node_start",
        "queued_messages": r["queued"],
        "checkpointed_flows": r["flows"],
        "ready_seconds_empty_median": round(empty, 3),
        "ready_seconds_loaded_median": round(loaded, 3),
        "ready_seconds_loaded_max": round(max(r["loaded"]), 3),
        "ratio_loaded_to_empty": round(loaded / empty, 3),
        "target_seconds": 2.0,
        "runs": args.runs,
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg()[0],
    }
    print(
        f"node start to ready: empty {empty:.2f} s, with {r['queued']:,} queued messages and "
        f"{r['flows']:,} checkpointed flows {loaded:.2f} s (median of {args.runs})"
    )
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
