"""A p2p node for tests: broker + messaging service + inbound acceptor + bridge manager over real TLS sockets.

Used in-process by ``tests/bridge`` and, through ``tests/bridge/p2p_child.py``, as a separate process.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import ssl
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import attrs
import trio
from cryptography import x509

from corda_trio import bridge, messaging, pki, store

NOW = dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)


@attrs.define(eq=False)
class P2PNode:
    creds: pki.NodeCredentials
    broker: store.Broker
    service: messaging.MessagingService
    in_node: tuple[bridge.InboundAcceptor, bridge.BridgeManager] | None
    directory: messaging.PeerDirectory
    #: ``external=True``: the node's local endpoint and the bridge talking to it (same process here).
    endpoint: bridge.LocalEndpoint | None = None
    external: bridge.ExternalBridge | None = None

    @property
    def acceptor(self) -> bridge.InboundAcceptor:
        if self.in_node is not None:
            return self.in_node[0]
        assert self.external is not None and self.external.acceptor is not None
        return self.external.acceptor

    @property
    def manager(self) -> bridge.BridgeManager:
        if self.in_node is not None:
            return self.in_node[1]
        assert self.external is not None and self.external.manager is not None
        return self.external.manager

    @property
    def port(self) -> int:
        assert self.acceptor.port is not None
        return self.acceptor.port

    def as_peer(self, host: str = "127.0.0.1") -> messaging.Peer:
        return messaging.Peer(
            legal_name=self.creds.legal_name,
            key_hash=pki.key_hash(self.creds.identity.cert.public_key()),
            addresses=[(host, self.port)],
        )


def contexts(creds: pki.NodeCredentials, root: x509.Certificate) -> tuple[object, object]:
    tls = {"cert_chain": creds.tls_chain, "key": creds.tls.key, "trust_root": root}
    return pki.server_ssl_context(**tls), pki.client_ssl_context(**tls)  # type: ignore[arg-type]


@contextlib.asynccontextmanager
async def running_node(
    creds: pki.NodeCredentials,
    root: x509.Certificate,
    directory: Path,
    *,
    peers: messaging.PeerDirectory | None = None,
    bridge_config: bridge.BridgeConfig | None = None,
    acceptor_config: bridge.AcceptorConfig | None = None,
    max_message_size: int = messaging.DEFAULT_MAX_MESSAGE_SIZE,
    fsync: str = "always",
    run_service: bool = True,
    external: bool = False,
    max_tls_version: ssl.TLSVersion | None = None,
) -> AsyncIterator[P2PNode]:
    """Run a node until the block exits (cancelling everything).

    ``max_tls_version``: cap what the node's acceptor speaks (``TLSv1_2``: a peer refusing a client's
    certificate then says so in the handshake, where TLS 1.3 says it on the first read after it).

    ``external``: instead of an in-node acceptor and bridge manager, run the node's local endpoint and an
    :class:`bridge.ExternalBridge` connected to it (what ``corda-trio bridge start`` runs in its own process).
    """
    server_ctx, client_ctx = contexts(creds, root)
    if max_tls_version is not None:
        server_ctx.maximum_version = max_tls_version  # type: ignore[attr-defined]
    peers = peers if peers is not None else messaging.PeerDirectory()
    key_hash = pki.key_hash(creds.identity.cert.public_key())
    async with store.open_broker(directory) as broker, trio.open_nursery() as nursery:
        config = messaging.MessagingConfig(
            legal_name=creds.legal_name, key_hash=key_hash, max_message_size=max_message_size, fsync=fsync
        )
        service = await messaging.MessagingService.open(broker, config, peers)
        acceptor_config = acceptor_config or bridge.AcceptorConfig(max_message_size=max_message_size)
        bridge_config = bridge_config or bridge.BridgeConfig()
        if external:
            endpoint = bridge.LocalEndpoint(
                messaging=service,
                resolver=peers,
                config=bridge.EndpointConfig(
                    username="bridge", password="secret", max_message_size=max_message_size
                ),
            )
            port = await nursery.start(endpoint.run)
            ext = bridge.ExternalBridge(
                config=bridge.ExternalBridgeConfig(
                    node_port=port,
                    username="bridge",
                    password="secret",
                    p2p=acceptor_config,
                    bridges=bridge_config,
                ),
                client_ssl_context=client_ctx,  # type: ignore[arg-type]
                server_ssl_context=server_ctx,  # type: ignore[arg-type]
            )
            await nursery.start(ext.run)
            with trio.fail_after(30):
                await ext.wait_serving()
            node = P2PNode(creds, broker, service, None, peers, endpoint, ext)
        else:
            acceptor = bridge.InboundAcceptor(
                inbox=service.inbox,
                ssl_context=server_ctx,  # type: ignore[arg-type]
                config=acceptor_config,
                on_checked=service.remember_received,
            )
            manager = bridge.BridgeManager(
                messaging=service,
                resolver=peers,
                ssl_context=client_ctx,  # type: ignore[arg-type]
                config=bridge_config,
            )
            await nursery.start(acceptor.run)
            await nursery.start(manager.run)
            node = P2PNode(creds, broker, service, (acceptor, manager), peers)
        if run_service:
            await nursery.start(service.run)
        yield node
        nursery.cancel_scope.cancel()


async def wait_until(predicate: Callable[[], object], *, interval: float = 0.02) -> None:
    """Poll ``predicate`` (state spread over several components has no single event to wait on)."""
    while not predicate():  # noqa: ASYNC110
        await trio.sleep(interval)
