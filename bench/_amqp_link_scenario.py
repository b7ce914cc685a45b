"""The ``amqp-link`` scenario: Corda P2P messages over our AMQP 1.0 link, mutual TLS, loopback.

A receiving node (``serve_amqp`` with a handler that accepts receiver links and settles every delivery
``accepted``) and ``peers`` sending connections (``open_amqp_connection``), each with one sender link to its
own inbox address ``p2p.inbound.bench-<i>`` (the link name in the records). TLS uses a throw-away network
from ``corda_trio.pki`` (root, doorman, two nodes; mutual TLS with Corda's legal-name and role checks), so
the path is the real one a bridge uses: engine, driver, TLS, TCP, the peer's engine and back.

Stages: *enqueued* = the sender had credit and the transfer is queued in the engine (``start_send``);
*delivered* = the receiving handler got the delivery (stamped on the receiving side, before it accepts);
*accepted* = the sender saw the peer settle it ``accepted``. Anything else (rejected, released, a lost link)
is an error. Parameters: ``peers`` (default 1), ``credit`` (receiver link credit, default 1000),
``tls`` (default true).
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, Final, final

import attrs
import trio

from corda_trio import amqp, pki, transport

from ._codec_scenario import p2p_message
from ._harness import BenchError, Operation, ScenarioContext

__all__ = ["AmqpLinkScenario"]

RECEIVER_NAME: Final = pki.CordaX500Name.parse("O=Bench Receiver, L=London, C=GB")
SENDER_NAME: Final = pki.CordaX500Name.parse("O=Bench Sender, L=Zurich, C=CH")


@attrs.define(eq=False)
class _LinkSession:
    senders: dict[str, transport.Sender]
    payload: bytes
    waiting: dict[int, Operation] = attrs.field(factory=dict)

    @property
    def links(self) -> list[str]:
        return list(self.senders)

    async def run(self, op: Operation) -> None:
        if op.size_bytes > len(self.payload):
            raise BenchError(f"size {op.size_bytes} exceeds the scenario's largest size")
        self.waiting[op.seq] = op
        try:
            message = p2p_message(op.seq, self.payload[: op.size_bytes])
            pending = await self.senders[op.link].start_send(message)
            op.mark("enqueued")
            assert pending is not None  # unsettled sends always have an outcome
            outcome = await pending.outcome()
            op.mark("accepted")
        finally:
            self.waiting.pop(op.seq, None)
        if outcome != amqp.Accepted():
            raise BenchError(f"peer settled the delivery {outcome!r}, not accepted")


def _contexts(network: pki.NetworkCredentials, node: pki.NodeCredentials) -> dict[str, Any]:
    chain = [node.tls.cert, node.node_ca.cert, node.doorman_cert]
    return {"cert_chain": chain, "key": node.tls.key, "trust_root": network.root.cert}


@final
class AmqpLinkScenario:
    """P2P messages over ``corda_trio.transport`` AMQP links with mutual TLS (see the module docstring)."""

    name = "amqp-link"
    description = (
        "Corda P2P messages over corda_trio AMQP 1.0 links (engine + Trio driver), mutual TLS, 127.0.0.1; "
        "latency to the peer's accepted disposition"
    )
    parameters: Final = {
        "peers": "number of sending connections, one sender link each (default 1)",
        "credit": "receiver link credit (default 1000)",
        "tls": "true (default): mutual TLS with legal-name checks; false: plain TCP",
    }

    @asynccontextmanager
    async def open(self, ctx: ScenarioContext) -> AsyncIterator[_LinkSession]:
        peers = ctx.param("peers", 1)
        credit = ctx.param("credit", 1000)
        tls = ctx.param("tls", True)
        if peers < 1 or credit < 1:
            raise BenchError("amqp-link: peers and credit must be at least 1")
        now = dt.datetime.now(dt.UTC)
        network = pki.NetworkCredentials.create(now=now)
        receiver_node = network.issue_node(RECEIVER_NAME, now=now)
        sender_node = network.issue_node(SENDER_NAME, now=now)
        server_ctx = pki.server_ssl_context(**_contexts(network, receiver_node)) if tls else None
        client_ctx = pki.client_ssl_context(**_contexts(network, sender_node)) if tls else None
        payload = bytes(range(256)) * (max(ctx.config.sizes.sizes) // 256 + 1)
        session = _LinkSession(senders={}, payload=payload)
        check_receiver = functools.partial(pki.check_peer_legal_name, expected=RECEIVER_NAME) if tls else None

        async def consume(receiver: transport.Receiver) -> None:
            async for delivery in receiver:
                op = session.waiting.get(delivery.message.application_properties["send-seq-no"])
                if op is not None:
                    op.mark("delivered")
                await delivery.accept()

        async def handle(conn: transport.AmqpConnection) -> None:
            async with trio.open_nursery() as nursery:
                async for request in conn.link_requests():
                    if request.peer_is_sender and request.address.startswith("p2p.inbound.bench-"):
                        nursery.start_soon(consume, await request.accept_receiver(credit=credit))
                    else:
                        await request.refuse("amqp:unauthorized-access")

        async with trio.open_nursery() as nursery:
            serve = functools.partial(
                transport.serve_amqp, handle, 0, ssl_context=server_ctx,
                peer_check=pki.check_peer_is_network_node if tls else None,
            )  # fmt: skip
            listeners = await nursery.start(serve)
            port = transport.listener_port(listeners)
            try:
                async with AsyncExitStack() as stack:
                    for i in range(peers):
                        dial = transport.open_amqp_connection(
                            "127.0.0.1", port, ssl_context=client_ctx, peer_check=check_receiver
                        )
                        conn = await stack.enter_async_context(dial)
                        address = f"p2p.inbound.bench-{i}"
                        session.senders[address] = await conn.open_sender(address)
                    yield session
            finally:
                nursery.cancel_scope.cancel()
