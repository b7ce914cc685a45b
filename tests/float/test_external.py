"""A bridge in its own process behind a float: ``ExternalBridge`` with ``floats`` (what ``corda-trio bridge
start`` runs with a ``[float]`` section) activates the float and stores what it forwards through the node's
local endpoint. In one process here, over real sockets and TLS; the CLI's configuration in test_cli.py."""

from __future__ import annotations

from pathlib import Path

import trio

from corda_trio import bridge, messaging, pki, store
from corda_trio.bridge import float as fl
from tests.float.test_inprocess import TOPIC, node_tls
from tests.p2p_harness import contexts, running_node, wait_until


async def test_an_external_bridge_activates_a_float_and_stores_through_the_endpoint(
    alice: pki.NodeCredentials,
    bob: pki.NodeCredentials,
    network: pki.NetworkCredentials,
    float_creds: fl.TunnelCredentials,
    bridge_creds: fl.TunnelCredentials,
    tmp_path: Path,
) -> None:
    n = 300
    root = network.root.cert
    flt = fl.Float(
        fl.FloatConfig(
            tunnel=float_creds, public_host="127.0.0.1", tls={"node": node_tls(bob, root, tmp_path / "tls")}
        )
    )
    peers = messaging.PeerDirectory()
    got: list[tuple[str | None, bytes]] = []
    async with trio.open_nursery() as nursery:
        control_port = await nursery.start(flt.run)
        async with (
            running_node(alice, root, tmp_path / "a", peers=peers) as a,
            store.open_broker(tmp_path / "b") as broker,
            trio.open_nursery() as b_nursery,
        ):
            key_hash = pki.key_hash(bob.identity.cert.public_key())
            config = messaging.MessagingConfig(legal_name=bob.legal_name, key_hash=key_hash)
            service = await messaging.MessagingService.open(broker, config, peers)

            async def handler(message: messaging.ReceivedMessage) -> None:
                got.append((message.validated_user, message.data))

            service.add_message_handler(TOPIC, handler)
            await b_nursery.start(service.run)
            endpoint = bridge.LocalEndpoint(
                messaging=service,
                resolver=peers,
                config=bridge.EndpointConfig(username="bridge", password="secret"),
            )
            endpoint_port = await b_nursery.start(endpoint.run)
            server_ctx, client_ctx = contexts(bob, root)
            ext = bridge.ExternalBridge(
                config=bridge.ExternalBridgeConfig(
                    node_port=endpoint_port,
                    username="bridge",
                    password="secret",
                    floats=fl.TunnelConfig(floats=[("127.0.0.1", control_port)]),
                ),
                client_ssl_context=client_ctx,  # type: ignore[arg-type]
                server_ssl_context=server_ctx,  # type: ignore[arg-type]
                tunnel_ssl_context=bridge_creds.client_context(),
            )
            await b_nursery.start(ext.run)
            with trio.fail_after(30):
                port = await ext.wait_serving()
            assert ext.acceptor is None and flt.public_port == port  # no listener of the bridge's own
            peers.put(a.as_peer())
            peers.put(
                messaging.Peer(legal_name=bob.legal_name, key_hash=key_hash, addresses=[("127.0.0.1", port)])
            )
            with trio.fail_after(60):
                for i in range(0, n, 50):
                    await a.service.send_many(
                        [a.service.create_message(TOPIC, b"%d" % j) for j in range(i, i + 50)], bob.legal_name
                    )
                await wait_until(lambda: len(got) >= n and flt.accepted >= n)
            assert got == [(str(alice.legal_name), b"%d" % i) for i in range(n)]
            assert ext.tunnel is not None and ext.tunnel.stored == n
            b_nursery.cancel_scope.cancel()
        nursery.cancel_scope.cancel()
