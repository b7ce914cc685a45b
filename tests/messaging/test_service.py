"""The messaging service on a real broker: durable send, dispatch, dedup, retries."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from corda_trio import amqp, messaging, pki, store
from tests.p2p_harness import wait_until

ME = pki.CordaX500Name.parse("O=Me, L=London, C=GB")
PEER = messaging.Peer(
    legal_name=pki.CordaX500Name.parse("O=Peer, L=Paris, C=FR"), key_hash="DLpeer", addresses=[]
)


async def test_send_is_durable_in_the_outbound_queue_created_on_demand(tmp_path: Path) -> None:
    peers = messaging.PeerDirectory.of([PEER])
    async with store.open_broker(tmp_path) as broker:
        service = await messaging.MessagingService.open(
            broker, messaging.MessagingConfig(legal_name=ME, key_hash="DLme"), peers
        )
        assert service.outbound_queues() == {}
        version = service.outbound_version
        await service.send(service.create_message("t", b"x", dedup_id="d1"), PEER.legal_name)
        await service.send(service.create_message("t", b"y", dedup_id="d2"), "DLpeer")
        assert service.outbound_version == version + 1
    async with store.open_broker(tmp_path) as broker:
        service = await messaging.MessagingService.open(
            broker, messaging.MessagingConfig(legal_name=ME, key_hash="DLme"), peers
        )
        queue = service.outbound_queues()["internal.peers.DLpeer"]
        stored = [messaging.from_amqp(amqp.Message.decode(d.payload)) async for d in queue.browse()]
        assert [(m.dedup_id, m.data, m.send_seq_no) for m in stored] == [("d1", b"x", 1), ("d2", b"y", 2)]


async def test_duplicates_dropped_failing_handler_retried_and_ordered(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    peers = messaging.PeerDirectory()
    async with store.open_broker(tmp_path) as broker, trio.open_nursery() as nursery:
        config = messaging.MessagingConfig(legal_name=ME, key_hash="DLme")
        service = await messaging.MessagingService.open(broker, config, peers)
        # messages waiting before any handler is registered stay in the inbox
        for i, dedup in enumerate(["a", "b", "a", "c", "b"]):
            await service.send(service.create_message("t", b"%d" % i, dedup_id=dedup), ME)
        await nursery.start(service.run)
        await trio.sleep(0.2)
        seen: list[bytes] = []
        failed = []

        async def handler(message: messaging.ReceivedMessage) -> bytes:
            if message.dedup_id == "c" and not failed:
                failed.append(1)
                raise RuntimeError("first time fails")
            seen.append(message.data)
            return b"done-" + message.data

        service.add_message_handler("t", handler)
        with pytest.raises(ValueError, match="already registered"):
            service.add_message_handler("t", handler)
        with trio.fail_after(60):
            await wait_until(lambda: not (service.inbox.statistics().depth))
        assert seen == [b"0", b"1", b"3"]  # in order; "c" handed over again after its handler failed
        assert service.deduplicator.receipt("c") == b"done-3"
        nursery.cancel_scope.cancel()
