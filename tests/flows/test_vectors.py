"""The golden vectors of protocol_spec/flow-sessions.md: encode and decode both ways, refusals with
reasons."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import attrs
import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from corda_trio import flows
from corda_trio.flows import _codec
from corda_trio.flows._messages import BadPayload
from corda_trio.flows._statemachine import new_responder
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


@flows.payload_type(name="tests.Box", version=1)
@attrs.frozen
class Box:
    inner: Any


def _boxes(depth: int) -> Any:
    value: Any = None
    for _ in range(depth):
        value = Box(inner=value)
    return value


def _nested_lists(depth: int) -> Any:
    value: Any = None
    for _ in range(depth):
        value = [value]
    return value


def test_registered_payloads_nest_up_to_the_limit_and_no_further() -> None:
    limit = _codec.MAX_PAYLOAD_EXT_DEPTH
    assert flows.decode_payload(flows.encode_payload(_boxes(limit))) == _boxes(limit)
    with pytest.raises(flows.PayloadError, match=f"nested more than {limit} deep"):
        flows.encode_payload(_boxes(limit + 1))
    # the same depth built by hand (as a peer would) is refused when read
    data = msgpack.packb(None)
    for _ in range(limit + 1):
        data = msgpack.packb(
            msgpack.ExtType(1, msgpack.packb(["tests.Box", 1, {"inner": msgpack.ExtType(1, data)}]))
        )
    with pytest.raises(flows.PayloadError, match=f"nested more than {limit} deep"):
        flows.decode_payload(data)


def test_a_payload_nesting_hundreds_of_ext_levels_is_a_bad_payload_not_a_crash(tmp_path: Path) -> None:
    """A 2 KB data message whose payload nests 200 ext levels (the type need not exist: the contents are read
    before the name) overflowed the C stack (SIGSEGV: the node died, and again at each restart while the
    message waited in its inbox). In a child process, so that a crash fails this test only."""
    script = tmp_path / "deep.py"
    script.write_text(
        "import msgpack\n"
        "from corda_trio import flows\n"
        "inner = msgpack.packb(None)\n"
        "for _ in range(200):\n"
        "    inner = msgpack.packb(msgpack.ExtType(1, msgpack.packb(['x', 1, msgpack.ExtType(1, inner)])))\n"
        "message = flows.decode_session_message(msgpack.packb([1, 2, 77, 0, inner]))\n"
        "print(message.payload.payload.reason)\n"
    )
    root = str(Path(__file__).resolve().parents[2])
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": root},
    )  # fmt: skip
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert (
        done.stdout.strip()
        == f"registered payload types nested more than {_codec.MAX_PAYLOAD_EXT_DEPTH} deep"
    )


def test_what_a_peer_may_send_can_be_checkpointed_and_deeper_arrays_are_a_bad_payload() -> None:
    """msgpack reads arrays nested 1024 deep but a checkpoint holds a received payload a few levels down,
    where the packer refuses them: the responder was parked (holding the init in the inbox) instead of
    failing. A bad payload not consumed yet could not be checkpointed either."""
    limit = _codec.MAX_PAYLOAD_NESTING
    for depth, readable in ((limit, True), (limit + 1, False), (1024, False)):
        wire = msgpack.packb(
            [1, 0, 5, 6, "corda_trio.flows.PingPong", 1, "", msgpack.packb(_nested_lists(depth))]
        )
        init = flows.decode_session_message(wire)
        assert isinstance(init, flows.InitialSessionMessage)
        if readable:
            assert init.first_payload == _nested_lists(depth)
        else:
            assert init.first_payload == BadPayload(reason=f"arrays and maps nested more than {limit} deep")
        state = new_responder("O=Mallory, L=Rome, C=IT", init, flows.PingPongResponder)
        again = flows.decode_checkpoint(flows.encode_checkpoint(state))
        assert again.sessions[0].received == [init.first_payload]


def test_outer_nesting_past_msgpack_s_bound_is_refused_with_that_reason() -> None:
    with pytest.raises(flows.SessionProtocolError) as info:
        flows.decode_session_message(b"\x91" * 5000 + b"\xc0")
    assert str(info.value) == "not msgpack: arrays and maps nested too deeply"
