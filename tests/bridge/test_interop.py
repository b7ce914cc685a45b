"""Third-party peers: Qpid Proton delivers into our inbox over mutual TLS (and is refused elsewhere); our
bridge delivers into RabbitMQ standing in for a peer's inbox, with Corda's headers."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

import pytest
import trio

from corda_trio import amqp, bridge, messaging, pki, store, transport
from tests.interop.conftest import Peer, rhea_node_path
from tests.p2p_harness import running_node, wait_until

pytestmark = [pytest.mark.interop]

PROTON_CLIENT = Path(__file__).with_name("proton_p2p_client.py")


def client_tls(tmp_path: Path, creds: pki.NodeCredentials, network: pki.NetworkCredentials) -> Path:
    """A directory with ``client.pem`` (``creds``' TLS chain), ``client.key`` and ``ca.pem`` (the network
    root): what the third-party clients here read."""
    tls = tmp_path / "client-tls"
    tls.mkdir()
    pki.write_certificates(tls / "client.pem", creds.tls_chain)
    pki.write_private_key(tls / "client.key", creds.tls.key, None)
    pki.write_certificates(tls / "ca.pem", [network.root.cert])
    return tls


async def _proton(port: int, address: str, count: int, tls: Path, *more: str) -> dict[str, object]:
    result = await trio.run_process(
        [
            sys.executable,
            str(PROTON_CLIENT),
            "--port",
            str(port),
            "--address",
            address,
            "--count",
            str(count),
            "--tls",
            str(tls),
            *more,
        ],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    lines = [ln for ln in result.stdout.decode().splitlines() if ln.startswith("{")]
    assert result.returncode == 0 and lines, result.stderr.decode()[-2000:]
    return json.loads(lines[-1])  # type: ignore[no-any-return]


async def test_proton_delivers_into_our_inbox_and_is_refused_elsewhere(
    alice: pki.NodeCredentials, bob: pki.NodeCredentials, network: pki.NetworkCredentials, tmp_path: Path
) -> None:
    tls = client_tls(tmp_path, alice, network)
    async with running_node(bob, network.root.cert, tmp_path / "b", run_service=False) as b:
        inbox = b.service.inbox
        with trio.fail_after(120):
            out = await _proton(b.port, inbox.name, 300, tls)
            assert out == {**out, "sent": 300, "accepted": 300, "rejected": 0, "released": 0, "error": None}
            refused = await _proton(b.port, "internal.peers.DLsomeone", 1, tls)
            # a sender that proposes receiver-settle-mode second learns that the inbox settles first (it
            # settles each delivery as it reports the outcome): our attach said so, not an echo
            second = await _proton(b.port, inbox.name, 20, tls, "--rcv-settle-mode", "second")
        assert out["remote_rcv_settle_mode"] == "first"
        assert second == {**second, "accepted": 20, "error": None, "remote_rcv_settle_mode": "first"}
        assert refused["accepted"] == 0
        assert "amqp:unauthorized-access" in str(refused["error"]) and inbox.name in str(refused["error"])
        stored = [messaging.from_amqp(amqp.Message.decode(d.payload)) async for d in inbox.browse()]
        assert [m.data for m in stored] == [b"proton-%d" % i for i in range(300)] + [
            b"proton-%d" % i for i in range(20)
        ]
        assert {m.validated_user for m in stored} == {str(alice.legal_name)}


@pytest.mark.parametrize("external", [False, True], ids=["in-node", "bridge-process"])
@pytest.mark.parametrize("how", ["detach", "close"])
async def test_a_link_detached_while_its_messages_are_stored_then_attached_again(
    alice: pki.NodeCredentials,
    bob: pki.NodeCredentials,
    network: pki.NetworkCredentials,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    how: str,
    external: bool,
) -> None:
    """Proton sends 200 messages and, without waiting for their outcomes, detaches its link (closed=false,
    or closed=true), then attaches a link of the same name on the same connection and sends them again.
    Proton puts the new attach on the wire before the old link's transfers and detach; the node used to
    close the whole connection (amqp:not-allowed, "already attached"), so the second link failed too. Now
    the old link is detached with amqp:link:stolen (spec 2.6.1) and the new one gets every message
    accepted, in the node's acceptor and in a bridge process alike, with nothing logged as an error."""
    tls = client_tls(tmp_path, alice, network)
    async with running_node(
        bob, network.root.cert, tmp_path / "b", run_service=False, external=external
    ) as b:
        with trio.fail_after(120):
            out = await _proton(b.port, b.service.inbox.name, 200, tls, "--detach-first", how)
        assert out == {**out, "sent": 200, "accepted": 200, "rejected": 0, "released": 0, "error": None}
        stored = [messaging.from_amqp(amqp.Message.decode(d.payload)) async for d in b.service.inbox.browse()]
        # all of the second link's, and whatever of the first link's the node stored before it went (the
        # messaging service drops the duplicates by their _AMQ_DUPL_ID)
        assert {m.data for m in stored} == {b"proton-%d" % i for i in range(200)}
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text[-3000:]


@pytest.mark.parametrize("external", [False, True], ids=["in-node", "bridge-process"])
async def test_a_pre_settled_sender_is_refused_at_attach(
    alice: pki.NodeCredentials,
    bob: pki.NodeCredentials,
    network: pki.NetworkCredentials,
    tmp_path: Path,
    external: bool,
) -> None:
    """Proton attaches its sender in snd-settle-mode settled (at-most-once: every message pre-settled).
    The acceptor used to take the link and store what it could: a message it refused, or lost before it
    was stored, was gone without the sender hearing of it, as no outcome reaches a pre-settled delivery.
    The link is refused at attach with amqp:not-implemented, saying why; nothing is stored."""
    tls = client_tls(tmp_path, alice, network)
    async with running_node(
        bob, network.root.cert, tmp_path / "b", run_service=False, external=external
    ) as b:
        with trio.fail_after(120):
            out = await _proton(b.port, b.service.inbox.name, 5, tls, "--snd-settle-mode", "settled")
        assert out["accepted"] == 0 and str(out["error"]).startswith("amqp:not-implemented: ")
        assert "pre-settled" in str(out["error"]) and "snd-settle-mode unsettled" in str(out["error"])
        assert [d async for d in b.service.inbox.browse()] == []
        assert b.acceptor.refused_links == 1


async def test_our_bridge_delivers_into_rabbitmq_with_corda_headers(rabbitmq: Peer, tmp_path: Path) -> None:
    """RabbitMQ (AMQP 1.0 plugin) stands in for a peer's inbox: a bridge moves a durable outbound queue
    into the RabbitMQ queue ``p2p.inbound.<key-hash>``, acking only what RabbitMQ accepted; read back, every
    message carries Corda's P2P headers, in order."""
    key_hash = "DLrabbitPeer"
    peer = messaging.Peer(
        legal_name=pki.CordaX500Name.parse("O=Rabbit, L=London, C=GB"),
        key_hash=key_hash,
        addresses=[("127.0.0.1", rabbitmq.port)],
    )
    resolver = messaging.PeerDirectory.of([peer])
    n = 200
    config = bridge.BridgeConfig(amqp_config=rabbitmq.config, target_prefix="/queue/", credit=16)
    async with store.open_broker(tmp_path / "store") as broker:
        queue = await broker.declare_queue(messaging.outbound_queue(key_hash))
        await queue.enqueue_many(
            [
                messaging.to_amqp(
                    messaging.OutgoingMessage(topic="test.p2p", data=b"r%d" % i, dedup_id=f"R-{i}"),
                    platform_version=1,
                    release_version="0.1.0",
                    sender_uuid="s",
                    send_seq_no=i,
                ).encode()
                for i in range(n)
            ]
        )
        b = bridge.Bridge(queue=queue, resolver=resolver, ssl_context=None, config=config)
        with trio.fail_after(120):
            async with trio.open_nursery() as nursery:
                await nursery.start(b.run)
                await wait_until(lambda: b.delivered == n)
                nursery.cancel_scope.cancel()
        assert queue.statistics().depth == 0
    got = []
    with trio.fail_after(120):
        async with transport.open_amqp_connection("127.0.0.1", rabbitmq.port, config=rabbitmq.config) as conn:
            receiver = await conn.open_receiver(
                rabbitmq.address(messaging.inbox_address(key_hash)), credit=50, refill=rabbitmq.refill
            )
            while len(got) < n:
                delivery = await receiver.receive()
                got.append(messaging.from_amqp(delivery.message))
                await delivery.accept()
    assert [m.data for m in got] == [b"r%d" % i for i in range(n)]
    assert [m.dedup_id for m in got] == [f"R-{i}" for i in range(n)]
    assert {(m.topic, m.platform_version, m.sender_uuid) for m in got} == {("test.p2p", 1, "s")}


RHEA_CLIENT = Path(__file__).with_name("rhea_p2p_client.js")


async def test_rhea_s_delivery_in_another_message_format_is_rejected_and_not_stored(
    alice: pki.NodeCredentials, bob: pki.NodeCredentials, network: pki.NetworkCredentials, tmp_path: Path
) -> None:
    """rhea (a real peer over mutual TLS) sends three well-formed P2P messages with transfer message-formats
    0, 0x80013700 (a vendor's format) and 0. The acceptor used to store all three as standard messages; the
    one in the other format is rejected with amqp:not-implemented and never stored, the others are."""
    tls = client_tls(tmp_path, alice, network)
    env = {**os.environ, "NODE_PATH": rhea_node_path()}
    async with running_node(bob, network.root.cert, tmp_path / "b", run_service=False) as b:
        inbox = b.service.inbox
        with trio.fail_after(60):
            result = await trio.run_process(
                ["node", str(RHEA_CLIENT), str(b.port), inbox.name, str(tls), "0", str(0x80013700), "0"],
                capture_stdout=True, capture_stderr=True, env=env, check=False,
            )  # fmt: skip
        lines = [ln for ln in result.stdout.decode().splitlines() if ln.startswith("{")]
        assert result.returncode == 0 and lines, result.stderr.decode()[-2000:]
        out = json.loads(lines[-1])
        assert out == {"outcomes": ["accepted", "amqp:not-implemented", "accepted"], "error": None}
        stored = [messaging.from_amqp(amqp.Message.decode(d.payload)) async for d in inbox.browse()]
        assert [m.data for m in stored] == [b"rhea-0", b"rhea-2"]
