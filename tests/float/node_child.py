"""A p2p node in its own process for the float tests, built from the same parts as tests/bridge/p2p_child.py.

``python node_child.py NODE_DIR run``: broker + messaging service + bridge manager, and either the inbound
acceptor (its own P2P port) or, when NODE_DIR has ``tunnel.json`` (``{"floats": [[host, port], ...],
"credit": N}`` plus ``tunnel.pem`` / ``tunnel.key`` / ``tunnel-ca.pem``), no listener at all and a
:class:`FloatTunnel` to the floats. NODE_DIR holds ``name``, ``tls.pem``, ``tls.key``, ``identity.pem``,
``root.pem`` and optionally ``send.json`` (``{"to", "count", "start", "batch", "interval", "expect"}``;
``"idle_timeout_seconds"`` there or in ``tunnel.json``: the AMQP idle timeout of its bridges, acceptor and
tunnel, default 10). ``tunnel.json`` may also hold ``"backoff": [initial, max]``, the tunnel's round backoff
(absent: ``TunnelConfig``'s defaults, as in a node), and ``"handshake_timeout_seconds"``.
Peers come from ``../peers.json`` (``corda_trio.testing.write_peer_file`` / ``follow_peer_file``). Prints
``ready PORT`` (``ready -`` behind a float), ``active HOST PORT`` on every activation,
``sent I`` once message I is durable, and ``done`` when everything was sent and ``expect`` messages handled.

``python node_child.py NODE_DIR dump``: prints the committed receipts as JSON, then exits.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Any

import trio

from corda_trio import bridge, messaging, pki, store, testing
from corda_trio.bridge import float as fl

TOPIC = "test.p2p"


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def _report_activations(tunnel: fl.FloatTunnel) -> None:
    # By count, not by watching public_address go None: a failover can take less than any poll interval.
    seen = 0
    while True:
        seen, (host, port) = await tunnel.wait_activation(seen)
        _say(f"active {host} {port}")


def tunnel_options(tunnel_plan: dict[str, Any]) -> dict[str, float]:
    """``TunnelConfig`` keywords from ``tunnel.json``'s ``backoff`` and ``handshake_timeout_seconds``."""
    options = {}
    if "backoff" in tunnel_plan:
        initial, maximum = tunnel_plan["backoff"]
        options["initial_backoff_seconds"], options["max_backoff_seconds"] = float(initial), float(maximum)
    if "handshake_timeout_seconds" in tunnel_plan:
        options["handshake_timeout_seconds"] = float(tunnel_plan["handshake_timeout_seconds"])
    return options


async def run(node_dir: Path) -> None:
    name = pki.CordaX500Name.parse((node_dir / "name").read_text())
    root = pki.read_certificate(node_dir / "root.pem")
    tls = {"cert_chain": node_dir / "tls.pem", "key": node_dir / "tls.key", "trust_root": root}
    key_hash = pki.key_hash(pki.read_certificates(node_dir / "identity.pem")[0].public_key())
    plan = json.loads((node_dir / "send.json").read_text()) if (node_dir / "send.json").exists() else {}
    tunnel_plan = (
        json.loads((node_dir / "tunnel.json").read_text()) if (node_dir / "tunnel.json").exists() else None
    )
    # (``idle_timeout_seconds`` in either: the AMQP idle timeout of its bridges, acceptor and tunnel)
    timeouts = {**plan, **(tunnel_plan or {})}
    idle = (
        {"idle_timeout_seconds": float(timeouts["idle_timeout_seconds"])}
        if "idle_timeout_seconds" in timeouts
        else {}
    )
    peers = messaging.PeerDirectory()
    async with store.open_broker(node_dir / "store") as broker, trio.open_nursery() as nursery:
        config = messaging.MessagingConfig(legal_name=name, key_hash=key_hash)
        service = await messaging.MessagingService.open(broker, config, peers)
        manager = bridge.BridgeManager(
            messaging=service,
            resolver=peers,
            ssl_context=pki.client_ssl_context(**tls),  # type: ignore[arg-type]
            config=bridge.BridgeConfig(initial_backoff_seconds=0.1, max_backoff_seconds=1.0, **idle),
        )

        async def handler(message: messaging.ReceivedMessage) -> bytes:
            return message.data

        service.add_message_handler(TOPIC, handler)
        if tunnel_plan is None:
            acceptor = bridge.InboundAcceptor(
                inbox=service.inbox,
                ssl_context=pki.server_ssl_context(**tls),  # type: ignore[arg-type]
                config=bridge.AcceptorConfig(**idle),
            )
            port = str(await nursery.start(acceptor.run))
        else:
            creds = fl.TunnelCredentials.read(
                node_dir / "tunnel.pem", node_dir / "tunnel.key", node_dir / "tunnel-ca.pem"
            )
            tunnel = fl.FloatTunnel(
                inbox=service.inbox,
                tunnel_context=creds.client_context(),
                config=fl.TunnelConfig(
                    floats=tunnel_plan["floats"],
                    credit=int(tunnel_plan.get("credit", 256)),
                    **tunnel_options(tunnel_plan),
                    **idle,
                ),
                resolver=peers,
            )
            await nursery.start(tunnel.run)
            nursery.start_soon(_report_activations, tunnel)
            port = "-"
        await nursery.start(manager.run)
        await nursery.start(service.run)
        peer_file = node_dir.parent / "peers.json"
        follow = functools.partial(testing.follow_peer_file, peer_file, peers, own_key_hash=key_hash)
        nursery.start_soon(follow)
        _say(f"ready {port}")
        if plan:
            to = pki.CordaX500Name.parse(plan["to"])
            while peers.peer_named(to) is None:
                await peers.wait_changed(peers.version)
            count, batch = int(plan["count"]), int(plan.get("batch", 100))
            for start in range(int(plan.get("start", 0)), count, batch):
                ids = range(start, min(count, start + batch))
                await service.send_many(
                    [
                        service.create_message(TOPIC, b"%d" % i, dedup_id=f"{name.organisation}-{i}")
                        for i in ids
                    ],
                    to,
                )
                _say(f"sent {ids[-1]}")
                await trio.sleep(float(plan.get("interval", 0)))
            queue = await service.outbound_queue_for(peers.peer_named(to).key_hash)  # type: ignore[union-attr]
            while queue.statistics().depth:  # noqa: ASYNC110
                await trio.sleep(0.05)
        expect = (
            int(plan.get("expect", 0)) if plan else int(tunnel_plan.get("expect", 0)) if tunnel_plan else 0
        )
        while len(service.deduplicator) < expect:  # noqa: ASYNC110
            await trio.sleep(0.05)
        _say("done")
        await trio.sleep_forever()


async def dump(node_dir: Path) -> None:
    async with store.open_broker(node_dir / "store") as broker:
        dedup = await messaging.Deduplicator.open(broker)
        print(json.dumps([[i.rpartition("\x00")[2], r.decode()] for i, r in dedup.receipts()]))


if __name__ == "__main__":
    directory, mode = Path(sys.argv[1]), sys.argv[2]
    trio.run(run if mode == "run" else dump, directory)
