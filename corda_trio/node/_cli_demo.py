"""``corda-trio demo``: a local development network, end to end, on this machine.

What it does, with the real parts of this round and nothing simulated:

1. ``network bootstrap`` (unless ``--dir`` already holds a network): root, doorman and map keys, one node per
   legal name with its node CA, TLS and identity certificates, ``node.toml`` files, network parameters.
2. Runs the network map service (h11) and, for every node, a durable broker (WAL queues), an AMQP 1.0
   acceptor over mutual TLS that only lets peers attach to the node's own inbox
   ``p2p.inbound.<key-hash>``, and a network-map updater that publishes the node's signed NodeInfo and polls
   the map until it has verified every other node.
3. The first node enqueues ``--messages`` P2P messages durably on ``internal.peers.<peer key-hash>`` for
   every other node; a forwarder per peer consumes that queue, dials the peer over mutual TLS (the peer's
   legal name checked after the handshake), sends each message unsettled and acks it from the outbound
   queue only after the peer settled it ``accepted``, which the peer does only once the message is durable
   in its inbox.
4. Prints latency and throughput, and the depth of every queue; ``--records DIR`` also writes benchmark
   records (``protocol_spec/bench-records.md``) for ``corda-trio report``.

The forwarder and acceptor here are deliberately small compositions of ``transport`` and ``store``: the
bridge round replaces them with ``corda_trio.bridge`` (reconnects with backoff, control protocol,
validated-user stamping, deduplication).
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import logging
import math
import time
import uuid
from collections.abc import Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any, Final

import attrs
import trio

import bench
from corda_trio import amqp, network, pki, store, transport

from ._cli import CliError
from ._cli_network import create_network
from ._cli_networkmap import _service as network_map_service
from ._config import ConfigError, NodeConfig, load_network_map_config, load_node_config

__all__ = ["register", "run_demo"]

log = logging.getLogger("corda_trio.demo")

DEFAULT_NODES: Final[tuple[str, ...]] = ("O=Alice,L=London,C=GB", "O=Bob,L=New York,C=US")
#: How long the demo waits for the nodes to see each other in the map before giving up.
DISCOVERY_TIMEOUT_SECONDS: Final[float] = 30.0
#: Credit the acceptor grants a peer's sending link (also the number of in-flight unsettled messages).
INBOUND_CREDIT: Final[int] = 256


def register(parser: argparse.ArgumentParser) -> None:
    """``corda-trio demo [--dir D] [--messages N] [--size BYTES] [--records DIR]``."""
    parser.add_argument(
        "--dir", type=Path, default=Path("devnet"), help="network directory (default ./devnet)"
    )
    parser.add_argument(
        "--node", action="append", metavar="LEGAL_NAME",
        help="legal name of a node when the network is created (repeat; default Alice and Bob)",
    )  # fmt: skip
    parser.add_argument(
        "--messages", type=int, default=2000, help="messages from the first node to each peer"
    )
    parser.add_argument("--size", type=int, default=1024, help="body size in bytes (default 1024)")
    parser.add_argument("--records", type=Path, help="also write benchmark records into this directory")
    parser.add_argument("--verbose", "-v", action="store_true", help="log what every component does")
    parser.set_defaults(func=_main)


@attrs.frozen(kw_only=True)
class LinkResult:
    """What one sender -> peer link did.

    ``stages`` holds, per message in send order, epoch nanoseconds (``bench.Clock``) at each stage of
    ``protocol_spec/bench-records.md``: created, enqueued (durable at the sender), sent, accepted (the peer's
    disposition arrived), delivered (durable in the peer's inbox).
    """

    sender: str
    receiver: str
    size_bytes: int
    elapsed_seconds: float
    stages: tuple[dict[str, int], ...]

    @property
    def messages(self) -> int:
        return len(self.stages)

    def latency_ms(self, q: float, stage: str = "delivered") -> float:
        ordered = sorted(s[stage] - s["created"] for s in self.stages)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1e6


@attrs.frozen(kw_only=True)
class DemoResult:
    links: tuple[LinkResult, ...]
    started_at: dt.datetime
    finished_at: dt.datetime
    queue_depths: dict[str, dict[str, int]]  # node -> queue -> depth


def _main(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args.messages < 1 or args.size < 0:
        raise CliError("--messages must be at least 1 and --size at least 0", 2)
    net_dir: Path = args.dir.absolute()
    if not (net_dir / "nodes").is_dir():
        try:
            names = [pki.CordaX500Name.parse(n) for n in (args.node or DEFAULT_NODES)]
        except pki.InvalidNameError as exc:
            raise CliError(str(exc), 2) from None
        if len(names) < 2:
            raise CliError("the demo needs at least two nodes", 2)
        net = create_network(net_dir, names)
        print(f"created a network of {len(net.nodes)} nodes in {net_dir}")
    elif args.node:
        raise CliError(f"{net_dir} already holds a network; --node applies only when creating one", 2)
    started = time.perf_counter()
    result = trio.run(functools.partial(run_demo, net_dir, messages=args.messages, size=args.size))
    _print(result, time.perf_counter() - started)
    if args.records is not None:
        path = _write_records(args.records, result, args)
        print(f"records: {path}  (corda-trio report --in {args.records} --out report.html)")
    return 0


def _write_records(out_dir: Path, result: DemoResult, args: argparse.Namespace) -> Path:
    run_id = bench.new_run_id("p2p-demo")
    try:
        writer = bench.RecordWriter(out_dir, run_id)
    except bench.BenchError as exc:
        raise CliError(str(exc), 2) from None
    for link in result.links:
        name = f"{link.sender} -> {link.receiver}"
        for seq, stages in enumerate(link.stages):
            writer.add_sync(
                bench.make_record(
                    run_id=run_id,
                    scenario="p2p-demo",
                    link=name,
                    size_bytes=link.size_bytes,
                    seq=seq,
                    intended_ns=stages["created"],
                    stages=stages,
                )
            )
    ends = sorted(max(st.values()) - st["created"] for link in result.links for st in link.stages)

    def nearest_rank(q: float) -> int:
        return ends[min(len(ends) - 1, max(0, math.ceil(q * len(ends)) - 1))]

    writer.finish(
        {
            "schema_version": bench.SCHEMA_VERSION,
            "run_id": run_id,
            "scenario": "p2p-demo",
            "description": "durable outbound queue -> AMQP 1.0 over mutual TLS -> durable inbox",
            "started_at": result.started_at.isoformat(),
            "finished_at": result.finished_at.isoformat(),
            "clock": "epoch ns: perf_counter_ns anchored to time_ns at run start, one clock for all nodes",
            "links": [f"{link.sender} -> {link.receiver}" for link in result.links],
            "config": {
                "scenario": "p2p-demo",
                "sizes": f"{args.size}:1",
                "params": {"messages": args.messages, "network": str(args.dir)},
                "load": {"mode": "burst", "note": "all messages enqueued at once, then forwarded"},
            },
            "environment": bench.environment_metadata(),
            "summary": {
                "recorded_ops": writer.count,
                "error_ops": 0,
                "elapsed_seconds": max(link.elapsed_seconds for link in result.links),
                "latency_ns": {f"p{q * 100:g}": nearest_rank(q) for q in (0.5, 0.9, 0.99, 0.999)}
                | {"max": ends[-1]},
            },
        }
    )
    return writer.records_path


async def run_demo(net_dir: Path, *, messages: int, size: int) -> DemoResult:
    """Run the network in ``net_dir`` (see the module docstring); returns what was measured."""
    try:
        configs = [load_node_config(p) for p in sorted((net_dir / "nodes").glob("*/node.toml"))]
        map_config = load_network_map_config(net_dir / "network-map" / "networkmap.toml")
    except ConfigError as exc:
        raise CliError(str(exc), 2) from None
    if len(configs) < 2:
        raise CliError(f"{net_dir} has fewer than two nodes", 2)
    service = network_map_service(map_config)
    started_at = dt.datetime.now(dt.UTC)
    try:
        async with trio.open_nursery() as nursery, AsyncExitStack() as stack:
            try:
                await nursery.start(
                    functools.partial(network.serve_network_map, host=map_config.address.host),
                    service,
                    map_config.address.port,
                )
            except OSError as exc:
                where = map_config.address
                raise CliError(f"network map: cannot listen on {where}: {exc.strerror}") from None
            clock = bench.Clock()  # one clock for every node: their stages are compared with each other
            nodes = [await _DemoNode.start(cfg, nursery, stack, clock) for cfg in configs]
            with trio.fail_after(DISCOVERY_TIMEOUT_SECONDS):
                async with trio.open_nursery() as discovery:
                    for node in nodes:
                        discovery.start_soon(node.wait_for_peers, len(nodes) - 1)
            first, peers = nodes[0], nodes[1:]
            results: list[LinkResult] = []
            async with trio.open_nursery() as links:
                for peer in peers:
                    links.start_soon(_run_link, first, peer, messages, size, results)
            depths = {str(n.config.legal_name): n.queue_depths() for n in nodes}
            nursery.cancel_scope.cancel()
    finally:
        service.store.close()
    return DemoResult(
        links=tuple(results),
        queue_depths=depths,
        started_at=started_at,
        finished_at=dt.datetime.now(dt.UTC),
    )


@attrs.define(eq=False)
class _DemoNode:
    config: NodeConfig
    broker: store.Broker
    inbox: store.Queue
    client_context: Any
    key_hash: str
    updater: network.NetworkMapUpdater
    clock: bench.Clock
    peers: dict[str, network.VerifiedNodeInfo] = attrs.field(factory=dict)
    peers_changed: trio.Event = attrs.field(factory=trio.Event)
    # message id (the AMQP message-id) -> clock ns when it became durable in this node's inbox
    delivered_ns: dict[str, int] = attrs.field(factory=dict)
    delivered_changed: trio.Event = attrs.field(factory=trio.Event)

    @classmethod
    async def start(
        cls, cfg: NodeConfig, nursery: trio.Nursery, stack: AsyncExitStack, clock: bench.Clock
    ) -> _DemoNode:
        try:
            passphrase = cfg.key_passphrase.read()
            tls = {"cert_chain": cfg.tls_cert_chain, "key": cfg.tls_key, "trust_root": cfg.trust_root}
            server_context = pki.server_ssl_context(**tls, passphrase=passphrase)
            client_context = pki.client_ssl_context(**tls, passphrase=passphrase)
            root = pki.read_certificate(cfg.trust_root)
            identity = pki.read_certificates(cfg.identity_cert_chain)[0]
            own_info = (cfg.base_directory / "node-info").read_bytes()
        except (ConfigError, pki.KeyStoreError, OSError) as exc:
            raise CliError(f"{cfg.legal_name}: {exc}", 2) from None
        key_hash = pki.key_hash(identity.public_key())
        broker = await stack.enter_async_context(store.open_broker(cfg.store_directory))
        inbox = await broker.declare_queue(f"p2p.inbound.{key_hash}", fsync=cfg.store_fsync)
        send_events, receive_events = trio.open_memory_channel[network.MapEvent](64)
        cfg.node_info_cache.parent.mkdir(parents=True, exist_ok=True)
        cache = network.NodeInfoCache(cfg.node_info_cache)
        stack.callback(cache.close)
        updater = network.NetworkMapUpdater(
            trust_root=root,
            cache=cache,
            events=send_events,
            client=network.NetworkMapClient(cfg.network_map_url) if cfg.network_map_url else None,
            node_infos_dir=cfg.additional_node_infos,
            own_node_info=own_info,
            poll_interval_seconds=0.2,
        )
        node = cls(
            config=cfg,
            broker=broker,
            inbox=inbox,
            client_context=client_context,
            key_hash=key_hash,
            updater=updater,
            clock=clock,
        )
        try:
            await nursery.start(
                functools.partial(
                    transport.serve_amqp,
                    host=cfg.p2p_listen.host,
                    ssl_context=server_context,
                    peer_check=pki.check_peer_is_network_node,
                ),
                node._handle_connection,
                cfg.p2p_listen.port,
            )
        except OSError as exc:
            raise CliError(f"{cfg.legal_name}: cannot listen on {cfg.p2p_listen}: {exc.strerror}") from None
        nursery.start_soon(updater.run)
        nursery.start_soon(node._watch_map, receive_events)
        return node

    async def _watch_map(self, events: trio.MemoryReceiveChannel[network.MapEvent]) -> None:
        own = str(self.config.legal_name)
        async for event in events:
            if isinstance(event, network.NodeAdded | network.NodeChanged):
                info = event.node if isinstance(event, network.NodeAdded) else event.new
                if str(info.legal_name) != own:
                    self.peers[str(info.legal_name)] = info
            elif isinstance(event, network.NodeRemoved):
                self.peers.pop(str(event.node.legal_name), None)
            self.peers_changed.set()
            self.peers_changed = trio.Event()

    async def wait_for_peers(self, count: int) -> None:
        while len(self.peers) < count:
            await self.peers_changed.wait()
        log.info("%s sees %d peers in the network map", self.config.legal_name, len(self.peers))

    async def _handle_connection(self, conn: transport.AmqpConnection) -> None:
        """Inbound: only a sender to our own inbox is accepted; a message is accepted once durable."""
        own_inbox = self.inbox.name
        async with trio.open_nursery() as nursery:
            async for request in conn.link_requests():
                if not request.peer_is_sender or request.address != own_inbox:
                    await request.refuse(
                        "amqp:unauthorized-access",
                        f"peers may only send to {own_inbox}, not {request.address!r}",
                    )
                    continue
                receiver = await request.accept_receiver(credit=INBOUND_CREDIT)
                for _ in range(INBOUND_CREDIT // 4):  # concurrent appenders share one group commit
                    nursery.start_soon(self._store_deliveries, receiver)

    async def _store_deliveries(self, receiver: transport.Receiver) -> None:
        try:
            async for delivery in receiver:
                message_id = str(amqp.Message.decode(delivery.payload).properties.message_id)
                await self.inbox.enqueue(delivery.payload)
                self.delivered_ns[message_id] = self.clock.now_ns()
                await delivery.accept()
                self.delivered_changed.set()
                self.delivered_changed = trio.Event()
        except (transport.AmqpTransportError, trio.BrokenResourceError, trio.ClosedResourceError):
            return  # the peer went away; what was not accepted is redelivered by its sender

    async def wait_delivered(self, message_ids: Sequence[str]) -> None:
        for message_id in message_ids:
            while message_id not in self.delivered_ns:
                await self.delivered_changed.wait()

    def queue_depths(self) -> dict[str, int]:
        return {s.name: s.depth for s in self.broker.statistics()}


def p2p_message(sender: pki.CordaX500Name, seq: int, message_id: str, body: bytes) -> amqp.Message:
    """A message shaped like Corda's P2P messages (DESIGN.md §3): durable header, Corda header names."""
    return amqp.Message(
        header=amqp.Header(durable=True),
        properties=amqp.Properties(message_id=message_id),
        application_properties={
            "platform-topic": "platform.demo",
            "platform-version": amqp.Int(1),
            "corda-vendor": "corda-trio",
            "release-version": "0.1.0",
            "sender-uuid": str(uuid.uuid5(uuid.NAMESPACE_URL, str(sender))),
            "send-seq-no": seq,
            "_AMQ_DUPL_ID": message_id,
        },
        body=body,  # bytes: one Data section
    )


async def _run_link(
    sender: _DemoNode, receiver: _DemoNode, messages: int, size: int, results: list[LinkResult]
) -> None:
    info = sender.peers[str(receiver.config.legal_name)]
    address = info.node_info.addresses[0]
    outbound = await sender.broker.declare_queue(
        f"internal.peers.{info.identity_key_hash}", fsync=sender.config.store_fsync
    )
    clock = sender.clock
    body = bytes(range(256)) * (size // 256) + bytes(size % 256)
    ids = [f"demo-{uuid.uuid4()}" for _ in range(messages)]
    stages: dict[str, dict[str, int]] = {mid: {} for mid in ids}
    started = time.perf_counter()

    async def produce() -> None:
        batch = 256
        for start in range(0, messages, batch):
            chunk = ids[start : start + batch]
            items = []
            for i, mid in enumerate(chunk):
                stages[mid]["created"] = clock.now_ns()
                # The message's own id rides along as the stored headers: a delivery can be matched to
                # it before enqueue_many has even returned (the consumer may well run first).
                message = p2p_message(sender.config.legal_name, start + i, mid, body).encode()
                items.append((message, mid.encode()))
            await outbound.enqueue_many(items)
            now = clock.now_ns()
            for mid in chunk:
                stages[mid]["enqueued"] = now

    async def settle(consumer: store.Consumer, message_id: int, mid: str, pending: Any) -> None:
        """Ack from the outbound queue only on ``accepted``; anything else goes back for redelivery."""
        outcome = await pending.outcome()
        if isinstance(outcome, amqp.Accepted):
            if mid in stages:
                stages[mid]["accepted"] = clock.now_ns()
            await consumer.ack(message_id)
        else:
            log.warning("message %d not accepted (%r): released for redelivery", message_id, outcome)
            consumer.release(message_id)

    async def forward() -> None:
        expected = receiver.config.legal_name
        async with transport.open_amqp_connection(
            address.host,
            address.port,
            ssl_context=sender.client_context,
            peer_check=lambda tls: pki.check_peer_legal_name(tls, expected),
        ) as conn:
            link = await conn.open_sender(f"p2p.inbound.{info.identity_key_hash}")
            async with outbound.consumer(credit=INBOUND_CREDIT) as consumer, trio.open_nursery() as acks:
                sent = 0
                while sent < messages:
                    delivery = await consumer.receive()
                    pending = await link.start_send(delivery.payload)
                    mid = delivery.headers.decode()
                    if mid in stages:
                        stages[mid]["sent"] = clock.now_ns()
                        sent += 1
                    # (else left over by an earlier, interrupted run: forwarded all the same)
                    acks.start_soon(settle, consumer, delivery.message_id, mid, pending)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(produce)
        nursery.start_soon(forward)
        await receiver.wait_delivered(ids)
    elapsed = time.perf_counter() - started
    for mid in ids:
        stages[mid]["delivered"] = receiver.delivered_ns[mid]
    results.append(
        LinkResult(
            sender=str(sender.config.legal_name),
            receiver=str(receiver.config.legal_name),
            size_bytes=size,
            elapsed_seconds=elapsed,
            stages=tuple(stages[mid] for mid in ids),
        )
    )


def _print(result: DemoResult, wall_seconds: float) -> None:
    for link in result.links:
        rate = link.messages / link.elapsed_seconds
        print(
            f"{link.sender} -> {link.receiver}: {link.messages} messages of {link.size_bytes} B "
            f"in {link.elapsed_seconds:.2f} s = {rate:,.0f} msg/s; latency created -> durable at the peer: "
            f"p50 {link.latency_ms(0.5):.1f} ms, p99 {link.latency_ms(0.99):.1f} ms, "
            f"max {link.latency_ms(1.0):.1f} ms"
        )
    for node, depths in result.queue_depths.items():
        shown = ", ".join(f"{q} = {d}" for q, d in sorted(depths.items()))
        print(f"  {node}: {shown}")
    print(f"demo finished in {wall_seconds:.1f} s (mutual TLS, AMQP 1.0, durable queues with fsync)")
