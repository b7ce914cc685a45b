"""The node's local endpoint and the external bridge, in one process over real sockets and mutual TLS."""

from __future__ import annotations

import logging
from collections import defaultdict
from pathlib import Path

import attrs
import pytest
import trio

from corda_trio import amqp, bridge, messaging, pki, store, transport
from corda_trio.bridge._endpoint import NOTIFY_BACKLOG
from tests.p2p_harness import contexts, running_node, wait_until
from tests.ports import free_port

from .test_p2p import TOPIC, collect


@pytest.mark.parametrize("modes", [("external", "external"), ("external", "in-node")])
async def test_exchange_through_external_bridges(
    modes: tuple[str, str],
    alice: pki.NodeCredentials,
    bob: pki.NodeCredentials,
    network: pki.NetworkCredentials,
    tmp_path: Path,
) -> None:
    """The same exchange as the in-node test: both ways, exactly once, in order, outbound queues drained."""
    n = 300
    peers = messaging.PeerDirectory()
    root = network.root.cert
    async with (
        running_node(alice, root, tmp_path / "a", peers=peers, external=modes[0] == "external") as a,
        running_node(bob, root, tmp_path / "b", peers=peers, external=modes[1] == "external") as b,
    ):
        peers.put(a.as_peer())
        peers.put(b.as_peer())
        got_a: dict[str, list[bytes]] = defaultdict(list)
        got_b: dict[str, list[bytes]] = defaultdict(list)
        done_a, done_b = trio.Event(), trio.Event()
        collect(a, got_a, (n, done_a))
        collect(b, got_b, (n, done_b))
        with trio.fail_after(120):
            for i in range(0, n, 10):
                await a.service.send_many(
                    [a.service.create_message(TOPIC, b"a%d" % j) for j in range(i, i + 10)], bob.legal_name
                )
                await b.service.send_many(
                    [b.service.create_message(TOPIC, b"b%d" % j) for j in range(i, i + 10)], alice.legal_name
                )
            await done_a.wait()
            await done_b.wait()
            await wait_until(
                lambda: all(
                    q.statistics().depth == 0
                    for node in (a, b)
                    for q in node.service.outbound_queues().values()
                )
            )
        assert got_b == {str(alice.legal_name): [b"a%d" % i for i in range(n)]}
        assert got_a == {str(bob.legal_name): [b"b%d" % i for i in range(n)]}
        if a.external is not None:
            assert a.external.control.state is bridge.ControlState.SYNCED
            assert a.endpoint is not None and a.endpoint.queries >= 1


async def test_bridge_follows_requests_and_deletes(
    alice: pki.NodeCredentials,
    bob: pki.NodeCredentials,
    carol: pki.NodeCredentials,
    network: pki.NetworkCredentials,
    tmp_path: Path,
) -> None:
    """A first send to a peer announces its queue; an address change re-announces it; removal deletes it."""
    peers = messaging.PeerDirectory()
    root = network.root.cert
    async with (
        running_node(alice, root, tmp_path / "a", peers=peers, external=True) as a,
        running_node(bob, root, tmp_path / "b", peers=peers) as b,
    ):
        ext = a.external
        assert ext is not None
        assert ext.control.bridges == {}
        assert ext.control.inboxes == (
            bridge.QueueEntry(legal_name=str(alice.legal_name), queue_name=a.service.config.inbox),
        )
        peers.put(b.as_peer())
        got: dict[str, list[bytes]] = defaultdict(list)
        done = trio.Event()
        collect(b, got, (1, done))
        await a.service.send(a.service.create_message(TOPIC, b"hello"), bob.legal_name)
        queue = messaging.outbound_queue(b.as_peer().key_hash)
        with trio.fail_after(30):
            await wait_until(lambda: queue in ext.control.bridges)
            assert ext.control.bridges[queue].addresses == (("127.0.0.1", b.port),)
            await done.wait()
            moved = messaging.Peer(
                legal_name=bob.legal_name, key_hash=b.as_peer().key_hash, addresses=[("127.0.0.2", b.port)]
            )
            peers.put(moved)
            await wait_until(lambda: ext.control.bridges[queue].addresses == (("127.0.0.2", b.port),))
            peers.remove(moved.key_hash)
            await wait_until(lambda: queue not in ext.control.bridges)
            await wait_until(lambda: ext.manager is not None and queue not in ext.manager.bridges())
        assert got == {str(alice.legal_name): [b"hello"]}


async def test_endpoint_authenticates_and_limits_addresses(
    alice: pki.NodeCredentials, network: pki.NetworkCredentials, tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match="loopback"):
        bridge.EndpointConfig(username="u", password="p", host="0.0.0.0")
    async with running_node(alice, network.root.cert, tmp_path / "a", external=True) as a:
        assert a.endpoint is not None and a.endpoint.port is not None
        port = a.endpoint.port
        wrong = amqp.ConnectionConfig(sasl_username="bridge", sasl_password="wrong")
        with trio.fail_after(30):
            with pytest.raises(transport.AuthenticationError):
                async with transport.open_amqp_connection("127.0.0.1", port, config=wrong):
                    pass
            anonymous = amqp.ConnectionConfig(sasl_mechanisms=("ANONYMOUS",))
            with pytest.raises(transport.AmqpTransportError):
                async with transport.open_amqp_connection("127.0.0.1", port, config=anonymous):
                    pass
            good = amqp.ConnectionConfig(sasl_username="bridge", sasl_password="secret")
            async with transport.open_amqp_connection("127.0.0.1", port, config=good) as conn:
                for address in ("p2p.inbound.DLsomeoneelse", "internal.p2p.dedup.0"):
                    with pytest.raises(transport.LinkDetachedError, match="unauthorized-access"):
                        await conn.open_sender(address)
                with pytest.raises(transport.LinkDetachedError, match="not-found"):
                    await conn.open_receiver("internal.peers.DLnobody")
                # a pre-settled (at-most-once) sender to the inbox: no outcome would reach its messages
                # (it used to be served); refused at attach as at the acceptor
                with pytest.raises(transport.LinkDetachedError, match=r"not-implemented.*pre-settled"):
                    await conn.open_sender(a.service.config.inbox, settle_mode=amqp.SenderSettleMode.SETTLED)
                # a message without the validated user the bridge must stamp is rejected, nothing stored
                sender = await conn.open_sender(a.service.config.inbox)
                message = messaging.to_amqp(
                    a.service.create_message(TOPIC, b"x"),
                    platform_version=1,
                    release_version="0",
                    sender_uuid="s",
                    send_seq_no=1,
                )
                outcome = await sender.send(message)
                assert isinstance(outcome, amqp.Rejected)
                assert outcome.error is not None and outcome.error.condition == "amqp:unauthorized-access"
                # stamped as a bridge must, but in another message-format (AMQP 1.0 section 2.7.5): the
                # endpoint stored it as a standard message; it is rejected with not-implemented
                props = dict(message.application_properties or {})
                props[messaging.HEADER_VALIDATED_USER] = "O=Bob, L=New York, C=US"
                stamped = attrs.evolve(message, application_properties=props)
                outcome = await sender.send(stamped, message_format=0x100)
                assert isinstance(outcome, amqp.Rejected)
                assert outcome.error is not None and outcome.error.condition == "amqp:not-implemented"
                assert a.service.inbox.statistics().depth == 0
                assert isinstance(await sender.send(stamped), amqp.Accepted)  # (format 0: taken)
                assert a.service.inbox.statistics().depth == 1


@pytest.mark.parametrize("external", [False, True], ids=["in-node", "external"])
async def test_a_rejected_message_is_dead_lettered_and_the_rest_flows(
    external: bool,
    alice: pki.NodeCredentials,
    bob: pki.NodeCredentials,
    network: pki.NetworkCredentials,
    tmp_path: Path,
) -> None:
    """Bob takes at most 2,000 bytes: Alice's 5,000-byte message is rejected for good. It must not block the
    messages behind it (no head-of-line blocking): it goes to Alice's dead-letter queue with the reason."""
    peers = messaging.PeerDirectory()
    root = network.root.cert
    small = bridge.AcceptorConfig(max_message_size=2000)
    async with (
        running_node(alice, root, tmp_path / "a", peers=peers, external=external) as a,
        running_node(bob, root, tmp_path / "b", peers=peers, acceptor_config=small) as b,
    ):
        peers.put(a.as_peer())
        peers.put(b.as_peer())
        got: dict[str, list[bytes]] = defaultdict(list)
        done = trio.Event()
        collect(b, got, (3, done))
        bodies = [b"first", bytes(5000), b"second", b"third"]
        await a.service.send_many([a.service.create_message(TOPIC, x) for x in bodies], bob.legal_name)
        with trio.fail_after(60):
            await done.wait()
            (queue,) = a.service.outbound_queues().values()
            await wait_until(lambda: queue.statistics().depth == 0)
        assert got == {str(alice.legal_name): [b"first", b"second", b"third"]}
        dead = a.broker.get_queue(messaging.DEAD_LETTER_QUEUE)
        (letter,) = [d async for d in dead.browse()]
        assert messaging.from_amqp(amqp.Message.decode(letter.payload)).data == bytes(5000)
        name, condition, _ = letter.headers.decode().split("\n", 2)
        assert (name, condition) == (queue.name, "amqp:link:message-size-exceeded")


async def test_external_bridge_reconnects_and_queries_again_after_the_endpoint_restarts(
    alice: pki.NodeCredentials,
    bob: pki.NodeCredentials,
    network: pki.NetworkCredentials,
    tmp_path: Path,
) -> None:
    """The node's endpoint goes away and comes back on the same port: the bridge backs off, reconnects,
    queries again (a new query id), keeps its P2P port and delivers what was queued meanwhile."""
    root = network.root.cert
    peers = messaging.PeerDirectory()
    server_ctx, client_ctx = contexts(alice, root)
    async with (
        running_node(bob, root, tmp_path / "b", peers=peers) as b,
        store.open_broker(tmp_path / "a") as broker,
        trio.open_nursery() as nursery,
    ):
        key_hash = pki.key_hash(alice.identity.cert.public_key())
        service = await messaging.MessagingService.open(
            broker, messaging.MessagingConfig(legal_name=alice.legal_name, key_hash=key_hash), peers
        )
        config = bridge.EndpointConfig(username="bridge", password="secret")
        first = bridge.LocalEndpoint(messaging=service, resolver=peers, config=config)
        scope = trio.CancelScope()

        async def serve(endpoint: bridge.LocalEndpoint, *, task_status: trio.TaskStatus[int]) -> None:
            with scope:
                await endpoint.run(task_status=task_status)

        port = await nursery.start(serve, first)
        ext = bridge.ExternalBridge(
            config=bridge.ExternalBridgeConfig(
                node_port=port,
                username="bridge",
                password="secret",
                bridges=bridge.BridgeConfig(initial_backoff_seconds=0.05, max_backoff_seconds=0.2),
            ),
            client_ssl_context=client_ctx,  # type: ignore[arg-type]
            server_ssl_context=server_ctx,  # type: ignore[arg-type]
        )
        await nursery.start(ext.run)
        with trio.fail_after(60):
            p2p_port = await ext.wait_serving()
            peers.put(b.as_peer())
            got: dict[str, list[bytes]] = defaultdict(list)
            done = trio.Event()
            collect(b, got, (2, done))
            await service.send(service.create_message(TOPIC, b"before"), bob.legal_name)
            await wait_until(lambda: len(got[str(alice.legal_name)]) == 1)
            scope.cancel()  # the node's endpoint goes away
            await wait_until(lambda: ext.control.state is not bridge.ControlState.SYNCED)
            await service.send(service.create_message(TOPIC, b"while away"), bob.legal_name)
            scope = trio.CancelScope()
            second = bridge.LocalEndpoint(
                messaging=service, resolver=peers, config=attrs.evolve(config, port=port)
            )
            await nursery.start(serve, second)
            await done.wait()
            assert ext.sessions >= 2 and second.queries >= 1
            assert ext.acceptor is not None and ext.acceptor.port == p2p_port
        assert got == {str(alice.legal_name): [b"before", b"while away"]}
        nursery.cancel_scope.cancel()


async def test_a_peer_s_message_arriving_while_the_node_is_away_is_released_and_delivered_once_it_is_back(
    alice: pki.NodeCredentials,
    bob: pki.NodeCredentials,
    network: pki.NetworkCredentials,
    tmp_path: Path,
) -> None:
    """Alice's bridge runs in its own process and her node goes away (it stopped on a full disk, say) while
    Bob keeps sending to her. The bridge's acceptor cannot store his delivery: it used to leave it
    unsettled on a link it no longer read, so Bob's bridge (its connection alive) waited for an outcome for
    ever, also after Alice was back. Now it is released and the link closed: Bob's bridge keeps the
    message, reconnects and delivers it once Alice's node is back, exactly once."""
    root = network.root.cert
    peers = messaging.PeerDirectory()
    server_ctx, client_ctx = contexts(alice, root)
    fast = bridge.BridgeConfig(initial_backoff_seconds=0.05, max_backoff_seconds=0.2)
    async with (
        running_node(bob, root, tmp_path / "b", peers=peers, bridge_config=fast) as b,
        store.open_broker(tmp_path / "a") as broker,
        trio.open_nursery() as nursery,
    ):
        key_hash = pki.key_hash(alice.identity.cert.public_key())
        service = await messaging.MessagingService.open(
            broker, messaging.MessagingConfig(legal_name=alice.legal_name, key_hash=key_hash), peers
        )
        got: list[bytes] = []

        async def handler(message: messaging.ReceivedMessage) -> None:
            got.append(message.data)

        service.add_message_handler(TOPIC, handler)
        await nursery.start(service.run)
        config = bridge.EndpointConfig(username="bridge", password="secret")
        scope = trio.CancelScope()

        async def serve(endpoint: bridge.LocalEndpoint, *, task_status: trio.TaskStatus[int]) -> None:
            with scope:
                await endpoint.run(task_status=task_status)

        port = await nursery.start(
            serve, bridge.LocalEndpoint(messaging=service, resolver=peers, config=config)
        )
        ext = bridge.ExternalBridge(
            config=bridge.ExternalBridgeConfig(
                node_port=port, username="bridge", password="secret", bridges=fast
            ),
            client_ssl_context=client_ctx,  # type: ignore[arg-type]
            server_ssl_context=server_ctx,  # type: ignore[arg-type]
        )
        await nursery.start(ext.run)
        with trio.fail_after(60):
            p2p_port = await ext.wait_serving()
            peers.put(b.as_peer())
            peers.put(
                messaging.Peer(
                    legal_name=alice.legal_name, key_hash=key_hash, addresses=[("127.0.0.1", p2p_port)]
                )
            )
            await b.service.send(b.service.create_message(TOPIC, b"before"), alice.legal_name)
            await wait_until(lambda: got == [b"before"])
            scope.cancel()  # Alice's node goes away; her bridge process stays
            await wait_until(lambda: ext.control.state is not bridge.ControlState.SYNCED)
            await b.service.send(b.service.create_message(TOPIC, b"while away"), alice.legal_name)
            (outbound,) = b.service.outbound_queues().values()
            await trio.sleep(0.5)  # (Bob's bridge sends it to Alice's acceptor, which cannot store it)
            assert outbound.statistics().depth == 1  # Bob still holds it
            scope = trio.CancelScope()
            second = bridge.LocalEndpoint(
                messaging=service, resolver=peers, config=attrs.evolve(config, port=port)
            )
            await nursery.start(serve, second)
        with trio.fail_after(20):
            await wait_until(lambda: len(got) == 2)
            await wait_until(lambda: outbound.statistics().depth == 0)
        await trio.sleep(0.5)  # (a duplicate would arrive now)
        assert got == [b"before", b"while away"]
        nursery.cancel_scope.cancel()


async def test_external_bridge_carries_a_message_above_10_mib_when_the_network_allows_it(
    alice: pki.NodeCredentials,
    bob: pki.NodeCredentials,
    network: pki.NetworkCredentials,
    tmp_path: Path,
) -> None:
    """The network's maxMessageSize is 12 MiB: an 11 MiB message goes through an external bridge as it does
    through the in-node one. The bridge's receiver on the node's endpoint used to advertise the transport's
    default 10 MiB, so the node dead-lettered the message as too large for the peer (which would take it)."""
    limit = 12 * 1024 * 1024
    peers = messaging.PeerDirectory()
    root = network.root.cert
    async with (
        running_node(alice, root, tmp_path / "a", peers=peers, external=True, max_message_size=limit) as a,
        running_node(bob, root, tmp_path / "b", peers=peers, max_message_size=limit) as b,
    ):
        peers.put(a.as_peer())
        peers.put(b.as_peer())
        got: dict[str, list[bytes]] = defaultdict(list)
        done = trio.Event()
        collect(b, got, (2, done))
        big = bytes(11 * 1024 * 1024)
        messages = [a.service.create_message(TOPIC, x) for x in (big, b"after")]
        await a.service.send_many(messages, bob.legal_name)
        with trio.fail_after(30):
            await done.wait()
        assert got == {str(alice.legal_name): [big, b"after"]}
        assert messaging.DEAD_LETTER_QUEUE not in a.broker.list_queues()


async def test_a_notify_link_that_falls_too_far_behind_is_detached_at_once(
    alice: pki.NodeCredentials, network: pki.NetworkCredentials, tmp_path: Path
) -> None:
    """A client whose notify link grants no more credit while NOTIFY_BACKLOG + 10 queries are answered: the
    endpoint detaches that link (protocol_spec/bridge-control.md) instead of keeping the backlog while the
    client stalls and then handing it over stale (the link used to end only once all of it was sent). The
    client then takes what it had buffered and its iteration ends: taking a buffered delivery of a link the
    peer had detached cleanly used to grant credit on the gone handle (LocalProtocolError)."""
    async with running_node(alice, network.root.cert, tmp_path / "a", external=True) as a:
        assert a.endpoint is not None and a.endpoint.port is not None
        good = amqp.ConnectionConfig(sasl_username="bridge", sasl_password="secret")
        async with transport.open_amqp_connection("127.0.0.1", a.endpoint.port, config=good) as conn:
            notify = await conn.open_receiver(bridge.NOTIFY_ADDRESS, credit=1, refill="empty")
            control = await conn.open_sender(bridge.CONTROL_ADDRESS)
            query = bridge.encode_control(bridge.QueueQuery(query_id="q", bridge_id="stalled"))
            for _ in range(NOTIFY_BACKLOG + 10):
                await control.start_send(query, settled=True)
            await wait_until(lambda: a.endpoint is not None and a.endpoint.queries > NOTIFY_BACKLOG + 10)
            received = 0
            with trio.fail_after(10):
                async for _ in notify:  # ends when the endpoint detaches the link
                    received += 1
            assert received <= 2


async def test_a_control_message_in_another_message_format_is_rejected_and_not_acted_on(
    alice: pki.NodeCredentials, network: pki.NetworkCredentials, tmp_path: Path
) -> None:
    """A logged-in local client sends a queue query with transfer message-format 5 (spec 2.7.5: not the
    standard AMQP message) on the control link: the endpoint read it as a standard one and answered it. It is
    rejected with amqp:not-implemented and nothing is answered; the same query in format 0 is."""
    async with running_node(alice, network.root.cert, tmp_path / "a", external=True) as a:
        assert a.endpoint is not None and a.endpoint.port is not None
        good = amqp.ConnectionConfig(sasl_username="bridge", sasl_password="secret")
        with trio.fail_after(30):
            async with transport.open_amqp_connection("127.0.0.1", a.endpoint.port, config=good) as conn:
                await wait_until(lambda: a.endpoint is not None and a.endpoint.queries >= 1)  # its own bridge
                queries = a.endpoint.queries
                control = await conn.open_sender(bridge.CONTROL_ADDRESS)
                query = bridge.encode_control(bridge.QueueQuery(query_id="q", bridge_id="odd"))
                outcome = await control.send(query, message_format=5)
                assert isinstance(outcome, amqp.Rejected), outcome
                assert outcome.error is not None and outcome.error.condition == "amqp:not-implemented"
                assert a.endpoint.queries == queries
                assert isinstance(await control.send(query), amqp.Accepted)
                await wait_until(lambda: a.endpoint is not None and a.endpoint.queries == queries + 1)


async def test_a_consumer_link_below_the_network_s_max_message_size_is_refused(
    alice: pki.NodeCredentials, bob: pki.NodeCredentials, network: pki.NetworkCredentials, tmp_path: Path
) -> None:
    """A logged-in local client attaches a receiver from an outbound queue advertising a max-message-size
    below the network's: the endpoint used to accept it, could not send the 5,000-byte message over it and
    dead-lettered it for good, by the client's choice. The link is refused with amqp:precondition-failed
    naming both limits; the message stays queued and reaches a link without that limit."""
    peers = messaging.PeerDirectory()
    # Bob's address has no listener: the node's own external bridge never consumes his queue
    key_hash = pki.key_hash(bob.identity.cert.public_key())
    peers.put(messaging.Peer(legal_name=bob.legal_name, key_hash=key_hash, addresses=[("127.0.0.1", 1)]))
    root = network.root.cert
    async with running_node(
        alice, root, tmp_path / "a", peers=peers, external=True, max_message_size=20_000
    ) as a:
        assert a.endpoint is not None and a.endpoint.port is not None
        await a.service.send(a.service.create_message(TOPIC, bytes(5000)), bob.legal_name)
        (queue,) = a.service.outbound_queues().values()
        good = amqp.ConnectionConfig(sasl_username="bridge", sasl_password="secret")
        with trio.fail_after(30):
            async with transport.open_amqp_connection("127.0.0.1", a.endpoint.port, config=good) as conn:
                with pytest.raises(transport.LinkDetachedError) as info:
                    receiver = await conn.open_receiver(queue.name, max_message_size=1000)
                    await receiver.receive()
                assert info.value.condition == "amqp:precondition-failed"
                assert "20000" in str(info.value) and "1000" in str(info.value)
                assert messaging.DEAD_LETTER_QUEUE not in a.broker.list_queues()
                receiver = await conn.open_receiver(queue.name, max_message_size=20_000)  # served
                delivery = await receiver.receive()
                assert messaging.from_amqp(delivery.message).data == bytes(5000)
                await delivery.release()  # (back in the queue)
                await receiver.aclose()
                await wait_until(lambda: queue.statistics().depth == 1)
        assert messaging.DEAD_LETTER_QUEUE not in a.broker.list_queues()


async def test_an_external_bridge_whose_node_is_down_logs_one_warning_and_one_line_when_it_is_back(
    alice: pki.NodeCredentials,
    network: pki.NetworkCredentials,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Over real sockets: the bridge starts with nothing listening on the node's endpoint, retrying every
    ~0.05 s. It logged a warning per attempt (``session with the node ended: OSError: all attempts to
    connect ... failed``) for as long as the node was down; now the first (``could not connect to the node
    at ...``: no session had been up), and an info line once the endpoint is up and the bridge reconnected."""
    caplog.set_level(logging.INFO, logger="corda_trio.bridge.external")
    port = free_port()  # nothing listens there yet (the endpoint does later)
    peers = messaging.PeerDirectory()
    server_ctx, client_ctx = contexts(alice, network.root.cert)
    async with store.open_broker(tmp_path / "a") as broker, trio.open_nursery() as nursery:
        key_hash = pki.key_hash(alice.identity.cert.public_key())
        service = await messaging.MessagingService.open(
            broker, messaging.MessagingConfig(legal_name=alice.legal_name, key_hash=key_hash), peers
        )
        ext = bridge.ExternalBridge(
            config=bridge.ExternalBridgeConfig(
                node_port=port,
                username="bridge",
                password="secret",
                bridges=bridge.BridgeConfig(initial_backoff_seconds=0.02, max_backoff_seconds=0.05),
            ),
            client_ssl_context=client_ctx,  # type: ignore[arg-type]
            server_ssl_context=server_ctx,  # type: ignore[arg-type]
        )
        await nursery.start(ext.run)
        await trio.sleep(1.5)  # ~30 attempts fail
        endpoint = bridge.LocalEndpoint(
            messaging=service,
            resolver=peers,
            config=bridge.EndpointConfig(username="bridge", password="secret", port=port),
        )
        await nursery.start(endpoint.run)
        with trio.fail_after(30):
            await wait_until(lambda: ext.sessions == 1)
        nursery.cancel_scope.cancel()
    name = f"bridge {ext.config.bridge_id}"
    lines = [
        (r.levelno, r.getMessage())
        for r in caplog.records
        if r.name == "corda_trio.bridge.external" and "accepting peers on port" not in r.getMessage()
    ]
    assert lines[0] == (
        logging.WARNING,
        f"{name}: could not connect to the node at 127.0.0.1:{port}: OSError: all attempts to connect to"
        f" 127.0.0.1:{port} failed (Connection refused)",
    )
    (level, back) = lines[1]
    assert len(lines) == 2 and level == logging.INFO, lines
    assert back.startswith(f"{name}: the node at 127.0.0.1:{port}: reconnected after "), back
    attempts = int(back.split("reconnected after ")[1].split()[0])
    assert attempts >= 10
