"""Bridges and the inbound acceptor over real sockets and real mutual TLS, in one process."""

from __future__ import annotations

import datetime as dt
import logging
import random
import ssl
from collections import defaultdict
from pathlib import Path

import attrs
import pytest
import trio

from corda_trio import amqp, bridge, messaging, pki, transport
from tests.p2p_harness import P2PNode, contexts, running_node, wait_until
from tests.ports import refused_port

TOPIC = "test.p2p"


def collect(
    node: P2PNode, got: dict[str, list[bytes]], event_at: tuple[int, trio.Event] | None = None
) -> None:
    async def handler(message: messaging.ReceivedMessage) -> None:
        got[message.validated_user or ""].append(message.data)
        if event_at is not None and sum(len(v) for v in got.values()) >= event_at[0]:
            event_at[1].set()

    node.service.add_message_handler(TOPIC, handler)


async def test_exchange_both_ways_exactly_once_in_order(
    alice: pki.NodeCredentials, bob: pki.NodeCredentials, network: pki.NetworkCredentials, tmp_path: Path
) -> None:
    n = 400
    peers = messaging.PeerDirectory()
    root = network.root.cert
    async with (
        running_node(alice, root, tmp_path / "a", peers=peers) as a,
        running_node(bob, root, tmp_path / "b", peers=peers) as b,
    ):
        peers.put(a.as_peer())
        peers.put(b.as_peer())
        got_a: dict[str, list[bytes]] = defaultdict(list)
        got_b: dict[str, list[bytes]] = defaultdict(list)
        done_a, done_b = trio.Event(), trio.Event()
        collect(a, got_a, (n, done_a))
        collect(b, got_b, (n, done_b))
        with trio.fail_after(120):
            for i in range(n):
                await a.service.send(a.service.create_message(TOPIC, b"a%d" % i), bob.legal_name)
                await b.service.send(b.service.create_message(TOPIC, b"b%d" % i), alice.legal_name)
            await done_a.wait()
            await done_b.wait()
            # wait for the senders' WAL acks
            await wait_until(
                lambda: (
                    not (
                        [x.delivered for x in [*a.manager.bridges().values(), *b.manager.bridges().values()]]
                        != [n, n]
                    )
                )
            )
        assert got_b == {str(alice.legal_name): [b"a%d" % i for i in range(n)]}
        assert got_a == {str(bob.legal_name): [b"b%d" % i for i in range(n)]}
        for node in (a, b):
            (queue,) = node.service.outbound_queues().values()
            assert queue.statistics().depth == 0


async def test_self_send_goes_to_own_inbox(
    alice: pki.NodeCredentials, network: pki.NetworkCredentials, tmp_path: Path
) -> None:
    async with running_node(alice, network.root.cert, tmp_path / "a") as a:
        got: dict[str, list[bytes]] = defaultdict(list)
        done = trio.Event()
        collect(a, got, (1, done))
        await a.service.send(a.service.create_message(TOPIC, b"me"), alice.legal_name)
        with trio.fail_after(30):
            await done.wait()
        assert got == {str(alice.legal_name): [b"me"]}
        assert a.service.outbound_queues() == {}


async def test_send_refuses_oversize_and_unknown_recipient(
    alice: pki.NodeCredentials, bob: pki.NodeCredentials, network: pki.NetworkCredentials, tmp_path: Path
) -> None:
    async with running_node(alice, network.root.cert, tmp_path / "a", max_message_size=2000) as a:
        with pytest.raises(messaging.MessageTooLargeError, match="max_message_size of 2000 bytes"):
            await a.service.send(a.service.create_message(TOPIC, bytes(3000)), alice.legal_name)
        with pytest.raises(messaging.UnknownRecipientError, match="Bob"):
            await a.service.send(a.service.create_message(TOPIC, b"x"), bob.legal_name)
        assert a.service.inbox.statistics().depth == 0
        # check_size tells beforehand, for any recipient (known or not), and never counts as a send
        for recipient in (alice.legal_name, bob.legal_name):
            with pytest.raises(messaging.MessageTooLargeError, match="max_message_size of 2000 bytes"):
                a.service.check_size(a.service.create_message(TOPIC, bytes(3000)), recipient)
            a.service.check_size(a.service.create_message(TOPIC, bytes(1000)), recipient)
        await a.service.send(a.service.create_message(TOPIC, bytes(1000)), alice.legal_name)
        assert a.service.inbox.statistics().depth == 1


async def test_a_send_to_a_node_not_in_the_map_tells_the_peer_directory(
    alice: pki.NodeCredentials, bob: pki.NodeCredentials, network: pki.NetworkCredentials, tmp_path: Path
) -> None:
    """The node learnt of a peer only at its next poll of the map (up to its max-age, 30 s): a first flow to
    a node that joined since waited that long. Now each send to a name or key-hash the directory does not
    hold tells it (``report_unknown``), and the node has its map updater poll early on that hook."""
    asked: list[None] = []
    peers = messaging.PeerDirectory(on_unknown=lambda: asked.append(None))
    async with running_node(alice, network.root.cert, tmp_path / "a", peers=peers) as a:
        await a.service.send(a.service.create_message(TOPIC, b"me"), alice.legal_name)
        assert asked == []
        for recipient in (bob.legal_name, pki.key_hash(bob.identity.cert.public_key())):
            with pytest.raises(messaging.UnknownRecipientError):
                await a.service.send(a.service.create_message(TOPIC, b"x"), recipient)
        assert len(asked) == 2
        peers.put(
            messaging.Peer(
                legal_name=bob.legal_name, key_hash=pki.key_hash(bob.identity.cert.public_key()), addresses=[]
            )
        )
        await a.service.send(a.service.create_message(TOPIC, b"x"), bob.legal_name)
        assert len(asked) == 2


def wire(sender: pki.NodeCredentials, i: int, **extra: object) -> amqp.Message:
    message = messaging.to_amqp(
        messaging.OutgoingMessage(topic=TOPIC, data=b"m%d" % i, dedup_id=f"id-{i}"),
        platform_version=1,
        release_version="t",
        sender_uuid="u",
        send_seq_no=i,
    )
    props = dict(message.application_properties or {})
    for k, v in extra.items():
        if v is None:
            props.pop(k, None)
        else:
            props[k] = v
    return amqp.Message(
        header=message.header, properties=message.properties, application_properties=props, body=message.body
    )


async def test_acceptor_security_cases(
    alice: pki.NodeCredentials,
    bob: pki.NodeCredentials,
    carol: pki.NodeCredentials,
    network: pki.NetworkCredentials,
    mallory: tuple[pki.NodeCredentials, pki.NetworkCredentials],
    tmp_path: Path,
) -> None:
    root = network.root.cert
    async with running_node(bob, root, tmp_path / "b", max_message_size=4096, run_service=False) as b:
        inbox = b.service.inbox
        _, client = contexts(alice, root)
        async with transport.open_amqp_connection(
            "127.0.0.1",
            b.port,
            ssl_context=client,
            peer_check=lambda t: pki.check_peer_legal_name(t, bob.legal_name),
        ) as conn:
            # any address other than the inbox is refused, naming the allowed one
            for address in ["p2p.inbound.DLsomeoneelse", "internal.peers.DLx", inbox.name + "x"]:
                with pytest.raises(transport.LinkDetachedError) as info:
                    s = await conn.open_sender(address)
                    await s.send(wire(alice, 0))
                assert info.value.condition == "amqp:unauthorized-access"
                assert inbox.name in str(info.value)
            with pytest.raises(transport.LinkDetachedError) as info:
                await conn.open_receiver(inbox.name)
            assert info.value.condition == "amqp:unauthorized-access"

            sender = await conn.open_sender(inbox.name)
            bad = {
                "spoofed": (
                    wire(alice, 1, _AMQ_VALIDATED_USER=str(carol.legal_name)),
                    "amqp:unauthorized-access",
                ),
                "no topic": (wire(alice, 3, **{"platform-topic": None}), "amqp:invalid-field"),
                "no dedup id": (wire(alice, 4, _AMQ_DUPL_ID=None), "amqp:invalid-field"),
                "bad version": (wire(alice, 5, **{"platform-version": "one"}), "amqp:invalid-field"),
            }
            for what, (message, condition) in bad.items():
                outcome = await sender.send(message)
                assert isinstance(outcome, amqp.Rejected), what
                assert outcome.error is not None and outcome.error.condition == condition, what
            assert inbox.statistics().depth == 0  # nothing stored
            # the link stays up: a good message (claiming the right user, too) is accepted and stamped
            assert isinstance(
                await sender.send(wire(alice, 6, _AMQ_VALIDATED_USER=str(alice.legal_name))), amqp.Accepted
            )
            assert isinstance(await sender.send(wire(alice, 7)), amqp.Accepted)
            # the network's max_message_size is the link's own: advertised in the acceptor's attach, so a
            # sender refuses a bigger message before sending it (a peer that sends one anyway loses the
            # link at the first frame past the limit: test_hostile.py::test_per_link_max_message_size)
            assert sender.remote_attach.max_message_size == 4096
            oversize = amqp.Message(
                header=amqp.Header(durable=True),
                application_properties=dict(wire(alice, 2).application_properties or {}),
                body=bytes(5000),
            )
            with pytest.raises(transport.AmqpTransportError) as too_big:
                await sender.send(oversize)
            assert too_big.value.condition == "amqp:link:message-size-exceeded"
        stored = [messaging.from_amqp(amqp.Message.decode(d.payload)) async for d in inbox.browse()]
        assert [(m.data, m.validated_user) for m in stored] == [
            (b"m6", str(alice.legal_name)),
            (b"m7", str(alice.legal_name)),
        ]

        # another root: refused in the TLS handshake, nothing stored, the acceptor keeps serving
        foreign, other_net = mallory
        _, foreign_client = contexts(foreign, other_net.root.cert)
        with pytest.raises(transport.HandshakeError):
            async with transport.open_amqp_connection(
                "127.0.0.1", b.port, ssl_context=foreign_client
            ) as conn:
                await (await conn.open_sender(inbox.name)).send(wire(foreign, 8))
        # another peer is unaffected
        _, carol_client = contexts(carol, root)
        async with transport.open_amqp_connection("127.0.0.1", b.port, ssl_context=carol_client) as conn:
            assert isinstance(await (await conn.open_sender(inbox.name)).send(wire(carol, 9)), amqp.Accepted)
        assert inbox.statistics().depth == 3
        assert b.acceptor.rejected == len(bad)


async def test_wrong_legal_name_at_the_address_is_parked(
    alice: pki.NodeCredentials,
    bob: pki.NodeCredentials,
    carol: pki.NodeCredentials,
    network: pki.NetworkCredentials,
    tmp_path: Path,
) -> None:
    """The map says Bob is at an address where Carol answers: the bridge parks it and sends nothing."""
    root = network.root.cert
    peers = messaging.PeerDirectory()
    async with (
        running_node(alice, root, tmp_path / "a", peers=peers) as a,
        running_node(carol, root, tmp_path / "c", run_service=False) as c,
    ):
        bob_key_hash = pki.key_hash(bob.identity.cert.public_key())
        peers.put(
            messaging.Peer(
                legal_name=bob.legal_name, key_hash=bob_key_hash, addresses=[("127.0.0.1", c.port)]
            )
        )
        await a.service.send(a.service.create_message(TOPIC, b"for bob"), bob.legal_name)
        with trio.fail_after(30):
            await wait_until(
                lambda: not (not a.manager.bridges() or not next(iter(a.manager.bridges().values())).parked())
            )
        (b,) = a.manager.bridges().values()
        assert list(b.parked()) == [("127.0.0.1", c.port)]
        assert "identity" in (b.last_error or "")
        assert c.service.inbox.statistics().depth == 0
        assert a.service.outbound_queues()[messaging.outbound_queue(bob_key_hash)].statistics().depth == 1


async def test_a_peer_with_several_addresses_is_dialled_in_turn_past_an_impostor_and_a_closed_port(
    alice: pki.NodeCredentials,
    bob: pki.NodeCredentials,
    carol: pki.NodeCredentials,
    network: pki.NetworkCredentials,
    tmp_path: Path,
) -> None:
    """Bob's NodeInfo lists three addresses (as a node behind floats with ``[p2p] advertise`` publishes):
    Carol answers at the first, nobody listens at the second (a standby float's closed port), Bob at the
    third. Alice's bridge tries them in order: the first fails the TLS identity check and is parked, the
    second refuses the connection at once, the third delivers everything."""
    root = network.root.cert
    peers = messaging.PeerDirectory()
    fast = bridge.BridgeConfig(initial_backoff_seconds=0.05, max_backoff_seconds=0.05, backoff_jitter=0.0)
    closed = refused_port()  # a port nobody listens on
    async with (
        running_node(alice, root, tmp_path / "a", peers=peers, bridge_config=fast) as a,
        running_node(bob, root, tmp_path / "b", peers=peers) as b,
        running_node(carol, root, tmp_path / "c", run_service=False) as c,
    ):
        peers.put(a.as_peer())
        listed = [("127.0.0.1", c.port), ("127.0.0.1", closed), ("127.0.0.1", b.port)]
        peers.put(messaging.Peer(legal_name=bob.legal_name, key_hash=b.as_peer().key_hash, addresses=listed))
        got: dict[str, list[bytes]] = defaultdict(list)
        done = trio.Event()
        collect(b, got, (20, done))
        for i in range(20):
            await a.service.send(a.service.create_message(TOPIC, b"m%d" % i), bob.legal_name)
        with trio.fail_after(30):
            await done.wait()
        assert got == {str(alice.legal_name): [b"m%d" % i for i in range(20)]}
        (sender,) = a.manager.bridges().values()
        assert list(sender.parked()) == [("127.0.0.1", c.port)]  # the impostor only, not the closed port
        assert sender.failures == 2 and sender.connects == 1
        assert c.service.inbox.statistics().depth == 0


async def test_cancelling_bridges_at_random_moments_loses_nothing(
    alice: pki.NodeCredentials, bob: pki.NodeCredentials, network: pki.NetworkCredentials, tmp_path: Path
) -> None:
    """Bridges are stopped (removed from the map) and restarted (added) at random moments while messages flow;
    in the end each message reached the handler exactly once, in order, and the sender's queue is empty."""
    root = network.root.cert
    rng = random.Random(1234)
    n = 600
    peers = messaging.PeerDirectory()
    fast = bridge.BridgeConfig(initial_backoff_seconds=0.01, max_backoff_seconds=0.05, credit=32)
    async with (
        running_node(alice, root, tmp_path / "a", peers=peers, bridge_config=fast) as a,
        running_node(bob, root, tmp_path / "b", peers=peers) as b,
    ):
        peers.put(a.as_peer())
        got: dict[str, list[bytes]] = defaultdict(list)
        done = trio.Event()
        collect(b, got, (n, done))
        cycles = 0

        async def send_all() -> None:
            # In lots with a pause between, so that the bridge is cancelled many times while the messages
            # flow, however fast the machine moves them.
            for i in range(n):
                await a.service.send(a.service.create_message(TOPIC, b"%d" % i), b.as_peer())
                if i % 20 == 19:
                    await trio.sleep(0.02)

        with trio.fail_after(180):
            async with trio.open_nursery() as sending:
                sending.start_soon(send_all)
                while not done.is_set():
                    peers.put(b.as_peer())
                    await trio.sleep(rng.uniform(0, 0.05))
                    peers.remove(b.as_peer().key_hash)  # cancels the bridge wherever it is
                    cycles += 1
                    await trio.lowlevel.checkpoint()
                    if cycles > 400:
                        peers.put(b.as_peer())
                        await done.wait()
            peers.put(b.as_peer())
            queue = a.service.outbound_queues()[messaging.outbound_queue(b.as_peer().key_hash)]
            await wait_until(lambda: not (queue.statistics().depth))
        assert got == {str(alice.legal_name): [b"%d" % i for i in range(n)]}
        assert cycles >= 3


async def test_address_change_reconnects_and_crashed_bridge_restarts(
    alice: pki.NodeCredentials, bob: pki.NodeCredentials, network: pki.NetworkCredentials, tmp_path: Path
) -> None:
    root = network.root.cert
    peers = messaging.PeerDirectory()
    fast = bridge.BridgeConfig(initial_backoff_seconds=0.01, max_backoff_seconds=0.05)
    async with (
        running_node(alice, root, tmp_path / "a", peers=peers, bridge_config=fast) as a,
        running_node(bob, root, tmp_path / "b", peers=peers) as b,
    ):
        got: dict[str, list[bytes]] = defaultdict(list)
        collect(b, got)
        # Bob first advertised at a dead port, then at the real one: the bridge follows the change.
        dead = refused_port()
        bob_peer = b.as_peer()
        peers.put(
            messaging.Peer(
                legal_name=bob.legal_name, key_hash=bob_peer.key_hash, addresses=[("127.0.0.1", dead)]
            )
        )
        await a.service.send(a.service.create_message(TOPIC, b"one"), bob.legal_name)
        with trio.fail_after(30):
            await wait_until(
                lambda: not (not a.manager.bridges() or not next(iter(a.manager.bridges().values())).failures)
            )
            peers.put(bob_peer)
            await wait_until(lambda: not (len(got[str(alice.legal_name)]) < 1))
        assert got[str(alice.legal_name)] == [b"one"]


async def test_a_listener_with_another_root_is_parked(
    alice: pki.NodeCredentials,
    network: pki.NetworkCredentials,
    mallory: tuple[pki.NodeCredentials, pki.NetworkCredentials],
    tmp_path: Path,
) -> None:
    """The map says Bob is where Mallory (Bob's name, another network's root) listens: the TLS handshake
    fails, the address is parked, nothing leaves Alice's queue."""
    foreign, other_net = mallory
    peers = messaging.PeerDirectory()
    async with (
        running_node(alice, network.root.cert, tmp_path / "a", peers=peers) as a,
        running_node(foreign, other_net.root.cert, tmp_path / "m", run_service=False) as m,
    ):
        peers.put(m.as_peer())
        await a.service.send(a.service.create_message(TOPIC, b"for bob"), foreign.legal_name)
        with trio.fail_after(30):
            await wait_until(lambda: any(b.parked() for b in a.manager.bridges().values()))
        (b,) = a.manager.bridges().values()
        assert list(b.parked()) == [("127.0.0.1", m.port)]
        assert b.delivered == 0 and b.connects == 0
        assert m.service.inbox.statistics().depth == 0
        assert (
            a.service.outbound_queues()[messaging.outbound_queue(m.as_peer().key_hash)].statistics().depth
            == 1
        )


async def test_the_acceptor_rejects_a_delivery_in_another_message_format(
    alice: pki.NodeCredentials, bob: pki.NodeCredentials, network: pki.NetworkCredentials, tmp_path: Path
) -> None:
    """A peer sends a well-formed P2P message with transfer message-format 0x80013700 (a vendor's format,
    AMQP 1.0 section 2.7.5): the acceptor used to store it as a standard message. It is rejected with
    amqp:not-implemented, nothing is stored, and the link stays up for format 0."""
    root = network.root.cert
    async with running_node(bob, root, tmp_path / "b", run_service=False) as b:
        _, client = contexts(alice, root)
        async with transport.open_amqp_connection("127.0.0.1", b.port, ssl_context=client) as conn:
            sender = await conn.open_sender(b.service.inbox.name)
            for fmt in (0x80013700, 1):
                outcome = await sender.send(wire(alice, fmt), message_format=fmt)
                assert isinstance(outcome, amqp.Rejected)
                assert outcome.error is not None and outcome.error.condition == "amqp:not-implemented"
                assert hex(fmt) in str(outcome.error.description)
            assert b.service.inbox.statistics().depth == 0
            assert isinstance(await sender.send(wire(alice, 7)), amqp.Accepted)
        assert b.service.inbox.statistics().depth == 1
        assert b.acceptor.rejected == 2


async def test_a_peer_rejected_again_and_again_is_one_warning_a_minute(
    alice: pki.NodeCredentials,
    bob: pki.NodeCredentials,
    network: pki.NetworkCredentials,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Every rejected message was a warning line: a member sending thousands of bad messages a second filled
    the victim's log. Now its first rejection is logged in full, the rest of the minute are counted (all of
    them, in ``rejected``) for a summary line."""
    root = network.root.cert
    async with running_node(bob, root, tmp_path / "b", run_service=False) as b:
        _, client = contexts(alice, root)
        async with transport.open_amqp_connection("127.0.0.1", b.port, ssl_context=client) as conn:
            sender = await conn.open_sender(b.service.inbox.name)
            for _ in range(200):
                outcome = await sender.send(wire(alice, 5), message_format=5)
                assert isinstance(outcome, amqp.Rejected)
        assert b.acceptor.rejected == 200
    lines = [r.getMessage() for r in caplog.records if "rejected a message" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith(str(alice.legal_name)), lines


@pytest.mark.parametrize(
    ("whose", "tls"), [("peer's", None), ("ours", None), ("ours", ssl.TLSVersion.TLSv1_2)],
    ids=["peer's", "ours-tls1.3", "ours-tls1.2"],
)  # fmt: skip
async def test_a_certificate_not_valid_yet_is_retried_with_the_backoff_not_parked(
    alice: pki.NodeCredentials,
    bob: pki.NodeCredentials,
    network: pki.NetworkCredentials,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    whose: str,
    tls: ssl.TLSVersion | None,
) -> None:
    """Bob's (or Alice's own) certificates become valid 3 s from now, as after a renewal or with the issuer's
    clock ahead. Alice's bridge treated the refused handshake as a failed identity check and parked Bob's
    address for 5 minutes, so delivery waited that long after the certificate was valid (Bob's certificate;
    Alice's when Bob speaks TLS 1.2, whose alert comes in the handshake); now it is retried with the usual
    backoff (1 s, doubling) and the message arrives seconds after."""
    valid_from = dt.datetime.now(dt.UTC).replace(microsecond=0) + dt.timedelta(seconds=3)
    # (create_certificate backdates not-before by an hour for clock skew: issue an hour ahead)
    fresh = network.issue_node(
        (bob if whose == "peer's" else alice).legal_name, now=valid_from + dt.timedelta(hours=1)
    )
    assert fresh.tls.cert.not_valid_before_utc == valid_from
    if whose == "peer's":
        bob = fresh
    else:
        alice = fresh
    root = network.root.cert
    peers = messaging.PeerDirectory()
    async with (
        running_node(alice, root, tmp_path / "a", peers=peers) as a,
        running_node(bob, root, tmp_path / "b", peers=peers, max_tls_version=tls) as b,
    ):
        peers.put(a.as_peer())
        peers.put(b.as_peer())
        got: dict[str, list[bytes]] = defaultdict(list)
        done = trio.Event()
        collect(b, got, (1, done))
        await a.service.send(a.service.create_message(TOPIC, b"when valid"), bob.legal_name)
        with trio.fail_after(30):
            await done.wait()
        arrived = dt.datetime.now(dt.UTC)
    assert got == {str(alice.legal_name): [b"when valid"]}
    (sender,) = a.manager.bridges().values()
    assert sender.failures >= 1 and sender.connects == 1 and not sender.parked()
    # at most one backoff step (1, 2, 4 s ...: about the time since the first attempt) after it became valid
    assert arrived - valid_from < dt.timedelta(seconds=8), arrived - valid_from
    assert not [r for r in caplog.records if "parked for" in r.getMessage()]


async def test_a_session_that_ends_and_an_attempt_that_never_connected_are_told_apart(
    alice: pki.NodeCredentials,
    bob: pki.NodeCredentials,
    network: pki.NetworkCredentials,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A dial that never completed its handshake was logged ``session with HOST:PORT ended: HandshakeError:
    ... did not complete``, as if a session had been up. Now it says ``could not connect to HOST:PORT``, and
    ``session with HOST:PORT ended`` is kept for a session that was up (here: Bob stops under it)."""
    caplog.set_level(logging.DEBUG, logger="corda_trio.bridge")
    root = network.root.cert
    peers = messaging.PeerDirectory()
    fast = bridge.BridgeConfig(initial_backoff_seconds=0.01, max_backoff_seconds=0.05)
    dead = refused_port()  # nobody listens there
    async with running_node(alice, root, tmp_path / "a", peers=peers, bridge_config=fast) as a:
        got: dict[str, list[bytes]] = defaultdict(list)
        async with running_node(bob, root, tmp_path / "b", peers=peers) as b:
            collect(b, got)
            bob_peer = b.as_peer()
            peers.put(bob_peer)
            await a.service.send(a.service.create_message(TOPIC, b"one"), bob.legal_name)
            with trio.fail_after(30):
                await wait_until(lambda: len(got[str(alice.legal_name)]) == 1)
        where = f"127.0.0.1:{bob_peer.addresses[0][1]}"
        (b1,) = a.manager.bridges().values()
        with trio.fail_after(30):
            await wait_until(lambda: b1.failures >= 2)
        # Bob back at a dead port: the bridge's next outage starts with an attempt that never connected
        peers.put(attrs.evolve(bob_peer, addresses=[("127.0.0.1", dead)]))
        with trio.fail_after(30):
            await wait_until(lambda: any(f"to 127.0.0.1:{dead}: " in r.getMessage() for r in caplog.records))
    lines = [r.getMessage() for r in caplog.records if r.name == "corda_trio.bridge"]
    # the outage's first line (a warning-level summary of the outage) is the session that was up
    first = [
        r.getMessage() for r in caplog.records if r.name == "corda_trio.bridge" and r.levelno >= logging.INFO
    ]
    assert any(ln.startswith(f"bridge {b1.queue.name}: session with {where} ended: ") for ln in first), first
    # the retries while Bob was down (debug: within the same outage) never had a session
    assert any(ln.startswith(f"bridge {b1.queue.name}: could not connect to {where}: ") for ln in lines), (
        lines
    )
    refused = [ln for ln in lines if f"to 127.0.0.1:{dead}: " in ln]
    assert refused[0] == (
        f"bridge {b1.queue.name}: could not connect to 127.0.0.1:{dead}: OSError: all attempts to connect to"
        f" 127.0.0.1:{dead} failed (Connection refused)"
    ), refused
    assert not any(f"session with 127.0.0.1:{dead}" in ln for ln in lines), lines
