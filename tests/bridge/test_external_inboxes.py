"""A bridge serves one node and its one inbox: a snapshot listing several stops it with a clear error."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import trio

from corda_trio import amqp, bridge, pki, transport
from tests.p2p_harness import contexts


def node_listing(*inboxes: str) -> Callable[[transport.AmqpConnection], Awaitable[None]]:
    """A minimal node side of the control protocol (a real AMQP server): answers the notify link with an
    unsolicited snapshot listing these inbox queues, and reads the control link."""
    snapshot = bridge.QueueSnapshot(
        correlation_id=None,
        inbox_queues=[
            bridge.QueueEntry(legal_name=f"O=Node{i}, L=London, C=GB", queue_name=name)
            for i, name in enumerate(inboxes)
        ],
        outbound_queues=[],
    )

    async def node(conn: transport.AmqpConnection) -> None:
        async with trio.open_nursery() as nursery:
            async for request in conn.link_requests():
                if request.peer_is_sender and request.address == bridge.CONTROL_ADDRESS:
                    receiver = await request.accept_receiver(credit=64)

                    async def drain(receiver: transport.Receiver = receiver) -> None:
                        async for _ in receiver:
                            pass

                    nursery.start_soon(drain)
                elif not request.peer_is_sender and request.address == bridge.NOTIFY_ADDRESS:
                    sender = await request.accept_sender()
                    await sender.send(bridge.encode_control(snapshot), settled=True)
                else:
                    await request.refuse("amqp:not-found", f"not here: {request.address!r}")

    return node


@contextlib.asynccontextmanager
async def _bridge_against(
    node: Callable[[transport.AmqpConnection], Awaitable[None]],
    alice: pki.NodeCredentials,
    network: pki.NetworkCredentials,
) -> AsyncIterator[tuple[trio.Nursery, bridge.ExternalBridge]]:
    """``node`` served as a node's endpoint (password ``pw``), and a bridge process's ``ExternalBridge`` for
    it (not started), with the nursery that serves it."""
    config = amqp.ConnectionConfig(
        sasl_mechanisms=("PLAIN",), sasl_plain_check=lambda user, password: password == "pw"
    )
    server_ctx, client_ctx = contexts(alice, network.root.cert)
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            lambda task_status: transport.serve_amqp(
                node, 0, host="127.0.0.1", config=config, task_status=task_status
            )
        )
        yield (
            nursery,
            bridge.ExternalBridge(
                config=bridge.ExternalBridgeConfig(
                    node_port=transport.listener_port(listeners), username="bridge", password="pw"
                ),
                client_ssl_context=client_ctx,  # type: ignore[arg-type]
                server_ssl_context=server_ctx,  # type: ignore[arg-type]
            ),
        )


_node_with_two_inboxes = node_listing("p2p.inbound.DLaaa", "p2p.inbound.DLbbb")


async def test_a_snapshot_with_two_inboxes_stops_the_bridge_naming_them(
    alice: pki.NodeCredentials, network: pki.NetworkCredentials
) -> None:
    async with _bridge_against(_node_with_two_inboxes, alice, network) as (nursery, ext):
        with (
            trio.fail_after(30),
            pytest.RaisesGroup(bridge.MultipleInboxesError, flatten_subgroups=True) as got,
        ):
            await ext.run()
        message = str(got.value.exceptions[0])
        assert "p2p.inbound.DLaaa" in message and "p2p.inbound.DLbbb" in message
        assert "one inbox" in message
        assert ext.acceptor is None and ext.sessions == 1  # not retried, nothing served
        nursery.cancel_scope.cancel()


async def test_a_notify_message_in_another_message_format_is_rejected_and_not_acted_on(
    alice: pki.NodeCredentials, network: pki.NetworkCredentials
) -> None:
    """The node's notify link carries a snapshot with transfer message-format 5 (spec 2.7.5: not the standard
    AMQP message): the bridge read it as a standard one and acted on it. It is rejected with
    amqp:not-implemented and the bridge goes on; the same snapshot in format 0 is acted on (here: it lists two
    inboxes, which stops the bridge)."""
    snapshot = bridge.encode_control(
        bridge.QueueSnapshot(
            correlation_id=None,
            inbox_queues=[
                bridge.QueueEntry(legal_name=f"O=Node{i}, L=London, C=GB", queue_name=f"p2p.inbound.DL{i}")
                for i in range(2)
            ],
            outbound_queues=[],
        )
    )
    outcomes: list[Any] = []

    async def node(conn: transport.AmqpConnection) -> None:
        async with trio.open_nursery() as nursery:
            async for request in conn.link_requests():
                if request.peer_is_sender:
                    receiver = await request.accept_receiver(credit=64)

                    async def drain(receiver: transport.Receiver = receiver) -> None:
                        async for _ in receiver:
                            pass

                    nursery.start_soon(drain)
                else:
                    sender = await request.accept_sender()

                    async def notify(sender: transport.Sender = sender) -> None:
                        outcomes.append(await sender.send(snapshot, message_format=5))
                        await trio.sleep(0.2)  # the bridge would have acted on it by now
                        outcomes.append(await sender.send(snapshot))

                    nursery.start_soon(notify)

    async with _bridge_against(node, alice, network) as (nursery, ext):
        with trio.fail_after(30), pytest.RaisesGroup(bridge.MultipleInboxesError, flatten_subgroups=True):
            await ext.run()
        assert isinstance(outcomes[0], amqp.Rejected), outcomes
        assert outcomes[0].error.condition == "amqp:not-implemented"
        assert len(outcomes) == 1, outcomes  # (the second stopped the bridge before any outcome)
        nursery.cancel_scope.cancel()
