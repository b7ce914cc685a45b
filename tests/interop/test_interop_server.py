"""Qpid Proton's client against our server (``serve_amqp`` + ``QueueBroker``): send, then receive back."""

from __future__ import annotations

import functools
import json
import ssl
import sys

import pytest
import trio

from corda_trio import amqp, transport
from corda_trio.testing import QueueBroker

from .conftest import PEERS

pytestmark = [pytest.mark.interop]


async def run_proton_client(port: int, *args: str) -> dict:
    result = await trio.run_process(
        [sys.executable, str(PEERS / "proton_client.py"), "--port", str(port), *args],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    lines = [ln for ln in result.stdout.decode().splitlines() if ln.startswith("{")]
    assert result.returncode == 0 and lines, result.stderr.decode()[-2000:]
    return json.loads(lines[-1])  # type: ignore[no-any-return]


@pytest.mark.parametrize("sasl", ["ANONYMOUS", "PLAIN"])
async def test_proton_client_sends_and_receives(nursery: trio.Nursery, sasl: str) -> None:
    seen_users: list[str] = []

    def check(user: str, password: str) -> bool:
        seen_users.append(user)
        return password == "secret"

    broker = QueueBroker(allow=lambda a: a is not None and a.startswith("p2p.inbound."))
    config = amqp.ConnectionConfig(sasl_mechanisms=("PLAIN", "ANONYMOUS", "EXTERNAL"), sasl_plain_check=check)
    listeners = await nursery.start(functools.partial(transport.serve_amqp, broker.handle, 0, config=config))
    port = transport.listener_port(listeners)
    creds = ["--user", "proton", "--password", "secret"] if sasl == "PLAIN" else []
    with trio.fail_after(60):
        out = await run_proton_client(
            port, "--address", "p2p.inbound.DLabc", "--count", "500", "--size", "1024", *creds
        )
    assert out == {
        **out,
        "sent": 500,
        "accepted": 500,
        "rejected": 0,
        "released": 0,
        "received": 500,
        "mismatches": 0,
    }
    assert out["remote_container"].startswith("corda-trio:")
    assert seen_users == (["proton"] if sasl == "PLAIN" else [])


async def test_proton_client_refused_target(nursery: trio.Nursery) -> None:
    broker = QueueBroker(allow=lambda a: a == "p2p.inbound.mine")
    listeners = await nursery.start(
        transport.serve_amqp,
        broker.handle,
        0,
    )
    port = transport.listener_port(listeners)
    with trio.fail_after(30):
        out = await run_proton_client(
            port, "--address", "internal.peers.other", "--count", "1", "--send-only"
        )
    assert out["accepted"] == 0 and broker.received == 0
    assert "unauthorized" in out.get("error", "") or out["sent"] == 0


async def test_proton_client_over_mutual_tls(nursery: trio.Nursery, tls_pems: tuple) -> None:
    """Proton dials our TLS server: both sides present certificates from the test CA; our peer check sees
    Proton's client certificate."""
    d, ca, _ = tls_pems
    server_cert = ca.issue_cert("localhost")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.verify_mode = ssl.CERT_REQUIRED
    ca.configure_trust(ctx)
    server_cert.configure_cert(ctx)
    peers: list[object] = []

    def peer_check(tls: object) -> object:
        cert = tls.getpeercert()  # type: ignore[attr-defined]
        peers.append(cert)
        return cert["subjectAltName"]

    broker = QueueBroker()
    serve = functools.partial(transport.serve_amqp, broker.handle, 0, ssl_context=ctx, peer_check=peer_check)
    port = transport.listener_port(await nursery.start(serve))
    with trio.fail_after(60):
        out = await run_proton_client(port, "--address", "tls-q", "--count", "200", "--tls", str(d))
    assert out["accepted"] == 200 and out["received"] == 200 and out["mismatches"] == 0
    assert peers and ("DNS", "interop-client.example") in peers[0]["subjectAltName"]


@pytest.mark.parametrize("address_length", [100, 2000])
async def test_proton_with_512_byte_frames_gets_attach_answers_that_fit(
    nursery: trio.Nursery, address_length: int
) -> None:
    """Proton advertises max-frame-size 512 and attaches a sender to a 2,000-character address (its frame
    only has to fit *our* 128 KiB). Our answer used to echo the address: a 2 KB frame that Proton rejects
    as a framing error, closing the whole connection. The engine now refuses that link with
    amqp:frame-size-too-small; Proton's other link on the connection delivers. A 100-character address fits
    and is echoed as before."""
    broker = QueueBroker()
    config = amqp.ConnectionConfig(sasl_mechanisms=("PLAIN", "ANONYMOUS"))
    listeners = await nursery.start(functools.partial(transport.serve_amqp, broker.handle, 0, config=config))
    port = transport.listener_port(listeners)
    with trio.fail_after(60):
        result = await trio.run_process(
            [sys.executable, str(PEERS / "proton_attach_client.py"), "--port", str(port),
             "--max-frame-size", "512", "--address-length", str(address_length)],
            capture_stdout=True, capture_stderr=True, check=False,
        )  # fmt: skip
    lines = [ln for ln in result.stdout.decode().splitlines() if ln.startswith("{")]
    assert result.returncode == 0 and lines, result.stderr.decode()[-2000:]
    out = json.loads(lines[-1])
    assert out["error"] is None and out["short"] == "accepted", out
    if address_length > 400:
        assert out["long_condition"] == "amqp:frame-size-too-small" and out["long_remote_target"] is None
        assert "512" in out["long_description"]
    else:
        assert out["long_condition"] is None and out["long_remote_target"] == "x" * address_length


async def test_proton_draining_our_sender_gets_the_unused_credit_back(nursery: trio.Nursery) -> None:
    """Proton's receiver drains (spec 2.6.7) while our sending task waits for credit; the task has two more
    messages. The drain woke it, it sent them, and the remaining 8 of the 10 credits were never given back:
    Proton's drain waited for ever (the driver gave credit back only when no task was waiting at the time
    the drain arrived). Now the unused credit goes back once the woken task has sent."""
    sent: list[int] = []

    async def handler(conn: transport.AmqpConnection) -> None:
        async for request in conn.link_requests():
            sender = await request.accept_sender()
            for i in range(3):
                await sender.start_send(amqp.Message(body=bytes([i])))
                sent.append(i)
            await sender.wait_detached()

    config = amqp.ConnectionConfig(sasl_mechanisms=("ANONYMOUS",))
    listeners = await nursery.start(functools.partial(transport.serve_amqp, handler, 0, config=config))
    port = transport.listener_port(listeners)
    with trio.fail_after(60):
        result = await trio.run_process(
            [sys.executable, str(PEERS / "proton_drain_client.py"), "--port", str(port)],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    lines = [ln for ln in result.stdout.decode().splitlines() if ln.startswith("{")]
    assert result.returncode == 0 and lines, result.stderr.decode()[-2000:]
    assert json.loads(lines[-1]) == {"received": 3, "drained": True}
    assert sent == [0, 1, 2]
