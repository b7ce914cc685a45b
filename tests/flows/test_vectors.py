"""The golden vectors of protocol_spec/flow-sessions.md: encode and decode both ways, refusals with
reasons."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corda_trio import flows
from corda_trio.flows._messages import BadPayload
from tests.flows.test_statemachine import Quote

VECTORS = json.loads(
    (Path(__file__).resolve().parents[2] / "protocol_spec" / "vectors" / "flow-sessions.json").read_text()
)


def _payload(value: Any) -> Any:
    if isinstance(value, dict) and "$quote" in value:
        return Quote(*value["$quote"])
    return value


def _message(kind: str, f: dict[str, Any]) -> flows.InitialSessionMessage | flows.ExistingSessionMessage:
    if kind == "init":
        return flows.InitialSessionMessage(
            initiator_session_id=f["initiator_session_id"], initiation_entropy=f["initiation_entropy"],
            initiator_flow_class_name=f["initiator_flow_class_name"], flow_version=f["flow_version"],
            app_name=f["app_name"], first_payload=f["first_payload"],
            has_payload=f["first_payload"] is not None,
        )  # fmt: skip
    payload: Any
    if kind == "confirm":
        payload = flows.ConfirmPayload(
            initiated_session_id=f["initiated_session_id"],
            flow_version=f["flow_version"],
            app_name=f["app_name"],
        )
    elif kind == "data":
        payload = flows.DataPayload(payload=_payload(f["payload"]))
    elif kind == "error":
        payload = flows.ErrorPayload(
            error_id=f["error_id"], exception_type=f["exception_type"], message=f["message"]
        )
    elif kind == "reject":
        payload = flows.RejectPayload(error_id=f["error_id"], message=f["message"])
    else:
        payload = flows.EndPayload()
    return flows.ExistingSessionMessage(
        recipient_session_id=f["recipient_session_id"], seq=f["seq"], payload=payload
    )


@pytest.mark.parametrize("case", VECTORS["valid"], ids=lambda c: c["name"])
def test_valid_vectors(case: dict[str, Any]) -> None:
    message = _message(case["kind"], case["fields"])
    assert flows.encode_session_message(message).hex() == case["hex"]
    assert flows.decode_session_message(bytes.fromhex(case["hex"])) == message


@pytest.mark.parametrize("case", VECTORS["invalid"], ids=lambda c: c["name"])
def test_invalid_vectors_are_refused_with_their_reason(case: dict[str, Any]) -> None:
    with pytest.raises(flows.SessionProtocolError) as info:
        flows.decode_session_message(bytes.fromhex(case["hex"]))
    assert str(info.value) == case["error"]


@pytest.mark.parametrize("case", VECTORS["bad_payloads"], ids=lambda c: c["name"])
def test_bad_payloads_become_bad_payload_with_the_type_name(case: dict[str, Any]) -> None:
    message = flows.decode_session_message(bytes.fromhex(case["hex"]))
    assert isinstance(message, flows.ExistingSessionMessage)
    assert isinstance(message.payload, flows.DataPayload)
    bad = message.payload.payload
    assert isinstance(bad, BadPayload) and bad.reason.startswith(case["error"])


payload_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=False) | st.text()
    | st.binary() | st.builds(Quote, symbol=st.text(), price=st.integers(-100, 100)),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)  # fmt: skip


@given(payload_values)
def test_payload_round_trip(value: Any) -> None:
    assert flows.decode_payload(flows.encode_payload(value)) == value


@given(st.binary(max_size=64))
def test_random_bytes_give_a_message_or_a_protocol_error(data: bytes) -> None:
    try:
        flows.decode_session_message(data)
    except flows.SessionProtocolError:
        pass


def test_unregistered_class_cannot_be_sent() -> None:
    class Plain:
        pass

    with pytest.raises(flows.PayloadError, match="register it with @payload_type"):
        flows.encode_payload([Plain()])


_BY_NAME = {c["name"]: c for c in VECTORS["valid"]}


@pytest.mark.parametrize("case", VECTORS["bundles"], ids=lambda c: c["name"])
def test_bundle_vectors(case: dict[str, Any]) -> None:
    parts = [_BY_NAME[name] for name in case["parts"]]
    wires = [bytes.fromhex(p["hex"]) for p in parts]
    assert flows.encode_session_bundle(wires).hex() == case["hex"]
    decoded = flows.decode_session_messages(bytes.fromhex(case["hex"]))
    assert decoded == [(_message(p["kind"], p["fields"]), w) for p, w in zip(parts, wires, strict=True)]


@pytest.mark.parametrize("case", VECTORS["invalid_bundles"], ids=lambda c: c["name"])
def test_invalid_bundles_are_refused_with_their_reason(case: dict[str, Any]) -> None:
    with pytest.raises(flows.SessionProtocolError) as info:
        flows.decode_session_messages(bytes.fromhex(case["hex"]))
    assert str(info.value) == case["error"]


def test_a_single_message_decodes_as_a_list_of_one() -> None:
    case = _BY_NAME["end"]
    data = bytes.fromhex(case["hex"])
    assert flows.decode_session_messages(data) == [(_message("end", case["fields"]), data)]
    with pytest.raises(ValueError, match="at least two"):
        flows.encode_session_bundle([data])
