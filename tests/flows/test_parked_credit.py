"""The inbox credit lent for the messages of flows in the hospital (``FlowManager``, "Hospital"), on flow
nodes in one process over real brokers and sockets, with an inbox window of 8: parked flows hold their
messages unacknowledged without taking the window, at most ``max_parked_messages`` of them; beyond, inits
for the failing responder are rejected; retry and kill take the credit back."""

from __future__ import annotations

import gc
from pathlib import Path

import msgpack
import pytest
import trio

from corda_trio import flows, pki, store, testing
from corda_trio.flows._messages import derive_id
from tests.node.parking_flows import OUTAGE_ENV, AskDouble, DoubleResponder

ALICE, BOB = "O=Alice, L=London, C=GB", "O=Bob, L=Paris, C=FR"
WINDOW = 8


async def wait_for(manager: flows.FlowManager, check: object) -> None:
    assert callable(check)
    while not check():
        await manager.wait_changed(manager.version)


def lent(node: testing.FlowNode) -> tuple[int, int]:
    """(messages the flow manager says parked flows hold, credit the messaging service has lent)."""
    assert node.messaging is not None
    return node.flows.statistics().parked_messages, node.messaging.lent_inbox_credit


def in_flight(node: testing.FlowNode) -> int:
    assert node.broker is not None and node.messaging is not None
    (stats,) = node.broker.statistics(node.messaging.inbox.name)
    return stats.in_flight


def parked(manager: flows.FlowManager) -> list[str]:
    return [f.flow_id for f in manager.flows() if f.status == "parked"]


async def test_parked_flows_borrow_inbox_credit_up_to_the_cap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outage = tmp_path / "outage"
    monkeypatch.setenv(OUTAGE_ENV, str(outage))
    config = flows.FlowManagerConfig(retry_initial_seconds=0.05, max_parked_messages=2 * WINDOW)
    async with testing.open_flow_network(
        tmp_path, [ALICE, BOB], flow_config=config, inbox_credit=WINDOW
    ) as net:
        alice, bob = net["Alice"].flows, net["Bob"].flows
        with trio.fail_after(60):
            # more parked responders than the window: each holds its init, the window stays free
            for i in range(2 * WINDOW):
                await alice.start_flow(AskDouble(recipient=BOB, first=f"abc{i}"))
                await wait_for(bob, lambda i=i: len(parked(bob)) == i + 1)
                assert lent(net["Bob"]) == (i + 1, i + 1)
            assert in_flight(net["Bob"]) == 2 * WINDOW
            assert await (await alice.start_flow("PingPong", recipient=BOB, rounds=2)).result() == 2
            # the cap is reached: an init for the failing responder is rejected with the reason ...
            refused = rf"rejected the session: {DoubleResponder.flow_name} is failing here: {2 * WINDOW} of"
            with pytest.raises(flows.FlowException, match=refused):
                await (await alice.start_flow(AskDouble(recipient=BOB, first="abc"))).result()
            assert bob.statistics().refused_inits == 1
            # ... others are not
            assert await (await alice.start_flow("PingPong", recipient=BOB)).result() == 1
            # a retry that parks again borrows again; a kill gives the credit back once the kill is durable
            first, *others = parked(bob)
            await bob.retry(first)
            await wait_for(bob, lambda: lent(net["Bob"]) == (2 * WINDOW, 2 * WINDOW))
            await bob.kill(first)
            await wait_for(bob, lambda: lent(net["Bob"]) == (2 * WINDOW - 1, 2 * WINDOW - 1))
            # a flow parked after its checkpoint: the message it holds, and one arriving meanwhile (the
            # initiator is killed: its error comes), count too
            for flow_id in others:
                await bob.kill(flow_id)
            await wait_for(bob, lambda: lent(net["Bob"]) == (0, 0))
            outage.touch()
            handle = await alice.start_flow(AskDouble(recipient=BOB, first="1", second="21"))
            # (a killed flow is listed as parked until its kill is durable)
            await wait_for(bob, lambda: len(parked(bob)) == 1 and lent(net["Bob"]) == (1, 1))
            outage.unlink()
            (responder,) = parked(bob)
            await bob.retry(responder)
            assert await handle.result() == 42
            assert await bob.wait_result(responder) == ["1", "21"]
            await wait_for(bob, lambda: lent(net["Bob"]) == (0, 0))
            outage.touch()
            handle = await alice.start_flow(AskDouble(recipient=BOB, first="1", second="21"))
            await wait_for(bob, lambda: len(parked(bob)) == 1 and lent(net["Bob"]) == (1, 1))
            await alice.kill(handle.flow_id)
            await wait_for(bob, lambda: lent(net["Bob"]) == (2, 2))
            (responder,) = parked(bob)
            await bob.kill(responder)
            await wait_for(bob, lambda: lent(net["Bob"]) == (0, 0))
            while in_flight(net["Bob"]):  # noqa: ASYNC110 (acked once the kill and the dedup ids are durable)
                await trio.sleep(0.01)


async def test_the_messages_a_killed_flow_held_are_acknowledged_only_once_the_kill_is_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kill of a parked flow resolved the receipts of the messages it held at once: the inbox acked them
    while the kill's checkpoint was still being written, and a crash then left the flow at its last
    checkpoint, not killed, waiting for a message that was gone. Here the kill's checkpoint write is held
    back (a slow disk): the message stays unacknowledged until it is durable."""
    outage = tmp_path / "outage"
    outage.touch()
    monkeypatch.setenv(OUTAGE_ENV, str(outage))
    async with testing.open_flow_network(tmp_path, [ALICE, BOB], inbox_credit=WINDOW) as net:
        alice, bob = net["Alice"].flows, net["Bob"].flows
        with trio.fail_after(60):
            await alice.start_flow(AskDouble(recipient=BOB, first="1", second="21"))
            await wait_for(bob, lambda: lent(net["Bob"]) == (1, 1))
            (responder,) = parked(bob)
            assert in_flight(net["Bob"]) == 1
            write, reached, disk = store.KeyedLog.write, trio.Event(), trio.Event()

            async def slow_disk(
                log: store.KeyedLog, puts: list[tuple[bytes, bytes]], deletes: list[bytes]
            ) -> None:
                if log is bob.checkpoints and any(key == responder.encode() for key, _ in puts):
                    reached.set()
                    await disk.wait()
                await write(log, puts, deletes)

            monkeypatch.setattr(store.KeyedLog, "write", slow_disk)
            await bob.kill(responder)
            await reached.wait()
            with trio.move_on_after(1):  # (acked 10 ms after the kill, before)
                while in_flight(net["Bob"]):  # noqa: ASYNC110 (the messaging service's commit task)
                    await trio.sleep(0.01)
            assert in_flight(net["Bob"]) == 1
            disk.set()
            with pytest.raises(flows.FlowException, match="killed by an operator"):
                await bob.wait_result(responder)
            while in_flight(net["Bob"]):  # noqa: ASYNC110 (the messaging service's commit task)
                await trio.sleep(0.01)


async def test_returning_more_credit_than_was_lent_is_refused(tmp_path: Path) -> None:
    async with testing.open_flow_network(tmp_path, [ALICE], inbox_credit=WINDOW) as net:
        service = net["Alice"].messaging
        assert service is not None
        service.lend_inbox_credit(3)
        service.return_inbox_credit(2)
        assert service.lent_inbox_credit == 1
        with pytest.raises(ValueError, match="cannot return 2 units of inbox credit: 1 are lent"):
            service.return_inbox_credit(2)
        service.return_inbox_credit(1)
        assert service.lent_inbox_credit == 0


async def test_a_draining_node_holds_inits_without_taking_the_inbox_window(tmp_path: Path) -> None:
    """Draining, a node holds the session inits peers send (unacknowledged) until it is undrained: more
    than the inbox window of them stopped it taking any other message, so the flows it was draining for
    never finished. Now the inbox is lent credit for them, up to the cap; beyond, an init is rejected."""
    config = flows.FlowManagerConfig(max_parked_messages=2 * WINDOW)
    async with testing.open_flow_network(
        tmp_path, [ALICE, BOB], flow_config=config, inbox_credit=WINDOW
    ) as net:
        alice, bob = net["Alice"].flows, net["Bob"].flows
        with trio.fail_after(60):
            running = await alice.start_flow("PingPong", recipient=BOB, rounds=200)
            await wait_for(bob, lambda: bob.statistics().responders == 1)
            bob.drain()
            held = [await alice.start_flow("PingPong", recipient=BOB) for _ in range(2 * WINDOW)]
            assert await running.result() == 200  # (its pings reach Bob past the held inits)
            await wait_for(bob, lambda: lent(net["Bob"]) == (2 * WINDOW, 2 * WINDOW))
            refused = (
                rf"rejected the session: {BOB} is draining \(no new flows\) and holds {2 * WINDOW} session"
            )
            with pytest.raises(flows.FlowException, match=refused):
                await (await alice.start_flow("PingPong", recipient=BOB)).result()
            await bob.wait_drained()
            assert bob.statistics().started == 1
            bob.undrain()
            assert [await h.result() for h in held] == [1] * (2 * WINDOW)
            assert lent(net["Bob"]) == (0, 0)


async def test_a_flood_on_a_parked_flows_session_goes_into_its_checkpoint_and_overflows_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A peer that parked a responder (here: its second step fails, a service is down) could send it any
    number of messages on its session: lent credit up to ``max_parked_messages``, then they took the inbox
    window and the node took no P2P message any more. Now, beyond a session's limit on data sent ahead or
    beyond the lent credit, the held messages go into the parked flow's checkpoint as data sent ahead,
    acknowledged once it is durable: the session overflows as for a running flow, the window stays free,
    and the flow, retried, fails with the overflow (so does its initiator)."""
    outage = tmp_path / "outage"
    outage.touch()
    monkeypatch.setenv(OUTAGE_ENV, str(outage))
    config = flows.FlowManagerConfig(max_parked_messages=4, max_unconsumed_messages=3)
    async with testing.open_flow_network(
        tmp_path, [ALICE, BOB], flow_config=config, inbox_credit=WINDOW
    ) as net:
        alice, bob = net["Alice"].flows, net["Bob"].flows
        sender = net["Alice"].messaging
        assert sender is not None
        with trio.fail_after(60):
            handle = await alice.start_flow(AskDouble(recipient=BOB, first="1", second="21"))
            await wait_for(bob, lambda: len(parked(bob)) == 1)
            (responder,) = parked(bob)
            session = derive_id(responder, "session", 0)
            for seq in range(2, 2 + 4 * WINDOW):  # (0: the init, 1: "21", which the parked step holds)
                data = msgpack.packb([1, 2, session, seq, msgpack.packb(f"x{seq}")])
                out = sender.create_message(flows.SESSION_TOPIC, data, dedup_id=f"flood-{seq}")
                await sender.send(out, pki.CordaX500Name.parse(BOB))
            # the flood is taken (acknowledged, the last ones refused: the session overflowed) ...
            while in_flight(net["Bob"]):  # noqa: ASYNC110 (acked once the checkpoint is durable)
                await trio.sleep(0.01)
            assert lent(net["Bob"]) == (0, 0)
            assert parked(bob) == [responder]
            assert any("was ended by the peer: data not allowed" in r for _, r in bob.refusals())
            # ... and the window is free for everything else
            assert await (await alice.start_flow("PingPong", recipient=BOB, rounds=2)).result() == 2
            outage.unlink()
            await bob.retry(responder)
            overflow = (
                r"sent more data on session \d+ than O=Bob, L=Paris, C=FR holds before its flow receives"
            )
            with pytest.raises(flows.FlowException, match=overflow):
                await bob.wait_result(responder)
            with pytest.raises(flows.FlowException, match=overflow):
                await handle.result()


async def test_a_parked_flow_keeps_its_errors_text_not_the_exception_and_its_frames(tmp_path: Path) -> None:
    """The hospital's waiting task kept the step's exception, and with its traceback every frame of the
    failed step with its locals (the half-changed state, the context, the machine), for as long as the flow
    was parked: about 3 KB more per parked responder (tracemalloc over 1,000 of them, docs/flows.md). Now
    only the text shown (type and message) is kept; the traceback is logged once."""
    async with testing.open_flow_network(tmp_path, [ALICE, BOB], inbox_credit=WINDOW) as net:
        alice, bob = net["Alice"].flows, net["Bob"].flows
        with trio.fail_after(60):
            await alice.start_flow(AskDouble(recipient=BOB, first="abc-parked"))
            await wait_for(bob, lambda: len(parked(bob)) == 1)
            (info,) = [f for f in bob.flows() if f.status == "parked"]
            assert info.error == "ValueError: invalid literal for int() with base 10: 'abc-parked'"
            gc.collect()
            kept = [o for o in gc.get_objects() if isinstance(o, ValueError) and "abc-parked" in str(o)]
            assert kept == []
