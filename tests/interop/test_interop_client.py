"""Our client against third-party AMQP 1.0 peers: Qpid Proton, RabbitMQ 3.10, rhea (see conftest.py)."""

from __future__ import annotations

import ssl
import uuid

import attrs
import pytest
import trio

from corda_trio import amqp, transport

from .conftest import Peer

pytestmark = [pytest.mark.interop]

COUNT = 1000
FIVE_MIB = 5 * 1024 * 1024


def message(i: int, size: int = 256) -> amqp.Message:
    return amqp.Message(
        header=amqp.Header(durable=True),
        properties=amqp.Properties(message_id=f"m-{i}"),
        application_properties={"seq": i, "platform-topic": "interop", "sender-uuid": "u-1"},
        body=bytes([i % 251]) * size,
    )


def data_body(msg: amqp.Message) -> bytes:
    body = msg.body
    if isinstance(body, bytes):
        return body
    return b"".join(body)  # a sequence of Data sections


async def test_thousand_messages_round_trip(peer: Peer) -> None:
    """Send 1,000 messages (app properties + Data body), every outcome accepted, then get them all back."""
    address = peer.address(f"interop-{uuid.uuid4().hex[:8]}")
    with trio.fail_after(60):
        async with transport.open_amqp_connection("127.0.0.1", peer.port, config=peer.config) as conn:
            sender = await conn.open_sender(address)
            pending = [await sender.start_send(message(i)) for i in range(COUNT)]
            outcomes = [await p.outcome() for p in pending if p is not None]
            assert len(outcomes) == COUNT
            assert all(o == amqp.Accepted() for o in outcomes), {type(o).__name__ for o in outcomes}
            await sender.aclose()

            receiver = await conn.open_receiver(address, credit=200, refill=peer.refill)
            for i in range(COUNT):
                delivery = await receiver.receive()
                msg = delivery.message
                assert msg.application_properties is not None
                assert msg.application_properties["seq"] == i
                assert msg.application_properties["platform-topic"] == "interop"
                assert data_body(msg) == bytes([i % 251]) * 256
                await delivery.accept()
            await receiver.aclose()


async def test_five_mib_message_both_ways(peer: Peer) -> None:
    """A 5 MiB message goes out split at the peer's max-frame-size and comes back reassembled."""
    address = peer.address(f"big-{uuid.uuid4().hex[:8]}")
    payload = bytes(range(256)) * (FIVE_MIB // 256)
    with trio.fail_after(60):
        async with transport.open_amqp_connection("127.0.0.1", peer.port, config=peer.config) as conn:
            sender = await conn.open_sender(address)
            outcome = await sender.send(amqp.Message(application_properties={"big": True}, body=payload))
            assert outcome == amqp.Accepted()
            receiver = await conn.open_receiver(address, credit=1)
            delivery = await receiver.receive()
            assert len(delivery.payload) > FIVE_MIB
            msg = delivery.message
            assert data_body(msg) == payload
            assert msg.application_properties == {"big": True}
            await delivery.accept()


@pytest.mark.parametrize(
    ("which", "idle_ms"),
    [
        ("proton_broker", 1500),
        ("rhea_broker", 1500),
        # RabbitMQ 3.10 heartbeats in whole seconds and not at all below one: with 1.5 s (750 ms advertised)
        # it stays silent and we close it, rightly, with amqp:resource-limit-exceeded. 4 s works.
        ("rabbitmq", 4000),
    ],
)
async def test_idle_connection_survives(which: str, idle_ms: int, request: pytest.FixtureRequest) -> None:
    """Short idle timeouts on both sides (ours 1.5-4 s, Proton 2 s): heartbeats keep the link up for 3x."""
    peer: Peer = request.getfixturevalue(which)
    config = attrs.evolve(peer.config, idle_timeout_ms=idle_ms)
    address = peer.address(f"idle-{uuid.uuid4().hex[:8]}")
    async with transport.open_amqp_connection("127.0.0.1", peer.port, config=config) as conn:
        sender = await conn.open_sender(address)
        await trio.sleep(3 * idle_ms / 1000)  # 3x our idle timeout (and > 2x Proton's)
        assert not conn.closed
        assert await sender.send(message(1)) == amqp.Accepted()
        if which == "proton_broker":
            assert conn._engine.remote_idle_timeout_ms == 1000  # Proton advertises half of its 2 s


async def test_wrong_password_at_rabbitmq_is_a_clear_error(rabbitmq: Peer) -> None:
    config = attrs.evolve(rabbitmq.config, sasl_password="not-the-password")
    with trio.fail_after(20), pytest.raises(transport.AuthenticationError) as info:
        async with transport.open_amqp_connection("127.0.0.1", rabbitmq.port, config=config):
            pass
    assert "guest" in str(info.value)
    assert "auth" in str(info.value)


async def test_rabbitmq_refuses_unknown_address_prefix(rabbitmq: Peer) -> None:
    """RabbitMQ answers an attach to an address it does not know with a refusal: a clear LinkDetachedError."""
    async with transport.open_amqp_connection("127.0.0.1", rabbitmq.port, config=rabbitmq.config) as conn:
        with pytest.raises(transport.LinkDetachedError) as info:
            await conn.open_sender("/nonsense/x")
        assert info.value.condition is not None
        sender = await conn.open_sender(rabbitmq.address("after-refusal"))
        assert await sender.send(message(0)) == amqp.Accepted()


async def test_mutual_tls_with_proton(proton_tls_broker: Peer, tls_pems: tuple) -> None:
    """Mutual TLS: Proton requires our client certificate; we trust only the test CA and check the host."""
    _, ca, client_cert = tls_pems
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    ca.configure_trust(ctx)
    client_cert.configure_cert(ctx)
    address = f"tls-{uuid.uuid4().hex[:8]}"
    with trio.fail_after(30):
        async with transport.open_amqp_connection(
            "127.0.0.1",
            proton_tls_broker.port,
            ssl_context=ctx,
            server_hostname="localhost",
            config=proton_tls_broker.config,
        ) as conn:
            sender = await conn.open_sender(address)
            for i in range(50):
                assert await sender.send(message(i)) == amqp.Accepted()
            receiver = await conn.open_receiver(address, credit=10, refill=proton_tls_broker.refill)
            for i in range(50):
                d = await receiver.receive()
                assert d.message.application_properties["seq"] == i
                await d.accept()


async def test_proton_tls_refuses_client_without_certificate(
    proton_tls_broker: Peer, tls_pems: tuple
) -> None:
    _, ca, _ = tls_pems
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    ca.configure_trust(ctx)
    with trio.fail_after(20), pytest.raises(transport.AmqpConnectionError):
        async with transport.open_amqp_connection(
            "127.0.0.1",
            proton_tls_broker.port,
            ssl_context=ctx,
            server_hostname="localhost",
            config=proton_tls_broker.config,
        ):
            pass
