"""``open_flow_network``: several flow nodes in one process over real brokers, real sockets and mutual TLS.

Each node is a store broker, a messaging service, an inbound acceptor, a bridge manager and a flow manager,
with its own directory and its own certificates from one test network root. Nodes can be stopped (their tasks
cancelled, as at a crash of everything but the disk) and started again on the same directory::

    names = ["O=Alice, L=London, C=GB", "O=Bob, L=Paris, C=FR"]
    async with testing.open_flow_network(tmp_path, names) as net:
        handle = await net["Alice"].flows.start_flow("PingPong", recipient=str(net["Bob"].name), rounds=3)
        assert await handle.result() == 3
        await net.restart("Bob")
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import attrs
import trio

from corda_trio import bridge, flows, messaging, pki, store

__all__ = ["FlowNetwork", "FlowNode", "open_flow_network"]


@attrs.define(eq=False)
class FlowNode:
    """One running (or stopped) node of a :class:`FlowNetwork`."""

    name: pki.CordaX500Name
    creds: pki.NodeCredentials
    directory: Path
    peers: messaging.PeerDirectory = attrs.field(factory=messaging.PeerDirectory)
    broker: store.Broker | None = None
    messaging: messaging.MessagingService | None = None
    acceptor: bridge.InboundAcceptor | None = None
    bridges: bridge.BridgeManager | None = None
    _flows: flows.FlowManager | None = None
    scope: trio.CancelScope | None = None
    stopped: trio.Event = attrs.field(factory=trio.Event)
    port: int | None = None

    @property
    def flows(self) -> flows.FlowManager:
        assert self._flows is not None, f"{self.name} is not running"
        return self._flows

    @property
    def key_hash(self) -> str:
        return pki.key_hash(self.creds.identity.cert.public_key())

    def as_peer(self) -> messaging.Peer:
        assert self.port is not None
        return messaging.Peer(
            legal_name=self.name, key_hash=self.key_hash, addresses=[("127.0.0.1", self.port)]
        )


@attrs.define(eq=False)
class FlowNetwork:
    """See the module docstring. Index nodes by organisation (``net["Bob"]``) or full name."""

    network: pki.NetworkCredentials
    base: Path
    nursery: trio.Nursery
    nodes: dict[str, FlowNode] = attrs.field(factory=dict)
    bridge_config: bridge.BridgeConfig = attrs.field(
        factory=lambda: bridge.BridgeConfig(initial_backoff_seconds=0.05, max_backoff_seconds=0.5)
    )
    flow_config: flows.FlowManagerConfig | None = None
    broker_config: store.BrokerConfig | None = None
    #: the messaging services' ``inbox_credit`` (``None``: its default)
    inbox_credit: int | None = None
    now: dt.datetime = attrs.field(factory=lambda: dt.datetime.now(dt.UTC) - dt.timedelta(hours=1))

    def __getitem__(self, name: str) -> FlowNode:
        for node in self.nodes.values():
            if name in (node.name.organisation, str(node.name)):
                return node
        raise KeyError(name)

    async def add_node(self, name: str, *, start: bool = True) -> FlowNode:
        """Issue credentials for ``name`` and (by default) start the node."""
        legal = pki.CordaX500Name.parse(name)
        creds = self.network.issue_node(legal, now=self.now)
        node = FlowNode(legal, creds, self.base / legal.organisation)
        self.nodes[str(legal)] = node
        if start:
            await self.start(name)
        return node

    def _publish(self) -> None:
        """Every running node knows every other running node (the network map's job in a real node)."""
        for node in self.nodes.values():
            for other in self.nodes.values():
                if other is not node and other.port is not None:
                    node.peers.put(other.as_peer())

    def forget(self, name: str) -> None:
        """Remove ``name`` from every other node's peer directory (as if it left the network map)."""
        gone = self[name]
        for node in self.nodes.values():
            node.peers.remove(gone.key_hash)

    async def start(self, name: str) -> FlowNode:
        node = self[name]
        assert node.scope is None, f"{name} is running"
        node.stopped = trio.Event()
        await self.nursery.start(self._run, node)
        self._publish()
        return node

    async def stop(self, name: str) -> None:
        """Cancel everything the node runs and close its store (a crash of the process, minus the OS)."""
        node = self[name]
        if node.scope is not None:
            node.scope.cancel()
            await node.stopped.wait()

    async def restart(self, name: str) -> FlowNode:
        await self.stop(name)
        return await self.start(name)

    async def _run(
        self, node: FlowNode, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        tls = {
            "cert_chain": node.creds.tls_chain,
            "key": node.creds.tls.key,
            "trust_root": self.network.root.cert,
        }
        server_ctx = pki.server_ssl_context(**tls)  # type: ignore[arg-type]
        client_ctx = pki.client_ssl_context(**tls)  # type: ignore[arg-type]
        try:
            with trio.CancelScope() as scope:
                node.scope = scope
                async with (
                    store.open_broker(node.directory / "store", config=self.broker_config) as broker,
                    trio.open_nursery() as nursery,
                ):
                    credit = {} if self.inbox_credit is None else {"inbox_credit": self.inbox_credit}
                    config = messaging.MessagingConfig(legal_name=node.name, key_hash=node.key_hash, **credit)
                    service = await messaging.MessagingService.open(broker, config, node.peers)
                    acceptor = bridge.InboundAcceptor(inbox=service.inbox, ssl_context=server_ctx)
                    bridges = bridge.BridgeManager(
                        messaging=service,
                        resolver=node.peers,
                        ssl_context=client_ctx,
                        config=self.bridge_config,
                    )
                    manager = await flows.FlowManager.open(service, config=self.flow_config)
                    node.port = await nursery.start(acceptor.run)
                    await nursery.start(bridges.run)
                    await nursery.start(service.run)
                    await nursery.start(manager.run)
                    node.broker, node.messaging, node.acceptor, node.bridges = (
                        broker,
                        service,
                        acceptor,
                        bridges,
                    )
                    node._flows = manager
                    task_status.started()
                    await trio.sleep_forever()
        finally:
            node.scope = None
            node._flows = None
            node.stopped.set()


@contextlib.asynccontextmanager
async def open_flow_network(
    base: Path,
    names: Sequence[str],
    *,
    flow_config: flows.FlowManagerConfig | None = None,
    broker_config: store.BrokerConfig | None = None,
    inbox_credit: int | None = None,
) -> AsyncIterator[FlowNetwork]:
    """Start one node per name (directories under ``base``); everything is cancelled when the block exits."""
    network = pki.NetworkCredentials.create(now=dt.datetime.now(dt.UTC) - dt.timedelta(hours=1))
    async with trio.open_nursery() as nursery:
        net = FlowNetwork(
            network, Path(base), nursery, flow_config=flow_config, broker_config=broker_config,
            inbox_credit=inbox_credit,
        )  # fmt: skip
        for name in names:
            await net.add_node(name)
        yield net
        nursery.cancel_scope.cancel()
