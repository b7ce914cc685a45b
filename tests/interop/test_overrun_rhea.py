"""A real rhea client that ignores its credit on one link: the server's buffering stays bounded in bytes.

rhea's ``Sender.send`` does not look at link credit, so ``peers/rhea_overrun_client.js`` can send far beyond
it. Over one connection its ``flood`` link sends 300 x 200 KB against a grant of 10 while its ``steady``
link sends small messages within its credit. The engine absorbs the flood's overrun only up to
``max_credit_overrun_bytes`` (here 4 MiB), then detaches that link alone with
``amqp:link:transfer-limit-exceeded``; what the server buffered for it (never consumed) is summed from the
receiver afterwards, and the steady link must deliver every message.
"""

from __future__ import annotations

import functools
import json
import os

import pytest
import trio

from corda_trio import amqp, transport

from .conftest import PEERS, rhea_node_path

pytestmark = [pytest.mark.interop]

FLOOD_COUNT = 300
FLOOD_BYTES = 200_000
STEADY_COUNT = 200
CREDIT = 10
OVERRUN_BYTES = 4 * 1024 * 1024


async def test_rhea_flooding_beyond_its_credit_loses_only_that_link(nursery: trio.Nursery) -> None:
    flood: list[transport.Receiver] = []
    steady: list[bytes] = []

    async def consume(receiver: transport.Receiver) -> None:
        async for delivery in receiver:
            steady.append(amqp.Message.decode(delivery.payload).body)
            await delivery.accept()

    async def handle(conn: transport.AmqpConnection) -> None:
        async with trio.open_nursery() as links:
            async for request in conn.link_requests():
                receiver = await request.accept_receiver(credit=CREDIT)
                if request.address == "flood":
                    flood.append(receiver)  # never consumed: whatever arrives stays buffered
                else:
                    links.start_soon(consume, receiver)

    config = amqp.ConnectionConfig(
        sasl_mechanisms=("PLAIN", "ANONYMOUS"), max_credit_overrun_bytes=OVERRUN_BYTES
    )
    serve = functools.partial(transport.serve_amqp, handle, 0, config=config)
    port = transport.listener_port(await nursery.start(serve))
    env = {**os.environ, "NODE_PATH": rhea_node_path()}
    args = [str(port), str(FLOOD_COUNT), str(FLOOD_BYTES), str(STEADY_COUNT)]
    with trio.fail_after(180):
        result = await trio.run_process(
            ["node", str(PEERS / "rhea_overrun_client.js"), *args], capture_stdout=True, capture_stderr=True,
            env=env, check=False,
        )  # fmt: skip
    lines = [ln for ln in result.stdout.decode().splitlines() if ln.startswith("{")]
    assert result.returncode == 0 and lines, result.stderr.decode()[-3000:]
    out = json.loads(lines[-1])
    assert "error" not in out and "connection_error" not in out, out
    # the flood link went, alone, with the condition; the steady one delivered everything
    assert out["flood_error"] == str(amqp.Condition.TRANSFER_LIMIT_EXCEEDED)
    assert out["steady_accepted"] == STEADY_COUNT
    assert sorted(steady) == sorted(b"steady %d" % i for i in range(STEADY_COUNT))
    # what the server holds for the flood link: its credit's worth plus at most the overrun bound
    [receiver] = flood
    buffered = 0
    with pytest.raises((trio.WouldBlock, trio.EndOfChannel, transport.LinkDetachedError)):
        while True:
            delivery = receiver.receive_nowait()
            buffered += len(delivery.payload)
    # (more than the credit: the overrun was absorbed, up to the bound, before the link went)
    assert CREDIT * FLOOD_BYTES < buffered <= CREDIT * (FLOOD_BYTES + 1024) + OVERRUN_BYTES
