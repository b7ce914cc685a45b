"""A legitimate network member that misbehaves at the AMQP level after TLS, against the float's public port:
raw frames over a real TLS socket, with a hand-driven inside (``test_float``'s harness). Each case checks
what comes back on the wire, that another member is still served end to end, and that the float's
end-to-end window comes back whole."""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import struct
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.lowlevel

from corda_trio import amqp, pki, transport
from corda_trio.bridge import float as fl
from tests.p2p_harness import contexts, wait_until
from tests.transport.test_hostile import RawPeer

from .test_float import _peer_connection, activate, command, control, inbox_of, running_float, wire
from .test_interop import bob_behind_float

SENDER = False  # Attach.role: sender


@contextlib.asynccontextmanager
async def tls_peer(creds: pki.NodeCredentials, root: Any, public: int) -> AsyncIterator[RawPeer]:
    tcp = await trio.open_tcp_stream("127.0.0.1", public)
    stream = trio.SSLStream(tcp, contexts(creds, root)[1], server_hostname="float")  # type: ignore[arg-type]
    await stream.do_handshake()
    peer = RawPeer(stream)
    init = amqp.SaslInit(mechanism=amqp.Symbol("EXTERNAL"))
    await peer.send(amqp.SASL_HEADER, amqp.encode_frame(init), amqp.AMQP_HEADER,
                    amqp.encode_frame(amqp.Open(container_id="hostile", max_frame_size=65536)),
                    amqp.encode_frame(amqp.Begin(next_outgoing_id=0, incoming_window=100_000,
                                                 outgoing_window=100_000)))  # fmt: skip
    await peer.read_until_frames(lambda fs: any(isinstance(f, amqp.Begin) for f in fs))
    try:
        yield peer
    finally:
        with contextlib.suppress(Exception):
            await trio.aclose_forcefully(stream)


def attach(name: str, handle: int, inbox: str, **kw: Any) -> bytes:
    source, target = amqp.Source(address="src"), amqp.Target(address=inbox)
    performative = amqp.Attach(
        name=name, handle=handle, role=SENDER, source=source, target=target, initial_delivery_count=0, **kw
    )
    return amqp.encode_frame(performative)


def transfer(handle: int, delivery_id: int | None, payload: bytes, **kw: Any) -> bytes:
    tag = None if delivery_id is None else b"t%d" % delivery_id
    performative = amqp.Transfer(handle=handle, delivery_id=delivery_id, delivery_tag=tag, **kw)
    return amqp.encode_frame(performative, 0, payload)


def of(kind: type, frames: list[object]) -> list[Any]:
    return [f for f in frames if isinstance(f, kind)]


def audited(directory: Path, event: str) -> list[dict[str, Any]]:
    lines = [json.loads(x) for x in (directory / "audit.jsonl").read_text().splitlines()]
    return [e for e in lines if e["event"] == event]


def credit_of(frames: list[object], handle: int = 0) -> int | None:
    """The link credit the last flow for ``handle`` in ``frames`` granted (``None``: no such flow)."""
    flows = [f for f in of(amqp.Flow, frames) if f.handle == handle]
    return flows[-1].link_credit if flows else None


def settled_ids(frames: list[object]) -> dict[int, Any]:
    """Delivery id -> the outcome of each disposition in ``frames`` that settled it."""
    out: dict[int, Any] = {}
    for d in of(amqp.Disposition, frames):
        if d.settled:
            for i in range(d.first, (d.last if d.last is not None else d.first) + 1):
                out[i] = d.state
    return out


async def test_aborted_deliveries_give_their_credit_back_and_are_never_forwarded(
    alice: pki.NodeCredentials,
    bob: pki.NodeCredentials,
    network: pki.NetworkCredentials,
    float_creds: fl.TunnelCredentials,
    bridge_creds: fl.TunnelCredentials,
    tmp_path: Path,
) -> None:
    """A member aborts its two deliveries (spec 2.6.14: one after a first frame with more=true, one at once),
    each within the credit of 2 the float granted. An aborted delivery takes a credit and never reaches the
    application, so the float never granted again: the member, which may send nothing more without credit,
    waited forever with its link holding its share of the window. Now each abort counts as a delivery taken:
    the credit comes back, nothing aborted is forwarded, and the next delivery is forwarded and settled."""
    root, inbox = network.root.cert, inbox_of(bob)
    async with running_float(float_creds, bob, root, tmp_path) as (flt, port):
        with trio.fail_after(60):
            async with control(port, bridge_creds) as (commands, reports, inbound):
                public = (await command(commands, reports, activate(inbox, credit=4))).public_port
                async with tls_peer(alice, root, public) as peer:
                    await peer.send(attach("l", 0, inbox))
                    assert credit_of(await peer.read_until_frames(lambda fs: credit_of(fs) is not None)) == 2
                    seen = len(peer.received())
                    m = wire(alice, 1)
                    await peer.send(
                        transfer(0, 0, m[:10], more=True),
                        transfer(0, None, m[10:20], more=True, aborted=True),
                        transfer(0, 1, m, aborted=True),
                    )
                    frames = await peer.read_until_frames(lambda fs: credit_of(fs[seen:]) is not None)
                    assert credit_of(frames[seen:]) == 2, frames[seen:]
                    await peer.send(transfer(0, 2, wire(alice, 2)))
                    forwarded = await inbound.receive()
                    assert fl.ForwardedDelivery.decode(forwarded.payload).payload == wire(alice, 2)
                    await forwarded.accept()
                    frames = await peer.read_until_frames(lambda fs: 2 in settled_ids(fs))
                    assert settled_ids(frames) == {2: amqp.Accepted()}, frames
                    assert not of(amqp.Detach, frames) and flt.forwarded == 1 and flt.accepted == 1


async def test_an_attach_that_arrives_with_the_connection_s_end_gives_its_window_back(
    alice: pki.NodeCredentials,
    bob: pki.NodeCredentials,
    carol: pki.NodeCredentials,
    network: pki.NetworkCredentials,
    float_creds: fl.TunnelCredentials,
    bridge_creds: fl.TunnelCredentials,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A member sends an attach and, in the same write, a transfer on a handle it never attached: the float
    closes the connection (amqp:session:unattached-handle) before it answers the attach. The link's share of
    the window was taken before the answer, and the answer raised on the broken connection: the share was
    never given back, so with a window of 4 (one link's) no member could attach again; and the error left
    the float's connection task as a traceback ('connection failed') and a second 'close' audit line
    (amqp:internal-error). Now the share is given back, Carol's link then gets the full credit and delivers
    end to end, and Alice's connection has one 'close' line with the condition, no traceback."""
    root, inbox = network.root.cert, inbox_of(bob)
    async with running_float(float_creds, bob, root, tmp_path) as (flt, port):
        with trio.fail_after(60):
            async with control(port, bridge_creds) as (commands, reports, inbound):
                public = (await command(commands, reports, activate(inbox, credit=4))).public_port
                async with tls_peer(alice, root, public) as peer:
                    await peer.send(attach("l", 0, inbox), transfer(7, 0, wire(alice, 1)))
                    frames = await peer.read_until_frames(lambda fs: of(amqp.Close, fs))
                    [close] = of(amqp.Close, frames)
                    assert close.error.condition == "amqp:session:unattached-handle", close
                await wait_until(lambda: audited(tmp_path, "close"))
                async with _peer_connection(carol, bob, root, public) as conn:
                    sender = await conn.open_sender(inbox)
                    pending = await sender.start_send(wire(carol, 2))
                    forwarded = await inbound.receive()
                    assert fl.ForwardedDelivery.decode(forwarded.payload).source == str(carol.legal_name)
                    await forwarded.accept()
                    assert isinstance(await pending.outcome(), amqp.Accepted)
                assert flt.forwarded == flt.accepted == 1
                await wait_until(lambda: flt._activation is not None and flt._activation.window_left == 4)
    [close_line, _carol] = audited(tmp_path, "close")
    assert close_line["legal_name"] == str(alice.legal_name), close_line
    assert "unattached-handle" in close_line["condition"], close_line
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records]


async def test_a_thousand_attach_detach_cycles_in_one_write_leave_the_window_whole(
    alice: pki.NodeCredentials,
    bob: pki.NodeCredentials,
    network: pki.NetworkCredentials,
    float_creds: fl.TunnelCredentials,
    bridge_creds: fl.TunnelCredentials,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A member pipelines 1,000 attach+detach cycles (handle 0, a new name each) in one write, as Qpid Proton
    sends a link opened and closed at once. A detach of a link not answered yet closed the whole connection
    (amqp:illegal-state, 'D:recv is not allowed in state ATTACH_RCVD'); and once the float's queue of
    unanswered attaches was full, refusing one the peer had detached already raised in the connection's
    reader: a 'connection failed' traceback. Now each gets its attach and detach answered (the float's
    refused with amqp:resource-limit-exceeded while the window is taken), the connection stays, the
    window comes back whole, and a final link on it gets the full credit and delivers end to end."""
    root, inbox = network.root.cert, inbox_of(bob)
    async with running_float(float_creds, bob, root, tmp_path) as (flt, port):
        with trio.fail_after(60):
            async with control(port, bridge_creds) as (commands, reports, inbound):
                public = (await command(commands, reports, activate(inbox, credit=4))).public_port
                async with tls_peer(alice, root, public) as peer:
                    detach = amqp.encode_frame(amqp.Detach(handle=0, closed=True))
                    await peer.send(*[f for i in range(1000) for f in (attach(f"c{i}", 0, inbox), detach)])
                    frames = await peer.read_until_frames(lambda fs: len(of(amqp.Detach, fs)) >= 1000, 30)
                    assert not of(amqp.Close, frames) and len(of(amqp.Attach, frames)) == 1000
                    conditions = {str(d.error.condition) for d in of(amqp.Detach, frames) if d.error}
                    assert conditions <= {"amqp:resource-limit-exceeded"}, conditions
                    await wait_until(lambda: flt._activation is not None and flt._activation.window_left == 4)
                    seen = len(frames)
                    await peer.send(attach("final", 0, inbox))
                    assert (
                        credit_of(await peer.read_until_frames(lambda fs: credit_of(fs[seen:]) is not None))
                        == 2
                    )
                    await peer.send(transfer(0, 0, wire(alice, 1)))
                    forwarded = await inbound.receive()
                    assert fl.ForwardedDelivery.decode(forwarded.payload).payload == wire(alice, 1)
                    await forwarded.accept()
                    frames = await peer.read_until_frames(lambda fs: 0 in settled_ids(fs[seen:]))
                    assert settled_ids(frames[seen:]) == {0: amqp.Accepted()}
                    assert flt.forwarded == flt.accepted == 1
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records]
    assert len(audited(tmp_path, "link-attached")) == flt.attached_links
    detached = audited(tmp_path, "link-detached")
    assert len(detached) == flt.attached_links
    # a link the peer detached before the float's answer was answered by the engine: the float neither
    # reserves window for it (another attach was refused meanwhile) nor audits it as attached
    assert not [e for e in detached if "before an answer" in (e["condition"] or "")], detached[:3]


async def test_a_peer_link_takes_no_message_whose_envelope_the_inside_would_not_take(
    alice: pki.NodeCredentials,
    bob: pki.NodeCredentials,
    network: pki.NetworkCredentials,
    float_creds: fl.TunnelCredentials,
    bridge_creds: fl.TunnelCredentials,
    tmp_path: Path,
) -> None:
    """The inside's inbound link takes envelopes of at most 1,500 bytes; the float offered peers its own
    max_message_size (10 MiB). A 3,000-byte message was taken, its envelope could not be sent inward, and
    the peer link's pump ended while the link stayed attached on the wire: the outcomes of the two messages
    before it, which the inside had accepted, never reached the peer, and nothing it sent after was ever
    settled. Now the link's max-message-size leaves room for the envelope: the peer's sender refuses the big
    message itself, and the others are forwarded and settled."""
    root, inbox = network.root.cert, inbox_of(bob)
    async with running_float(float_creds, bob, root, tmp_path) as (flt, port):
        with trio.fail_after(60):
            async with transport.open_amqp_connection(
                "127.0.0.1", port, ssl_context=bridge_creds.client_context(),
                peer_check=lambda t: fl.check_tunnel_peer(t, "float"),
            ) as conn:  # fmt: skip
                commands = await conn.open_sender(fl.CONTROL_ADDRESS)
                reports = await conn.open_receiver(fl.EVENTS_ADDRESS, credit=8)
                inbound = await conn.open_receiver(fl.INBOUND_ADDRESS, credit=8, max_message_size=1500)
                public = (await command(commands, reports, activate(inbox, credit=8))).public_port
                async with _peer_connection(alice, bob, root, public) as peer:
                    sender = await peer.open_sender(inbox)
                    limit = sender.remote_attach.max_message_size
                    prefix = fl.ForwardedDelivery.prefix(str(alice.legal_name), inbox, "127.0.0.1:1")
                    assert 0 < limit <= 1500 - len(prefix), limit
                    sent = [await sender.start_send(wire(alice, i)) for i in (1, 2)]
                    with pytest.raises(transport.AmqpTransportError, match="message-size-exceeded"):
                        await sender.start_send(amqp.Message(body=amqp.AmqpValue("x" * 3000)).encode())
                    sent.append(await sender.start_send(wire(alice, 3)))
                    for i in (1, 2, 3):
                        forwarded = await inbound.receive()
                        assert fl.ForwardedDelivery.decode(forwarded.payload).payload == wire(alice, i)
                        await forwarded.accept()
                    assert [await p.outcome() for p in sent] == [amqp.Accepted()] * 3
    assert flt.forwarded == flt.accepted == 3


def _socket_of(stream: Any) -> Any:
    while not isinstance(stream, trio.SocketStream):
        stream = stream.transport_stream
    return stream.socket


async def test_a_member_reset_with_deliveries_in_flight_sends_them_again_and_none_is_lost(
    alice: pki.NodeCredentials,
    bob: pki.NodeCredentials,
    network: pki.NetworkCredentials,
    float_creds: fl.TunnelCredentials,
    bridge_creds: fl.TunnelCredentials,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Alice's connection to the float is reset (TCP RST) with 20 deliveries taken by the float and on their
    way to Bob's inbox through a real inside. She connects again and sends again those whose outcome had not
    reached her: Bob's inbox holds every message (copies of the ones stored before the reset at most), the
    window comes back whole, and the reset is one 'close' audit line with its condition, no traceback."""
    root = network.root.cert
    async with bob_behind_float(bob, network, float_creds, bridge_creds, tmp_path, [alice]) as b:
        with trio.fail_after(60):
            async with _peer_connection(alice, bob, root, b.port) as conn:
                sender = await conn.open_sender(b.inbox.name)
                for i in range(10):
                    assert await sender.send(wire(alice, i)) == amqp.Accepted()
                pending = [await sender.start_send(wire(alice, i)) for i in range(10, 30)]
                await trio.lowlevel.checkpoint()  # (the writer sends them)
                _socket_of(conn._stream).setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                )
                await trio.aclose_forcefully(conn._stream)
            # (those whose outcome came before the reset are done; the rest are in doubt: sent again)
            doubt = [i for i, p in zip(range(10, 30), pending, strict=True) if p.state != amqp.Accepted()]
            async with _peer_connection(alice, bob, root, b.port) as conn:
                sender = await conn.open_sender(b.inbox.name)
                again = [await sender.start_send(wire(alice, i)) for i in doubt]
                assert [await p.outcome() for p in again] == [amqp.Accepted()] * len(doubt)
            stored = [m.data for m in await b.stored()]
            assert set(stored) == {b"%d" % i for i in range(30)} and len(stored) <= 50, stored
            await wait_until(lambda: b.flt._activation is not None and b.flt._activation.window_left == 1024)
    closes = [e for e in b.audit("close") if e.get("legal_name") == str(alice.legal_name)]
    assert len(closes) == 2 and closes[1]["condition"] is None, closes
    assert "reset" in closes[0]["condition"].lower() or "without a close" in closes[0]["condition"], closes
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR], caplog.text[-3000:]


async def test_a_transaction_coordinator_attach_is_refused_and_the_connection_goes_on(
    alice: pki.NodeCredentials,
    bob: pki.NodeCredentials,
    network: pki.NetworkCredentials,
    float_creds: fl.TunnelCredentials,
    bridge_creds: fl.TunnelCredentials,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A member attaches a sender whose target is a transaction coordinator (spec 4.5.1: a described
    ``amqp:coordinator:list``, not a ``target``), as a transacted JMS session does. Reading the attach's
    address raised AttributeError in the connection's reader: a 'connection failed' traceback and the
    member's connection closed (with no error). Now it is refused with amqp:unauthorized-access like any
    other address, and a sender to the inbox on the same connection then delivers end to end."""
    root, inbox = network.root.cert, inbox_of(bob)
    coordinator = amqp.Described(amqp.Symbol("amqp:coordinator:list"), [])
    async with running_float(float_creds, bob, root, tmp_path) as (flt, port):
        with trio.fail_after(60):
            async with control(port, bridge_creds) as (commands, reports, inbound):
                public = (await command(commands, reports, activate(inbox, credit=4))).public_port
                async with tls_peer(alice, root, public) as peer:
                    source = amqp.Source(address="s")
                    txn = amqp.Attach(
                        name="txn", handle=0, role=SENDER, source=source, target=coordinator,
                        initial_delivery_count=0,
                    )  # fmt: skip
                    await peer.send(amqp.encode_frame(txn))
                    frames = await peer.read_until_frames(lambda fs: of(amqp.Detach, fs))
                    [refused] = of(amqp.Detach, frames)
                    assert refused.error.condition == "amqp:unauthorized-access", refused
                    seen = len(frames)
                    await peer.send(attach("l", 1, inbox))
                    await peer.read_until_frames(lambda fs: credit_of(fs[seen:], handle=1) is not None)
                    await peer.send(transfer(1, 0, wire(alice, 1)))
                    forwarded = await inbound.receive()
                    await forwarded.accept()
                    frames = await peer.read_until_frames(lambda fs: 0 in settled_ids(fs))
                    assert settled_ids(frames) == {0: amqp.Accepted()} and not of(amqp.Close, frames)
    assert flt.refused_links_by_condition == {"amqp:unauthorized-access": 1} and flt.accepted == 1
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records]
