"""Flow nodes in one process over real brokers, sockets and mutual TLS (``testing.open_flow_network``): many
concurrent flows, error propagation, rejects, the hospital, kill, drain, restarts and a malicious peer."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import attrs
import msgpack
import pytest
import trio

from corda_trio import flows, messaging, store, testing
from corda_trio.flows._codec import encode_outbox_record
from corda_trio.flows._manager import outbox_key
from corda_trio.flows._messages import derive_id
from corda_trio.flows._statemachine import Outgoing
from tests.flows.hasty import Hasty, HastyResponder, ended_text
from tests.flows.picky import AskNumber

ALICE, BOB, CAROL = "O=Alice, L=London, C=GB", "O=Bob, L=Paris, C=FR", "O=Carol, L=Rome, C=IT"

#: test switch read by Fragile (a flow may read module state only in tests like this one)
BROKEN = {"on": True}


@flows.initiating_flow
@attrs.define
class Fragile(flows.FlowLogic[str]):
    """Fails with a bug (RuntimeError) while ``BROKEN`` is on; then asks ``peer`` and returns the answer."""

    peer: str

    def call(self, ctx: Any) -> Any:
        if BROKEN["on"]:
            raise RuntimeError("simulated bug")
        s = ctx.initiate_flow(self.peer)
        return ctx.send_and_receive(s, "hi", str, then=self.done)

    def done(self, ctx: Any, answer: str) -> Any:
        return ctx.finish(answer)


@flows.initiated_by(Fragile)
@attrs.define
class FragileResponder(flows.BroadcastResponder):
    pass


@flows.initiating_flow
@attrs.define
class Orphan(flows.FlowLogic[None]):
    """No node registers a responder for it."""

    peer: str

    def call(self, ctx: Any) -> Any:
        s = ctx.initiate_flow(self.peer)
        return ctx.send_and_receive(s, "anyone?", str, then=self.done)

    def done(self, ctx: Any, _: str) -> Any:
        return ctx.finish(None)


@flows.initiating_flow
@attrs.define
class Waiter(flows.FlowLogic[str]):
    """Opens a session and waits for data that never comes (until killed)."""

    peer: str

    def call(self, ctx: Any) -> Any:
        s = ctx.initiate_flow(self.peer)
        return ctx.send_and_receive(s, "wait", str, then=self.done)

    def done(self, ctx: Any, answer: str) -> Any:
        return ctx.finish(answer)


@flows.initiated_by(Waiter)
@attrs.define
class Silent(flows.FlowLogic[None]):
    session: flows.FlowSession

    def call(self, ctx: Any) -> Any:
        return ctx.receive(self.session, str, then=self.got)

    def got(self, ctx: Any, _: str) -> Any:
        return ctx.receive(self.session, str, then=self.got)  # waits forever


async def wait_status(manager: flows.FlowManager, flow_id: str, status: str) -> flows.FlowInfo:
    version = manager.version
    while True:
        for info in manager.flows():
            if info.flow_id == flow_id and info.status == status:
                return info
        version = await manager.wait_changed(version)


@pytest.fixture
async def net(tmp_path: Path) -> Any:
    async with testing.open_flow_network(
        tmp_path, [ALICE, BOB, CAROL], flow_config=flows.FlowManagerConfig(retry_initial_seconds=0.05)
    ) as network:
        yield network


async def test_thousand_concurrent_ping_pongs_between_three_nodes(net: testing.FlowNetwork) -> None:
    names = [ALICE, BOB, CAROL]
    handles = []
    with trio.fail_after(120):
        for i in range(1000):
            src, dst = names[i % 3], names[(i + 1) % 3]
            handles.append(await net[src].flows.start_flow(flows.PingPong(recipient=dst, rounds=1 + i % 2)))
        results = [await h.result() for h in handles]
    assert results == [1 + i % 2 for i in range(1000)]
    for name in names:
        stats = net[name].flows.statistics()
        assert stats.running == 0 and stats.parked == 0 and stats.failed == 0
        assert all(not r[1].startswith("out of sequence") for r in net[name].flows.refusals())


async def test_flow_exception_propagates_with_its_message(net: testing.FlowNetwork) -> None:
    with trio.fail_after(30):
        handle = await net["Alice"].flows.start_flow(
            "FailingFlow", recipient=BOB, reason="insufficient funds"
        )
        with pytest.raises(flows.FlowException, match=r"^insufficient funds$"):
            await handle.result()
    failed = [f for f in net["Bob"].flows.flows() if f.status == "failed"]
    assert [(f.flow_name, f.error, f.initiator) for f in failed] == [
        ("corda_trio.flows.FailingResponder", "insufficient funds", ALICE)
    ]


async def test_broadcast_collects_every_answer(net: testing.FlowNetwork) -> None:
    with trio.fail_after(30):
        handle = await net["Alice"].flows.start_flow("Broadcast", recipients=f"{BOB};{CAROL}", message="hey")
        assert await handle.result() == [f"{BOB} got hey", f"{CAROL} got hey"]


async def test_unknown_initiating_flow_is_rejected_with_a_reason(net: testing.FlowNetwork) -> None:
    with trio.fail_after(30):
        handle = await net["Alice"].flows.start_flow(Orphan(peer=BOB))
        with pytest.raises(flows.FlowException) as info:
            await handle.result()
    reason = f"no responder is registered for flow {Orphan.flow_name!r}"
    assert str(info.value) == f"{BOB} rejected the session: {reason}"
    assert (ALICE, reason) in net["Bob"].flows.refusals()


async def test_parked_flow_is_listed_retried_and_completes(net: testing.FlowNetwork) -> None:
    alice = net["Alice"].flows
    BROKEN["on"] = True
    try:
        with trio.fail_after(30):
            handle = await alice.start_flow(Fragile(peer=CAROL))
            info = await wait_status(alice, handle.flow_id, "parked")
            assert info.error == "RuntimeError: simulated bug"
            BROKEN["on"] = False
            await alice.retry(handle.flow_id)
            assert await handle.result() == f"{CAROL} got hi"
    finally:
        BROKEN["on"] = True


async def test_unknown_peer_is_transient_and_retried(net: testing.FlowNetwork) -> None:
    alice = net["Alice"].flows
    net.forget(CAROL)
    with trio.fail_after(30):
        handle = await alice.start_flow("PingPong", recipient=CAROL, rounds="2")
        doomed = await alice.start_flow("PingPong", recipient=CAROL, rounds="2")
        info = await wait_status(alice, handle.flow_id, "retrying")
        assert "is not in the network map" in (info.error or "")
        await wait_status(alice, doomed.flow_id, "retrying")
        await alice.kill(doomed.flow_id)
        with pytest.raises(flows.FlowException, match="killed by an operator"):
            await doomed.result()
        net._publish()
        assert await handle.result() == 2


async def test_a_retrying_send_goes_as_soon_as_the_peer_is_known(tmp_path: Path) -> None:
    """A flow's messages to a node not in the map waited out their backoff (doubling up to 30 s) even when the
    node learnt of the peer meanwhile (the send asks the node to poll the map early). Now they go when the
    node's view of the network changes."""
    async with testing.open_flow_network(
        tmp_path, [ALICE, CAROL], flow_config=flows.FlowManagerConfig(retry_initial_seconds=20)
    ) as net:
        alice = net["Alice"].flows
        net.forget(CAROL)
        with trio.fail_after(30):
            handle = await alice.start_flow("PingPong", recipient=CAROL, rounds="2")
            await wait_status(alice, handle.flow_id, "retrying")
        net._publish()
        with trio.fail_after(5):  # (the backoff: 10 to 30 s)
            assert await handle.result() == 2


async def test_kill_tells_the_counterparty(net: testing.FlowNetwork) -> None:
    alice, bob = net["Alice"].flows, net["Bob"].flows
    with trio.fail_after(30):
        handle = await bob.start_flow(Waiter(peer=ALICE))
        version = alice.version
        while not any(f.flow_name == Silent.flow_name for f in alice.flows()):
            version = await alice.wait_changed(version)
        (silent,) = [f for f in alice.flows() if f.flow_name == Silent.flow_name]
        await wait_status(alice, silent.flow_id, "running")
        await alice.kill(silent.flow_id)
        with pytest.raises(flows.FlowException, match=rf"^{flows.COUNTER_FLOW_ERRORED}$"):
            await handle.result()
        info = await wait_status(alice, silent.flow_id, "failed")
        assert info.error == "killed by an operator"


async def test_killing_a_responder_parked_by_its_first_step_ends_its_initiator(
    net: testing.FlowNetwork,
) -> None:
    """A responder parked by its first step still owes its confirm (that step went to the hospital). Its kill
    sent the error first, with the confirm's sequence number: the initiator refused it ("not confirmed yet")
    and waited for ever, and the killed responder, its confirm still held, stayed unconfirmed for ever. A
    soak of real nodes (a flow parked and killed every minute) left one running initiator per cycle. Now the
    confirm goes first, then the error: every cycle ends on both sides and nothing is left behind."""
    alice, bob = net["Alice"].flows, net["Bob"].flows
    with trio.fail_after(60):
        for _ in range(5):
            handle = await alice.start_flow(AskNumber(peer=BOB, value="abc"))
            version = bob.version
            while not (parked := [f for f in bob.flows() if f.status == "parked"]):
                version = await bob.wait_changed(version)
            (responder,) = parked
            assert responder.error is not None and "ValueError" in responder.error
            await bob.kill(responder.flow_id)
            with pytest.raises(flows.FlowException, match=rf"^{flows.COUNTER_FLOW_ERRORED}$"):
                await handle.result()
            assert (await wait_status(bob, responder.flow_id, "failed")).error == "killed by an operator"
        assert await (await alice.start_flow(AskNumber(peer=BOB, value="21"))).result() == "42"
    for manager in (alice, bob):
        stats = manager.statistics()
        assert (stats.running, stats.parked, stats.unconfirmed) == (0, 0, 0), stats
    assert not [r for p, r in alice.refusals() if p == BOB], alice.refusals()


async def test_a_long_run_of_flows_keeps_the_store_bounded(tmp_path: Path) -> None:
    """Steady flows between three nodes, with small segments (64 KiB) and 50 finished flows remembered: the
    outbound queues, the inbox and the checkpoint log stay within a few segments cycle after cycle (acked
    messages and retired checkpoints are reclaimed by rollover and compaction). Without reclaiming, each
    node's checkpoint log alone grows by some 170 KB a cycle. (The dedup ids grow until their ``retain``:
    not checked here.)"""
    segment = 64 * 1024
    names = [ALICE, BOB, CAROL]
    async with testing.open_flow_network(
        tmp_path, names, broker_config=store.BrokerConfig(segment_bytes=segment),
        flow_config=flows.FlowManagerConfig(finished_retain=50),
    ) as net:  # fmt: skip
        sizes: list[dict[str, int]] = []
        with trio.fail_after(240):
            for _cycle in range(5):
                for _batch in range(10):
                    handles = []
                    for i in range(6):
                        src, dst = names[i % 3], names[(i + 1) % 3]
                        others = [n for n in names if n != src]
                        handles.append(
                            await net[src].flows.start_flow(flows.PingPong(recipient=dst, rounds=2))
                        )
                        handles.append(
                            await net[src].flows.start_flow(
                                flows.Broadcast(recipients=others, message="x" * 200)
                            )
                        )
                    for handle in handles:
                        await handle.result()
                sizes.append({
                    f"{name}: {part.name}": sum(map(_size_if_there, part.iterdir()))
                    for name in names
                    for part in [*(net[name].directory / "store").glob("*.*.*"),
                                 net[name].directory / "store" / "keyed" / "flows.checkpoints"]
                    if not part.name.startswith("internal.p2p.dedup.")
                })  # fmt: skip
        assert len(sizes[-1]) == 3 * 4, sizes[-1]  # per node: two outbound queues, inbox, checkpoints
        for part, size in sizes[-1].items():
            assert size <= 4 * segment, (part, [s[part] for s in sizes])


def _size_if_there(path: Path) -> int:
    """A file's size, 0 if it went between listing and stat (the store writes ``manifest.tmp`` and renames it
    while the flows' tasks run: read in the middle, the listing named it and the stat failed)."""
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


async def test_drain_refuses_new_flows_and_holds_initiations(net: testing.FlowNetwork) -> None:
    alice, bob = net["Alice"].flows, net["Bob"].flows
    with trio.fail_after(30):
        bob.drain()
        with pytest.raises(flows.FlowManagerDrainingError):
            await bob.start_flow("PingPong", recipient=ALICE)
        handle = await alice.start_flow("PingPong", recipient=BOB, rounds=1)
        with trio.move_on_after(0.5):
            await handle.result()
            pytest.fail("a draining node answered a session init")
        await bob.wait_drained()
        bob.undrain()
        assert await handle.result() == 1


async def test_flows_resume_after_a_node_restart(net: testing.FlowNetwork) -> None:
    alice = net["Alice"].flows
    with trio.fail_after(60):
        handles = [await alice.start_flow(flows.PingPong(recipient=BOB, rounds=5)) for _ in range(50)]
        await trio.sleep(0.05)
        await net.restart("Bob")
        await net.restart("Alice")
        alice = net["Alice"].flows
        for h in handles:
            assert await alice.wait_result(h.flow_id) == 5
    answered = [f.result for f in net["Bob"].flows.flows() if f.flow_name.endswith("PingPongResponder")]
    assert answered.count(5) == len([f for f in answered if f is not None])


async def test_a_client_id_starts_a_flow_once_also_across_a_restart(net: testing.FlowNetwork) -> None:
    """Corda's client id: the same id names the same flow (running, finished, or after a restart) and a
    second start only hands back its handle; the responder ran once."""
    with trio.fail_after(60):
        first = await net["Alice"].flows.start_flow("PingPong", client_id="order-17", recipient=BOB, rounds=2)
        again = await net["Alice"].flows.start_flow("PingPong", client_id="order-17", recipient=BOB, rounds=2)
        assert (first.flow_id, first.started, again.flow_id, again.started) == (
            "C-order-17",
            True,
            "C-order-17",
            False,
        )
        assert await again.result() == 2
        await net.restart("Alice")
        after = await net["Alice"].flows.start_flow("PingPong", client_id="order-17", recipient=BOB, rounds=2)
        assert not after.started and await after.result() == 2
        other = await net["Alice"].flows.start_flow("PingPong", client_id="order-18", recipient=BOB)
        assert other.started and await other.result() == 1
        # the arguments as one mapping (a flow may have an argument named client_id), or as keywords
        args = {"recipient": BOB, "rounds": 3}
        mapped = await net["Alice"].flows.start_flow("PingPong", args, client_id="m")
        assert mapped.flow_id == "C-m" and await mapped.result() == 3
        with pytest.raises(TypeError, match="as keywords or as one mapping, not both"):
            await net["Alice"].flows.start_flow("PingPong", {"recipient": BOB}, rounds=2)
    responders = [f for f in net["Bob"].flows.flows() if f.flow_name.endswith("PingPongResponder")]
    assert sorted(f.result for f in responders) == [1, 2, 3]
    # the id names a flow of another kind: refused (a caller allowed to start Broadcast cannot follow it)
    with pytest.raises(ValueError) as other_kind:
        await net["Alice"].flows.start_flow("Broadcast", client_id="order-17", recipients=[BOB])
    assert str(other_kind.value).endswith(
        "names a corda_trio.flows.PingPong flow, not a corda_trio.flows.Broadcast"
    )
    for bad, got in (
        ("", "got 0 characters"),
        ("x" * 201, "got 201 characters"),
        ("a\x00b", "got U+0000 at character 2"),
        ("order-1\n", "got U+000A at character 8"),
        ("\x1b[31mred", "got U+001B at character 1"),
        ("\x85", "got U+0085 at character 1"),
    ):
        with pytest.raises(ValueError) as info:
            await net["Alice"].flows.start_flow("PingPong", client_id=bad, recipient=BOB)
        assert str(info.value) == f"a client id is 1 to 200 characters without control characters, {got}"


async def test_a_client_id_belongs_to_the_flows_starter_also_across_a_restart(
    net: testing.FlowNetwork,
) -> None:
    """A client id is its starter's: another starter reusing it learns nothing of that flow (not its id, kind
    or result), before it finished, after, and after a restart (the starter is in the checkpoint); the starter
    follows it as before. A flow whose checkpoint records no starter (written before starters were recorded,
    or started by code in the node) is followed only by a start without a starter."""
    alice = net["Alice"].flows
    with trio.fail_after(60):
        mine = await alice.start_flow(
            "PingPong", client_id="order-1", started_by="app1", recipient=BOB, rounds=2
        )

        async def taken(flow: str, started_by: str | None, **args: Any) -> str:
            with pytest.raises(flows.ClientIdTakenError) as info:
                await alice.start_flow(flow, client_id="order-1", started_by=started_by, **args)
            assert "C-order-1" not in str(info.value) and "PingPong" not in str(info.value)
            return str(info.value)

        assert await taken("PingPong", "app2", recipient=BOB, rounds=2) == (
            "client id 'order-1' is taken: it names a flow that another user started; choose another "
            "client id"
        )
        await taken("Broadcast", "app2", recipients=[BOB])  # (its kind is not told either)
        assert await mine.result() == 2
        await taken("PingPong", "app2", recipient=BOB)
        await taken("PingPong", None, recipient=BOB)
        await net.restart("Alice")
        alice = net["Alice"].flows
        await taken("PingPong", "app2", recipient=BOB)
        again = await alice.start_flow("PingPong", client_id="order-1", started_by="app1", recipient=BOB)
        assert not again.started and await again.result() == 2
        listed = {f.flow_id: f for f in alice.flows()}
        assert listed["C-order-1"].started_by == "app1"

        legacy = await alice.start_flow("PingPong", client_id="old", recipient=BOB)
        assert await legacy.result() == 1
        await net.restart("Alice")
        alice = net["Alice"].flows
        with pytest.raises(flows.ClientIdTakenError, match="was started before starters were recorded"):
            await alice.start_flow("PingPong", client_id="old", started_by="app1", recipient=BOB)
        same = await alice.start_flow("PingPong", client_id="old", recipient=BOB)
        assert not same.started and await same.result() == 1


def expected_from_carol(sid: int) -> list[tuple[str, str]]:
    return [
        (CAROL, "field 'payload' must be bytes"),
        (CAROL, "unknown session 424242"),
        (CAROL, f"session {sid} belongs to {BOB}, not to the sender {CAROL}"),
        (CAROL, "not msgpack: "),
    ]


async def _wait_refused(manager: flows.FlowManager, expected: list[tuple[str, str]]) -> None:
    """Wait (at most 10 s) until every (party, reason prefix) in ``expected`` is among the refusals."""

    def missing() -> list[tuple[str, str]]:
        refusals = manager.refusals()
        return [(p, r) for p, r in expected if not any(s == p and x.startswith(r) for s, x in refusals)]

    with trio.move_on_after(10):
        while missing():
            await manager.wait_changed(manager.version)
    assert not missing(), manager.refusals()


async def test_malicious_peer_messages_are_refused_with_reasons(
    net: testing.FlowNetwork, caplog: pytest.LogCaptureFixture
) -> None:
    """Carol and Bob send hand-made session messages to Alice; each is refused with its reason (every one in
    ``refusals()``); the log has one warning per sender in the minute, not one per message; Alice keeps
    serving."""
    caplog.set_level(logging.INFO, logger="corda_trio.flows")
    alice, carol = net["Alice"], net["Carol"]
    with trio.fail_after(30):
        waiting = await alice.flows.start_flow(Waiter(peer=BOB))
        await wait_status(alice.flows, waiting.flow_id, "running")
        # (internal look: Bob's confirm, seq 0, must be in before Bob's forged seq 1)
        session = alice.flows._runners[waiting.flow_id].state.sessions
        while not session or session[0].peer_id is None:
            await alice.flows.wait_changed(alice.flows.version)
        sid = session[0].our_id
        evil_payload = msgpack.packb(msgpack.ExtType(1, msgpack.packb(["os.system", 1, {"cmd": "id"}])))
        forged = [
            msgpack.packb([1, 2, sid, 1, "not bytes"]),  # bad type
            msgpack.packb([1, 5, 424242, 1]),  # unknown session (an end is dropped quietly, so use data)
            msgpack.packb([1, 2, 424242, 1, msgpack.packb("x")]),
            msgpack.packb([1, 2, sid, 9, msgpack.packb("x")]),  # from the wrong party
            b"\xff\x00",
        ]
        service = carol.messaging
        assert service is not None
        for i, data in enumerate(forged):
            await service.send(
                service.create_message(flows.SESSION_TOPIC, data, dedup_id=f"evil-{i}"), alice.name
            )
        # Carol's refusals first: Bob's in-sequence message below fails the waiting flow and ends the session,
        # after which Carol's forged message for it could only be refused as an unknown session
        await _wait_refused(alice.flows, expected_from_carol(sid))
        # Bob's real session: out of sequence, then an unregistered class in sequence (seq 0 is Bob's confirm)
        bob_service = net["Bob"].messaging
        assert bob_service is not None
        for i, data in enumerate(
            [msgpack.packb([1, 5, sid, 7]), msgpack.packb([1, 2, sid, 1, evil_payload])]
        ):
            await bob_service.send(
                bob_service.create_message(flows.SESSION_TOPIC, data, dedup_id=f"bad-{i}"), alice.name
            )
        await _wait_refused(alice.flows, [(BOB, f"out of sequence on session {sid}: expected ")])
        # the in-sequence message naming os.system fails the waiting flow with the type name
        with pytest.raises(flows.FlowException, match=r"payload type 'os\.system' is not registered"):
            await waiting.result()
        handle = await alice.flows.start_flow("PingPong", recipient=CAROL, rounds=2)
        assert await handle.result() == 2
    warned = [
        r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "refused" in r.getMessage()
    ]
    assert [w.split(" refused: ")[0] for w in warned] == [
        f"session message from {CAROL}",
        f"session message from {BOB}",
    ], warned
    assert alice.flows.statistics().refused >= 5


async def test_a_member_cannot_use_up_the_dedup_ids_of_a_flow_between_two_others(
    net: testing.FlowNetwork,
) -> None:
    """A client id makes a flow's dedup ids predictable (they derive from the flow id). Carol sends Bob
    messages under the ids Alice's flow will use; Bob dropped Alice's real init as their duplicate and the
    flow waited for ever. Ids are scoped by their sender: Carol's count only against Carol's."""
    alice, bob, carol = net["Alice"], net["Bob"], net["Carol"]
    flow_id = "C-order-17"
    sid, entropy = derive_id(flow_id, "session", 0), derive_id(flow_id, "entropy", 0)
    service = carol.messaging
    assert service is not None
    with trio.fail_after(30):
        for n in range(1, 8):  # the transitions of PingPong rounds=3 (one message to Bob each)
            dedup_id = flows.normal_dedup_id(f"R-{sid}-{entropy}", n, 0)
            body = msgpack.packb([1, 2, 900 + n, 0, msgpack.packb("squat")])
            await service.send(service.create_message(flows.SESSION_TOPIC, body, dedup_id=dedup_id), bob.name)
        await _wait_refused(bob.flows, [(CAROL, f"unknown session {900 + n}") for n in range(1, 8)])
        handle = await alice.flows.start_flow("PingPong", client_id="order-17", recipient=BOB, rounds=3)
        assert handle.flow_id == flow_id
        assert await handle.result() == 3


async def test_a_flow_ending_before_the_confirm_ends_its_responder_across_restarts(
    net: testing.FlowNetwork,
) -> None:
    """Hasty flows finish (or fail) before Bob, stopped, can confirm; Alice restarts holding their ends and
    errors in her checkpoints; once Bob is back every responder hears how its initiator ended."""
    alice = net["Alice"].flows
    await net.stop("Bob")
    with trio.fail_after(60):
        plans = [(1 + i % 3, f"r{i}" if i % 2 else "") for i in range(6)]
        handles = [await alice.start_flow(Hasty(peer=BOB, notes=n, reason=r)) for n, r in plans]
        for (n, r), h in zip(plans, handles, strict=True):
            if r:
                with pytest.raises(flows.FlowException, match=rf"^{r}$"):
                    await h.result()
            else:
                assert await h.result() == f"sent {n}"
        assert alice.statistics().unconfirmed == len(plans)
        await net.restart("Alice")
        alice = net["Alice"].flows
        assert alice.statistics().unconfirmed == len(plans)
        await net.start("Bob")
        bob = net["Bob"].flows
        expected = sorted(r or ended_text(ALICE) for _n, r in plans)

        def ended() -> list[str]:
            return sorted(
                f.error or "" for f in bob.flows() if f.flow_name == HastyResponder.flow_name
                and f.status == "failed"
            )  # fmt: skip

        version = bob.version
        while ended() != expected:
            version = await bob.wait_changed(version)
        version = alice.version
        while alice.statistics().unconfirmed:
            version = await alice.wait_changed(version)


async def test_kill_releases_a_flow_waiting_for_a_confirm(net: testing.FlowNetwork) -> None:
    """A flow that finished before Bob (stopped) could confirm is killed: it stays completed, no longer waits
    (also after a restart), and Bob's late confirm is refused as for an unknown session."""
    alice = net["Alice"].flows
    await net.stop("Bob")
    with trio.fail_after(60):
        handle = await alice.start_flow(Hasty(peer=BOB, notes=2))
        assert await handle.result() == "sent 2"
        assert alice.statistics().unconfirmed == 1
        await alice.kill(handle.flow_id)
        version = alice.version
        while alice.statistics().unconfirmed:
            version = await alice.wait_changed(version)
        with pytest.raises(flows.UnknownFlowError):
            await alice.kill(handle.flow_id)
        await net.restart("Alice")
        alice = net["Alice"].flows
        assert alice.statistics().unconfirmed == 0
        assert await alice.wait_result(handle.flow_id) == "sent 2"
        await net.start("Bob")
        version = alice.version
        while not any(p == BOB and r.startswith("unknown session") for p, r in alice.refusals()):
            version = await alice.wait_changed(version)


async def test_a_restart_resends_only_outboxes_not_known_to_be_in_the_outbound_queues(
    net: testing.FlowNetwork,
) -> None:
    """After flows finished and their outbox records were deleted, a restart sends nothing again; an outbox
    record left by a crash between a checkpoint and the hand-over is sent at start, once, then deleted."""
    alice = net["Alice"].flows
    with trio.fail_after(60):
        handles = [await alice.start_flow("PingPong", recipient=BOB, rounds=2) for _ in range(20)]
        for h in handles:
            assert await h.result() == 2
        version = alice.version
        while alice.statistics().outbox_records:
            version = await alice.wait_changed(version)
        await net.restart("Alice")
        assert net["Alice"].flows.statistics().resent == 0
        await net.stop("Alice")
        lost = Outgoing(counterparty=BOB, dedup_id="lost-0", wire=msgpack.packb([1, 2, 424242, 0, b"\x01"]))
        async with store.open_broker(net["Alice"].directory / "store") as broker:
            log = await broker.open_keyed_log(flows.CHECKPOINT_LOG)
            await log.put(outbox_key("lost-flow", 3), encode_outbox_record([lost])[0])
        await net.start("Alice")
        alice = net["Alice"].flows
        assert (alice.statistics().resent, alice.statistics().outbox_records) == (1, 1)
        bob = net["Bob"].flows
        version = bob.version
        while (ALICE, "unknown session 424242") not in bob.refusals():
            version = await bob.wait_changed(version)
        version = alice.version
        while alice.statistics().outbox_records:
            version = await alice.wait_changed(version)
        await net.restart("Alice")
        assert net["Alice"].flows.statistics().resent == 0


async def test_bundles_from_a_peer_are_taken_part_by_part_or_refused_whole(net: testing.FlowNetwork) -> None:
    """A bundle's parts are routed one by one (here: to unknown sessions, each refused with its reason); a
    bundle with a malformed part is refused whole, naming the part; Alice keeps serving."""
    alice, carol = net["Alice"], net["Carol"]
    service = carol.messaging
    assert service is not None
    bundles = [
        flows.encode_session_bundle(
            [
                msgpack.packb([1, 2, 777, 0, msgpack.packb("x")]),
                msgpack.packb([1, 2, 778, 0, msgpack.packb("y")]),
            ]
        ),
        flows.encode_session_bundle([msgpack.packb([1, 5, 779, 0]), b"\xff\x00"]),
    ]
    with trio.fail_after(30):
        for i, data in enumerate(bundles):
            message = service.create_message(flows.SESSION_TOPIC, data, dedup_id=f"bundle-{i}")
            await service.send(message, alice.name)
        await _wait_refused(
            alice.flows,
            [
                (CAROL, "unknown session 777"),
                (CAROL, "unknown session 778"),
                (CAROL, "bundle part 1: not msgpack"),
            ],
        )
        assert not any("779" in reason for _p, reason in alice.flows.refusals())
        handle = await alice.flows.start_flow("PingPong", recipient=CAROL, rounds=2)
        assert await handle.result() == 2


async def test_an_end_for_a_session_whose_flow_has_gone_is_dropped_not_counted_as_refused(
    net: testing.FlowNetwork,
) -> None:
    """The peer's end crossing ours after our flow ended and left memory is normal (one per flow whose two
    sides end together): it was counted in ``statistics().refused`` (``/metrics``
    ``corda_trio_flows_session_messages_refused_total``), which so rose with every healthy PingPong."""
    alice, carol = net["Alice"], net["Carol"]
    service = carol.messaging
    assert service is not None
    before = alice.flows.statistics().refused
    with trio.fail_after(30):
        for i, data in enumerate([msgpack.packb([1, 5, 424243, 3]), msgpack.packb([1, 2, 424244, 0, b"x"])]):
            await service.send(
                service.create_message(flows.SESSION_TOPIC, data, dedup_id=f"e-{i}"), alice.name
            )
        await _wait_refused(alice.flows, [(CAROL, "unknown session 424244")])  # (after the end, in order)
    assert not any("424243" in reason for _p, reason in alice.flows.refusals())
    assert alice.flows.statistics().refused == before + 1


@flows.initiating_flow
@attrs.define
class Oversized(flows.FlowLogic[str]):
    """Sends ``size`` bytes to ``peer`` in its first message."""

    peer: str
    size: int

    def call(self, ctx: Any) -> Any:
        s = ctx.initiate_flow(self.peer)
        return ctx.send_and_receive(s, b"x" * self.size, str, then=self.done)

    def done(self, ctx: Any, answer: str) -> Any:
        return ctx.finish(answer)


@flows.initiated_by(Oversized)
@attrs.define
class OversizedResponder(flows.BroadcastResponder):
    pass


@pytest.mark.parametrize(
    "size",
    [
        messaging.DEFAULT_MAX_MESSAGE_SIZE + 1,  # the payload alone is too large
        messaging.DEFAULT_MAX_MESSAGE_SIZE - 200,  # fits, but not with the session and P2P headers around it
    ],
)
async def test_a_message_above_max_message_size_parks_its_flow_before_the_checkpoint(
    net: testing.FlowNetwork, size: int
) -> None:
    alice = net["Alice"].flows
    with trio.fail_after(60):
        handle = await alice.start_flow(Oversized(peer=BOB, size=size))
        info = await wait_status(alice, handle.flow_id, "parked")
        assert info.error is not None and info.error.startswith("MessageTooLargeError: ")
        assert f"max_message_size of {messaging.DEFAULT_MAX_MESSAGE_SIZE} bytes" in info.error
        # nothing of it was committed or queued for Bob
        assert alice.statistics().checkpoint_writes == 0
        assert all(q.depth == 0 for q in net["Alice"].broker.statistics("internal.peers."))
        await alice.kill(handle.flow_id)
        with pytest.raises(flows.FlowException, match="killed by an operator"):
            await handle.result()


async def test_checkpoint_records_with_unreadable_keys_are_listed_and_the_node_starts(
    net: testing.FlowNetwork,
) -> None:
    """A checkpoint key that is not UTF-8, or an outbox key whose transition number is not a number, raised
    out of FlowManager.open (a traceback at node start); like an undecodable checkpoint, such a record is
    listed as parked with the reason and kept, and the other flows run."""
    await net.stop("Alice")
    async with store.open_broker(net["Alice"].directory / "store") as broker:
        log = await broker.open_keyed_log(flows.CHECKPOINT_LOG)
        await log.write([(b"\xff\xfe", b"x"), (b"flow\x00nine", b"y")], [])
    await net.start("Alice")
    alice = net["Alice"].flows
    parked = {i.flow_id: i.error for i in alice.flows() if i.status == "parked"}
    assert set(parked) == {"\\xff\\xfe", "flow\x00nine"}
    assert "unreadable checkpoint key" in parked["\\xff\\xfe"] and "utf-8" in parked["\\xff\\xfe"]
    with trio.fail_after(30):
        handle = await alice.start_flow("PingPong", recipient=BOB, rounds=2)
        assert await handle.result() == 2
    await net.restart("Alice")  # kept as they were
    assert {i.flow_id for i in net["Alice"].flows.flows() if i.status == "parked"} == set(parked)


async def test_live_responders_per_peer_are_bounded_also_after_a_restart(tmp_path: Path) -> None:
    """A member's inits each started a responder that waited for ever, without any bound (5,000 took a node
    from 60 to 102 MB). Beyond ``max_responders_per_peer`` live ones an init is rejected: the initiating flow
    fails with the reason at once; other peers are not affected; the count survives a restart and goes down
    as responders end."""
    config = flows.FlowManagerConfig(retry_initial_seconds=0.05, max_responders_per_peer=3)
    limit_text = (
        r"rejected the session: too many flows from one peer: 3 started by O=Alice, L=London, C=GB are "
        r"running here \(max_responders_per_peer = 3\)"
    )
    async with testing.open_flow_network(tmp_path, [ALICE, BOB, CAROL], flow_config=config) as net:
        alice = net["Alice"].flows
        with trio.fail_after(60):
            for _ in range(3):
                await alice.start_flow(Waiter(peer=BOB))
            bob = net["Bob"].flows
            while bob.statistics().responders < 3:
                await bob.wait_changed(bob.version)
            with pytest.raises(flows.FlowException, match=limit_text):
                await (await alice.start_flow(Waiter(peer=BOB))).result()
            stats = bob.statistics()
            assert (stats.responders, stats.refused_inits, stats.refused) == (3, 1, 1)
            assert bob.refusals()[-1][0] == ALICE
            # another peer is not affected
            assert await (await net["Carol"].flows.start_flow("PingPong", recipient=BOB)).result() == 1
            # after a restart the three still count (from their checkpoints)
            bob = (await net.restart("Bob")).flows
            assert bob.statistics().responders == 3
            with pytest.raises(flows.FlowException, match=limit_text):
                await (await alice.start_flow(Waiter(peer=BOB))).result()
            assert bob.statistics().refused_inits == 1
            # a responder that ends makes room
            silent = next(f.flow_id for f in bob.flows() if f.flow_name == Silent.flow_name)
            assert next(f.initiator for f in bob.flows() if f.flow_id == silent) == ALICE
            await bob.kill(silent)
            with pytest.raises(flows.FlowException):
                await bob.wait_result(silent)
            assert bob.statistics().responders == 2
            assert await (await alice.start_flow("PingPong", recipient=BOB, rounds=2)).result() == 2
            assert bob.statistics().responders == 2
