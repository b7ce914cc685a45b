"""The float and the tunnel's inside end in one process, over real sockets and real (mutual) TLS."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import attrs
import trio

from corda_trio import bridge, messaging, pki, store
from corda_trio.bridge import float as fl
from tests.p2p_harness import running_node, wait_until

TOPIC = "test.p2p"


def node_tls(creds: pki.NodeCredentials, root: object, directory: Path) -> fl.NodeTls:
    directory.mkdir(parents=True, exist_ok=True)
    pki.write_certificates(directory / "tls.pem", creds.tls_chain)
    pki.write_private_key(directory / "tls.key", creds.tls.key, None)
    pki.write_certificates(directory / "root.pem", [root])  # type: ignore[list-item]
    return fl.NodeTls(
        cert_chain=directory / "tls.pem", key=directory / "tls.key", trust_root=directory / "root.pem"
    )


def float_for(
    node: pki.NodeCredentials, root: object, float_creds: fl.TunnelCredentials, directory: Path
) -> fl.Float:
    """A float for ``node`` on 127.0.0.1, its audit log in ``directory``."""
    return fl.Float(
        fl.FloatConfig(
            tunnel=float_creds, public_host="127.0.0.1", tls={"node": node_tls(node, root, directory / "tls")}
        ),
        audit=fl.AuditLog(directory / "audit.jsonl"),
    )


@attrs.define(eq=False)
class Receiver:
    service: messaging.MessagingService
    tunnel: fl.FloatTunnel
    got: list[tuple[str | None, bytes]] = attrs.field(factory=list)


@contextlib.asynccontextmanager
async def receiver_behind_float(
    creds: pki.NodeCredentials,
    directory: Path,
    floats: list[tuple[str, int]],
    bridge_creds: fl.TunnelCredentials,
    peers: messaging.PeerDirectory,
    **tunnel_config: object,
) -> AsyncIterator[Receiver]:
    key_hash = pki.key_hash(creds.identity.cert.public_key())
    async with store.open_broker(directory) as broker, trio.open_nursery() as nursery:
        config = messaging.MessagingConfig(legal_name=creds.legal_name, key_hash=key_hash)
        service = await messaging.MessagingService.open(broker, config, peers)
        tunnel = fl.FloatTunnel(
            inbox=service.inbox,
            tunnel_context=bridge_creds.client_context(),
            config=fl.TunnelConfig(
                floats=floats, initial_backoff_seconds=0.05, max_backoff_seconds=0.5, **tunnel_config
            ),  # type: ignore[arg-type]
            resolver=peers,
        )
        receiver = Receiver(service, tunnel)

        async def handler(message: messaging.ReceivedMessage) -> None:
            receiver.got.append((message.validated_user, message.data))

        service.add_message_handler(TOPIC, handler)
        await nursery.start(service.run)
        await nursery.start(tunnel.run)
        yield receiver
        nursery.cancel_scope.cancel()


async def test_messages_reach_a_receiver_behind_a_float_exactly_once(
    alice: pki.NodeCredentials,
    bob: pki.NodeCredentials,
    network: pki.NetworkCredentials,
    float_creds: fl.TunnelCredentials,
    bridge_creds: fl.TunnelCredentials,
    tmp_path: Path,
) -> None:
    n = 300
    root = network.root.cert
    flt = float_for(bob, root, float_creds, tmp_path)
    peers = messaging.PeerDirectory()
    async with trio.open_nursery() as nursery:
        control_port = await nursery.start(flt.run)
        assert flt.state is fl.FloatState.IDLE and flt.public_port is None
        async with (
            running_node(alice, root, tmp_path / "a", peers=peers) as a,
            receiver_behind_float(
                bob, tmp_path / "b", [("127.0.0.1", control_port)], bridge_creds, peers
            ) as b,
        ):
            with trio.fail_after(30):
                host, port = await b.tunnel.wait_active()
            assert flt.state is fl.FloatState.ACTIVE and flt.public_port == port
            peers.put(a.as_peer())
            bob_hash = pki.key_hash(bob.identity.cert.public_key())
            peers.put(messaging.Peer(legal_name=bob.legal_name, key_hash=bob_hash, addresses=[(host, port)]))
            with trio.fail_after(60):
                for i in range(0, n, 50):
                    await a.service.send_many(
                        [a.service.create_message(TOPIC, b"%d" % j) for j in range(i, i + 50)], bob.legal_name
                    )
                await wait_until(lambda: len(b.got) >= n and flt.accepted >= n)
            assert b.got == [(str(alice.legal_name), b"%d" % i) for i in range(n)]
            assert b.tunnel.stored == n and flt.accepted == n
        nursery.cancel_scope.cancel()


async def test_every_failover_is_seen_by_counting_activations(
    bob: pki.NodeCredentials,
    network: pki.NetworkCredentials,
    float_creds: fl.TunnelCredentials,
    bridge_creds: fl.TunnelCredentials,
    tmp_path: Path,
) -> None:
    """Regression: a failover can be over (standby active) within milliseconds, before an observer that
    waits for ``public_address`` to read ``None`` ever looks; ``wait_activation`` counts, so it cannot miss
    one. Here nobody looks during the failover at all, and it is still reported, with the new address."""
    tls = {"node": node_tls(bob, network.root.cert, tmp_path / "tls")}
    floats = [
        fl.Float(fl.FloatConfig(tunnel=float_creds, public_host="127.0.0.1", tls=tls)) for _ in range(2)
    ]
    peers = messaging.PeerDirectory()
    async with trio.open_nursery() as nursery:
        scopes = [trio.CancelScope(), trio.CancelScope()]

        async def serve(i: int, *, task_status: trio.TaskStatus[int]) -> None:
            with scopes[i]:
                await floats[i].run(task_status=task_status)

        ports = [await nursery.start(serve, i) for i in (0, 1)]
        async with receiver_behind_float(
            bob, tmp_path / "b", [("127.0.0.1", p) for p in ports], bridge_creds, peers
        ) as b:
            with trio.fail_after(30):
                count, address = await b.tunnel.wait_activation()
                assert count == 1 and address == ("127.0.0.1", floats[0].public_port)
                scopes[0].cancel()  # the active float goes away
                await wait_until(lambda: b.tunnel.activations == 2)  # the standby took over meanwhile
                assert b.tunnel.failovers == 1
                assert b.tunnel.last_error is not None and "ExceptionGroup" not in b.tunnel.last_error
                assert await b.tunnel.wait_activation(count) == (2, ("127.0.0.1", floats[1].public_port))
                assert await b.tunnel.wait_activation() == (2, ("127.0.0.1", floats[1].public_port))
        nursery.cancel_scope.cancel()


async def test_a_sender_the_receiver_does_not_know_yet_is_released_then_delivered_in_order(
    alice: pki.NodeCredentials,
    bob: pki.NodeCredentials,
    network: pki.NetworkCredentials,
    float_creds: fl.TunnelCredentials,
    bridge_creds: fl.TunnelCredentials,
    tmp_path: Path,
) -> None:
    """Alice has just joined: she knows Bob (behind a float), Bob's copy of the map does not know her yet.
    Her messages are released, not rejected: none goes to her dead letters, and once Bob's map has her,
    every one is delivered exactly once, in order."""
    n = 200
    root = network.root.cert
    flt = float_for(bob, root, float_creds, tmp_path)
    alice_map, bob_map = messaging.PeerDirectory(), messaging.PeerDirectory()
    fast = bridge.BridgeConfig(initial_backoff_seconds=0.05, max_backoff_seconds=0.2)
    async with trio.open_nursery() as nursery:
        control_port = await nursery.start(flt.run)
        async with (
            running_node(alice, root, tmp_path / "a", peers=alice_map, bridge_config=fast) as a,
            receiver_behind_float(
                bob, tmp_path / "b", [("127.0.0.1", control_port)], bridge_creds, bob_map
            ) as b,
        ):
            with trio.fail_after(30):
                host, port = await b.tunnel.wait_active()
            bob_hash = pki.key_hash(bob.identity.cert.public_key())
            bob_peer = messaging.Peer(legal_name=bob.legal_name, key_hash=bob_hash, addresses=[(host, port)])
            alice_map.put(bob_peer)
            with trio.fail_after(60):
                for i in range(0, n, 20):
                    await a.service.send_many(
                        [a.service.create_message(TOPIC, b"%d" % j) for j in range(i, i + 20)], bob.legal_name
                    )
                # several sessions' worth of releases (each one ends Alice's session: she retries)
                await wait_until(lambda: b.tunnel.released >= 3 * 20)
            assert b.got == [] and b.tunnel.stored == 0 and b.tunnel.rejected == 0
            assert messaging.DEAD_LETTER_QUEUE not in a.broker.list_queues()
            bob_map.put(a.as_peer())  # Bob's map catches up
            with trio.fail_after(60):
                await wait_until(lambda: len(b.got) >= n)
                await wait_until(lambda: not a.broker.statistics("internal.peers.")[0].depth)
            await trio.sleep(0.2)  # (anything more would be a duplicate)
            assert b.got == [(str(alice.legal_name), b"%d" % i) for i in range(n)]
            assert messaging.DEAD_LETTER_QUEUE not in a.broker.list_queues()
        nursery.cancel_scope.cancel()
