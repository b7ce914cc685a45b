"""A flow node in its own process, for kill -9 tests and benchmarks.

    python -m corda_trio.testing._flow_process NODE_DIR run [--import MODULE]...
    python -m corda_trio.testing._flow_process NODE_DIR dump [--import MODULE]...

NODE_DIR holds ``name`` (legal name), ``tls.pem``, ``tls.key``, ``identity.pem``, ``root.pem`` and optionally
``plan.json``; the peers come from ``../peers.json`` (written by :func:`write_peer_file`, followed with
:func:`follow_peer_file`: the stand-in for the network map). ``--import`` loads modules that register flows. A
plan's ``"retain"`` and ``"bundle"`` set those ``FlowManagerConfig`` fields (``finished_retain``, ``bundle``).

``run`` starts broker, messaging service, acceptor, bridge manager and flow manager; prints ``ready PORT``.
With a plan ``{"flow": name, "args": {...}, "count": N, "concurrency": C, "rate": R (optional, open loop),
"prefix": client id prefix}`` it starts flow ``i`` for ``i in range(N)`` with client id ``<prefix><i>``
(idempotent across restarts), ``{i}`` in string arguments replaced by ``i``, at most ``C`` at once (closed
loop) or one every ``1/R`` s (open loop), writes ``[i, intended_ns, started_ns, finished_ns]`` per flow to
``latencies-<phase>.json`` and prints ``phase K start``, ``phase K done {json}`` and ``done`` (a plan may list
``phases``, see ``_run_plan``). ``dump`` prints every record of the checkpoint log as JSON
(``flow_id``, ``flow_name``, ``status``, ``result``, ``error``), the ledger of what the flows did.
"""

from __future__ import annotations

import functools
import importlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import trio

from corda_trio import bridge, flows, messaging, pki, store

from ._cpu import cpu_with_helpers
from ._peer_file import follow_peer_file


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _args(template: dict[str, Any], i: int) -> dict[str, Any]:
    return {k: v.replace("{i}", str(i)) if isinstance(v, str) else v for k, v in template.items()}


async def _run_phase(manager: flows.FlowManager, plan: dict[str, Any], rate: float | None) -> list[list[int]]:
    count, prefix = int(plan["count"]), str(plan.get("prefix", ""))
    times: list[list[int]] = []

    async def one(i: int, intended: int) -> None:
        started = time.time_ns()
        handle = await manager.start_flow(plan["flow"], _args(plan["args"], i), client_id=f"{prefix}{i}")
        try:
            await handle.result()
        except flows.FlowException:
            pass  # the ledger (dump) tells what happened
        times.append([i, intended, started, time.time_ns()])

    async with trio.open_nursery() as nursery:
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
                try:
                    await one(i, time.time_ns())
                finally:
                    limiter.release_on_behalf_of(i)

            for i in range(count):
                await limiter.acquire_on_behalf_of(i)
                nursery.start_soon(limited, i)
    return sorted(times)


async def _run_plan(manager: flows.FlowManager, plan: dict[str, Any], node_dir: Path) -> None:
    """Run the plan's phases (``plan["phases"]``, or the plan itself as one phase); each phase may set
    ``rate`` (open loop, flows/s) or ``rate_factor`` (open loop at that fraction of the previous phase's
    throughput), and a ``count`` of -1 with ``seconds`` for as many flows as that rate gives."""
    phases = plan.get("phases") or [plan]
    previous_rate: float | None = None
    for k, phase in enumerate(phases):
        phase = {**plan, **phase}
        rate = phase.get("rate")
        if phase.get("rate_factor") and previous_rate:
            rate = previous_rate * float(phase["rate_factor"])
        if int(phase["count"]) < 0:  # as many as the rate gives in ``seconds``
            phase["count"] = max(1, int((rate or 0) * float(phase["seconds"])))
        cpu0, t0 = cpu_with_helpers(os.getpid()), time.time_ns()
        _say(f"phase {k} start")
        times = await _run_phase(manager, phase, rate)
        t1 = time.time_ns()
        cpu = cpu_with_helpers(os.getpid()) - cpu0
        previous_rate = len(times) / ((t1 - t0) / 1e9)
        (node_dir / f"latencies-{k}.json").write_text(json.dumps(times))
        info = {"phase": k, "flows": len(times), "seconds": (t1 - t0) / 1e9, "cpu_seconds": cpu, "rate": rate}
        _say(f"phase {k} done {json.dumps(info)}")
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
            service,
            config=flows.FlowManagerConfig(
                finished_retain=int(plan.get("retain", 100_000)), bundle=bool(plan.get("bundle", True))
            ),
        )
        port = await nursery.start(acceptor.run)
        await nursery.start(bridges.run)
        await nursery.start(service.run)
        await nursery.start(manager.run)
        peer_file = node_dir.parent / "peers.json"
        nursery.start_soon(functools.partial(follow_peer_file, peer_file, peers, own_key_hash=key_hash))
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
        for flow_id, data in flows.checkpoint_records(log):
            try:
                state = flows.decode_checkpoint(data)
            except flows.PayloadError as exc:
                out.append({"flow_id": flow_id, "status": "unreadable", "error": str(exc)})
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
