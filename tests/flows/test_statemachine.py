"""The pure flow state machine end to end over an in-memory network (tests/flows/memnet.py): example flows,
errors, sleeps and sub-flows; hypothesis over delivery interleavings, duplicated messages and crashes."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corda_trio import flows
from corda_trio.flows import _statemachine as sm
from tests.flows.hasty import Hasty, ended_text
from tests.flows.memnet import MemNet, outgoing_wire
from tests.flows.picky import AskNumber, NumberResponder

A, B, C = "O=Alice, L=London, C=GB", "O=Bob, L=Paris, C=FR", "O=Carol, L=Rome, C=IT"


@flows.payload_type(name="tests.Quote", version=1)
@attrs.frozen
class Quote:
    symbol: str = attrs.field(validator=attrs.validators.instance_of(str))
    price: int = attrs.field(validator=attrs.validators.instance_of(int))


@flows.initiating_flow
@attrs.define
class SleepyAsk(flows.FlowLogic[Any]):
    """Sleeps, runs a PingPong as a sub-flow, then asks for a Quote."""

    peer: str
    pause: float = 5.0
    pongs: int = 0
    session: flows.FlowSession | None = None

    def call(self, ctx: Any) -> Any:
        return ctx.sleep(self.pause, then=self.woke)

    def woke(self, ctx: Any, _: None) -> Any:
        return ctx.sub_flow(flows.PingPong(recipient=self.peer, rounds=2), then=self.after_sub)

    def after_sub(self, ctx: Any, pongs: int) -> Any:
        self.pongs = pongs
        self.session = ctx.initiate_flow(self.peer)
        return ctx.send_and_receive(self.session, "IBM", Quote, then=self.got)

    def got(self, ctx: Any, quote: Quote) -> Any:
        return ctx.finish([self.pongs, quote])


@flows.initiated_by(SleepyAsk)
@attrs.define
class QuoteResponder(flows.FlowLogic[None]):
    session: flows.FlowSession

    def call(self, ctx: Any) -> Any:
        return ctx.receive(self.session, str, then=self.answer)

    def answer(self, ctx: Any, symbol: str) -> Any:
        return ctx.send(self.session, Quote(symbol=symbol, price=42), then=self.done)

    def done(self, ctx: Any, _: None) -> Any:
        return ctx.finish(None)


def test_ping_pong_completes() -> None:
    net = MemNet.of(A, B)
    fid = net.start(A, flows.PingPong(recipient=B, rounds=5))
    net.run()
    assert net.nodes[A].results == {fid: 5}
    assert list(net.nodes[B].results.values()) == [5]
    assert not net.nodes[A].states and not net.nodes[B].states


def test_broadcast_collects_answers_in_order() -> None:
    net = MemNet.of(A, B, C)
    fid = net.start(A, flows.Broadcast(recipients=f"{C};{B}", message="hi"))
    net.run()
    assert net.nodes[A].results[fid] == [f"{C} got hi", f"{B} got hi"]


def test_flow_exception_reaches_the_initiator_with_its_message() -> None:
    net = MemNet.of(A, B)
    fid = net.start(A, flows.FailingFlow(recipient=B, reason="no credit for you"))
    net.run()
    error = net.nodes[A].results[fid]
    assert isinstance(error, flows.FlowException) and str(error) == "no credit for you"
    (responder_result,) = net.nodes[B].results.values()
    assert str(responder_result) == "no credit for you"


def test_sleep_sub_flow_and_registered_payload() -> None:
    net = MemNet.of(A, B)
    fid = net.start(A, SleepyAsk(peer=B, pause=5.0))
    net.run()
    assert not net.nodes[A].results and net.nodes[A].states[fid].wake_at == 5.0
    net.crash(A)  # the wake-up time is in the checkpoint
    net.tick(4.9)
    net.run()
    assert not net.nodes[A].results
    net.tick(0.2)
    net.run()
    assert net.nodes[A].results[fid] == [2, Quote(symbol="IBM", price=42)]


def test_unknown_responder_type_mismatch_and_validation() -> None:
    @flows.initiating_flow
    @attrs.define
    class WantsInt(flows.FlowLogic[int]):
        peer: str

        def call(self, ctx: Any) -> Any:
            s = ctx.initiate_flow(self.peer)
            return ctx.send_and_receive(s, "ping 0/1", int, then=self.got)

        def got(self, ctx: Any, value: int) -> Any:
            return ctx.finish(value)

    flows.registry.responders[WantsInt.flow_name] = flows.PingPongResponder
    try:
        net = MemNet.of(A, B)
        fid = net.start(A, WantsInt(peer=B))
        net.run()
        error = net.nodes[A].results[fid]
        assert "expected a int from O=Bob, L=Paris, C=FR, got a str" in str(error)
    finally:
        del flows.registry.responders[WantsInt.flow_name]


def test_refusals_name_their_reason() -> None:
    net = MemNet.of(A, B)
    net.start(A, SleepyAsk(peer=B, pause=0.0))
    net.tick(0)
    # the init is on the wire; let it through and take Bob's confirm + pong off the link
    net.deliver((A, B))
    bob = net.nodes[B]
    (state,) = bob.states.values() if bob.states else (None,)
    confirm_and_pong = list(net.links[(B, A)])
    assert len(confirm_and_pong) == 2
    alice = net.nodes[A]
    (astate,) = alice.states.values()
    sid = next(iter(astate.sessions.values())).our_id
    out_of_seq = flows.encode_session_message(
        flows.ExistingSessionMessage(recipient_session_id=sid, seq=5, payload=flows.EndPayload())
    )
    net.receive(B, A, out_of_seq)
    net.receive(C, A, confirm_and_pong[0][1])  # right bytes, wrong sender
    net.receive(B, A, b"\x93\x01\x09\x00")  # unknown kind
    net.receive(B, A, flows.encode_session_message(
        flows.ExistingSessionMessage(recipient_session_id=12345, seq=0, payload=flows.EndPayload())
    ))  # fmt: skip
    assert alice.refused == [
        f"out of sequence on session {sid}: expected 0, got 5",
        f"session {sid} belongs to {B}, not to the sender {C}",
        "unknown session message kind 9",
        "unknown session 12345",
    ]
    del state
    net.run()  # the real messages still complete the flow
    assert list(alice.results.values()) == [[2, Quote(symbol="IBM", price=42)]]


def test_unregistered_payload_class_fails_the_receiver_with_the_type_name() -> None:
    net = MemNet.of(A, B)
    fid = net.start(A, flows.PingPong(recipient=B, rounds=1))
    (_, wire) = net.links[(A, B)].popleft()
    init = flows.decode_session_message(wire)
    # A forged init whose payload names a class nobody registered.
    import msgpack

    evil = msgpack.packb(msgpack.ExtType(1, msgpack.packb(["os.system", 1, {"command": "rm -rf /"}])))
    forged = attrs.evolve(init, first_payload=None, has_payload=False)
    raw = msgpack.unpackb(flows.encode_session_message(forged))
    raw[7] = evil
    net.receive(A, B, msgpack.packb(raw, use_bin_type=True))
    net.run()
    error = net.nodes[A].results[fid]
    assert "payload type 'os.system' is not registered" in str(error)


# --------------------------------------------------------------------------- properties


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), rounds=st.integers(1, 4), n_flows=st.integers(1, 4))
def test_any_interleaving_duplicates_and_crashes_complete_exactly_once(
    data: st.DataObject, rounds: int, n_flows: int
) -> None:
    """Links are FIFO per (sender, recipient) as bridges keep them; everything else is up to hypothesis:
    which link delivers next, copies of any earlier message, and crashes (resume from checkpoints, resend
    the outbox). Every flow completes with the right result and every responder answered each ping once."""
    net = MemNet.of(A, B, C)
    ids = [
        net.start(A, flows.PingPong(recipient=B, rounds=rounds)) if i % 2 == 0
        else net.start(A, flows.Broadcast(recipients=[B, C], message=f"m{i}"))
        for i in range(n_flows)
    ]  # fmt: skip
    for _ in range(400):
        links = net.pending()
        if not links:
            break
        choice = data.draw(st.integers(0, 9))
        if choice == 0 and net.history:
            sender, recipient, _, wire = data.draw(st.sampled_from(net.history))
            net.receive(sender, recipient, wire)
        elif choice == 1:
            net.crash(data.draw(st.sampled_from([A, B, C])))
        else:
            net.deliver(data.draw(st.sampled_from(sorted(links))))
    net.run()
    results = net.nodes[A].results
    for i, fid in enumerate(ids):
        expected = rounds if i % 2 == 0 else [f"{B} got m{i}", f"{C} got m{i}"]
        assert results[fid] == expected
    assert sorted(v for v in net.nodes[B].results.values() if isinstance(v, int)) == [rounds] * len(ids[::2])
    for node in net.nodes.values():
        assert not node.hospital
        # copies injected ahead of their original on a link are out of sequence: dropped, harmlessly
        assert all(r.startswith(("unknown session", "out of sequence")) for r in node.refused), node.refused
    # A message resent after a crash is the same message: same dedup id, same bytes.
    by_id: dict[str, bytes] = {}
    for _s, _r, dedup_id, wire in net.history:
        assert by_id.setdefault(dedup_id, wire) == wire


@settings(max_examples=40, deadline=None)
@given(rounds=st.integers(1, 5), crash_every=st.integers(1, 3))
def test_checkpoint_round_trip_resumes_to_the_same_behaviour(rounds: int, crash_every: int) -> None:
    """Decoding every checkpoint and going on from it sends exactly what the uninterrupted run sends."""

    def run(crash: bool) -> list[tuple[str, bytes]]:
        net = MemNet.of(A, B)
        net.counter = 0
        net.start(A, SleepyAsk(peer=B, pause=1.0))
        net.tick(1.0)
        steps = 0
        while net.pending():
            net.deliver(sorted(net.pending())[0])
            steps += 1
            if crash and steps % crash_every == 0:
                for node in net.nodes.values():
                    for fid, data in node.checkpoints.items():
                        if fid in node.states:
                            node.states[fid] = flows.decode_checkpoint(data)
                            assert flows.encode_checkpoint(node.states[fid]) == data
        return [(d, w) for _s, _r, d, w in net.history]

    assert run(False) == run(True)


def test_every_state_and_event_kind_gives_a_legal_result() -> None:
    """Each event kind against each stage of a flow: a transition or a refusal, never an exception."""
    net = MemNet.of(A, B)
    net.start(A, flows.PingPong(recipient=B, rounds=2))
    (state,) = net.nodes[A].states.values()
    data = net.nodes[A].checkpoints[state.flow_id]
    sid = next(iter(state.sessions.values())).our_id
    env = sm.Environment(our_name=A)
    payloads: list[Any] = [
        flows.ConfirmPayload(initiated_session_id=1, flow_version=1, app_name="x"),
        flows.DataPayload(payload="pong 0"),
        flows.ErrorPayload(error_id=1, exception_type=None, message=None),
        flows.RejectPayload(error_id=1, message="no"),
        flows.EndPayload(),
    ]
    events: list[Any] = [sm.TimerFired(now=1.0), sm.Kill(reason="operator", now=1.0), sm.Start(now=0.0)]
    for p in payloads:
        for seq in (0, 1, 7):
            m = flows.ExistingSessionMessage(recipient_session_id=sid, seq=seq, payload=p)
            events.append(sm.MessageArrived(sender=B, message=m, token=seq, now=1.0))
    for event in events:
        t = sm.transition(flows.decode_checkpoint(data), event, env)
        kinds = {type(a) for a in t.actions}
        assert sm.SendToHospital not in kinds, (event, t.actions)
        if isinstance(event, sm.MessageArrived) and event.message.seq == 7:
            assert [type(a) for a in t.actions] == [sm.AcknowledgeMessages, sm.RefuseMessage]


@pytest.mark.parametrize("bad", [b"", b"\xc1", b"\x90", b"\x92\x02\x00", b"\x94\x01\x05\xa1x\x00"])
def test_malformed_session_messages_raise_protocol_errors(bad: bytes) -> None:
    with pytest.raises(flows.SessionProtocolError):
        flows.decode_session_message(bad)


# --------------------------------------------------------------------------- ended before the confirm


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), plans=st.lists(st.tuples(st.integers(1, 3), st.booleans()), min_size=1, max_size=4))
def test_a_flow_ending_before_the_confirm_still_ends_its_responder(
    data: st.DataObject, plans: list[tuple[int, bool]]
) -> None:
    """Each ``Hasty`` finishes (or fails) in its first transition, before any confirm can arrive; with any
    interleaving, copies and crashes of any node, every responder still receives the notes in order and then
    the initiator's end (or error), and every held message leaves the initiator's checkpoint."""
    net = MemNet.of(A, B, C)
    ids = [
        net.start(A, Hasty(peer=(B, C)[i % 2], notes=notes, reason=f"r{i}" if fails else ""))
        for i, (notes, fails) in enumerate(plans)
    ]
    for _ in range(400):
        links = net.pending()
        if not links:
            break
        choice = data.draw(st.integers(0, 9))
        if choice == 0 and net.history:
            sender, recipient, _, wire = data.draw(st.sampled_from(net.history))
            net.receive(sender, recipient, wire)
        elif choice == 1:
            net.crash(data.draw(st.sampled_from([A, B, C])))
        else:
            net.deliver(data.draw(st.sampled_from(sorted(links))))
    net.run()
    alice = net.nodes[A]
    for i, ((notes, fails), fid) in enumerate(zip(plans, ids, strict=True)):
        result = alice.results[fid]
        assert (str(result) if fails else result) == (f"r{i}" if fails else f"sent {notes}")
    responders = [str(v) for n in (B, C) for v in net.nodes[n].results.values()]
    expected = [f"r{i}" if fails else ended_text(A) for i, (_n, fails) in enumerate(plans)]
    assert sorted(responders) == sorted(expected)
    for node in net.nodes.values():
        assert not node.states and not node.hospital
        assert all(r.startswith(("unknown session", "out of sequence")) for r in node.refused), node.refused
    for checkpoint in alice.checkpoints.values():
        assert not flows.decode_checkpoint(checkpoint).unflushed
    by_id: dict[str, bytes] = {}
    for _s, _r, dedup_id, wire in net.history:
        assert by_id.setdefault(dedup_id, wire) == wire


def test_a_reject_drops_what_a_finished_flow_held_for_the_confirm() -> None:
    net = MemNet.of(A, B)
    fid = net.start(A, Hasty(peer=B, notes=2))
    ((_, init_wire),) = net.links[(A, B)]
    net.links[(A, B)].clear()
    alice = net.nodes[A]
    assert alice.results[fid] == "sent 2" and alice.states[fid].unflushed
    init = flows.decode_session_message(init_wire)
    reject = flows.ExistingSessionMessage(
        recipient_session_id=init.initiator_session_id, seq=0,
        payload=flows.RejectPayload(error_id=7, message="not here"),
    )  # fmt: skip
    net.receive(B, A, flows.encode_session_message(reject))
    assert not alice.states and not net.pending()
    state = flows.decode_checkpoint(alice.checkpoints[fid])
    assert not state.unflushed
    assert state.sessions[0].peer_error == (None, f"{B} rejected the session: not here")


def test_a_kill_drops_what_a_finished_flow_held_for_the_confirm() -> None:
    """An operator gives up on a confirm that does not come: the held end and data go, the record stays
    completed, and a confirm arriving afterwards is refused as for an unknown session."""
    net = MemNet.of(A, B)
    fid = net.start(A, Hasty(peer=B, notes=2))
    ((_, init_wire),) = net.links[(A, B)]
    state = net.nodes[A].states[fid]
    assert state.finished and state.unflushed
    t = sm.transition(state, sm.Kill(reason="operator", now=1.0), sm.Environment(our_name=A))
    assert t.actions == (sm.PersistCheckpoint(),)
    assert not t.state.unflushed and t.state.status == "completed" and t.state.result == "sent 2"
    init = flows.decode_session_message(init_wire)
    confirm = flows.ExistingSessionMessage(
        recipient_session_id=init.initiator_session_id, seq=0,
        payload=flows.ConfirmPayload(initiated_session_id=5, flow_version=1, app_name=""),
    )  # fmt: skip
    t = sm.transition(t.state, sm.MessageArrived(sender=B, message=confirm, token="tok", now=2.0),
                      sm.Environment(our_name=A))  # fmt: skip
    assert [type(a) for a in t.actions] == [sm.AcknowledgeMessages, sm.RefuseMessage]
    assert t.actions[1].reason.startswith(f"unknown session {init.initiator_session_id}")  # type: ignore[union-attr]


def test_a_kill_of_a_responder_parked_before_its_confirm_sends_the_confirm_then_the_error() -> None:
    """The step that would send a responder's confirm went to the hospital, so its checkpoint still owes the
    confirm. A kill sent the error alone, with the confirm's sequence number (0): the initiator refused it,
    not confirmed yet, and waited for ever; the killed responder stayed unconfirmed. Now the confirm goes
    first."""
    net = MemNet.of(A, B)
    fid = net.start(A, AskNumber(peer=B, value="abc"))
    ((_, init_wire),) = net.links[(A, B)]
    init = flows.decode_session_message(init_wire)
    assert isinstance(init, flows.InitialSessionMessage)
    parked = flows.new_responder(A, init, NumberResponder)
    checkpoint = flows.encode_checkpoint(parked)  # what a parked responder resumes from
    env = sm.Environment(our_name=B)
    t = sm.transition(parked, sm.Start(now=0.0), env)
    assert [type(a) for a in t.actions] == [sm.SendToHospital]
    t = sm.transition(flows.decode_checkpoint(checkpoint), sm.Kill(reason="operator", now=1.0), env)
    (sent,) = [a for a in t.actions if isinstance(a, sm.SendMessages)]
    messages = [o.message for o in sent.messages]
    assert [(type(m.payload), m.seq) for m in messages] == [  # type: ignore[union-attr]
        (flows.ConfirmPayload, 0), (flows.ErrorPayload, 1),
    ]  # fmt: skip
    assert t.state.status == "failed" and not t.state.unflushed
    for o in sent.messages:
        net.receive(B, A, outgoing_wire(o))
    alice = net.nodes[A]
    assert str(alice.results[fid]) == flows.COUNTER_FLOW_ERRORED and not alice.refused and not alice.states


# --- data a flow has not received yet is bounded per session ------------------------------------------------


def _broadcast_with_a_flooding_peer(settings: dict[str, int]) -> tuple[MemNet, str, int]:
    """Alice broadcasts to Bob and Carol. Bob's answer stays on the wire (Alice's receive_all waits for it);
    Carol is hand-driven: she confirms, then each data message she sends is held by Alice. Returns the
    network, the flow id and Alice's session id for Carol."""
    net = MemNet.of(A, B, C)
    net.settings = settings
    fid = net.start(A, flows.Broadcast(recipients=f"{B};{C}", message="hi"))
    net.deliver((A, B))  # Bob's responder answers; its answer waits on the link
    net.links[(A, C)].clear()  # Carol's side is scripted
    sid = net.nodes[A].states[fid].sessions[1].our_id
    confirm = flows.ConfirmPayload(initiated_session_id=777, flow_version=1, app_name="")
    net.receive(C, A, flows.encode_session_message(flows.ExistingSessionMessage(
        recipient_session_id=sid, seq=0, payload=confirm)))  # fmt: skip
    return net, fid, sid


def _carol_sends(net: MemNet, sid: int, seq: int, value: Any) -> None:
    data = flows.DataPayload(payload=value)
    message = flows.ExistingSessionMessage(recipient_session_id=sid, seq=seq, payload=data)
    net.receive(C, A, flows.encode_session_message(message))


def test_a_session_holding_too_many_messages_overflows_and_tells_the_peer() -> None:
    """Data a peer sent ahead of the flow was held without bound, and every checkpoint wrote all of it again:
    now the session overflows beyond the limit, the peer gets an error naming it, the flow goes on and fails
    with it when it receives from that session."""
    net, fid, sid = _broadcast_with_a_flooding_peer({"max_unconsumed_messages": 3})
    for seq in range(1, 4):
        _carol_sends(net, sid, seq, f"spam {seq}")
    session = net.nodes[A].states[fid].sessions[1]
    assert session.received == ["spam 1", "spam 2", "spam 3"] and not net.links[(A, C)]
    _carol_sends(net, sid, 4, "spam 4")
    text = (
        f"{C} sent more data on session {sid} than {A} holds before its flow receives it (4 messages, "
        f"{3 * 7 + 7} bytes; at most 3 messages and {sm.MAX_UNCONSUMED_BYTES} bytes): the session is closed"
    )
    ((_dedup, wire),) = net.links[(A, C)]
    error = flows.decode_session_message(wire)
    assert isinstance(error, flows.ExistingSessionMessage) and error.recipient_session_id == 777
    assert error.payload == flows.ErrorPayload(
        error_id=error.payload.error_id, exception_type=sm.SESSION_OVERFLOW_ERROR_TYPE, message=text
    )
    session = net.nodes[A].states[fid].sessions[1]
    assert (session.received, session.received_sizes, session.closed) == ([], [], True)
    _carol_sends(net, sid, 5, "more")  # the session is closed: refused, nothing more held or sent
    assert net.nodes[A].refused[-1] == f"session {sid} was ended by the peer: data not allowed"
    assert len(net.links[(A, C)]) == 1
    net.run()  # Bob's answer: receive_all takes it, then fails on Carol's session with the reason
    result = net.nodes[A].results[fid]
    assert isinstance(result, flows.FlowException) and str(result) == text


def test_a_session_holding_too_many_bytes_overflows_but_one_message_of_any_size_is_taken() -> None:
    net, fid, sid = _broadcast_with_a_flooding_peer({"max_unconsumed_bytes": 100})
    _carol_sends(net, sid, 1, "x" * 500)  # nothing held yet: taken, whatever its size
    assert net.nodes[A].states[fid].sessions[1].received_bytes == 503
    _carol_sends(net, sid, 2, "")
    assert net.nodes[A].states[fid].sessions[1].closed
    net.run()
    assert "(2 messages, 504 bytes; at most 1000 messages and 100 bytes)" in str(net.nodes[A].results[fid])


def test_data_within_the_limits_is_held_across_a_crash_and_received() -> None:
    net, fid, sid = _broadcast_with_a_flooding_peer({"max_unconsumed_messages": 2})
    _carol_sends(net, sid, 1, "first")
    _carol_sends(net, sid, 2, "second")
    net.crash(A)  # the sizes come back with the checkpoint
    assert net.nodes[A].states[fid].sessions[1].received_sizes == [6, 7]
    net.run()
    assert net.nodes[A].results[fid] == [f"{B} got hi", "first"]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lengths=st.lists(st.integers(0, 120), min_size=1, max_size=12),
    max_messages=st.integers(1, 6),
    max_bytes=st.integers(1, 400),
    crash_at=st.integers(0, 12),
)
def test_held_data_never_exceeds_the_limits(
    lengths: list[int], max_messages: int, max_bytes: int, crash_at: int
) -> None:
    """Whatever a peer sends ahead (sizes, counts, a crash in between), a session holds at most the limits
    (one message of any size when it held nothing), overflows exactly when the model says, sends one error,
    and the flow's outcome follows."""
    settings_ = {"max_unconsumed_messages": max_messages, "max_unconsumed_bytes": max_bytes}
    net, fid, sid = _broadcast_with_a_flooding_peer(settings_)
    held: list[int] = []  # the model: sizes held
    overflowed = False
    first: str | None = None
    for seq, n in enumerate(lengths, start=1):
        value = "y" * n
        size = len(flows.encode_payload(value))
        refused = len(net.nodes[A].refused)
        _carol_sends(net, sid, seq, value)
        if overflowed:  # refused (closed; then out of sequence, as refused messages do not count)
            assert len(net.nodes[A].refused) == refused + 1
        elif held and (len(held) >= max_messages or sum(held) + size > max_bytes):
            overflowed, held = True, []
        else:
            held.append(size)
            first = value if first is None else first
        if seq == crash_at:
            net.crash(A)
        session = net.nodes[A].states[fid].sessions[1]
        assert session.received_sizes == held and len(session.received) == len(held)
        assert len(held) <= max_messages and (len(held) <= 1 or sum(held) <= max_bytes)
        assert session.closed is overflowed
        errors = {d for d, _w in net.links[(A, C)]}  # (a crash sends the last outbox again: same id)
        assert len(errors) == (1 if overflowed else 0)
    net.run()
    result = net.nodes[A].results[fid]
    if overflowed:
        assert isinstance(result, flows.FlowException) and "the session is closed" in str(result)
    else:
        assert result == [f"{B} got hi", first]


def test_by_default_a_session_holds_a_thousand_messages_not_more() -> None:
    net, fid, sid = _broadcast_with_a_flooding_peer({})
    for seq in range(1, 1001):
        _carol_sends(net, sid, seq, "s")
    assert len(net.nodes[A].states[fid].sessions[1].received) == 1000 and not net.links[(A, C)]
    _carol_sends(net, sid, 1001, "s")
    assert net.nodes[A].states[fid].sessions[1].received == [] and len(net.links[(A, C)]) == 1


@pytest.mark.parametrize(
    ("flow", "payload", "reason"),
    [
        # int() refuses more than 4,300 digits: a ValueError parked the responder
        (flows.PingPong, "ping 0/" + "9" * 5000, "expected 'ping 0/<rounds, at most 10000>'"),
        # an echo near the network's max_message_size did not fit it: parked when its send was checked
        (flows.Broadcast, "x" * 10_001, "a broadcast message has at most 10000 characters, got 10001"),
    ],
)
def test_a_peer_cannot_park_the_shipped_responders(flow: Any, payload: str, reason: str) -> None:
    """A parked flow keeps its messages unacknowledged in the inbox (they take inbox credit): a member that
    could park responders at will could stop a node taking any P2P message. The shipped responders refuse
    such input with a FlowException (the peer is told) instead."""
    init = flows.InitialSessionMessage(
        initiator_session_id=1, initiation_entropy=2, initiator_flow_class_name=flow.flow_name,
        flow_version=1, app_name="", first_payload=payload, has_payload=True,
    )  # fmt: skip
    state = flows.new_responder(C, init, flows.registry.responders[flow.flow_name])
    t = sm.transition(state, sm.Start(now=0.0), sm.Environment(our_name=B))
    assert not any(isinstance(a, sm.SendToHospital) for a in t.actions), t.actions
    (failed,) = [a for a in t.actions if isinstance(a, sm.FailFlow)]
    assert reason in failed.message
