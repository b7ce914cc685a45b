"""The float on its own, in one process over real sockets and TLS: activation commands, what it refuses on
the public side, the end-to-end window, the single control link, the audit log."""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from corda_trio import amqp, messaging, pki, transport
from corda_trio.bridge import float as fl
from tests.p2p_harness import NOW, contexts, wait_until

from .test_inprocess import node_tls


@contextlib.asynccontextmanager
async def running_float(
    float_creds: fl.TunnelCredentials, bob: pki.NodeCredentials, root: Any, tmp_path: Path, **config: Any
) -> AsyncIterator[tuple[fl.Float, int]]:
    flt = fl.Float(
        fl.FloatConfig(
            tunnel=float_creds,
            public_host="127.0.0.1",
            tls={"node": node_tls(bob, root, tmp_path / "tls")},
            **config,
        ),
        audit=fl.AuditLog(tmp_path / "audit.jsonl"),
    )
    async with trio.open_nursery() as nursery:
        port = await nursery.start(flt.run)
        yield flt, port
        nursery.cancel_scope.cancel()


@contextlib.asynccontextmanager
async def control(port: int, creds: fl.TunnelCredentials) -> AsyncIterator[tuple[Any, Any, Any]]:
    """A hand-driven inside: (commands sender, reports receiver, inbound receiver)."""
    async with transport.open_amqp_connection(
        "127.0.0.1",
        port,
        ssl_context=creds.client_context(),
        peer_check=lambda t: fl.check_tunnel_peer(t, "float"),
    ) as conn:
        commands = await conn.open_sender(fl.CONTROL_ADDRESS)
        reports = await conn.open_receiver(fl.EVENTS_ADDRESS, credit=8)
        inbound = await conn.open_receiver(fl.INBOUND_ADDRESS, credit=4)
        yield commands, reports, inbound


async def command(commands: Any, reports: Any, message: fl.ControlMessage) -> Any:
    assert isinstance(await commands.send(fl.encode_control(message)), amqp.Accepted)
    delivery = await reports.receive()
    await delivery.accept()
    return fl.decode_control(delivery.message)


def inbox_of(creds: pki.NodeCredentials) -> str:
    return messaging.inbox_address(pki.key_hash(creds.identity.cert.public_key()))


def activate(inbox: str, *, credit: int = 4, tls_ref: str = "node") -> fl.ActivateFloat:
    return fl.ActivateFloat(activation_id="x1", tls_ref=tls_ref, inboxes=(inbox,), credit=credit)


async def test_activation_deactivation_and_bad_commands(
    bob: pki.NodeCredentials,
    network: pki.NetworkCredentials,
    float_creds: fl.TunnelCredentials,
    bridge_creds: fl.TunnelCredentials,
    tmp_path: Path,
) -> None:
    async with running_float(float_creds, bob, network.root.cert, tmp_path) as (flt, port):
        with trio.fail_after(30):
            async with control(port, bridge_creds) as (commands, reports, _):
                report = await command(commands, reports, activate(inbox_of(bob), tls_ref="nope"))
                assert isinstance(report, fl.FloatActivationFailed) and report.condition == "amqp:not-found"
                assert flt.state is fl.FloatState.CONNECTED and flt.public_port is None
                report = await command(commands, reports, activate(inbox_of(bob)))
                assert isinstance(report, fl.FloatActivated) and report.public_port == flt.public_port
                public = report.public_port
                await trio.open_tcp_stream("127.0.0.1", public)  # open
                outcome = await commands.send(b"\x00\x53\x70")  # not a message
                assert isinstance(outcome, amqp.Rejected) and outcome.error.condition == "amqp:decode-error"
                report = await command(commands, reports, fl.DeactivateFloat(reason="maintenance"))
                assert report == fl.FloatDeactivated(reason="maintenance")
                assert flt.state is fl.FloatState.CONNECTED
                with pytest.raises(OSError):
                    await trio.open_tcp_stream("127.0.0.1", public)
                report = await command(commands, reports, activate(inbox_of(bob)))
                assert isinstance(report, fl.FloatActivated)
                # activating an active float is a protocol error: the control link closes, the port with it
                again = await commands.send(fl.encode_control(activate(inbox_of(bob))))
                assert (
                    isinstance(again, amqp.Rejected) and again.error.condition == "amqp:precondition-failed"
                )
                with trio.fail_after(10):
                    while flt.state is not fl.FloatState.IDLE:  # noqa: ASYNC110
                        await trio.sleep(0.01)
            assert flt.public_port is None
    events = [json.loads(x) for x in (tmp_path / "audit.jsonl").read_text().splitlines()]
    kinds = [e["event"] for e in events]
    assert kinds.count("public-open") == 2 and kinds.count("public-closed") == 2
    assert "activation-failed" in kinds and "control-error" in kinds and kinds[-1] == "control-down"


@pytest.mark.parametrize("dates", ["expired", "not-yet-valid"])
async def test_an_activation_on_tls_material_replaced_by_an_out_of_date_chain_is_refused(
    bob: pki.NodeCredentials,
    network: pki.NetworkCredentials,
    float_creds: fl.TunnelCredentials,
    bridge_creds: fl.TunnelCredentials,
    tmp_path: Path,
    dates: str,
) -> None:
    """The [tls.<ref>] files are read anew at each activation; a chain replaced on disk by one that has
    expired (or is not valid yet) was activated anyway, and every peer's handshake then failed. Now the
    activation is refused with FloatActivationFailed amqp:precondition-failed, the reason in the words of
    'float start' (file, certificate, time), audited 'activation-failed'; the port stays closed, and the
    good files put back activate again."""
    if dates == "expired":  # ended fifty minutes ago
        stale = network.issue_node(bob.legal_name, now=NOW, validity=dt.timedelta(minutes=10))
        when = f"expired at {stale.tls.cert.not_valid_after_utc.isoformat()}"
    else:  # from tomorrow on
        stale = network.issue_node(bob.legal_name, now=NOW + dt.timedelta(days=1, hours=1))
        when = "is not valid before"
    async with running_float(float_creds, bob, network.root.cert, tmp_path) as (flt, port):
        chain, key = tmp_path / "tls" / "tls.pem", tmp_path / "tls" / "tls.key"
        good_chain, good_key = chain.read_bytes(), key.read_bytes()
        pki.write_certificates(chain, stale.tls_chain)
        pki.write_private_key(key, stale.tls.key, None)
        with trio.fail_after(30):
            async with control(port, bridge_creds) as (commands, reports, _):
                report = await command(commands, reports, activate(inbox_of(bob)))
                assert isinstance(report, fl.FloatActivationFailed), report
                assert report.condition == "amqp:precondition-failed", report
                subject = stale.tls.cert.subject.rfc4514_string()
                said = f"TLS material 'node': {chain}: certificate {subject!r} "
                assert report.description.startswith(said), report
                assert when in report.description and "this machine's clock" in report.description, report
                assert flt.state is fl.FloatState.CONNECTED and flt.public_port is None
                chain.write_bytes(good_chain)
                key.write_bytes(good_key)
                report = await command(commands, reports, activate(inbox_of(bob)))
                assert isinstance(report, fl.FloatActivated), report
    events = [json.loads(x) for x in (tmp_path / "audit.jsonl").read_text().splitlines()]
    (refused,) = [e for e in events if e["event"] == "activation-failed"]
    assert refused["condition"] == "amqp:precondition-failed" and when in refused["description"], refused
    assert [e["event"] for e in events].count("public-open") == 1


async def test_a_command_in_another_message_format_is_rejected_and_not_acted_on(
    bob: pki.NodeCredentials,
    network: pki.NetworkCredentials,
    float_creds: fl.TunnelCredentials,
    bridge_creds: fl.TunnelCredentials,
    tmp_path: Path,
) -> None:
    """An activation sent with transfer message-format 5 (not the standard AMQP message, spec 2.7.5) was read
    as a standard one and opened the public port. It is rejected with amqp:not-implemented; the float stays
    inactive, and the same command in format 0 then activates it."""
    async with running_float(float_creds, bob, network.root.cert, tmp_path) as (flt, port):
        with trio.fail_after(30):
            async with control(port, bridge_creds) as (commands, reports, _):
                outcome = await commands.send(fl.encode_control(activate(inbox_of(bob))), message_format=5)
                assert isinstance(outcome, amqp.Rejected), outcome
                assert (
                    outcome.error.condition == "amqp:not-implemented" and "0x5" in outcome.error.description
                )
                assert flt.state is fl.FloatState.CONNECTED and flt.public_port is None
                report = await command(commands, reports, activate(inbox_of(bob)))
                assert isinstance(report, fl.FloatActivated) and flt.public_port == report.public_port


async def test_one_control_link_at_a_time_and_only_with_a_bridge_certificate(
    bob: pki.NodeCredentials,
    network: pki.NetworkCredentials,
    float_creds: fl.TunnelCredentials,
    bridge_creds: fl.TunnelCredentials,
    tunnel: fl.TunnelPki,
    tmp_path: Path,
) -> None:
    other_float = tunnel.issue("float", "float-z", now=NOW)
    async with running_float(float_creds, bob, network.root.cert, tmp_path) as (flt, port):
        with trio.fail_after(30):
            async with control(port, bridge_creds):
                while flt.state is not fl.FloatState.CONNECTED:  # noqa: ASYNC110
                    await trio.sleep(0.01)
                with pytest.raises((transport.AmqpTransportError, trio.BrokenResourceError)):
                    async with control(port, bridge_creds):
                        pass
            # a float certificate, or a node certificate, does not open the control link
            for wrong in (other_float.client_context(), contexts(bob, network.root.cert)[1]):
                with pytest.raises((transport.HandshakeError, transport.AmqpTransportError)):
                    async with transport.open_amqp_connection(
                        "127.0.0.1",
                        port,
                        ssl_context=wrong,
                        peer_check=lambda t: fl.check_tunnel_peer(t, "float"),
                    ) as conn:
                        await conn.open_sender(fl.CONTROL_ADDRESS)
    kinds = [json.loads(x)["event"] for x in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert "control-refused" in kinds


async def test_public_side_refusals_and_the_end_to_end_window(
    alice: pki.NodeCredentials,
    bob: pki.NodeCredentials,
    carol: pki.NodeCredentials,
    network: pki.NetworkCredentials,
    float_creds: fl.TunnelCredentials,
    bridge_creds: fl.TunnelCredentials,
    tmp_path: Path,
) -> None:
    root = network.root.cert
    inbox = inbox_of(bob)
    foreign = pki.NetworkCredentials.create(now=NOW).issue_node(alice.legal_name, now=NOW)
    async with running_float(float_creds, bob, root, tmp_path) as (_, port):
        with trio.fail_after(60):
            async with control(port, bridge_creds) as (commands, reports, inbound):
                report = await command(commands, reports, activate(inbox, credit=4))
                public = report.public_port

                def dial(creds: pki.NodeCredentials, trust: Any = root) -> Any:
                    return transport.open_amqp_connection(
                        "127.0.0.1", public, ssl_context=contexts(creds, trust)[1],
                        peer_check=lambda t: pki.check_peer_legal_name(t, bob.legal_name),
                    )  # fmt: skip

                async with dial(alice) as conn:
                    for address, refused in (
                        (inbox_of(carol), True),
                        ("internal.peers.DLx", True),
                        (inbox, False),
                    ):
                        if refused:
                            with pytest.raises(transport.LinkDetachedError, match="unauthorized-access"):
                                await conn.open_sender(address)
                    with pytest.raises(transport.LinkDetachedError, match="unauthorized-access"):
                        await conn.open_receiver(inbox)
                    # a pre-settled (at-most-once) sender: no outcome would reach its messages (it used to
                    # be served); refused at attach as at the acceptor, before it reserves any window
                    with pytest.raises(transport.LinkDetachedError, match=r"not-implemented.*pre-settled"):
                        await conn.open_sender(inbox, settle_mode=amqp.SenderSettleMode.SETTLED)
                    first = await conn.open_sender(inbox)
                    # window 4: this link reserved it all (2 credit + 2 in flight); a second is refused
                    with pytest.raises(transport.LinkDetachedError, match="resource-limit-exceeded"):
                        await conn.open_sender(inbox)
                    with trio.fail_after(5):
                        while first.credit == 0:  # noqa: ASYNC110
                            await trio.sleep(0.01)
                    assert first.credit == 2
                    # the float forwards each message unparsed with the TLS-authenticated sender; the inside's
                    # outcome (here: hand-made) settles the peer's delivery
                    messages = [wire(alice, 1), wire(alice, 2, user=str(carol.legal_name))]
                    pending = [await first.start_send(m) for m in messages]
                    got = [await inbound.receive(), await inbound.receive()]
                    envelopes = [fl.ForwardedDelivery.decode(d.payload) for d in got]
                    assert [e.source for e in envelopes] == [str(alice.legal_name)] * 2
                    assert all(e.target == inbox for e in envelopes)
                    assert [e.payload for e in envelopes] == messages
                    await got[0].accept()
                    await got[1].reject("amqp:unauthorized-access", "inside says no")
                    assert isinstance(await pending[0].outcome(), amqp.Accepted)
                    second = await pending[1].outcome()
                    assert isinstance(second, amqp.Rejected) and second.error.description == "inside says no"
                    assert second.error.condition == "amqp:unauthorized-access"
                    # a delivery in another message-format (AMQP 1.0 section 2.7.5) is refused at the edge
                    # (it used to be forwarded as if standard): never forwarded, and the next one is
                    odd = await first.send(wire(alice, 3), message_format=0x80013700)
                    assert isinstance(odd, amqp.Rejected) and odd.error.condition == "amqp:not-implemented"
                    after = await first.start_send(wire(alice, 4))
                    forwarded = await inbound.receive()
                    assert fl.ForwardedDelivery.decode(forwarded.payload).payload == wire(alice, 4)
                    await forwarded.accept()
                    assert isinstance(await after.outcome(), amqp.Accepted)
                # another network's node is refused at TLS
                with pytest.raises((transport.HandshakeError, transport.AmqpTransportError, OSError)):
                    async with dial(foreign, trust=root) as conn:
                        await conn.open_sender(inbox)
    events = [json.loads(x) for x in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert any(e["event"] == "tls" and e["outcome"] == "refused" for e in events)
    refused = [e["condition"] for e in events if e["event"] == "link-refused"]
    assert refused.count("amqp:unauthorized-access") == 3 and "amqp:resource-limit-exceeded" in refused
    assert refused.count("amqp:not-implemented") == 1
    [odd] = [e for e in events if e["event"] == "delivery-refused"]
    assert odd["condition"] == "amqp:not-implemented" and odd["message_format"] == 0x80013700
    assert odd["legal_name"] == str(alice.legal_name)


async def test_one_member_cannot_take_the_whole_window(
    alice: pki.NodeCredentials,
    bob: pki.NodeCredentials,
    carol: pki.NodeCredentials,
    network: pki.NetworkCredentials,
    float_creds: fl.TunnelCredentials,
    bridge_creds: fl.TunnelCredentials,
    tmp_path: Path,
) -> None:
    """A member attaching link after link (over one connection or several) gets max_links_per_member of them;
    the window left is there for the others. Without the bound, Alice's 16 idle links took a window of 16
    links' shares and every other member was refused with resource-limit-exceeded."""
    root, inbox = network.root.cert, inbox_of(bob)
    async with running_float(
        float_creds, bob, root, tmp_path, peer_link_window=4, max_links_per_member=3
    ) as (
        _,
        port,
    ):
        with trio.fail_after(60):
            async with control(port, bridge_creds) as (commands, reports, inbound):
                public = (await command(commands, reports, activate(inbox, credit=16))).public_port

                def dial(creds: pki.NodeCredentials) -> Any:
                    return transport.open_amqp_connection(
                        "127.0.0.1", public, ssl_context=contexts(creds, root)[1],
                        peer_check=lambda t: pki.check_peer_legal_name(t, bob.legal_name),
                    )  # fmt: skip

                async with dial(alice) as one, dial(alice) as two, dial(carol) as other:
                    links = [await one.open_sender(inbox), await one.open_sender(inbox)]
                    links.append(await two.open_sender(inbox))
                    for conn in (one, two):  # a fourth, on either connection
                        with pytest.raises(transport.LinkDetachedError, match="max_links_per_member"):
                            await conn.open_sender(inbox)
                    carols = await other.open_sender(inbox)  # the window's last share is Carol's
                    pending = await carols.start_send(wire(carol, 1))
                    forwarded = await inbound.receive()
                    assert fl.ForwardedDelivery.decode(forwarded.payload).source == str(carol.legal_name)
                    await forwarded.accept()
                    assert isinstance(await pending.outcome(), amqp.Accepted)
                    await links.pop().aclose()  # one of Alice's goes: she may attach one again
                    with trio.fail_after(5):
                        while True:
                            try:
                                await two.open_sender(inbox)
                                break
                            except transport.LinkDetachedError:  # (until the float has seen the detach)
                                await trio.sleep(0.05)
    refused = _audited(tmp_path, "link-refused")
    assert all(e["legal_name"] == str(alice.legal_name) for e in refused) and len(refused) >= 2
    assert {e["condition"] for e in refused} == {"amqp:resource-limit-exceeded"}


async def test_one_address_with_idle_connections_cannot_take_the_public_slots(
    alice: pki.NodeCredentials,
    bob: pki.NodeCredentials,
    network: pki.NetworkCredentials,
    float_creds: fl.TunnelCredentials,
    bridge_creds: fl.TunnelCredentials,
    tmp_path: Path,
) -> None:
    """127.0.0.2 opens idle sockets to the public port: once half the 12 slots are in their handshake it gets
    no more (each closed at once, audited), while a peer from 127.0.0.1 still gets in and delivers."""
    root, inbox = network.root.cert, inbox_of(bob)
    limits = {"max_handshakes_per_address": 3, "max_connections": 12, "handshake_timeout_seconds": 600.0}
    async with running_float(float_creds, bob, root, tmp_path, **limits) as (_, port):
        with trio.fail_after(60):
            async with control(port, bridge_creds) as (commands, reports, inbound):
                public = (await command(commands, reports, activate(inbox, credit=4))).public_port
                dial_idle = functools.partial(trio.open_tcp_stream, "127.0.0.1", public)
                idle = [await dial_idle(local_address="127.0.0.2") for _ in range(10)]
                closed = 0
                for stream in idle[6:]:  # closed at once, without a word
                    assert await stream.receive_some() == b""
                    closed += 1
                async with transport.open_amqp_connection(
                    "127.0.0.1", public, ssl_context=contexts(alice, root)[1],
                    peer_check=lambda t: pki.check_peer_legal_name(t, bob.legal_name),
                ) as conn:  # fmt: skip
                    sender = await conn.open_sender(inbox)
                    pending = await sender.start_send(wire(alice, 1))
                    delivery = await inbound.receive()
                    await delivery.accept()
                    assert isinstance(await pending.outcome(), amqp.Accepted)
                for stream in idle:
                    await stream.aclose()
    assert closed == 4
    events = [json.loads(x) for x in (tmp_path / "audit.jsonl").read_text().splitlines()]
    refusals = [e for e in events if e["event"] == "connection-refused"]
    assert len(refusals) == 4
    assert all(e["reason"] == "max_handshakes_per_address reached" and e["peer"].startswith("127.0.0.2:")
               for e in refusals)  # fmt: skip


def wire(sender: pki.NodeCredentials, i: int, *, user: str | None = None) -> bytes:
    message = messaging.to_amqp(
        messaging.OutgoingMessage(topic="t", data=b"%d" % i, dedup_id=f"d{i}"),
        platform_version=1, release_version="t", sender_uuid="u", send_seq_no=i,
    )  # fmt: skip
    props = dict(message.application_properties or {})
    if user is not None:
        props[messaging.HEADER_VALIDATED_USER] = user
    return amqp.Message(
        header=message.header, properties=message.properties, application_properties=props, body=message.body
    ).encode()


def test_audit_log_rotates_by_size_and_summarises_latency(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    audit = fl.AuditLog(path, max_bytes=400, backups=2, clock=lambda: "T")
    for i in range(30):
        audit.write("connection", peer=f"10.0.0.{i}:1")
    summary = fl.LatencySummary()
    for ms in range(1, 101):
        summary.add("O=A, L=B, C=GB", ms / 1000)
    audit.write_latency(summary)
    audit.close()
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["audit.jsonl", "audit.jsonl.1", "audit.jsonl.2"]
    assert all(p.stat().st_size <= 400 for p in tmp_path.iterdir())
    last = json.loads(path.read_text().splitlines()[-1])
    assert last == {"ts": "T", "event": "latency", "legal_name": "O=A, L=B, C=GB", "count": 100,
                    "p50_ms": 50.0, "p99_ms": 99.0, "max_ms": 100.0}  # fmt: skip
    lines = [
        json.loads(x)
        for p in ("audit.jsonl.2", "audit.jsonl.1", "audit.jsonl")
        for x in (tmp_path / p).read_text().splitlines()
    ]
    peers = [int(e["peer"].split(".")[3].split(":")[0]) for e in lines if e["event"] == "connection"]
    assert peers == list(range(30 - len(peers), 30))  # the newest kept, in order; older rotated away
    assert summary.drain() == {}


class _FullFile:
    """Stands in for the audit file on a full disk: every flush fails, and so does close."""

    def write(self, data: bytes) -> int:
        return len(data)

    def flush(self) -> None:
        raise OSError(28, "No space left on device")

    def close(self) -> None:
        raise OSError(28, "No space left on device")


def test_an_audit_line_that_cannot_be_written_fails_the_log_once(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    failures: list[fl.AuditLogError] = []
    audit = fl.AuditLog(path, on_failure=failures.append)
    audit.write("connection", peer="a")
    audit._file.close()  # type: ignore[union-attr]
    audit._file = _FullFile()  # type: ignore[assignment]
    audit.write("connection", peer="b")
    audit.write("connection", peer="c")  # dropped: the log failed already
    assert [str(f) for f in failures] == [f"cannot write the audit log {path}: No space left on device"]
    assert audit.failure is failures[0]
    audit.close()  # nothing left to close, nothing raised
    # Without on_failure, the write raises it.
    bare = fl.AuditLog(tmp_path / "other.jsonl")
    bare._file.close()  # type: ignore[union-attr]
    bare._file = _FullFile()  # type: ignore[assignment]
    with pytest.raises(fl.AuditLogError, match="No space left on device"):
        bare.write("connection", peer="d")


async def test_the_float_stops_when_its_audit_log_fails(
    bob: pki.NodeCredentials,
    network: pki.NetworkCredentials,
    float_creds: fl.TunnelCredentials,
    tmp_path: Path,
) -> None:
    with pytest.raises(BaseExceptionGroup) as info, trio.fail_after(10):
        async with running_float(float_creds, bob, network.root.cert, tmp_path) as (flt, _port):
            flt.audit._file.close()  # type: ignore[union-attr]
            flt.audit._file = _FullFile()  # type: ignore[assignment]
            flt.audit.write("connection", peer="x")
            await trio.sleep_forever()  # the float's nursery ends with the error
    assert info.group_contains(fl.AuditLogError, depth=None)


async def test_a_member_dropping_its_connections_gets_one_info_line_for_its_links(
    alice: pki.NodeCredentials,
    bob: pki.NodeCredentials,
    network: pki.NetworkCredentials,
    float_creds: fl.TunnelCredentials,
    bridge_creds: fl.TunnelCredentials,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Alice attaches a sender to the active float's public side, sends a message and drops the connection
    without a close (a process killed) before it is settled, 30 times: an info line each ("link ... ended:
    ... the peer closed the transport without a close frame"); now one, the rest at debug and counted into
    a summary, as the acceptor does."""
    root, inbox = network.root.cert, inbox_of(bob)
    caplog.set_level(logging.DEBUG, logger="corda_trio.bridge.float")

    def ended() -> list[logging.LogRecord]:
        return [r for r in caplog.records if " ended: " in r.getMessage()]

    async with running_float(float_creds, bob, root, tmp_path) as (_, port):
        with trio.fail_after(60):
            async with control(port, bridge_creds) as (commands, reports, inbound):
                public = (await command(commands, reports, activate(inbox, credit=4))).public_port
                for i in range(30):
                    async with _peer_connection(alice, bob, root, public) as conn:
                        sender = await conn.open_sender(inbox)
                        await sender.start_send(wire(alice, i))
                        forwarded = await inbound.receive()
                        await trio.aclose_forcefully(conn._stream)
                    await forwarded.accept()
                    # (the link's end gives its window back: the next attach needs it)
                    await wait_until(lambda i=i: len(ended()) == i + 1)
    lines = [r.getMessage() for r in ended() if r.levelno >= logging.INFO]
    assert len(lines) == 1, lines[:3]
    assert lines[0].startswith(f"{alice.legal_name}: link "), lines[0]


async def test_the_audit_close_line_of_a_peer_s_clean_close_has_no_condition(
    alice: pki.NodeCredentials,
    bob: pki.NodeCredentials,
    network: pki.NetworkCredentials,
    float_creds: fl.TunnelCredentials,
    bridge_creds: fl.TunnelCredentials,
    tmp_path: Path,
) -> None:
    """A peer that ends its connection with a close without an error is audited ``close`` with condition
    null (docs/float.md, section 5); it read 'the peer closed the connection', as for any other end, so a
    clean close could not be told from a failed one. One dropped without a close still says why."""
    root, inbox = network.root.cert, inbox_of(bob)

    def closes() -> list[dict[str, Any]]:
        return _audited(tmp_path, "close")

    async with running_float(float_creds, bob, root, tmp_path) as (_, port):
        with trio.fail_after(60):
            async with control(port, bridge_creds) as (commands, reports, _inbound):
                public = (await command(commands, reports, activate(inbox, credit=4))).public_port
                for drop in (False, True):
                    async with _peer_connection(alice, bob, root, public) as conn:
                        await conn.open_sender(inbox)
                        if drop:
                            await trio.aclose_forcefully(conn._stream)
                    await wait_until(lambda drop=drop: len(closes()) == 1 + drop)
    clean, dropped = closes()
    assert clean == {**clean, "legal_name": str(alice.legal_name), "condition": None}
    assert dropped["condition"] and "without a close frame" in dropped["condition"], dropped


async def test_each_peer_link_s_end_is_audited_with_why(
    alice: pki.NodeCredentials,
    bob: pki.NodeCredentials,
    network: pki.NetworkCredentials,
    float_creds: fl.TunnelCredentials,
    bridge_creds: fl.TunnelCredentials,
    tmp_path: Path,
) -> None:
    """The audit log said when a peer's link was attached, never when it ended, so a link the float cut
    off (a peer sending past its credit) left no line. Each end is a ``link-detached`` line: null when the
    peer detached it, why otherwise (the connection dropped without a close; the float deactivated while
    the link was attached: the control link went)."""
    root, inbox = network.root.cert, inbox_of(bob)

    def detached() -> list[dict[str, Any]]:
        return _audited(tmp_path, "link-detached")

    def connect(public: int) -> Any:
        return _peer_connection(alice, bob, root, public)

    attached, done = trio.Event(), trio.Event()

    async def stay_attached(public: int) -> None:
        with contextlib.suppress(transport.AmqpConnectionError):
            async with connect(public) as conn:
                await conn.open_sender(inbox)
                attached.set()
                await done.wait()

    async with running_float(float_creds, bob, root, tmp_path) as (_, port), trio.open_nursery() as peers:
        with trio.fail_after(60):
            async with control(port, bridge_creds) as (commands, reports, _inbound):
                public = (await command(commands, reports, activate(inbox, credit=4))).public_port
                async with connect(public) as conn:
                    sender = await conn.open_sender(inbox)
                    await sender.aclose()
                    await wait_until(lambda: len(detached()) == 1)
                async with connect(public) as conn:
                    await conn.open_sender(inbox)
                    await trio.aclose_forcefully(conn._stream)
                await wait_until(lambda: len(detached()) == 2)
                peers.start_soon(stay_attached, public)
                await attached.wait()
            # (the control link is gone: the float deactivates, with the peer's link attached)
            await wait_until(lambda: len(detached()) == 3)
            done.set()
    peer_detached, dropped, deactivated = detached()
    assert peer_detached == {**peer_detached, "legal_name": str(alice.legal_name), "condition": None}
    assert peer_detached["address"] == inbox
    assert dropped["condition"] and "without a close frame" in dropped["condition"], dropped
    assert deactivated["condition"] == "the float stopped serving the peer", deactivated


def _audited(directory: Path, event: str) -> list[dict[str, Any]]:
    """The lines of ``event`` in the float's audit log in ``directory`` (``running_float``'s)."""
    lines = [json.loads(x) for x in (directory / "audit.jsonl").read_text().splitlines()]
    return [e for e in lines if e["event"] == event]


def _peer_connection(
    peer: pki.NodeCredentials, node: pki.NodeCredentials, root: Any, public: int
) -> contextlib.AbstractAsyncContextManager[transport.AmqpConnection]:
    """``peer``'s connection to the float's public port ``public``, which answers as ``node``."""
    return transport.open_amqp_connection(
        "127.0.0.1", public, ssl_context=contexts(peer, root)[1],
        peer_check=lambda t: pki.check_peer_legal_name(t, node.legal_name),
    )  # fmt: skip


async def test_an_inside_that_settles_without_an_outcome_gets_the_peer_link_detached_not_stalled(
    alice: pki.NodeCredentials,
    bob: pki.NodeCredentials,
    network: pki.NetworkCredentials,
    float_creds: fl.TunnelCredentials,
    bridge_creds: fl.TunnelCredentials,
    tmp_path: Path,
) -> None:
    """An inside that settles a forwarded delivery with no state (the spec allows it; ours never does it)
    does not say whether the message is in the inbox. The peer's delivery stays unsettled, so its sender
    sends it again; the peer's link is detached with ``amqp:internal-error``, where it stayed attached with
    no credit ever again (the pump had ended), and the link's end is audited."""
    root, inbox = network.root.cert, inbox_of(bob)
    async with running_float(float_creds, bob, root, tmp_path) as (_, port):
        with trio.fail_after(30):
            async with control(port, bridge_creds) as (commands, reports, inbound):
                public = (await command(commands, reports, activate(inbox, credit=4))).public_port
                async with _peer_connection(alice, bob, root, public) as conn:
                    sender = await conn.open_sender(inbox)
                    pending = await sender.start_send(amqp.Message(body=b"x").encode())
                    forwarded = await inbound.receive()
                    await forwarded.settle(None)
                    with pytest.raises(transport.LinkDetachedError) as ended:
                        await pending.outcome()
                    assert "amqp:internal-error" in str(ended.value), ended.value
                    assert "without an outcome" in str(ended.value), ended.value
                    # the connection goes on: a new link delivers
                    again = await conn.open_sender(inbox)
                    retry = await again.start_send(amqp.Message(body=b"x").encode())
                    await (await inbound.receive()).accept()
                    assert isinstance(await retry.outcome(), amqp.Accepted)
    [line] = [e for e in _audited(tmp_path, "link-detached") if e["condition"]]
    assert "without an outcome" in line["condition"], line


async def test_a_stopping_float_writes_the_latency_summary_of_the_interval_so_far(
    alice: pki.NodeCredentials,
    bob: pki.NodeCredentials,
    network: pki.NetworkCredentials,
    float_creds: fl.TunnelCredentials,
    bridge_creds: fl.TunnelCredentials,
    tmp_path: Path,
) -> None:
    """The summary was written only every ``latency_summary_seconds``: a float stopped within a minute of
    its start (or of its last summary) lost those latencies from its audit log."""
    root, inbox = network.root.cert, inbox_of(bob)
    with trio.fail_after(30):
        async with running_float(float_creds, bob, root, tmp_path, latency_summary_seconds=3600.0) as (
            _,
            port,
        ):
            async with control(port, bridge_creds) as (commands, reports, inbound):
                public = (await command(commands, reports, activate(inbox, credit=4))).public_port
                async with _peer_connection(alice, bob, root, public) as conn:
                    sender = await conn.open_sender(inbox)
                    for i in range(3):
                        pending = await sender.start_send(wire(alice, i))
                        await (await inbound.receive()).accept()
                        assert isinstance(await pending.outcome(), amqp.Accepted)
            assert _audited(tmp_path, "latency") == []  # (an hour to go)
    [line] = _audited(tmp_path, "latency")
    assert line["legal_name"] == str(alice.legal_name) and line["count"] == 3, line
    assert 0 < line["p50_ms"] <= line["p99_ms"] <= line["max_ms"] < 30_000, line
