"""The messaging service on a real broker: durable send, dispatch, dedup, retries."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import attrs
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


async def test_duplicates_dropped_failing_handler_retried_and_ordered(tmp_path: Path) -> None:
    # Real clock: the store's commit helper is a real process, and an autojump clock would race the polls
    # below past their deadline while the loop waits on the helper's I/O.
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


async def test_no_head_of_line_blocking_by_a_topic_without_handler_or_a_failing_handler(
    tmp_path: Path,
) -> None:
    """Messages on a topic nobody handles yet, or whose handler keeps failing, wait aside (in order, still in
    the inbox); messages on other topics are handled meanwhile."""
    peers = messaging.PeerDirectory()
    async with store.open_broker(tmp_path) as broker, trio.open_nursery() as nursery:
        config = messaging.MessagingConfig(legal_name=ME, key_hash="DLme")
        service = await messaging.MessagingService.open(broker, config, peers)
        plan = [("later", 0), ("now", 1), ("flaky", 2), ("later", 3), ("now", 4), ("flaky", 5), ("now", 6)]
        for topic, i in plan:
            await service.send(service.create_message(topic, b"%d" % i), ME)
        seen: dict[str, list[bytes]] = {"now": [], "later": [], "flaky": []}
        failures = [0]

        def handler_for(topic: str) -> messaging.Handler:
            async def handler(message: messaging.ReceivedMessage) -> None:
                if topic == "flaky" and failures[0] < 3:
                    failures[0] += 1
                    raise RuntimeError("not yet")
                seen[topic].append(message.data)

            return handler

        service.add_message_handler("now", handler_for("now"))
        service.add_message_handler("flaky", handler_for("flaky"))
        await nursery.start(service.run)
        with trio.fail_after(60):
            await wait_until(lambda: len(seen["now"]) == 3)
            assert seen["flaky"] == [] and service.parked() == {"later": 2, "flaky": 2}
            await wait_until(lambda: service.inbox.statistics().depth == 4)  # waiting aside: not acked
            await wait_until(lambda: len(seen["flaky"]) == 2)  # retried after HANDLER_RETRY_SECONDS each
            service.add_message_handler("later", handler_for("later"))
            await wait_until(lambda: not service.inbox.statistics().depth)
        assert seen == {"now": [b"1", b"4", b"6"], "later": [b"0", b"3"], "flaky": [b"2", b"5"]}
        assert service.parked() == {}
        nursery.cancel_scope.cancel()


async def test_an_undecodable_inbox_message_goes_to_the_dead_letters_and_frees_its_credit(
    tmp_path: Path,
) -> None:
    """A record in the inbox that is no P2P message (written here through the store's API: the acceptor never
    stores one) is moved to the dead-letter queue with its reason, acked from the inbox, and does not hold
    inbox credit: with ``inbox_credit=1`` the good messages behind it are still handled."""
    peers = messaging.PeerDirectory()
    config = messaging.MessagingConfig(legal_name=ME, key_hash="DLme", inbox_credit=1)
    async with store.open_broker(tmp_path) as broker:
        service = await messaging.MessagingService.open(broker, config, peers)
        await service.inbox.enqueue(b"\x00\x53\x77\xa1")  # a truncated value section: not decodable
        no_headers = amqp.Message(body=b"x").encode()  # decodable, but no P2P headers
        await service.inbox.enqueue(no_headers)
        await service.send(service.create_message("t", b"good", dedup_id="g1"), ME)
    async with store.open_broker(tmp_path) as broker, trio.open_nursery() as nursery:
        service = await messaging.MessagingService.open(broker, config, peers)
        seen: list[bytes] = []

        async def handler(message: messaging.ReceivedMessage) -> None:
            seen.append(message.data)

        service.add_message_handler("t", handler)
        await nursery.start(service.run)
        with trio.fail_after(60):
            await wait_until(lambda: seen == [b"good"] and not service.inbox.statistics().depth)
        nursery.cancel_scope.cancel()
    async with store.open_broker(tmp_path) as broker:
        dead = await broker.declare_queue(messaging.DEAD_LETTER_QUEUE)
        moved = [d async for d in dead.browse()]
        assert [d.payload for d in moved] == [b"\x00\x53\x77\xa1", no_headers]
        reasons = [d.headers.decode().split("\n") for d in moved]
        assert [r[:2] for r in reasons] == [
            [config.inbox, "amqp:decode-error"],
            [config.inbox, reasons[1][1]],
        ]
        assert reasons[1][1].startswith("amqp:") and reasons[1][2]
        inbox = await broker.declare_queue(config.inbox)
        assert [d async for d in inbox.browse()] == []


async def test_a_message_remembered_by_the_acceptor_equals_the_one_decoded_from_the_inbox(
    tmp_path: Path,
) -> None:
    """``remember_received`` is only a cache keyed by the stored bytes: what the dispatcher takes from it is
    what decoding those bytes gives; it holds at most twice ``inbox_credit`` entries, oldest dropped first."""
    peers = messaging.PeerDirectory()
    config = messaging.MessagingConfig(legal_name=ME, key_hash="DLme", inbox_credit=2)
    user = "O=Peer, L=Paris, C=FR"
    async with store.open_broker(tmp_path) as broker:
        service = await messaging.MessagingService.open(broker, config, peers)
        sent = [service.create_message("t", b"m%d" % i, headers={"k": "v"}) for i in range(6)]
        encoded = [
            messaging.to_amqp(m, platform_version=4, release_version="1", sender_uuid="s", send_seq_no=i)
            for i, m in enumerate(sent)
        ]
        raw = [m.encode() for m in encoded]
        wires = [amqp.Message.decode(e) for e in raw]  # as the acceptor decoded them
        stored = [messaging.stamped_payload(e, w, user) for e, w in zip(raw, wires, strict=True)]
        service.remember_received(stored, wires, user)
        assert list(service._decoded) == stored[2:]  # 2 * inbox_credit entries kept, the newest
        from_store = [messaging.from_amqp(amqp.Message.decode(p)) for p in stored]
        got = [service._received(bytes(p)) for p in stored]  # equal bytes, other objects
        assert got == from_store and not service._decoded
        assert all(m.validated_user == user for m in got)


async def test_a_topic_nobody_handles_cannot_stop_the_other_topics(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """1100 messages on a topic with no handler (inbox_credit 1024) parked until the credit was used up, and
    then no message of any topic was handed over any more. Now half the credit waits for a handler; the rest
    goes to the dead letters, durably, and a handler registered later still gets the ones that waited. The
    68 moved aside are one warning (per sender and minute), not 68."""
    peers = messaging.PeerDirectory()
    config = messaging.MessagingConfig(legal_name=ME, key_hash="DLme", inbox_credit=64)
    async with store.open_broker(tmp_path) as broker, trio.open_nursery() as nursery:
        service = await messaging.MessagingService.open(broker, config, peers)
        for i in range(100):
            await service.send(service.create_message("nobody", b"n%d" % i), ME)
        await service.send(service.create_message("known", b"k"), ME)
        seen: dict[str, list[bytes]] = {"known": [], "nobody": []}

        def handler_for(topic: str) -> messaging.Handler:
            async def handler(message: messaging.ReceivedMessage) -> None:
                seen[topic].append(message.data)

            return handler

        service.add_message_handler("known", handler_for("known"))
        await nursery.start(service.run)
        with trio.fail_after(60):
            await wait_until(lambda: seen["known"] == [b"k"])
            assert service.parked() == {"nobody": 32}  # half of inbox_credit waits for a handler
            await wait_until(lambda: service.inbox.statistics().depth == 32)  # the rest moved aside
            service.add_message_handler("nobody", handler_for("nobody"))
            await wait_until(lambda: not service.inbox.statistics().depth)
        assert seen["nobody"] == [b"n%d" % i for i in range(32)]
        nursery.cancel_scope.cancel()
    async with store.open_broker(tmp_path) as broker:
        dead = await broker.declare_queue(messaging.DEAD_LETTER_QUEUE)
        moved = [messaging.from_amqp(amqp.Message.decode(d.payload)) async for d in dead.browse()]
        assert [m.data for m in moved] == [b"n%d" % i for i in range(32, 100)]  # nothing lost
        reasons = {tuple(d.headers.decode().split("\n")[:2]) async for d in dead.browse()}
        assert reasons == {(config.inbox, "amqp:not-found")}
    moved_lines = [r.getMessage() for r in caplog.records if "moved to" in r.getMessage()]
    assert [r.levelname for r in caplog.records if "moved to" in r.getMessage()] == ["WARNING"], moved_lines
    assert "no handler for topic 'nobody'; 32 messages already wait for one" in moved_lines[0]


async def test_the_dead_letters_keep_the_newest_within_their_bounds(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A member that sends messages for a topic nobody handles, for as long as it likes, grew the dead-letter
    queue (and the store) without end: a soak of three real nodes added about 1 MB of dead letters per node
    every 5 minutes, never reclaimed. Now the queue keeps at most ``dead_letters_max_messages`` (and
    ``_max_bytes``): each move past the bound drops the oldest, logged once a minute, counted by the
    queue's acks; the space goes with the store's compaction."""
    peers = messaging.PeerDirectory()
    config = messaging.MessagingConfig(
        legal_name=ME, key_hash="DLme", inbox_credit=8, dead_letters_max_messages=10
    )
    async with store.open_broker(tmp_path) as broker, trio.open_nursery() as nursery:
        service = await messaging.MessagingService.open(broker, config, peers)
        for i in range(60):
            await service.send(service.create_message("nobody", b"n%d" % i), ME)
        await nursery.start(service.run)
        with trio.fail_after(60):
            await wait_until(lambda: service.inbox.statistics().depth == 4)  # half the credit waits
        dead = broker.get_queue(messaging.DEAD_LETTER_QUEUE)
        stats = dead.statistics()
        assert (stats.depth, stats.enqueued, stats.acked) == (10, 56, 46)
        nursery.cancel_scope.cancel()
    async with store.open_broker(tmp_path) as broker:
        dead = await broker.declare_queue(messaging.DEAD_LETTER_QUEUE)
        kept = [messaging.from_amqp(amqp.Message.decode(d.payload)) async for d in dead.browse()]
        assert [m.data for m in kept] == [b"n%d" % i for i in range(50, 60)]  # the newest ten
        # by bytes too: the newest is always kept, however large
        service = await messaging.MessagingService.open(
            broker, attrs.evolve(config, dead_letters_max_bytes=1), peers
        )
        consumer = service.inbox.consumer()
        await service.send(service.create_message("nobody", b"x" * 1000), ME)
        delivery = await consumer.receive()
        await service.dead_letter(service.inbox.name, consumer, delivery.message_id, delivery.payload,
                                  "amqp:not-found", "test")  # fmt: skip
        assert [d.payload async for d in dead.browse()] == [delivery.payload]
    dropped = [r for r in caplog.records if "dropped" in r.getMessage()]
    assert [r.levelname for r in dropped] == ["WARNING", "WARNING"], [r.getMessage() for r in dropped]
    assert "keeps at most 10 messages" in dropped[0].getMessage()


@pytest.mark.parametrize("hold", [0.0, 0.5])
async def test_ids_of_messages_handled_within_the_hold_share_one_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hold: float
) -> None:
    """The commit task waits ``COMMIT_HOLD_SECONDS`` after the first handled message: what is handled
    meanwhile shares its group commit (one sync for many ids, not one each); every id ends up committed."""
    from corda_trio.messaging import _service

    monkeypatch.setattr(_service, "COMMIT_HOLD_SECONDS", hold)
    async with store.open_broker(tmp_path) as broker, trio.open_nursery() as nursery:
        config = messaging.MessagingConfig(legal_name=ME, key_hash="DLme")
        service = await messaging.MessagingService.open(broker, config, messaging.PeerDirectory())
        for i in range(20):
            await service.send(service.create_message("t", b"%d" % i, dedup_id=f"id-{i}"), ME)
        commits: list[int] = []
        commit_many = messaging.Deduplicator.commit_many

        async def counted(self: messaging.Deduplicator, items: list[tuple[str, bytes]]) -> None:
            commits.append(len(items))
            await commit_many(self, items)

        monkeypatch.setattr(messaging.Deduplicator, "commit_many", counted)

        async def handler(message: messaging.ReceivedMessage) -> bytes:
            await trio.lowlevel.checkpoint()  # the commit task gets to run in between
            return b"r" + message.data

        service.add_message_handler("t", handler)
        await nursery.start(service.run)
        with trio.fail_after(60):
            await wait_until(lambda: not service.inbox.statistics().depth)
        assert sum(commits) == 20
        assert all(service.deduplicator.receipt(f"id-{i}") == b"r%d" % i for i in range(20))
        if hold:
            assert commits == [20]
        else:
            assert len(commits) > 1  # the control: without the hold, the first id commits on its own
        nursery.cancel_scope.cancel()


async def test_dedup_ids_are_scoped_by_their_sender_and_bare_ids_stored_before_still_count(
    tmp_path: Path,
) -> None:
    """Two peers may use the same id (one cannot use up the other's); a copy from the same peer is dropped;
    an id stored bare (before ids were scoped) still drops its copy."""
    async with store.open_broker(tmp_path) as broker, trio.open_nursery() as nursery:
        config = messaging.MessagingConfig(legal_name=ME, key_hash="DLme")
        service = await messaging.MessagingService.open(broker, config, messaging.PeerDirectory())
        assert service.deduplicator.begin("old")
        await service.deduplicator.commit("old")

        def stored(user: str, dedup_id: str, data: bytes) -> bytes:
            out = service.create_message("t", data, dedup_id=dedup_id)
            wire = messaging.to_amqp(
                out, platform_version=1, release_version="0", sender_uuid="u", send_seq_no=0
            )
            return messaging.stamp_validated_user(wire, user).encode()

        bob, carol = "O=Bob, L=Paris, C=FR", "O=Carol, L=Rome, C=IT"
        await service.inbox.enqueue_many(
            [
                stored(carol, "order-17", b"carol's"),
                stored(bob, "order-17", b"bob's"),
                stored(bob, "order-17", b"bob's copy"),
                stored(bob, "old", b"from before"),
            ]
        )
        seen: list[bytes] = []

        async def handler(message: messaging.ReceivedMessage) -> None:
            seen.append(message.data)

        service.add_message_handler("t", handler)
        await nursery.start(service.run)
        with trio.fail_after(60):
            await wait_until(lambda: not (service.inbox.statistics().depth))
        assert seen == [b"carol's", b"bob's"]
        assert f"{bob}\x00order-17" in service.deduplicator
        nursery.cancel_scope.cancel()


async def test_a_deferred_receipt_failing_with_a_group_is_logged_by_its_cause(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A deferred receipt whose nursery fails raises a group: the warning said only ``(Exceptions from Trio
    nursery (2 sub-exceptions))``; it names the cause now, and the message is handed over again."""
    caplog.set_level(logging.WARNING, logger="corda_trio.messaging")
    async with store.open_broker(tmp_path) as broker, trio.open_nursery() as nursery:
        service = await messaging.MessagingService.open(
            broker, messaging.MessagingConfig(legal_name=ME, key_hash="DLme"), messaging.PeerDirectory()
        )
        calls: list[bytes] = []

        async def fail(text: str) -> None:
            raise RuntimeError(text)

        async def handler(message: messaging.ReceivedMessage) -> messaging.DeferredReceipt:
            calls.append(message.data)

            async def receipt() -> bytes:
                if len(calls) == 1:
                    async with trio.open_nursery() as inner:
                        inner.start_soon(fail, "the flow's checkpoint failed")
                        inner.start_soon(fail, "and so did its session")
                return b"ok"

            return receipt

        service.add_message_handler("t", handler)
        await service.send(service.create_message("t", b"x", dedup_id="d1"), ME)
        await nursery.start(service.run)
        with trio.fail_after(60):
            await wait_until(lambda: service.deduplicator.receipt("d1") == b"ok")
        nursery.cancel_scope.cancel()
    assert calls == [b"x", b"x"]
    (line,) = [r.getMessage() for r in caplog.records if "deferred handler outcome" in r.getMessage()]
    # (which of the two failed first is the scheduler's choice)
    assert re.fullmatch(
        "deferred handler outcome of d1 failed: RuntimeError: (the flow's checkpoint failed|and so did its "
        r"session) \(and 1 more error\); redelivering",
        line,
    ), line


async def test_a_stop_commits_the_ids_of_the_messages_handled_during_the_hold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the chaos run (``tests.node.chaos``): after a node stopped cleanly (SIGTERM, "node
    stopped cleanly") and started again, messages its flows had consumed last were handed over again: their
    ids were waiting out the commit hold (or being committed) when the stop cancelled the service, and were
    never committed. A flow that had finished meanwhile no longer knew the session, so each copy was logged
    as a refused session message (``unknown session``) and counted in
    ``flows_session_messages_refused_total``. Cancelled, the commit task commits what it holds (and acks it)
    before it ends: nothing is handed over again."""
    from corda_trio.messaging import _service

    monkeypatch.setattr(_service, "COMMIT_HOLD_SECONDS", 30.0)  # the stop comes within the hold
    config = messaging.MessagingConfig(legal_name=ME, key_hash="DLme")
    seen: list[bytes] = []

    async def handler(message: messaging.ReceivedMessage) -> bytes:
        seen.append(message.data)
        return b"r" + message.data

    async with store.open_broker(tmp_path) as broker, trio.open_nursery() as nursery:
        service = await messaging.MessagingService.open(broker, config, messaging.PeerDirectory())
        for i in range(5):
            await service.send(service.create_message("t", b"%d" % i, dedup_id=f"id-{i}"), ME)
        service.add_message_handler("t", handler)
        await nursery.start(service.run)
        with trio.fail_after(60):
            await wait_until(lambda: len(seen) == 5)
        nursery.cancel_scope.cancel()  # as a node's stop does, once its flows are drained
    assert seen == [b"0", b"1", b"2", b"3", b"4"]
    seen.clear()
    monkeypatch.setattr(_service, "COMMIT_HOLD_SECONDS", 0.0)
    async with store.open_broker(tmp_path) as broker, trio.open_nursery() as nursery:
        service = await messaging.MessagingService.open(broker, config, messaging.PeerDirectory())
        assert all(service.deduplicator.receipt(f"id-{i}") == b"r%d" % i for i in range(5))
        service.add_message_handler("t", handler)
        await nursery.start(service.run)
        with trio.fail_after(60):
            await wait_until(lambda: not service.inbox.statistics().depth)
        nursery.cancel_scope.cancel()
    assert seen == []


async def test_a_stop_commits_the_id_of_a_deferred_receipt_resolved_as_it_came(tmp_path: Path) -> None:
    """A deferred receipt resolved in the same moment as the stop (a flow's last step committed just as the
    node stopped): its task, woken, hands the id to the commit task only after that one, cancelled, took
    what it held, committed it, and ended, when the scheduler ran the commit task first (half the time):
    the id was never committed, and the message was handed over again after the restart. The stopping
    commit task lets such receipts in first. Ten stops, each with a fresh store: every id is committed."""
    config = messaging.MessagingConfig(legal_name=ME, key_hash="DLme")
    lost = []

    def deferring(resolved: trio.Event, waiting: trio.Event) -> messaging.Handler:
        async def handler(message: messaging.ReceivedMessage) -> messaging.DeferredReceipt:
            async def receipt() -> bytes:
                waiting.set()
                await resolved.wait()
                return b"done"

            return receipt

        return handler

    for trial in range(10):
        resolved, waiting = trio.Event(), trio.Event()
        handler = deferring(resolved, waiting)
        directory = tmp_path / str(trial)
        async with store.open_broker(directory) as broker, trio.open_nursery() as nursery:
            service = await messaging.MessagingService.open(broker, config, messaging.PeerDirectory())
            await service.send(service.create_message("t", b"x", dedup_id="d1"), ME)
            service.add_message_handler("t", handler)
            await nursery.start(service.run)
            with trio.fail_after(60):
                await waiting.wait()
                await trio.testing.wait_all_tasks_blocked()
            resolved.set()  # (no checkpoint between the two)
            nursery.cancel_scope.cancel()
        async with store.open_broker(directory) as broker:
            service = await messaging.MessagingService.open(broker, config, messaging.PeerDirectory())
            if service.deduplicator.receipt("d1") != b"done":
                lost.append(trial)
    assert lost == []
