"""Hypothesis state machines for link credit and session windows, and the (state x input) tables."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from corda_trio import amqp
from corda_trio.amqp import _state
from corda_trio.testing import ConnectionPair


class CreditAndWindows(RuleBasedStateMachine):
    """Random grants, sends, settlements, frame sizes and byte splits between two of our engines."""

    def __init__(self) -> None:
        super().__init__()
        self.pair = ConnectionPair(
            amqp.ConnectionConfig(max_frame_size=512, incoming_window=3),
            amqp.ConnectionConfig(max_frame_size=700, incoming_window=5, sasl_mechanisms=("PLAIN",)),
        )
        self.pair.open()
        ch, och = self.pair.begin("client")
        self.sh, self.rh = self.pair.attach("client", ch, och, sender_at="client")
        self.ch, self.och = ch, och
        self.sent: list[bytes] = []
        self.received: list[bytes] = []
        self.unsettled: list[int] = []
        self.outcomes = 0
        self.last_count = 0

    @property
    def sender_link(self):  # type: ignore[no-untyped-def]
        return self.pair.client.link(self.ch, self.sh)

    @property
    def receiver_link(self):  # type: ignore[no-untyped-def]
        return self.pair.server.link(self.och, self.rh)

    def pump(self, chunk: int | None) -> None:
        self.pair.chunk = chunk
        client_events, server_events = self.pair.pump()
        for e in server_events:
            if isinstance(e, amqp.DeliveryReceived):
                self.received.append(e.payload)
                if not e.settled:
                    self.unsettled.append(e.delivery_id)
        self.outcomes += sum(isinstance(e, amqp.DeliverySettled) for e in client_events)

    @rule(credit=st.integers(0, 20), chunk=st.one_of(st.none(), st.integers(1, 300)))
    def grant(self, credit: int, chunk: int | None) -> None:
        self.pair.server.flow(self.och, self.rh, credit=credit)
        self.pump(chunk)

    @precondition(lambda self: self.sender_link.link_credit > 0)
    @rule(size=st.integers(0, 3000), settled=st.booleans(), pump=st.booleans())
    def send(self, size: int, settled: bool, pump: bool) -> None:
        payload = bytes([len(self.sent) % 256]) * size
        self.pair.client.send_transfer(self.ch, self.sh, payload, settled=settled)
        self.sent.append(payload)
        if pump:
            self.pump(None)

    @precondition(lambda self: bool(self.unsettled))
    @rule(n=st.integers(1, 5), chunk=st.one_of(st.none(), st.integers(1, 50)))
    def settle(self, n: int, chunk: int | None) -> None:
        for did in self.unsettled[:n]:
            self.pair.server.settle(self.och, did)
        del self.unsettled[:n]
        self.pump(chunk)

    @rule()
    def pump_all(self) -> None:
        self.pump(None)

    @invariant()
    def credit_never_negative_and_count_only_grows(self) -> None:
        assert self.sender_link.link_credit >= 0
        assert self.receiver_link.link_credit >= 0
        count = self.sender_link.delivery_count
        assert count >= self.last_count  # no wrap in these short runs
        self.last_count = count

    @invariant()
    def windows_never_negative(self) -> None:
        for conn in (self.pair.client, self.pair.server):
            for channel in (0,):
                session = conn.session(channel)
                assert session.incoming_window >= 0
                assert session.remote_incoming_window >= 0

    @invariant()
    def delivered_in_order_and_views_agree_when_quiet(self) -> None:
        assert self.received == self.sent[: len(self.received)]
        if not self.pair.client.wants_write and not self.pair.server.wants_write:
            if not self.pair.client.session(self.ch).blocked:
                assert self.received == self.sent
                assert self.sender_link.link_credit == self.receiver_link.link_credit
                assert self.sender_link.delivery_count == self.receiver_link.delivery_count


TestCreditAndWindows = CreditAndWindows.TestCase
TestCreditAndWindows.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)


TABLES = [
    (_state.CONNECTION_TRANSITIONS, _state.ConnectionState, _state.ConnectionInput),
    (_state.SESSION_TRANSITIONS, _state.SessionState, _state.SessionInput),
    (_state.LINK_TRANSITIONS, _state.LinkState, _state.LinkInput),
]


@pytest.mark.parametrize("table,states,inputs", TABLES)
def test_every_state_input_pair_is_a_transition_or_an_error(table, states, inputs) -> None:  # type: ignore[no-untyped-def]
    """h2 style: every (state, input) pair moves to a legal state or raises and leaves the state alone."""
    for state, event in itertools.product(states, inputs):
        machine = _state.StateMachine("t", table, state)
        if (state, event) in table:
            assert machine.process(event) in states
        else:
            with pytest.raises(amqp.LocalProtocolError) as info:
                machine.process(event)
            assert info.value.condition == amqp.Condition.ILLEGAL_STATE
            assert machine.state is state


def test_markdown_rendering() -> None:
    text = _state.transition_table_markdown(_state.LINK_TRANSITIONS)
    assert "| DETACHED | `A:send` | ATTACH_SENT |" in text


@settings(max_examples=300, deadline=None)
@given(
    prefix=st.sampled_from([b"", amqp.AMQP_HEADER, amqp.SASL_HEADER]),
    data=st.binary(max_size=300),
    split=st.integers(0, 300),
)
def test_random_bytes_only_raise_remote_protocol_error(prefix: bytes, data: bytes, split: int) -> None:
    """The h11 fuzz invariant: whatever a client sends, the server engine raises nothing but
    RemoteProtocolError, and after it every later input is ignored quietly."""
    server = amqp.Connection(amqp.ConnectionConfig(allow_bare_amqp=True), client=False)
    blob = prefix + data
    try:
        server.receive_data(blob[:split])
        server.receive_data(blob[split:])
    except amqp.RemoteProtocolError:
        server.data_to_send()
        server.receive_data(b"more garbage")
        server.receive_data(b"")
        assert server.closed


@settings(max_examples=100, deadline=None)
@given(split_points=st.lists(st.integers(1, 50), max_size=20))
def test_a_split_point_never_changes_the_events(split_points: list[int]) -> None:
    """A whole conversation fed in random pieces yields the same events as fed at once."""

    def conversation(chunks: list[int] | None) -> list[str]:
        pair = ConnectionPair()
        pair.open()
        ch, och = pair.begin("client")
        sh, _ = pair.attach("client", ch, och, sender_at="client", credit=3)
        for i in range(3):
            pair.client.send_transfer(ch, sh, bytes([i]) * (100 * i))
        raw = pair.client.data_to_send()
        events: list[amqp.Event] = []
        if chunks is None:
            events = pair.server.receive_data(raw)
        else:
            pos = 0
            for n in [*chunks, len(raw)]:
                events += pair.server.receive_data(raw[pos : pos + n])
                pos += n
                if pos >= len(raw):
                    break
        return [repr(e) for e in events]

    assert conversation(split_points) == conversation(None)
