"""The trio driver: our client and server over TCP, TLS (corda_trio.pki contexts) and memory streams."""

from __future__ import annotations

import datetime as dt
import functools

import pytest
import trio
import trio.testing

from corda_trio import amqp, pki, transport
from corda_trio.testing import QueueBroker

NOW = dt.datetime.now(dt.UTC)
ALICE = pki.CordaX500Name.parse("O=Alice, L=London, C=GB")
BOB = pki.CordaX500Name.parse("O=Bob, L=New York, C=US")
MALLORY = pki.CordaX500Name.parse("O=Mallory, L=Paris, C=FR")
C = amqp.Condition


@pytest.fixture(scope="module")
def network() -> pki.NetworkCredentials:
    return pki.NetworkCredentials.create(now=NOW - dt.timedelta(hours=1))


@pytest.fixture(scope="module")
def nodes(network: pki.NetworkCredentials) -> dict[str, pki.NodeCredentials]:
    when = NOW - dt.timedelta(minutes=30)
    return {"alice": network.issue_node(ALICE, now=when), "bob": network.issue_node(BOB, now=when)}


def contexts(node: pki.NodeCredentials, network: pki.NetworkCredentials) -> tuple:
    kw = dict(cert_chain=node.tls_chain, key=node.tls.key, trust_root=network.root.cert)
    return pki.client_ssl_context(**kw), pki.server_ssl_context(**kw)  # type: ignore[arg-type]


async def start_broker(nursery: trio.Nursery, broker: QueueBroker, **kw: object) -> int:
    listeners = await nursery.start(functools.partial(transport.serve_amqp, broker.handle, 0, **kw))
    return transport.listener_port(listeners)


# --- end to end over TCP ----------------------------------------------------------------------------------


async def test_send_and_receive_over_tcp(nursery: trio.Nursery) -> None:
    broker = QueueBroker(allow=lambda a: a in ("inbox", "big"))
    port = await start_broker(nursery, broker)
    with trio.fail_after(20):
        async with transport.open_amqp_connection("127.0.0.1", port) as conn:
            with pytest.raises(transport.LinkDetachedError) as info:
                await conn.open_sender("elsewhere")
            assert info.value.condition == "amqp:unauthorized-access"
            sender = await conn.open_sender("inbox")
            pending = [await sender.start_send(amqp.Message(body=bytes([i % 256]) * 10)) for i in range(300)]
            assert [await p.outcome() for p in pending if p] == [amqp.Accepted()] * 300
            receiver = await conn.open_receiver("inbox", credit=7)
            for i in range(300):
                d = await receiver.receive()
                assert d.message.body == bytes([i % 256]) * 10
                await d.accept()


async def test_mutual_tls_with_pki_contexts_and_legal_name_check(
    nursery: trio.Nursery, network: pki.NetworkCredentials, nodes: dict
) -> None:
    alice_client, _ = contexts(nodes["alice"], network)
    _, bob_server = contexts(nodes["bob"], network)
    broker = QueueBroker()
    port = await start_broker(
        nursery, broker, ssl_context=bob_server, peer_check=pki.check_peer_is_network_node
    )
    with trio.fail_after(20):
        check = functools.partial(pki.check_peer_legal_name, expected=BOB)
        async with transport.open_amqp_connection(
            "127.0.0.1", port, ssl_context=alice_client, peer_check=check
        ) as conn:
            assert conn.peer_identity == BOB
            sender = await conn.open_sender("p2p.inbound.x")
            assert await sender.send(amqp.Message(body=b"hi")) == amqp.Accepted()
        # the same server, but we expected someone else: refused after the handshake
        wrong = functools.partial(pki.check_peer_legal_name, expected=MALLORY)
        with pytest.raises(transport.HandshakeError) as info:
            async with transport.open_amqp_connection(
                "127.0.0.1", port, ssl_context=alice_client, peer_check=wrong
            ):
                pass
        assert "Mallory" in str(info.value)
    assert broker.received == 1


async def test_tls_from_another_network_is_refused(
    nursery: trio.Nursery, network: pki.NetworkCredentials, nodes: dict
) -> None:
    other = pki.NetworkCredentials.create(now=NOW - dt.timedelta(hours=1))
    stranger = other.issue_node(MALLORY, now=NOW - dt.timedelta(minutes=30))
    stranger_client, _ = contexts(stranger, other)
    _, bob_server = contexts(nodes["bob"], network)
    broker = QueueBroker()
    port = await start_broker(
        nursery, broker, ssl_context=bob_server, peer_check=pki.check_peer_is_network_node
    )
    with trio.fail_after(20), pytest.raises(transport.AmqpConnectionError):
        async with transport.open_amqp_connection("127.0.0.1", port, ssl_context=stranger_client):
            pass
    # the server is still serving
    alice_client, _ = contexts(nodes["alice"], network)
    async with transport.open_amqp_connection("127.0.0.1", port, ssl_context=alice_client) as conn:
        assert await (await conn.open_sender("q")).send(b"\x00Sw\xa1\x01x") == amqp.Accepted()


# --- hostile input against our server ---------------------------------------------------------------------


async def raw_exchange(port: int, chunks: list[bytes], *, dribble: bool = False) -> bytes:
    """Send ``chunks`` (one byte at a time if ``dribble``), then read until the server closes."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    received = bytearray()
    async with stream:
        for chunk in chunks:
            if dribble:
                for i in range(len(chunk)):
                    await stream.send_all(chunk[i : i + 1])
            else:
                await stream.send_all(chunk)
        with trio.fail_after(10):
            while data := await stream.receive_some(65536):
                received += data
    return bytes(received)


def close_error(data: bytes) -> amqp.ErrorCondition | None:
    """The error of the close frame in the server's reply to a bare-AMQP client (header, then frames)."""
    assert data.startswith(amqp.AMQP_HEADER), data[:16]
    buf = amqp.FrameBuffer()
    buf.feed(data[8:])
    for frame in buf.frames():
        if isinstance(frame.performative, amqp.Close):
            return frame.performative.error  # type: ignore[no-any-return]
    return None


def handshake_bytes() -> tuple[bytes, bytes, bytes]:
    """A bare-AMQP client hello: header + open + begin."""
    open_ = amqp.encode_frame(amqp.Open(container_id="hostile"))
    begin = amqp.encode_frame(amqp.Begin(next_outgoing_id=0, incoming_window=100, outgoing_window=100))
    return amqp.AMQP_HEADER, open_, begin


@pytest.fixture
async def hostile_server(nursery: trio.Nursery) -> tuple[int, QueueBroker]:
    broker = QueueBroker()
    config = amqp.ConnectionConfig(sasl_mechanisms=("PLAIN", "ANONYMOUS"), allow_bare_amqp=True)
    port = await start_broker(nursery, broker, config=config, handshake_timeout=2)
    return port, broker


async def assert_still_serving(port: int) -> None:
    async with transport.open_amqp_connection("127.0.0.1", port) as conn:
        sender = await conn.open_sender("still-alive")
        assert await sender.send(b"\x00Sw\xa1\x02ok") == amqp.Accepted()


async def test_garbage_gets_our_header_and_a_close(hostile_server: tuple) -> None:
    port, _ = hostile_server
    reply = await raw_exchange(port, [b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"])
    assert reply == amqp.SASL_HEADER  # spec 2.2: answer with the header we speak, then close
    await assert_still_serving(port)


async def test_wrong_protocol_header(hostile_server: tuple) -> None:
    port, _ = hostile_server
    reply = await raw_exchange(port, [amqp.TLS_HEADER])
    assert reply == amqp.SASL_HEADER
    await assert_still_serving(port)


@pytest.mark.parametrize("dribble", [False, True])
async def test_oversize_frame(hostile_server: tuple, dribble: bool) -> None:
    port, _ = hostile_server
    header, open_, _ = handshake_bytes()
    oversize = (1_000_000).to_bytes(4, "big") + b"\x02\x00\x00\x00"
    reply = await raw_exchange(port, [header + open_, oversize], dribble=dribble)
    error = close_error(reply)
    assert error is not None and error.condition == C.FRAMING_ERROR
    assert "exceeds max-frame-size 131072" in error.description
    await assert_still_serving(port)


async def test_transfer_on_unattached_handle(hostile_server: tuple) -> None:
    port, _ = hostile_server
    header, open_, begin = handshake_bytes()
    transfer = amqp.encode_frame(amqp.Transfer(handle=3, delivery_id=0, delivery_tag=b"t"), 0, b"x")
    reply = await raw_exchange(port, [header + open_ + begin + transfer], dribble=True)
    error = close_error(reply)
    assert error is not None and error.condition == C.UNATTACHED_HANDLE
    await assert_still_serving(port)


async def test_silent_client_is_dropped_after_handshake_timeout(hostile_server: tuple) -> None:
    port, _ = hostile_server
    with trio.fail_after(15):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(amqp.AMQP_HEADER[:5])  # ...and nothing more
        data = await stream.receive_some(100)
        assert data == b""  # closed by the server's 2 s handshake timeout
        await stream.aclose()
    await assert_still_serving(port)


# --- over memory streams, virtual time ---------------------------------------------------------------------


async def test_idle_connection_survives_with_heartbeats(
    nursery: trio.Nursery, autojump_clock: object
) -> None:
    broker = QueueBroker()
    cfg = amqp.ConnectionConfig(idle_timeout_ms=2000, sasl_mechanisms=("PLAIN",))
    client_stream, server_stream = trio.testing.memory_stream_pair()

    async def run_server() -> None:
        async with transport.open_amqp_over_stream(server_stream, client=False, config=cfg) as conn:
            await broker.handle(conn)

    nursery.start_soon(run_server)
    async with transport.open_amqp_over_stream(client_stream, config=cfg) as conn:
        sender = await conn.open_sender("q")
        await trio.sleep(60)  # 30x the idle timeout, virtual time
        assert not conn.closed
        assert await sender.send(b"\x00Sw\xa1\x01x") == amqp.Accepted()


async def test_silent_peer_is_closed_with_resource_limit_exceeded(
    nursery: trio.Nursery, autojump_clock: object
) -> None:
    """A peer that completes the handshake and then never sends another frame (not even heartbeats)."""
    client_stream, server_stream = trio.testing.memory_stream_pair()
    peer = amqp.Connection(amqp.ConnectionConfig(idle_timeout_ms=None, sasl=False), client=False)
    seen: list[bytes] = []

    async def mute_peer() -> None:
        # answers the handshake, then only listens
        while data := await server_stream.receive_some(65536):
            seen.append(data)
            try:
                peer.receive_data(data)
            except amqp.RemoteProtocolError:
                pass
            out = peer.data_to_send()
            if out and not peer.closed and len(seen) < 3:
                await server_stream.send_all(out)

    nursery.start_soon(mute_peer)
    cfg = amqp.ConnectionConfig(idle_timeout_ms=3000, sasl=False)
    start = trio.current_time()
    with pytest.raises(transport.AmqpConnectionError) as info:
        async with transport.open_amqp_over_stream(client_stream, config=cfg) as conn:
            await conn.wait_closed()
            raise conn.close_error  # type: ignore[misc]
    assert info.value.condition == "amqp:resource-limit-exceeded"
    # closed at 3 s; the goodbye then waits (bounded) for the mute peer to close its side
    assert 3.0 <= trio.current_time() - start < 4.0 + transport.CLOSE_TIMEOUT_SECONDS
    assert peer.close_error is not None and peer.close_error.condition == C.RESOURCE_LIMIT_EXCEEDED


@pytest.mark.parametrize("full", [False, True], ids=["peer-buffer-free", "peer-buffer-full"])
async def test_a_peer_found_silent_is_not_waited_for(
    nursery: trio.Nursery, autojump_clock: object, full: bool
) -> None:
    """Once our idle timeout found the peer silent, the connection ends at once: our close goes out if the
    stream takes it (best effort) and nobody waits for the silent peer's close. It used to wait the
    graceful CLOSE_TIMEOUT_SECONDS (2 s) for it, so a frozen peer was noticed after 12 s, not the 10 s of
    the idle timeout. With the peer's receive buffer full (it stopped reading too) our close cannot go out
    at all, and the end is as prompt."""
    client_raw, server_stream = trio.testing.memory_stream_pair()
    client_stream = FreezableStream(client_raw)
    peer = amqp.Connection(amqp.ConnectionConfig(idle_timeout_ms=None, sasl=False), client=False)
    mute = False

    async def mute_peer() -> None:  # answers the handshake, then only reads (never a heartbeat or close)
        while data := await server_stream.receive_some(65536):
            try:
                peer.receive_data(data)
            except amqp.RemoteProtocolError:
                pass
            if not mute and (out := peer.data_to_send()):
                await server_stream.send_all(out)

    nursery.start_soon(mute_peer)
    cfg = amqp.ConnectionConfig(idle_timeout_ms=3000, sasl=False)
    with trio.fail_after(30):
        async with transport.open_amqp_over_stream(client_stream, config=cfg) as conn:
            mute = True  # (the handshake is over: the peer's last frame came just now)
            client_stream.frozen = full
            start = trio.current_time()
            await conn.wait_closed()
            took = trio.current_time() - start
            assert isinstance(conn.close_error, transport.AmqpConnectionError)
            assert conn.close_error.condition == "amqp:resource-limit-exceeded"
    assert 3.0 <= took <= 3.0 + transport.SILENT_PEER_CLOSE_TIMEOUT_SECONDS
    if not full:  # our close reached the peer
        assert peer.close_error is not None and peer.close_error.condition == C.RESOURCE_LIMIT_EXCEEDED


class PausableReads(trio.abc.Stream):
    """Wraps a stream; while ``paused``, ``receive_some`` waits (a process that stopped reading: SIGSTOP)."""

    def __init__(self, inner: trio.abc.Stream) -> None:
        self.inner = inner
        self.paused = False
        self.resumed = trio.Event()

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        if self.paused:
            await self.resumed.wait()
        return await self.inner.receive_some(max_bytes)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_a_close_from_the_peer_reads_as_the_peers_on_both_sides(
    nursery: trio.Nursery, autojump_clock: object
) -> None:
    """The node's idle timeout ends the connection to a frozen bridge; resumed, the bridge reads the node's
    close. Its error used to quote the node's words as its own ('session with the node ended: ...
    no frame received for 10.003 s; our idle timeout is ...': the bridge had received frames all along).
    The side that closed reports its own error; the other reads it as the peer's."""
    node_raw, bridge_raw = trio.testing.memory_stream_pair()
    bridge_stream = PausableReads(bridge_raw)
    # the node asks for no heartbeats (advertises none), so the frozen bridge owes it nothing but reads
    node_cfg = amqp.ConnectionConfig(idle_timeout_ms=1000, advertised_idle_timeout_ms=0, sasl=False)
    bridge_cfg = amqp.ConnectionConfig(idle_timeout_ms=None, sasl=False, allow_bare_amqp=True)
    node_closed = trio.Event()
    node_errors: list[str] = []

    async def node() -> None:
        async with transport.open_amqp_over_stream(node_raw, client=False, config=node_cfg) as conn:
            await conn.wait_closed()
            node_errors.append(str(conn.close_error))
        node_closed.set()

    nursery.start_soon(node)
    with trio.fail_after(30):
        async with transport.open_amqp_over_stream(bridge_stream, config=bridge_cfg) as conn:
            bridge_stream.paused = True  # SIGSTOP
            await node_closed.wait()
            bridge_stream.resumed.set()  # SIGCONT
            await conn.wait_closed()
            error = conn.close_error
    expected = "amqp:resource-limit-exceeded: no frame received for 1.000 s (idle timeout 1000 ms, advertised"
    assert node_errors[0].startswith(expected), node_errors
    assert isinstance(error, transport.AmqpConnectionError) and error.by_peer
    assert str(error).startswith(f"the peer closed the connection: {expected}"), str(error)
    assert error.condition == "amqp:resource-limit-exceeded"


async def test_a_stalled_process_reads_what_the_peer_sent_before_it_judges_the_peer_silent(
    nursery: trio.Nursery, mock_clock: trio.testing.MockClock
) -> None:
    """Our process was not running (SIGSTOP, a paused VM, swap) for longer than our idle timeout, while the
    live peer went on sending: at the resume its frames wait unread and our idle deadline is long past. The
    timer must not declare the peer silent before the reader has taken them: it did, in about half the
    resumes (whichever task ran first), blaming the peer for our own pause and ending a healthy connection
    (found by SIGCONT of a frozen bridge process: 'no frame received for 13.020 s')."""
    to_us = trio.testing.MemoryReceiveStream()  # the test puts the peer's bytes here, synchronously
    from_us = trio.testing.MemorySendStream()
    peer = amqp.Connection(amqp.ConnectionConfig(idle_timeout_ms=None, sasl=False), client=False)

    async def pump_to_peer() -> None:  # the peer answers the handshake; the rest it only reads
        while data := await from_us.get_data():
            peer.receive_data(data)
            if out := peer.data_to_send():
                to_us.put_data(out)

    nursery.start_soon(pump_to_peer)
    cfg = amqp.ConnectionConfig(idle_timeout_ms=2000, sasl=False)
    stream = trio.StapledStream(from_us, to_us)
    with trio.fail_after(60):  # (virtual time: the stalls below take 36 s of it)
        async with transport.open_amqp_over_stream(stream, config=cfg) as conn:
            try:
                heartbeat = amqp.encode_empty_frame()
                for _ in range(12):  # each resume was a coin toss: a dozen of them never all went well
                    await trio.testing.wait_all_tasks_blocked()
                    to_us.put_data(heartbeat)  # sent by the peer while we were stopped ...
                    mock_clock.jump(3.0)  # ... for longer than our idle timeout
                    await trio.testing.wait_all_tasks_blocked()
                    assert not conn.closed, conn.close_error
            finally:
                mock_clock.autojump_threshold = 0  # the close's bounded waits pass in virtual time


async def test_cancelled_send_is_never_reported_delivered(
    nursery: trio.Nursery, autojump_clock: object
) -> None:
    """A receiver that never settles: a cancelled send reports nothing; closing the link fails the rest."""
    cfg = amqp.ConnectionConfig(sasl=False, allow_bare_amqp=True)
    client_stream, server_stream = trio.testing.memory_stream_pair()
    got: list[transport.Delivery] = []

    async def hoarder(conn: transport.AmqpConnection) -> None:
        async for request in conn.link_requests():
            receiver = await request.accept_receiver(credit=10)
            async for d in receiver:
                got.append(d)  # never settled

    async def run_server() -> None:
        async with transport.open_amqp_over_stream(server_stream, client=False, config=cfg) as conn:
            await hoarder(conn)

    nursery.start_soon(run_server)
    async with transport.open_amqp_over_stream(client_stream, config=cfg) as conn:
        sender = await conn.open_sender("q")
        with trio.move_on_after(1) as scope:
            await sender.send(b"\x00Sw\xa1\x01a")
        assert scope.cancelled_caught
        pending = await sender.start_send(b"\x00Sw\xa1\x01b")
        assert pending is not None
        await trio.sleep(1)
        assert len(got) == 2
        await sender.aclose()
        with pytest.raises(transport.LinkDetachedError):
            await pending.outcome()
        assert not pending.settled


class FreezableStream(trio.abc.Stream):
    """Wraps a stream; once ``frozen``, ``send_all`` blocks forever (a peer that stopped reading)."""

    def __init__(self, inner: trio.abc.Stream) -> None:
        self.inner = inner
        self.frozen = False

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self.frozen:
            await trio.sleep_forever()
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        return await self.inner.receive_some(max_bytes)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_cancelled_write_breaks_the_connection_and_fails_pending(
    nursery: trio.Nursery, autojump_clock: object
) -> None:
    cfg = amqp.ConnectionConfig(sasl=False, allow_bare_amqp=True)
    client_raw, server_stream = trio.testing.memory_stream_pair()
    client_stream = FreezableStream(client_raw)
    broker = QueueBroker()

    async def run_server() -> None:
        async with transport.open_amqp_over_stream(server_stream, client=False, config=cfg) as conn:
            await broker.handle(conn)

    nursery.start_soon(run_server)
    pending = None
    with trio.move_on_after(5) as scope:
        async with transport.open_amqp_over_stream(client_stream, config=cfg) as conn:
            sender = await conn.open_sender("q")
            client_stream.frozen = True
            pending = await sender.start_send(b"\x00Sw\xa1\x01x")
            assert pending is not None
            await pending.outcome()  # never arrives: the write is stuck, then cancelled
    assert scope.cancelled_caught
    assert pending is not None and not pending.settled
    assert isinstance(pending.error, transport.AmqpConnectionError)
    assert conn.closed and "interrupted" in str(conn.close_error)
    assert broker.received == 0


@pytest.mark.parametrize("refill", ["half", "empty"])
async def test_receiver_refill_policy(nursery: trio.Nursery, refill: transport.RefillPolicy) -> None:
    """``half`` tops credit up after half was used; ``empty`` only once all of it was used (RabbitMQ 3.x)."""
    broker = QueueBroker(allow=lambda a: a == "q")
    port = await start_broker(nursery, broker)
    with trio.fail_after(20):
        async with transport.open_amqp_connection("127.0.0.1", port) as conn:
            sender = await conn.open_sender("q")
            for i in range(40):
                assert await sender.send(amqp.Message(body=bytes([i]))) == amqp.Accepted()
            consumed = 0
            grants: list[tuple[int, int]] = []  # (number of the delivery being taken, credit granted)
            engine_flow = conn._engine.flow

            def spy(channel: int, handle: int, *, credit: int, **kw: object) -> None:
                grants.append((consumed + 1, credit))
                engine_flow(channel, handle, credit=credit, **kw)

            conn._engine.flow = spy  # type: ignore[method-assign]
            receiver = await conn.open_receiver("q", credit=10, refill=refill)
            for i in range(40):
                d = await receiver.receive()
                assert d.message.body == bytes([i])
                consumed += 1
                await d.accept()
    assert grants[0] == (1, 10)  # the initial grant, at attach
    refills = grants[1:]
    if refill == "empty":
        assert refills[:3] == [(10, 10), (20, 10), (30, 10)]
    else:
        assert [n for n, _ in refills[:3]] == [5, 10, 15]
        assert all(5 <= credit <= 10 for _, credit in refills)


async def test_settle_many_nowait_settles_without_a_checkpoint(nursery: trio.Nursery) -> None:
    """A receiver settles with ``settle_many_nowait`` (no checkpoint): the disposition leaves with the
    connection's next write (the test broker sends its next message only once the previous one is
    settled ``accepted``, so each arrival proves the previous settlement reached it)."""
    broker = QueueBroker(allow=lambda a: a == "q")
    port = await start_broker(nursery, broker)
    with trio.fail_after(20):
        async with transport.open_amqp_connection("127.0.0.1", port) as conn:
            sender = await conn.open_sender("q")
            for i in range(6):
                assert await sender.send(amqp.Message(body=bytes([i]))) == amqp.Accepted()
            receiver = await conn.open_receiver("q", credit=10)
            for i in range(6):
                d = await receiver.receive()
                assert d.message.body == bytes([i])
                with trio.testing.assert_no_checkpoints():
                    receiver.settle_many_nowait([d], amqp.Accepted())
                    receiver.settle_many_nowait([d], amqp.Accepted())  # settled already: skipped
                assert d.settled
            with trio.move_on_after(0.3):
                extra = await receiver.receive()
                pytest.fail(f"a settled message came again: {extra.message.body!r}")
    assert not broker.queues["q"]


@pytest.mark.parametrize("how", ["settle", "settle_many_nowait"])
async def test_settling_after_the_peer_detached_the_link_cleanly(nursery: trio.Nursery, how: str) -> None:
    """The peer detaches its sending link (no error) while the application still holds its deliveries
    unsettled (the node's acceptor storing a batch). Settling them used to raise amqp.LocalProtocolError
    ("delivery 0 ... is unknown or settled": the engine forgot them with the link), which crashed the node's
    connection handler and every other link on its connection (found with Proton detaching right after
    sending). It raises LinkDetachedError, which the application handles as any other link loss: the
    outcome cannot reach the peer, which has the deliveries unsettled and sends them again."""
    got_them = trio.Event()
    detached = trio.Event()
    raised: list[BaseException] = []

    async def handler(conn: transport.AmqpConnection) -> None:
        async for request in conn.link_requests():
            receiver = await request.accept_receiver(credit=10)
            taken = [await receiver.receive(), await receiver.receive()]
            got_them.set()
            await detached.wait()
            with pytest.raises(trio.EndOfChannel):  # the peer's detach has been read: the link ended
                await receiver.receive()
            with pytest.raises(transport.LinkDetachedError) as info:
                if how == "settle":
                    await taken[0].accept()
                else:
                    receiver.settle_many_nowait(taken, amqp.Accepted())
            raised.append(info.value)
            # the connection is still there for other links (the test's client opens one below)

    listeners = await nursery.start(functools.partial(transport.serve_amqp, handler, 0))
    port = transport.listener_port(listeners)
    with trio.fail_after(20):
        async with transport.open_amqp_connection("127.0.0.1", port) as conn:
            sender = await conn.open_sender("q")
            for i in range(2):
                await sender.start_send(amqp.Message(body=bytes([i])))
            await got_them.wait()
            await sender.aclose()
            detached.set()
            while not raised:  # noqa: ASYNC110
                await trio.sleep(0.01)
            assert "detached by the peer" in str(raised[0])
            assert not conn.closed
