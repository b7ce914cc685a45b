"""A flow node in its own process, for kill -9 tests and benchmarks.

    python -m corda_trio.testing._flow_process NODE_DIR run [--import MODULE]...
    python -m corda_trio.testing._flow_process NODE_DIR dump [--import MODULE]...

NODE_DIR holds ``name`` (legal name), ``tls.pem``, ``tls.key``, ``identity.pem``, ``root.pem`` and optionally
``plan.json``; the peers come from ``../peers.json`` (a list of ``{"name", "key_hash", "host", "port"}``,
re-read every 50 ms: the stand-in for the network map). ``--import`` loads modules that register flows.

``run`` starts broker, messaging service, acceptor, bridge manager and flow manager; prints ``ready PORT``.
With a plan ``{"flow": name, "args": {...}, "count": N, "concurrency": C, "rate": R (optional, open loop),
"prefix": client id prefix}`` it starts flow ``i`` for ``i in range(N)`` with client id ``<prefix><i>``
(idempotent across restarts), ``{i}`` in string arguments replaced by ``i``, at most ``C`` at once (closed
loop) or one every ``1/R`` s (open loop), writes ``[i, intended_ns, started_ns, finished_ns]`` per flow to
``latencies.json`` and prints ``done``. ``dump`` prints every record of the checkpoint log as JSON
(``flow_id``, ``flow_name``, ``status``, ``result``, ``error``), the ledger of what the flows did.
"""

from __future__ import annotations

import importlib
import json
import sys
import time
from pathlib import Path
from typing import Any

import trio

from corda_trio import bridge, flows, messaging, pki, store


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def _follow_peers(path: Path, own: str, directory: messaging.PeerDirectory) -> None:
    last = b""
    while True:
        try:
            raw = path.read_bytes()  # noqa: ASYNC240 (a small local file)
        except FileNotFoundError:
            raw = b"[]"
        if raw != last:
            last = raw
            entries = json.loads(raw)
            for e in entries:
                if e["key_hash"] != own:
                    directory.put(
                        messaging.Peer(
                            legal_name=pki.CordaX500Name.parse(e["name"]),
                            key_hash=e["key_hash"],
                            addresses=[(e["host"], e["port"])],
                        )
                    )
        await trio.sleep(0.05)


def _args(template: dict[str, Any], i: int) -> dict[str, Any]:
    return {k: v.replace("{i}", str(i)) if isinstance(v, str) else v for k, v in template.items()}


async def _run_plan(manager: flows.FlowManager, plan: dict[str, Any], node_dir: Path) -> None:
    count, prefix = int(plan["count"]), str(plan.get("prefix", ""))
    times: dict[int, list[int]] = {}

    async def one(i: int, intended: int) -> None:
        started = time.time_ns()
        handle = await manager.start_flow(plan["flow"], client_id=f"{prefix}{i}", **_args(plan["args"], i))
        try:
            await handle.result()
        except flows.FlowException:
            pass  # the ledger (dump) tells what happened
        times[i] = [i, intended, started, time.time_ns()]

    async with trio.open_nursery() as nursery:
        rate = plan.get("rate")
        if rate:
            start = time.time_ns() + 20_000_000
            for i in range(count):
                intended = start + int(i * 1e9 / rate)
                delay = (intended - time.time_ns()) / 1e9
                if delay > 0:
                    await trio.sleep(delay)
                nursery.start_soon(one, i, intended)
        else:
            limiter = trio.CapacityLimiter(int(plan.get("concurrency", 100)))

            async def limited(i: int) -> None:
                async with limiter:
                    await one(i, time.time_ns())

            for i in range(count):
                await limiter.acquire()  # keep the nursery from holding N waiting tasks
                limiter.release()
                nursery.start_soon(limited, i)
    (node_dir / "latencies.json").write_text(json.dumps(sorted(times.values())))
    _say("done")


async def run(node_dir: Path) -> None:
    name = pki.CordaX500Name.parse((node_dir / "name").read_text())
    root = pki.read_certificate(node_dir / "root.pem")
    tls = {"cert_chain": node_dir / "tls.pem", "key": node_dir / "tls.key", "trust_root": root}
    key_hash = pki.key_hash(pki.read_certificates(node_dir / "identity.pem")[0].public_key())
    plan = json.loads((node_dir / "plan.json").read_text()) if (node_dir / "plan.json").exists() else {}
    peers = messaging.PeerDirectory()
    async with store.open_broker(node_dir / "store") as broker, trio.open_nursery() as nursery:
        config = messaging.MessagingConfig(legal_name=name, key_hash=key_hash, inbox_credit=4096)
        service = await messaging.MessagingService.open(broker, config, peers)
        acceptor = bridge.InboundAcceptor(
            inbox=service.inbox,
            ssl_context=pki.server_ssl_context(**tls),  # type: ignore[arg-type]
            config=bridge.AcceptorConfig(credit=1024),
        )
        bridges = bridge.BridgeManager(
            messaging=service,
            resolver=peers,
            ssl_context=pki.client_ssl_context(**tls),  # type: ignore[arg-type]
            config=bridge.BridgeConfig(credit=1024, initial_backoff_seconds=0.1, max_backoff_seconds=1.0),
        )
        manager = await flows.FlowManager.open(
            service, config=flows.FlowManagerConfig(finished_retain=int(plan.get("retain", 100_000)))
        )
        port = await nursery.start(acceptor.run)
        await nursery.start(bridges.run)
        await nursery.start(service.run)
        await nursery.start(manager.run)
        nursery.start_soon(_follow_peers, node_dir.parent / "peers.json", key_hash, peers)
        _say(f"ready {port}")
        if plan.get("flow"):
            if plan.get("wait_for_peers"):
                while len(peers.peers()) < int(plan["wait_for_peers"]):
                    await peers.wait_changed(peers.version)
            await _run_plan(manager, plan, node_dir)
        await trio.sleep_forever()


async def dump(node_dir: Path) -> None:
    async with store.open_broker(node_dir / "store") as broker:
        log = await broker.open_keyed_log(flows.CHECKPOINT_LOG)
        out = []
        for key, data in log.items():
            try:
                state = flows.decode_checkpoint(data)
            except flows.PayloadError as exc:
                out.append({"flow_id": key.decode(), "status": "unreadable", "error": str(exc)})
                continue
            out.append(
                {
                    "flow_id": state.flow_id,
                    "flow_name": state.flow_name,
                    "status": state.status,
                    "result": state.result,
                    "error": None if state.error is None else state.error[1],
                }
            )
        print(json.dumps(out, default=repr))


def main(argv: list[str]) -> None:
    directory, mode, rest = Path(argv[0]), argv[1], argv[2:]
    for i, arg in enumerate(rest):
        if arg == "--import":
            importlib.import_module(rest[i + 1])
    trio.run(run if mode == "run" else dump, directory)


if __name__ == "__main__":
    main(sys.argv[1:])
