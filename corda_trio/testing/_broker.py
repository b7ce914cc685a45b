"""``QueueBroker``: a tiny in-memory AMQP queue broker for ``serve_amqp`` (tests, benchmarks, interop)."""

from __future__ import annotations

import collections
from collections.abc import Callable

import trio

from corda_trio import amqp, transport

__all__ = ["QueueBroker"]


class QueueBroker:
    """Stores messages sent to an address; peers that attach a receiving link get them in order.

    Args:
        allow: ``address -> bool``; attaches to other addresses are refused with ``amqp:unauthorized-access``.
        credit: credit granted to each sending peer.
        discard: count messages without storing them (benchmarks).

    Use ``await nursery.start(transport.serve_amqp, broker.handle, 0)``.
    """

    def __init__(
        self,
        *,
        allow: Callable[[str | None], bool] = lambda a: True,
        credit: int = 1000,
        discard: bool = False,
    ) -> None:
        self.allow = allow
        self.credit = credit
        self.discard = discard
        self.queues: dict[str | None, collections.deque[bytes]] = collections.defaultdict(collections.deque)
        self._arrived: dict[str | None, trio.Event] = collections.defaultdict(trio.Event)
        self.received = 0
        self.connections = 0

    async def handle(self, conn: transport.AmqpConnection) -> None:
        """The ``serve_amqp`` handler: answer link requests until the connection ends."""
        self.connections += 1
        async with trio.open_nursery() as nursery:
            async for request in conn.link_requests():
                if not self.allow(request.address):
                    await request.refuse(
                        "amqp:unauthorized-access", f"attaching to {request.address!r} is not allowed"
                    )
                elif request.peer_is_sender:
                    receiver = await request.accept_receiver(credit=self.credit)
                    nursery.start_soon(self._consume, receiver)
                else:
                    sender = await request.accept_sender()
                    nursery.start_soon(self._produce, sender)

    async def _consume(self, receiver: transport.Receiver) -> None:
        queue = self.queues[receiver.address]
        try:
            async for delivery in receiver:
                self.received += 1
                if not self.discard:
                    queue.append(delivery.payload)
                    self._arrived.pop(receiver.address, trio.Event()).set()
                await delivery.accept()
        except transport.AmqpTransportError:
            pass

    async def _produce(self, sender: transport.Sender) -> None:
        queue = self.queues[sender.address]
        try:
            while True:
                while not queue:
                    await self._arrived[sender.address].wait()
                payload = queue.popleft()
                try:
                    outcome = await sender.send(payload)
                except transport.AmqpTransportError:
                    queue.appendleft(payload)  # not delivered: keep it
                    return
                if outcome != amqp.Accepted():
                    queue.appendleft(payload)
                    return
        except transport.AmqpTransportError:
            return
