"""Hostile and careless peers against ``serve_amqp``, over real sockets: what comes back on the wire.

Each case that promises a frame (a ``close`` with a condition, a ``sasl-outcome``) checks that the raw peer
reads it before the socket shuts, ``CORDA_TRIO_HOSTILE_RUNS`` times (default 100), and that the server still
serves a well-behaved client afterwards.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import logging
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable

import pytest
import trio
import trio.testing

from corda_trio import amqp, pki, transport
from corda_trio.testing import QueueBroker

C = amqp.Condition
RUNS = int(os.environ.get("CORDA_TRIO_HOSTILE_RUNS", "100"))
BARE = amqp.ConnectionConfig(sasl_mechanisms=("PLAIN", "ANONYMOUS"), allow_bare_amqp=True)
OPEN = amqp.encode_frame(amqp.Open(container_id="hostile"))
BEGIN = amqp.encode_frame(amqp.Begin(next_outgoing_id=0, incoming_window=100_000, outgoing_window=100))
CLOSE = amqp.encode_frame(amqp.Close())


def parse(data: bytes) -> list[object]:
    """Protocol headers (as bytes) and performatives in ``data``, in order; an incomplete tail is ignored."""
    out: list[object] = []
    pos = 0
    while pos + 8 <= len(data):
        if data[pos : pos + 4] == b"AMQP":
            out.append(data[pos : pos + 8])
            pos += 8
            continue
        size = int.from_bytes(data[pos : pos + 4], "big")
        if pos + size > len(data):
            break
        buf = amqp.FrameBuffer(max_frame_size=1 << 24)
        buf.feed(data[pos : pos + size])
        frame = buf.next_frame()
        assert frame is not None
        out.append(frame.performative)
        pos += size
    return out


class RawPeer:
    """A hand-driven client on a trio stream: send bytes, read and parse what comes back."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.data = bytearray()
        self.eof = False

    @classmethod
    async def connect(cls, port: int) -> RawPeer:
        return cls(await trio.open_tcp_stream("127.0.0.1", port))

    async def send(self, *data: bytes) -> None:
        await self.stream.send_all(b"".join(data))

    def received(self) -> list[object]:
        return parse(bytes(self.data))

    async def read_until(self, kind: type, count: int = 1) -> list[object]:
        """Read until ``count`` frames of ``kind`` arrived (or EOF); returns everything parsed."""
        return await self.read_until_frames(lambda frames: sum(isinstance(p, kind) for p in frames) >= count)

    async def read_until_frames(
        self, done: Callable[[list[object]], bool], seconds: float = 20
    ) -> list[object]:
        """Read until ``done`` holds of the frames parsed so far (or EOF); returns them."""
        with trio.fail_after(seconds):
            while not self.eof and not done(self.received()):
                await self._read()
        return self.received()

    async def read_for(self, seconds: float) -> list[object]:
        """Read what arrives in ``seconds`` (or until EOF); returns everything parsed."""
        with trio.move_on_after(seconds):
            await self.read_until_frames(lambda _frames: False, seconds + 1)
        return self.received()

    async def read_to_eof(self) -> list[object]:
        with trio.fail_after(20):
            while not self.eof:
                await self._read()
        return self.received()

    async def _read(self) -> None:
        try:
            chunk = await self.stream.receive_some(65536)
        except trio.BrokenResourceError:
            chunk = b""
        if chunk:
            self.data += chunk
        else:
            self.eof = True

    async def aclose(self) -> None:
        await self.stream.aclose()


async def start(nursery: trio.Nursery, broker: QueueBroker | None = None, **kw: object) -> int:
    broker = broker or QueueBroker()
    kw.setdefault("config", BARE)
    listeners = await nursery.start(functools.partial(transport.serve_amqp, broker.handle, 0, **kw))
    return transport.listener_port(listeners)


async def assert_still_serving(port: int) -> None:
    with trio.fail_after(20):
        async with transport.open_amqp_connection("127.0.0.1", port) as conn:
            sender = await conn.open_sender("still-alive")
            assert await sender.send(b"\x00Sw\xa1\x02ok") == amqp.Accepted()


def the_close(frames: list[object]) -> amqp.Close:
    closes = [p for p in frames if isinstance(p, amqp.Close)]
    assert len(closes) == 1, frames
    return closes[0]


# --- a promised frame arrives before the socket shuts, every time --------------------------------------


async def one_exchange(port: int, hello: bytes, trailer: bytes = b"") -> list[object]:
    peer = await RawPeer.connect(port)
    try:
        await peer.send(hello)
        if trailer:
            try:
                await peer.send(trailer)
            except trio.BrokenResourceError:
                pass
        return await peer.read_to_eof()
    finally:
        await peer.aclose()


async def test_begin_before_open_gets_an_illegal_state_close(nursery: trio.Nursery) -> None:
    port = await start(nursery)
    for _ in range(RUNS):
        frames = await one_exchange(port, amqp.AMQP_HEADER + BEGIN)
        error = the_close(frames).error
        assert error.condition == C.ILLEGAL_STATE and "begin" in error.description
    await assert_still_serving(port)


async def test_protocol_garbage_gets_a_decode_error_close_before_the_socket_shuts(
    nursery: trio.Nursery,
) -> None:
    port = await start(nursery)
    garbage = b"\x00\x00\x00\x10\x02\x00\x00\x00\x00\x53\x10\xc0\xff\xff\xff\xff"  # open list past the frame
    junk = bytes(range(256)) * 256  # 64 KiB more after it: unread input must not turn our FIN into a RST
    for _ in range(RUNS):
        frames = await one_exchange(port, amqp.AMQP_HEADER + OPEN + garbage, junk)
        error = the_close(frames).error
        assert error.condition == C.DECODE_ERROR, error
    await assert_still_serving(port)


async def test_bad_sasl_gets_a_sasl_outcome(nursery: trio.Nursery) -> None:
    config = amqp.ConnectionConfig(sasl_mechanisms=("PLAIN",), sasl_plain_check=lambda u, p: p == "right")
    port = await start(nursery, config=config)
    cases = [
        (amqp.SaslInit(mechanism=amqp.Symbol("CRAM-MD5")), amqp.SaslCode.SYS_PERM),
        (amqp.SaslInit(mechanism=amqp.Symbol("PLAIN"), initial_response=b"\0u\0wrong"), amqp.SaslCode.AUTH),
        (amqp.SaslInit(mechanism=amqp.Symbol("PLAIN"), initial_response=b"no-nul"), amqp.SaslCode.SYS),
    ]
    for i in range(RUNS):
        init, code = cases[i % len(cases)]
        frames = await one_exchange(port, amqp.SASL_HEADER + amqp.encode_frame(init))
        outcomes = [p for p in frames if isinstance(p, amqp.SaslOutcome)]
        assert [o.code for o in outcomes] == [code], frames
    async with transport.open_amqp_connection(
        "127.0.0.1", port, config=amqp.ConnectionConfig(sasl_username="u", sasl_password="right")
    ) as conn:
        assert await (await conn.open_sender("q")).send(b"\x00Sw\xa1\x01x") == amqp.Accepted()


async def test_polite_close_always_gets_the_reply_close(nursery: trio.Nursery) -> None:
    port = await start(nursery)
    for _ in range(RUNS):
        frames = await one_exchange(port, amqp.AMQP_HEADER + OPEN + BEGIN + CLOSE)
        assert the_close(frames).error is None
    await assert_still_serving(port)


async def test_tls_peer_gets_the_close_and_a_close_notify(nursery: trio.Nursery) -> None:
    now = dt.datetime.now(dt.UTC)
    network = pki.NetworkCredentials.create(now=now - dt.timedelta(hours=1))
    node = network.issue_node(pki.CordaX500Name.parse("O=Alice, L=London, C=GB"), now=now)
    kw = dict(cert_chain=node.tls_chain, key=node.tls.key, trust_root=network.root.cert)
    client_ctx, server_ctx = pki.client_ssl_context(**kw), pki.server_ssl_context(**kw)  # type: ignore[arg-type]
    port = await start(nursery, ssl_context=server_ctx)
    for _ in range(max(1, RUNS // 10)):  # TLS handshakes cost CPU: a tenth of the runs
        tcp = await trio.open_tcp_stream("127.0.0.1", port)
        tls = trio.SSLStream(tcp, client_ctx, server_hostname=None)
        peer = RawPeer(tls)
        await peer.send(amqp.AMQP_HEADER + BEGIN)
        await peer.read_until(amqp.Close)
        await peer.send(CLOSE)  # answer like a polite client; then the server ends TLS
        with trio.fail_after(20):
            while True:
                # With a close_notify the TLS stream ends cleanly (b""); without one trio raises.
                chunk = await tls.receive_some(65536)
                if not chunk:
                    break
                peer.data += chunk
        assert the_close(peer.received()).error.condition == C.ILLEGAL_STATE
        await trio.aclose_forcefully(tls)


# --- credit overrun over a real socket -----------------------------------------------------------------


async def test_a_client_sending_three_times_its_credit_is_served(nursery: trio.Nursery) -> None:
    broker = QueueBroker(credit=10)
    port = await start(nursery, broker)
    peer = await RawPeer.connect(port)
    attach = amqp.Attach(
        name="greedy",
        handle=5,
        role=amqp.Role.SENDER,
        target=amqp.Target(address="q"),
        initial_delivery_count=0,
    )
    await peer.send(amqp.AMQP_HEADER + OPEN + amqp.encode_frame(BEGIN_PERF, 3) + amqp.encode_frame(attach, 3))
    await peer.read_until(amqp.Flow)
    flows = [p for p in peer.received() if isinstance(p, amqp.Flow) and p.handle is not None]
    assert flows and flows[-1].link_credit == 10
    transfers = b"".join(
        amqp.encode_frame(
            amqp.Transfer(handle=5, delivery_id=i, delivery_tag=i.to_bytes(4, "big")), 3, b"\x00Sw\x40"
        )
        for i in range(30)
    )
    await peer.send(transfers)
    settled: set[int] = set()
    with trio.fail_after(20):
        while len(settled) < 30:
            await peer._read()
            assert not peer.eof
            for p in peer.received():
                if isinstance(p, amqp.Disposition) and p.settled:
                    settled.update(range(p.first, (p.last if p.last is not None else p.first) + 1))
                assert not isinstance(p, amqp.Close | amqp.Detach), p
    assert settled == set(range(30)) and broker.received == 30
    await peer.send(CLOSE)
    assert the_close(await peer.read_to_eof()).error is None
    await peer.aclose()


BEGIN_PERF = amqp.Begin(next_outgoing_id=0, incoming_window=100_000, outgoing_window=100)


# --- slots: half-open, dribbling and crowds -------------------------------------------------------------


async def test_half_open_clients_hold_their_slot_only_until_the_handshake_timeout(
    nursery: trio.Nursery,
) -> None:
    port = await start(nursery, max_connections=2, handshake_timeout=1.0)
    silent = [await RawPeer.connect(port) for _ in range(2)]
    await trio.sleep(0.2)
    over_cap = await RawPeer.connect(port)
    assert await over_cap.read_to_eof() == []  # a closed socket, nothing said
    for peer in silent:
        assert await peer.read_to_eof() == []  # given up at the handshake timeout
    for peer in [*silent, over_cap]:
        await peer.aclose()
    with trio.fail_after(20):
        while True:  # the slots come back as soon as the server has seen the sockets close
            try:
                await assert_still_serving(port)
                break
            except transport.AmqpConnectionError:
                await trio.sleep(0.1)


async def test_one_byte_dribble_after_open_is_closed_by_the_idle_timeout(nursery: trio.Nursery) -> None:
    config = amqp.ConnectionConfig(sasl_mechanisms=("ANONYMOUS",), allow_bare_amqp=True, idle_timeout_ms=1000)
    port = await start(nursery, config=config)
    peer = await RawPeer.connect(port)
    await peer.send(amqp.AMQP_HEADER + OPEN)
    await peer.read_until(amqp.Open)
    frame = amqp.encode_frame(amqp.Begin(next_outgoing_id=0, incoming_window=1, outgoing_window=1))
    with trio.fail_after(20):
        for byte in frame[:-1]:  # never completes the frame
            try:
                await peer.send(bytes([byte]))
            except trio.BrokenResourceError:
                break
            await trio.sleep(0.25)
            if any(isinstance(p, amqp.Close) for p in peer.received()):
                break
            with trio.move_on_after(0):
                await peer._read()
    error = the_close(await peer.read_to_eof()).error
    assert error.condition == C.RESOURCE_LIMIT_EXCEEDED
    await peer.aclose()


@pytest.mark.parametrize("cap", [512, 50])
async def test_two_hundred_connections_at_once(nursery: trio.Nursery, cap: int) -> None:
    # with the default limits, 200 handshakes at once from one address are all served (fewer than half the
    # 512 slots: the per-address limit does not apply yet); with 50 slots, the slot cap alone
    per_address = transport.DEFAULT_MAX_HANDSHAKES_PER_ADDRESS if cap == 512 else None
    port = await start(nursery, max_connections=cap, max_handshakes_per_address=per_address)
    results: list[str] = []

    async def one() -> None:
        try:
            peer = await RawPeer.connect(port)
        except OSError:
            results.append("refused")
            return
        try:
            await peer.send(amqp.AMQP_HEADER + OPEN + BEGIN + CLOSE)
        except trio.BrokenResourceError:
            pass
        frames = await peer.read_to_eof()
        await peer.aclose()
        if frames == []:
            results.append("closed")
        else:
            assert the_close(frames).error is None
            results.append("served")

    with trio.fail_after(60):
        async with trio.open_nursery() as crowd:
            for _ in range(200):
                crowd.start_soon(one)
    assert len(results) == 200
    if cap >= 200:
        assert results.count("served") == 200
    else:
        assert results.count("served") >= cap and set(results) <= {"served", "closed", "refused"}
    await assert_still_serving(port)


async def test_one_address_with_idle_connections_cannot_take_every_slot(
    nursery: trio.Nursery, caplog: pytest.LogCaptureFixture
) -> None:
    """127.0.0.2 opens as many idle sockets as there are slots: once half the slots are in their handshake it
    gets no more; 127.0.0.1 still connects and sends."""
    slots, per_address = 40, 8
    admitted = max(slots // 2, per_address)
    port = await start(
        nursery, max_connections=slots, max_handshakes_per_address=per_address, handshake_timeout=600
    )
    connect = functools.partial(trio.open_tcp_stream, "127.0.0.1", port, local_address="127.0.0.2")
    idle = [RawPeer(await connect()) for _ in range(slots)]
    closed: list[RawPeer] = []
    enough = trio.Event()

    async def watch(peer: RawPeer) -> None:
        while not peer.eof:
            await peer._read()
        closed.append(peer)
        if len(closed) == slots - admitted:
            enough.set()

    async with trio.open_nursery() as watchers:
        for peer in idle:
            watchers.start_soon(watch, peer)
        with trio.fail_after(60):
            await enough.wait()  # the sockets beyond the limit are closed at once, without a word
        await assert_still_serving(port)  # another address gets a slot and exchanges a message
        # the ones within the limit still hold their handshake (its timeout is far away)
        assert len(closed) == slots - admitted and all(p.data == b"" for p in closed)
        watchers.cancel_scope.cancel()
    assert any("127.0.0.2" in r.getMessage() and "closed at once" in r.getMessage() for r in caplog.records)
    for peer in idle:
        await peer.aclose()


async def test_connections_past_their_handshake_do_not_count_against_their_address(
    nursery: trio.Nursery,
) -> None:
    port = await start(nursery, max_connections=8, max_handshakes_per_address=2)  # limit from 4 handshakes
    with trio.fail_after(60):
        async with contextlib.AsyncExitStack() as stack:
            conns = [
                await stack.enter_async_context(transport.open_amqp_connection("127.0.0.1", port))
                for _ in range(6)  # one after the other: each is open before the next one starts
            ]
            for i, conn in enumerate(conns):
                sender = await conn.open_sender(f"q{i}")
                assert await sender.send(b"\x00Sw\xa1\x02ok") == amqp.Accepted()


# --- running out of descriptors ------------------------------------------------------------------------

EMFILE_SERVER = textwrap.dedent(
    """
    import functools, logging, resource, sys
    import trio
    from corda_trio import amqp, transport

    resource.setrlimit(resource.RLIMIT_NOFILE, (48, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="%(name)s %(message)s")

    async def handler(conn):
        await conn.wait_closed()

    async def main():
        config = amqp.ConnectionConfig(sasl=False, idle_timeout_ms=None)
        serve = functools.partial(  # (60 connections stay in their handshake: no per-address limit here)
            transport.serve_amqp, handler, 0, config=config, handshake_timeout=None, max_connections=1000,
            max_handshakes_per_address=None,
        )
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(serve)
            print(transport.listener_port(listeners), flush=True)

    trio.run(main)
    """
)


async def test_descriptor_exhaustion_is_logged_once_and_accepting_recovers_at_once() -> None:
    proc = subprocess.Popen(  # noqa: ASYNC220 - started once, stopped in finally
        [sys.executable, "-c", EMFILE_SERVER], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    began = trio.current_time()
    try:
        assert proc.stdout is not None
        port = int(await trio.to_thread.run_sync(proc.stdout.readline))
        held: list[RawPeer] = []
        with trio.fail_after(30):
            for _ in range(60):  # more than the server's 48 descriptors
                peer = await RawPeer.connect(port)
                await peer.send(amqp.AMQP_HEADER)
                held.append(peer)
            await trio.sleep(1.0)  # the server keeps failing to accept meanwhile (about 20 tries)
            answered = 0
            for peer in held:
                with trio.move_on_after(0.05):
                    await peer.read_until(amqp.Open)
                answered += any(isinstance(p, amqp.Open) for p in peer.received())
            assert answered < 60
            # free descriptors (more than are waiting): the waiting connections are served at once
            for peer in held[:30]:
                await peer.aclose()
            start = trio.current_time()
            for peer in held[30:]:
                await peer.read_until(amqp.Open)
            assert trio.current_time() - start < 10
            for peer in held[30:]:
                await peer.aclose()
    finally:
        proc.kill()
        _, err = await trio.to_thread.run_sync(functools.partial(proc.communicate, timeout=30))
        elapsed = trio.current_time() - began
    lines = [line for line in err.decode().splitlines() if "accept failed" in line]
    # dozens of failed accepts, but one line per ACCEPT_ERROR_LOG_INTERVAL_SECONDS at most
    assert 1 <= len(lines) <= 1 + elapsed // transport.ACCEPT_ERROR_LOG_INTERVAL_SECONDS, err.decode()
    # naming the limit it ran into (the child set 48), which the system's text does not say
    assert "EMFILE (Too many open files (the limit, ulimit -n, is 48))" in lines[0], lines[0]


def transfer_with_0x56_booleans(
    handle: int, delivery_id: int, channel: int, payload: bytes, *, settled: bool
) -> bytes:
    """A transfer whose booleans use the one-byte 0x56 encoding (as _pyamqp writes them); more = false."""
    fields = (
        bytes([0x52, handle, 0x52, delivery_id, 0xA0, 1, delivery_id, 0x43])
        + (b"\x56\x01" if settled else b"\x56\x00")
        + b"\x56\x00"
    )
    body = b"\x00\x53\x14\xc0" + bytes([len(fields) + 1, 6]) + fields
    header = (8 + len(body) + len(payload)).to_bytes(4, "big") + b"\x02\x00" + channel.to_bytes(2, "big")
    return header + body + payload


async def test_booleans_as_0x56_on_channel_3_handle_5_pipelined(nursery: trio.Nursery) -> None:
    broker = QueueBroker(credit=100)
    port = await start(nursery, broker)
    peer = await RawPeer.connect(port)
    attach = amqp.Attach(
        name="b56",
        handle=5,
        role=amqp.Role.SENDER,
        target=amqp.Target(address="b56"),
        initial_delivery_count=0,
    )
    # header, open, begin, attach and the transfers in one write, before any credit arrived: ten
    # pre-settled, then one unsettled whose disposition tells that all eleven were taken (in order)
    hello = amqp.AMQP_HEADER + OPEN + amqp.encode_frame(BEGIN_PERF, 3) + amqp.encode_frame(attach, 3)
    body = b"\x00Sw\x40"
    transfers = [transfer_with_0x56_booleans(5, i, 3, body, settled=i < 10) for i in range(11)]
    await peer.send(hello + b"".join(transfers))
    frames = await peer.read_until(amqp.Disposition)
    dispositions = [p for p in frames if isinstance(p, amqp.Disposition)]
    assert dispositions and dispositions[0].first == 10 and dispositions[0].state == amqp.Accepted()
    assert broker.received == 11 and len(broker.queues["b56"]) == 11
    assert not [p for p in frames if isinstance(p, amqp.Close | amqp.Detach)]
    await peer.send(CLOSE)
    assert the_close(await peer.read_to_eof()).error is None
    await peer.aclose()


async def test_a_peer_overrunning_again_while_the_buffer_is_full_loses_only_its_link(
    nursery: trio.Nursery,
) -> None:
    """Credit 10, overrun bound 20: the peer fills the buffer (30), the consumer takes a few (no grant while
    the buffer is over the credit, so the overrun is not forgiven), the peer sends more: only its link is
    detached, with transfer-limit-exceeded; the connection and the reader survive."""
    took_some = trio.Event()
    took_more = trio.Event()
    consumed = trio.Event()
    taken: list[bytes] = []
    ended: list[BaseException] = []

    async def handler(conn: transport.AmqpConnection) -> None:
        async for request in conn.link_requests():
            receiver = await request.accept_receiver(credit=10)
            await took_some.wait()  # the peer has filled the buffer meanwhile
            assert receiver.overrun_total == 20
            for _ in range(5):
                taken.append((await receiver.receive()).payload)
            took_more.set()
            try:
                async for delivery in receiver:
                    taken.append(delivery.payload)
            except transport.LinkDetachedError as exc:
                ended.append(exc)
            consumed.set()

    config = amqp.ConnectionConfig(
        sasl_mechanisms=("ANONYMOUS",), allow_bare_amqp=True, max_credit_overrun=20
    )
    listeners = await nursery.start(functools.partial(transport.serve_amqp, handler, 0, config=config))
    peer = await RawPeer.connect(transport.listener_port(listeners))
    attach = amqp.Attach(
        name="flood",
        handle=0,
        role=amqp.Role.SENDER,
        target=amqp.Target(address="f"),
        initial_delivery_count=0,
    )
    await peer.send(amqp.AMQP_HEADER + OPEN + BEGIN + amqp.encode_frame(attach))
    await peer.read_until(amqp.Flow)

    def settled_transfers(first: int, count: int) -> bytes:
        return b"".join(
            amqp.encode_frame(
                amqp.Transfer(handle=0, delivery_id=i, delivery_tag=i.to_bytes(4, "big"), settled=True),
                0,
                b"\x00Sw\x40",
            )
            for i in range(first, first + count)
        )

    await peer.send(settled_transfers(0, 30))  # credit 10 + the 20 absorbed
    await trio.testing.wait_all_tasks_blocked(0.05)  # the server has read them all (loopback)
    took_some.set()
    await took_more.wait()
    await peer.send(settled_transfers(30, 30))
    frames = await peer.read_until(amqp.Detach)
    detach = next(p for p in frames if isinstance(p, amqp.Detach))
    assert detach.error is not None and detach.error.condition == C.TRANSFER_LIMIT_EXCEEDED
    assert not [p for p in frames if isinstance(p, amqp.Close)]
    await peer.send(amqp.encode_frame(amqp.Detach(handle=0, closed=True)))  # a conformant answer
    with trio.fail_after(20):
        await consumed.wait()
    assert len(taken) == 30  # everything up to the bound was delivered, nothing beyond it
    assert ended and ended[0].condition == C.TRANSFER_LIMIT_EXCEEDED  # the receiver learns why
    await peer.send(CLOSE)
    assert the_close(await peer.read_to_eof()).error is None
    await peer.aclose()


async def test_per_link_max_message_size(nursery: trio.Nursery) -> None:
    """``accept_receiver(max_message_size=)``: advertised in the attach (our client refuses to send more);
    a raw peer that sends more anyway loses that link at the first frame past the limit, the connection
    stays."""
    outcome: list[BaseException] = []
    got: list[bytes] = []
    done = trio.Event()

    async def handler(conn: transport.AmqpConnection) -> None:
        async for request in conn.link_requests():
            receiver = await request.accept_receiver(credit=10, max_message_size=2000)
            try:
                async for delivery in receiver:
                    got.append(delivery.payload)
                    await delivery.accept()
            except transport.LinkDetachedError as exc:
                outcome.append(exc)
                done.set()

    listeners = await nursery.start(functools.partial(transport.serve_amqp, handler, 0, config=BARE))
    port = transport.listener_port(listeners)
    async with transport.open_amqp_connection("127.0.0.1", port) as conn:
        sender = await conn.open_sender("limited")
        assert sender.remote_attach.max_message_size == 2000
        assert await sender.send(b"\x00Sw\xa0\x10" + bytes(16)) == amqp.Accepted()
        with pytest.raises(transport.AmqpTransportError) as info:
            await sender.send(b"\x00Su\xb0" + (3000).to_bytes(4, "big") + bytes(3000))
        assert info.value.condition == "amqp:link:message-size-exceeded"
    peer = await RawPeer.connect(port)
    attach = amqp.Attach(
        name="big", handle=0, role=amqp.Role.SENDER, target=amqp.Target(address="b"), initial_delivery_count=0
    )
    await peer.send(amqp.AMQP_HEADER + OPEN + BEGIN + amqp.encode_frame(attach))
    await peer.read_until(amqp.Flow)
    first = amqp.Transfer(handle=0, delivery_id=0, delivery_tag=b"t", more=True)
    more = amqp.Transfer(handle=0, more=True)
    await peer.send(amqp.encode_frame(first, 0, bytes(900)) + amqp.encode_frame(more, 0, bytes(900)) * 5)
    frames = await peer.read_until(amqp.Detach)
    detach = next(p for p in frames if isinstance(p, amqp.Detach))
    assert detach.error is not None and detach.error.condition == C.MESSAGE_SIZE_EXCEEDED
    await peer.send(amqp.encode_frame(amqp.Detach(handle=0, closed=True)))
    with trio.fail_after(20):
        await done.wait()
    assert outcome[0].condition == C.MESSAGE_SIZE_EXCEEDED and len(got) == 1
    await peer.send(CLOSE)
    assert the_close(await peer.read_to_eof()).error is None
    await peer.aclose()


@pytest.mark.parametrize("grouped", [False, True])
async def test_a_connection_lost_under_a_handler_s_tasks_is_no_handler_failure(
    nursery: trio.Nursery, caplog: pytest.LogCaptureFixture, grouped: bool
) -> None:
    """A peer that goes away while the handler answers its attach: the handler's nursery raises the
    connection error in a group; the server logs the connection as ended (info), not a 'handler failed'
    traceback as for a bug. A bug in a handler still gets its traceback."""
    done = trio.Event()

    async def handler(conn: transport.AmqpConnection) -> None:
        try:
            if grouped:
                async with trio.open_nursery() as tasks:
                    tasks.start_soon(trio.sleep_forever)
                    raise transport.AmqpConnectionError("the peer went away during the attach")
            raise RuntimeError("a bug in the handler")
        finally:
            done.set()

    listeners = await nursery.start(functools.partial(transport.serve_amqp, handler, 0, config=BARE))
    with caplog.at_level(logging.INFO, logger="corda_trio.transport"):
        with contextlib.suppress(transport.AmqpConnectionError):  # (the server closes it when done)
            async with transport.open_amqp_connection("127.0.0.1", transport.listener_port(listeners)):
                await done.wait()
        with trio.fail_after(10):  # the server logs once its side of the connection is closed
            while not any(r.getMessage().startswith("inbound ") for r in caplog.records):  # noqa: ASYNC110
                await trio.sleep(0.01)
    failed = [r for r in caplog.records if "handler failed" in r.getMessage()]
    if grouped:
        assert not failed
        assert any("ended: the peer went away during the attach" in r.getMessage() for r in caplog.records)
    else:
        assert len(failed) == 1 and failed[0].exc_info is not None


async def test_an_attach_the_answer_to_which_would_not_fit_the_peer_s_frames_is_refused(
    nursery: trio.Nursery,
) -> None:
    """A raw peer advertises max-frame-size 512, then attaches a sender with a 3,000-byte target and a
    receiver with a 3,000-byte source (each within our 128 KiB frames). Every frame the server sends fits
    512 (the echoing attach used to be 3 KB, a framing error at the peer ending the connection): both links
    are refused with amqp:frame-size-too-small, and a link with a short address is then served on the same
    connection. A link name too long for any answer closes the connection with that condition, in a frame
    that fits too."""
    broker = QueueBroker()
    port = await start(nursery, broker)
    peer = await RawPeer.connect(port)
    small = amqp.encode_frame(amqp.Open(container_id="small", max_frame_size=512))
    long = "x" * 3000
    attaches = [
        amqp.Attach(name="s", handle=0, role=amqp.Role.SENDER, target=amqp.Target(address=long),
                    initial_delivery_count=0),
        amqp.Attach(name="r", handle=1, role=amqp.Role.RECEIVER, source=amqp.Source(address=long)),
    ]  # fmt: skip
    await peer.send(amqp.AMQP_HEADER + small + BEGIN + b"".join(amqp.encode_frame(a) for a in attaches))
    frames = await peer.read_until(amqp.Detach, 2)
    detaches = [p for p in frames if isinstance(p, amqp.Detach)]
    assert [d.handle for d in detaches] == [0, 1]
    assert all(d.error.condition == C.FRAME_SIZE_TOO_SMALL for d in detaches)
    answers = [p for p in frames if isinstance(p, amqp.Attach)]
    assert [(a.source, a.target) for a in answers] == [(None, None), (None, None)]
    await peer.send(b"".join(amqp.encode_frame(amqp.Detach(handle=h, closed=True)) for h in (0, 1)))
    fine = amqp.Attach(name="fine", handle=2, role=amqp.Role.SENDER, target=amqp.Target(address="q"),
                       initial_delivery_count=0)  # fmt: skip
    await peer.send(amqp.encode_frame(fine))
    frames = await peer.read_until(amqp.Flow)
    assert [a.target.address for a in frames if isinstance(a, amqp.Attach) and a.target] == ["q"]
    huge_name = amqp.Attach(name="n" * 1000, handle=3, role=amqp.Role.SENDER, initial_delivery_count=0)
    await peer.send(amqp.encode_frame(huge_name))
    assert the_close(await peer.read_to_eof()).error.condition == C.FRAME_SIZE_TOO_SMALL
    await peer.aclose()
    raw = bytes(peer.data)
    pos, sizes = 8, []  # (after the AMQP header)
    while pos < len(raw):
        sizes.append(int.from_bytes(raw[pos : pos + 4], "big"))
        pos += sizes[-1]
    assert max(sizes) <= 512, sizes
    await assert_still_serving(port)
