"""A p2p node in its own process, for the real-process tests (``test_processes.py``).

``python p2p_child.py NODE_DIR run``: runs broker + messaging service + inbound acceptor + bridge manager.
NODE_DIR holds ``name``, ``tls.pem``, ``tls.key``, ``identity.pem``, ``root.pem`` and optionally ``send.json``
(``{"to": legal name, "count": N, "start": K, "batch": B, "expect": M,
"interval": seconds between batches, "trace": print ``handled ID`` on each handler call, "body_size":
bytes of each body (default: just ``I``; else ``I|`` then filler, see :func:`body`), "idle_timeout_seconds":
the AMQP idle timeout of its acceptor, bridges and local endpoint (default 10; the test writes it into the
bridge process's bridge.toml too), "log": print the ``corda_trio`` log (INFO and up) as ``log LEVEL
LOGGER: MESSAGE`` lines}``); the peers come
from ``../peers.json`` (``corda_trio.testing.write_peer_file``, followed by ``follow_peer_file``: the test's
stand-in for the network map cache).
Prints ``ready PORT`` once listening, ``sent I`` after message I (and all before it) is durable, and ``done``
once it has sent everything, its outbound queue is empty and it handled ``expect`` messages (``expect`` in
``send.json``). The handler returns the message body as its receipt, committed with the dedup id.

``python p2p_child.py NODE_DIR endpoint``: the same node, but instead of an acceptor and bridge manager it
serves its local endpoint (user ``bridge``, password from ``NODE_DIR/bridge.password``) for a bridge started
with ``corda-trio bridge start``; prints ``endpoint PORT`` (and ``ready PORT`` is not printed: the bridge
process prints where it listens).

``python p2p_child.py NODE_DIR dump``: prints the committed receipts as JSON (the ledger of what handlers
did; receipts as Latin-1 text), then exits.
"""

from __future__ import annotations

import functools
import json
import logging
import sys
from pathlib import Path

import trio

from corda_trio import bridge, messaging, pki, store, testing

TOPIC = "test.p2p"


def body(i: int, size: int = 0) -> bytes:
    """The body of message ``i``: its number, padded with filler to ``size`` bytes when that is longer (each
    body differs from every other, so the ledger shows a message handed over with another one's body)."""
    head = b"%d" % i
    if size <= len(head):
        return head
    head += b"|"
    return head + (bytes(range(256)) * (size // 256 + 1))[: size - len(head)]


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def run(node_dir: Path, external: bool = False) -> None:
    name = pki.CordaX500Name.parse((node_dir / "name").read_text())
    root = pki.read_certificate(node_dir / "root.pem")
    tls = {"cert_chain": node_dir / "tls.pem", "key": node_dir / "tls.key", "trust_root": root}
    server_ctx = pki.server_ssl_context(**tls)  # type: ignore[arg-type]
    client_ctx = pki.client_ssl_context(**tls)  # type: ignore[arg-type]
    key_hash = pki.key_hash(pki.read_certificates(node_dir / "identity.pem")[0].public_key())
    plan = json.loads((node_dir / "send.json").read_text()) if (node_dir / "send.json").exists() else {}
    if plan.get("log"):
        logging.basicConfig(
            stream=sys.stdout, level=logging.INFO, format="log %(levelname)s %(name)s: %(message)s"
        )
    idle = (
        {"idle_timeout_seconds": float(plan["idle_timeout_seconds"])}
        if "idle_timeout_seconds" in plan
        else {}
    )
    peers = messaging.PeerDirectory()
    async with store.open_broker(node_dir / "store") as broker, trio.open_nursery() as nursery:
        config = messaging.MessagingConfig(legal_name=name, key_hash=key_hash)
        service = await messaging.MessagingService.open(broker, config, peers)
        expect = int(plan.get("expect", 0))

        trace = bool(plan.get("trace"))

        async def handler(message: messaging.ReceivedMessage) -> bytes:
            if trace:  # every hand-over to the handler, for tests that count them
                _say(f"handled {message.dedup_id}")
            return message.data

        service.add_message_handler(TOPIC, handler)
        if external:
            endpoint = bridge.LocalEndpoint(
                messaging=service,
                resolver=peers,
                config=bridge.EndpointConfig(
                    username="bridge", password=(node_dir / "bridge.password").read_text().strip(), **idle
                ),
            )
            port = await nursery.start(endpoint.run)
        else:
            acceptor = bridge.InboundAcceptor(
                inbox=service.inbox,
                ssl_context=server_ctx,
                on_checked=service.remember_received,
                config=bridge.AcceptorConfig(**idle),
            )
            manager = bridge.BridgeManager(
                messaging=service,
                resolver=peers,
                ssl_context=client_ctx,
                config=bridge.BridgeConfig(initial_backoff_seconds=0.1, max_backoff_seconds=1.0, **idle),
            )
            port = await nursery.start(acceptor.run)
            await nursery.start(manager.run)
        await nursery.start(service.run)
        peer_file = node_dir.parent / "peers.json"
        follow = functools.partial(testing.follow_peer_file, peer_file, peers, own_key_hash=key_hash)
        nursery.start_soon(follow)
        _say(f"endpoint {port}" if external else f"ready {port}")
        if plan:
            to = pki.CordaX500Name.parse(plan["to"])
            while peers.peer_named(to) is None:
                await peers.wait_changed(peers.version)
            count, batch = int(plan["count"]), int(plan.get("batch", 100))
            size = int(plan.get("body_size", 0))
            for start in range(int(plan.get("start", 0)), count, batch):
                ids = range(start, min(count, start + batch))
                await service.send_many(
                    [
                        service.create_message(TOPIC, body(i, size), dedup_id=f"{name.organisation}-{i}")
                        for i in ids
                    ],
                    to,
                )
                _say(f"sent {ids[-1]}")
                await trio.sleep(float(plan.get("interval", 0)))
            queue = await service.outbound_queue_for(peers.peer_named(to).key_hash)  # type: ignore[union-attr]
            while queue.statistics().depth:  # noqa: ASYNC110
                await trio.sleep(0.05)
            while len(service.deduplicator) < expect:  # noqa: ASYNC110
                await trio.sleep(0.05)
            _say("done")
        await trio.sleep_forever()


async def dump(node_dir: Path) -> None:
    async with store.open_broker(node_dir / "store") as broker:
        dedup = await messaging.Deduplicator.open(broker)
        print(
            json.dumps([[i.rpartition("\x00")[2], r.decode("latin-1")] for i, r in dedup.receipts()])
        )  # any bytes


if __name__ == "__main__":
    directory, mode = Path(sys.argv[1]), sys.argv[2]
    if mode == "dump":
        trio.run(dump, directory)
    else:
        trio.run(run, directory, mode == "endpoint")
