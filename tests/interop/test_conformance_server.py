"""Third-party clients against our server: azure-servicebus's pure-Python ``_pyamqp``, Qpid Proton, uamqp.

Each client sends 2,000 x 1 KiB messages to ``serve_amqp`` (a ``QueueBroker``) and receives them back, over
plain TCP, TLS and mutual TLS (uamqp, the azure-uamqp-c client: TLS only, as it has no plain transport and
no client certificate in its Python API). Every delivery must arrive exactly once each way (the broker
counts what it stored, the client what it got back and any duplicate), and no connection may be closed on
the way.
``_pyamqp`` asks for rcv-settle-mode ``second`` on its receiver and encodes booleans as ``0x56``; the server
records each attach so the test sees what was asked. The hostile-peer variants (a client sending three
times its credit, non-zero channel and handle, pipelined open/begin/attach) are in
``tests/transport/test_hostile.py``, over raw sockets.
"""

from __future__ import annotations

import functools
import json
import ssl
import sys
from pathlib import Path

import pytest
import trio

from corda_trio import amqp, transport
from corda_trio.testing import QueueBroker

from .conftest import PEERS

pytestmark = [pytest.mark.interop]

COUNT = 2000
SIZE = 1024


class RecordingBroker(QueueBroker):
    """A ``QueueBroker`` that also keeps every attach the clients send."""

    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.attaches: list[amqp.Attach] = []

    async def handle(self, conn: transport.AmqpConnection) -> None:
        requests = conn.link_requests()
        send, receive = trio.open_memory_channel[transport.LinkRequest](64)

        async def record() -> None:
            async with send:
                async for request in requests:
                    self.attaches.append(request.attach)
                    await send.send(request)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(record)
            conn.link_requests = lambda: receive  # type: ignore[method-assign]
            await super().handle(conn)


class PipelinedBroker(RecordingBroker):
    """A ``RecordingBroker`` whose senders keep up to ``window`` deliveries in flight instead of one.

    uamqp settles (sends its dispositions) on its own ~50 ms work cycle: one delivery per round trip would
    take ~100 s for 2,000 messages.
    """

    window = 100

    async def _produce(self, sender: transport.Sender) -> None:
        queue = self.queues[sender.address]
        in_flight = trio.Semaphore(self.window)

        async def settle(pending: transport.PendingDelivery, payload: bytes) -> None:
            try:
                outcome = await pending.outcome()
            except transport.AmqpTransportError:
                outcome = None
            if outcome != amqp.Accepted():
                queue.append(payload)  # not delivered: keep it
            in_flight.release()

        try:
            async with trio.open_nursery() as nursery:
                while True:
                    while not queue:
                        await self._arrived[sender.address].wait()
                    await in_flight.acquire()
                    payload = queue.popleft()
                    pending = await sender.start_send(payload)
                    if pending is not None:
                        nursery.start_soon(settle, pending, payload)
        except transport.AmqpTransportError:
            return


def server_context(d: Path, *, mutual: bool) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(str(d / "server.pem"), str(d / "server.key"))
    if mutual:
        ctx.load_verify_locations(str(d / "ca.pem"))
        ctx.verify_mode = ssl.CERT_REQUIRED
    else:
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


async def run_client(script: str, port: int, *args: str) -> dict:
    result = await trio.run_process(
        [sys.executable, str(PEERS / script), "--port", str(port), *args],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    lines = [ln for ln in result.stdout.decode().splitlines() if ln.startswith("{")]
    assert result.returncode == 0 and lines, result.stderr.decode()[-3000:]
    out = json.loads(lines[-1])
    assert "error" not in out, (out, result.stderr.decode()[-3000:])
    return out  # type: ignore[no-any-return]


@pytest.mark.parametrize("security", ["plain", "tls", "mutual-tls"])
@pytest.mark.parametrize("client", ["pyamqp", "proton"])
async def test_third_party_client_sends_and_receives_2000(
    nursery: trio.Nursery, tls_pems: tuple, client: str, security: str
) -> None:
    d, _ca, _leaf = tls_pems
    broker = RecordingBroker(credit=100)
    serve = functools.partial(transport.serve_amqp, broker.handle, 0)
    if security != "plain":
        serve = functools.partial(serve, ssl_context=server_context(d, mutual=security == "mutual-tls"))
    port = transport.listener_port(await nursery.start(serve))
    args = ["--address", "conformance", "--count", str(COUNT), "--size", str(SIZE)]
    if client == "pyamqp":
        script = "pyamqp_client.py"
        args += ["--settle", "second"]
        if security != "plain":
            args += ["--tls", str(d)] + (["--client-cert"] if security == "mutual-tls" else [])
    else:
        script = "proton_client.py"
        if security != "plain":
            args += ["--tls", str(d)] + ([] if security == "mutual-tls" else ["--no-client-cert"])
    with trio.fail_after(180):
        out = await run_client(script, port, *args)
    assert out["sent"] == COUNT and out["accepted"] == COUNT
    assert out["received"] == COUNT and out["mismatches"] == 0 and out.get("duplicates", 0) == 0
    assert broker.received == COUNT  # stored exactly once each
    assert not broker.queues["conformance"]  # and every one went back out
    if client == "pyamqp":
        receiving = [a for a in broker.attaches if a.role]
        assert receiving and receiving[0].rcv_settle_mode == amqp.ReceiverSettleMode.SECOND


async def test_pyamqp_with_a_credit_of_one(nursery: trio.Nursery) -> None:
    """A grant of one credit at a time: the client must wait for each flow (or be absorbed if it does not)."""
    broker = RecordingBroker(credit=1)
    port = transport.listener_port(await nursery.start(transport.serve_amqp, broker.handle, 0))
    with trio.fail_after(180):
        out = await run_client("pyamqp_client.py", port, "--address", "c1", "--count", "300", "--credit", "7")
    assert out["sent"] == out["accepted"] == out["received"] == 300 and out["duplicates"] == 0
    assert broker.received == 300


async def test_uamqp_sends_and_receives_2000_over_tls(nursery: trio.Nursery, tls_pems: tuple) -> None:
    """uamqp (azure-uamqp-c) connects over TLS only and its API has no client certificate: TLS, no mutual."""
    d, _ca, _leaf = tls_pems
    broker = PipelinedBroker(credit=100)
    ctx = server_context(d, mutual=False)
    serve = functools.partial(transport.serve_amqp, broker.handle, 0, ssl_context=ctx)
    port = transport.listener_port(await nursery.start(serve))
    args = ["--address", "conformance-uamqp", "--count", str(COUNT), "--size", str(SIZE), "--tls", str(d)]
    with trio.fail_after(180):
        out = await run_client("uamqp_client.py", port, *args)
    assert out["sent"] == COUNT and out["accepted"] == COUNT
    assert out["received"] == COUNT and out["mismatches"] == 0 and out["duplicates"] == 0
    assert broker.received == COUNT
    assert not broker.queues["conformance-uamqp"]
    receiving = [a for a in broker.attaches if a.role]
    assert receiving and receiving[0].rcv_settle_mode == amqp.ReceiverSettleMode.SECOND  # uamqp's PeekLock
