"""Bridge control protocol: golden vectors, codec round trips, the bridge side's table, the node's diff."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corda_trio import bridge
from corda_trio.bridge import _control as control

VECTORS = json.loads(
    (Path(__file__).resolve().parents[2] / "protocol_spec" / "vectors" / "bridge-control.json").read_text()
)


def build(d: dict[str, Any]) -> Any:
    t = d["type"]
    if t == "QueueQuery":
        return bridge.QueueQuery(query_id=d["query_id"], bridge_id=d["bridge_id"])
    if t == "QueueSnapshot":
        return bridge.QueueSnapshot(
            correlation_id=d["correlation_id"],
            inbox_queues=[bridge.QueueEntry(legal_name=a, queue_name=b) for a, b in d["inbox_queues"]],
            outbound_queues=[
                bridge.BridgeEntry(legal_name=a, queue_name=b, addresses=x)
                for a, b, x in d["outbound_queues"]
            ],
        )
    if t == "BridgeRequest":
        entry = bridge.BridgeEntry(
            legal_name=d["legal_name"], queue_name=d["queue_name"], addresses=d["addresses"]
        )
        return bridge.BridgeRequest(entry=entry)
    if t == "BridgeDelete":
        return bridge.BridgeDelete(legal_name=d["legal_name"], queue_name=d["queue_name"])
    assert t == "UnknownControlMessage"
    return bridge.UnknownControlMessage(descriptor=d["descriptor"])


@pytest.mark.parametrize("case", VECTORS["positive"], ids=lambda c: c["name"])
def test_golden_vectors_encode_and_decode(case: dict[str, Any]) -> None:
    message = build(case["message"])
    assert bridge.encode_control(message).hex() == case["hex"]
    assert bridge.decode_control(bytes.fromhex(case["hex"])) == message


@pytest.mark.parametrize("case", VECTORS["extensions"], ids=lambda c: c["name"])
def test_extension_vectors(case: dict[str, Any]) -> None:
    assert bridge.decode_control(bytes.fromhex(case["hex"])) == build(case["expected"])


@pytest.mark.parametrize("case", VECTORS["negative"], ids=lambda c: c["name"])
def test_negative_vectors(case: dict[str, Any]) -> None:
    with pytest.raises(bridge.ControlProtocolError):
        bridge.decode_control(bytes.fromhex(case["hex"]))


names = st.text(min_size=1, max_size=30)
addresses = st.lists(st.tuples(names, st.integers(0, 65535)), max_size=3)
entries = st.builds(bridge.BridgeEntry, legal_name=names, queue_name=names, addresses=addresses)
messages = st.one_of(
    st.builds(bridge.QueueQuery, query_id=names, bridge_id=names),
    st.builds(
        bridge.QueueSnapshot,
        correlation_id=st.none() | names,
        inbox_queues=st.lists(st.builds(bridge.QueueEntry, legal_name=names, queue_name=names), max_size=3),
        outbound_queues=st.lists(entries, max_size=3),
    ),
    st.builds(bridge.BridgeRequest, entry=entries),
    st.builds(bridge.BridgeDelete, legal_name=names, queue_name=names),
)


@given(messages)
def test_round_trip(message: Any) -> None:
    assert bridge.decode_control(bridge.encode_control(message)) == message


@given(st.binary(max_size=200))
def test_random_bytes_raise_only_the_protocol_error(data: bytes) -> None:
    try:
        bridge.decode_control(data)
    except bridge.ControlProtocolError:
        pass


@pytest.mark.parametrize("state", list(bridge.ControlState))
@pytest.mark.parametrize("event", list(control.ControlInput))
def test_every_state_input_pair_is_legal_or_a_protocol_error(
    state: bridge.ControlState, event: control.ControlInput
) -> None:
    client = bridge.ControlClient(bridge_id="b", state=state)
    if (state, event) in control.TRANSITIONS:
        client._step(event)
        assert client.state in bridge.ControlState
    else:
        with pytest.raises(bridge.ControlProtocolError):
            client._step(event)


E1 = bridge.BridgeEntry(legal_name="O=B, L=X, C=GB", queue_name="internal.peers.DL1", addresses=[("h", 1)])
E2 = bridge.BridgeEntry(legal_name="O=C, L=X, C=GB", queue_name="internal.peers.DL2", addresses=[("h", 2)])
INBOX = bridge.QueueEntry(legal_name="O=A, L=X, C=GB", queue_name="p2p.inbound.DL0")


def test_client_queries_until_answered_then_follows_requests() -> None:
    client = bridge.ControlClient(bridge_id="bridge-a")
    assert client.connected("q-1", now=0.0) == [bridge.QueueQuery(query_id="q-1", bridge_id="bridge-a")]
    assert client.tick(0.5) == []
    assert client.tick(1.0) == [bridge.QueueQuery(query_id="q-1", bridge_id="bridge-a")]  # repeated
    client.receive(bridge.BridgeRequest(entry=E2))  # before the snapshot: the snapshot will include it
    assert client.bridges == {}
    client.receive(bridge.QueueSnapshot(correlation_id="q-0", inbox_queues=[], outbound_queues=[E2]))  # stale
    assert client.state is bridge.ControlState.QUERYING
    client.receive(bridge.QueueSnapshot(correlation_id="q-1", inbox_queues=[INBOX], outbound_queues=[E1]))
    assert client.state is bridge.ControlState.SYNCED
    assert client.bridges == {E1.queue_name: E1} and client.inboxes == (INBOX,)
    assert client.tick(5.0) == []  # answered: no more queries
    version = client.version
    client.receive(bridge.BridgeRequest(entry=E2))
    moved = bridge.BridgeEntry(legal_name=E1.legal_name, queue_name=E1.queue_name, addresses=[("h", 9)])
    client.receive(bridge.BridgeRequest(entry=moved))
    client.receive(bridge.BridgeRequest(entry=moved))  # no change: no new version
    assert client.bridges == {E1.queue_name: moved, E2.queue_name: E2} and client.version == version + 2
    client.receive(bridge.BridgeDelete(legal_name=E2.legal_name, queue_name=E2.queue_name))
    assert client.bridges == {E1.queue_name: moved}
    client.receive(bridge.UnknownControlMessage(descriptor="corda-trio:bridge-control:float-activate:v1"))
    assert client.ignored == 1
    # the node restarted: its unsolicited snapshot replaces everything
    client.receive(bridge.QueueSnapshot(correlation_id=None, inbox_queues=[INBOX], outbound_queues=[E2]))
    assert client.bridges == {E2.queue_name: E2}
    client.disconnected()
    assert client.bridges == {} and client.state is bridge.ControlState.DISCONNECTED
    with pytest.raises(bridge.ControlProtocolError):
        client.receive(bridge.BridgeRequest(entry=E1))
    with pytest.raises(bridge.ControlProtocolError):
        client.receive(bridge.QueueQuery(query_id="x", bridge_id="y"))


@given(
    st.dictionaries(st.sampled_from(["q1", "q2", "q3"]), entries),
    st.dictionaries(st.sampled_from(["q1", "q2", "q3"]), entries),
)
def test_diff_entries_brings_a_synced_client_from_old_to_new(
    old: dict[str, Any], new: dict[str, Any]
) -> None:
    old = {
        k: bridge.BridgeEntry(legal_name=e.legal_name, queue_name=k, addresses=e.addresses)
        for k, e in old.items()
    }
    new = {
        k: bridge.BridgeEntry(legal_name=e.legal_name, queue_name=k, addresses=e.addresses)
        for k, e in new.items()
    }
    client = bridge.ControlClient(bridge_id="b")
    client.connected("q", 0.0)
    client.receive(bridge.QueueSnapshot(correlation_id="q", inbox_queues=[], outbound_queues=old.values()))
    for message in bridge.diff_entries(old, new):
        client.receive(bridge.decode_control(bridge.encode_control(message)))
    assert client.bridges == new
