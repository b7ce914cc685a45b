# ruff: noqa: E501  (vector tables read better unwrapped)
"""Regenerate ``flow-sessions.json``, the golden vectors of protocol_spec/flow-sessions.md.

    .venv/bin/python protocol_spec/vectors/generate_flow_sessions.py

The bytes are built with plain ``msgpack.packb`` from the array layouts the document gives (not with
``corda_trio.flows``), so the tests check the codec against the document. Payload bytes are msgpack of the
value; ``ext 1`` payloads are ``[wire name, version, {field: value}]``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgpack

OUT = Path(__file__).with_name("flow-sessions.json")
SID_A = 0x1234_5678_9ABC_DEF0
SID_B = 0x0FED_CBA9_8765_4321
ENTROPY = 0x5555_AAAA_5555_AAAA


def pack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


QUOTE = pack(msgpack.ExtType(1, pack(["tests.Quote", 1, {"symbol": "IBM", "price": 42}])))

VALID: list[dict[str, Any]] = [
    {
        "name": "init-with-payload",
        "description": "session init from PingPong carrying its first payload, the str 'ping 0/1'",
        "kind": "init",
        "fields": {"initiator_session_id": SID_A, "initiation_entropy": ENTROPY,
                   "initiator_flow_class_name": "corda_trio.flows.PingPong", "flow_version": 1,
                   "app_name": "corda-trio", "first_payload": "ping 0/1"},
        "array": [1, 0, SID_A, ENTROPY, "corda_trio.flows.PingPong", 1, "corda-trio", pack("ping 0/1")],
    },
    {
        "name": "init-without-payload",
        "description": "session init of a flow that receives first (no first payload: nil)",
        "kind": "init",
        "fields": {"initiator_session_id": 7, "initiation_entropy": 9,
                   "initiator_flow_class_name": "example.Receiver", "flow_version": 3, "app_name": "app",
                   "first_payload": None},
        "array": [1, 0, 7, 9, "example.Receiver", 3, "app", None],
    },
    {
        "name": "confirm",
        "description": "the responder confirms: its session id, flow version and app name; seq 0",
        "kind": "confirm",
        "fields": {"recipient_session_id": SID_A, "seq": 0, "initiated_session_id": SID_B, "flow_version": 1,
                   "app_name": "corda-trio"},
        "array": [1, 1, SID_A, 0, SID_B, 1, "corda-trio"],
    },
    {
        "name": "data-str",
        "description": "data 'pong 0' on the initiator's session, seq 1",
        "kind": "data",
        "fields": {"recipient_session_id": SID_A, "seq": 1, "payload": "pong 0"},
        "array": [1, 2, SID_A, 1, pack("pong 0")],
    },
    {
        "name": "data-registered-type",
        "description": "data holding the registered payload type tests.Quote v1 (msgpack ext 1)",
        "kind": "data",
        "fields": {"recipient_session_id": SID_B, "seq": 2, "payload": {"$quote": ["IBM", 42]}},
        "array": [1, 2, SID_B, 2, QUOTE],
    },
    {
        "name": "error-flow-exception",
        "description": "a FlowException reaches the counterparty with its type and message",
        "kind": "error",
        "fields": {"recipient_session_id": SID_A, "seq": 1, "error_id": 77,
                   "exception_type": "corda_trio.flows._errors.FlowException", "message": "no credit"},
        "array": [1, 3, SID_A, 1, 77, "corda_trio.flows._errors.FlowException", "no credit"],
    },
    {
        "name": "error-counter-flow",
        "description": "any other error: type and message nil (the receiver says 'counter-flow errored')",
        "kind": "error",
        "fields": {"recipient_session_id": SID_A, "seq": 4, "error_id": 78, "exception_type": None,
                   "message": None},
        "array": [1, 3, SID_A, 4, 78, None, None],
    },
    {
        "name": "reject",
        "description": "an init for a flow the responder does not know is rejected with a reason",
        "kind": "reject",
        "fields": {"recipient_session_id": SID_A, "seq": 0, "error_id": 5,
                   "message": "no responder is registered for flow 'x.Y'"},
        "array": [1, 4, SID_A, 0, 5, "no responder is registered for flow 'x.Y'"],
    },
    {
        "name": "end",
        "description": "the sender closed its end of the session, seq 3",
        "kind": "end",
        "fields": {"recipient_session_id": SID_B, "seq": 3},
        "array": [1, 5, SID_B, 3],
    },
]  # fmt: skip

INVALID: list[dict[str, Any]] = [
    {"name": "not-an-array", "array": {"a": 1}, "error": "a session message is a msgpack array [format, kind, ...]"},
    {"name": "format-2", "array": [2, 5, 1, 0], "error": "unknown session message format 2"},
    {"name": "kind-9", "array": [1, 9, 1, 0], "error": "unknown session message kind 9"},
    {"name": "end-too-long", "array": [1, 5, 1, 0, 0], "error": "a end message has 4 fields, not 5"},
    {"name": "negative-session", "array": [1, 5, -1, 0],
     "error": "field 'recipient_session_id' must be an integer in 0..9223372036854775807, got -1"},
    {"name": "seq-str", "array": [1, 5, 1, "0"],
     "error": "field 'seq' must be an integer in 0..9223372036854775807, got '0'"},
    {"name": "data-payload-str", "array": [1, 2, 1, 0, "x"], "error": "field 'payload' must be bytes"},
    {"name": "init-class-int", "array": [1, 0, 1, 2, 3, 1, "app", None],
     "error": "field 'initiator_flow_class_name' must be a string, got int"},
]  # fmt: skip

BAD_PAYLOADS: list[dict[str, Any]] = [
    {"name": "unregistered-class", "payload": pack(msgpack.ExtType(1, pack(["os.system", 1, {"cmd": "id"}]))),
     "error": "payload type 'os.system' is not registered"},
    {"name": "wrong-version", "payload": pack(msgpack.ExtType(1, pack(["tests.Quote", 2, {}]))),
     "error": "payload type 'tests.Quote' version 2 is not the registered version 1"},
    {"name": "checkpoint-only-ext", "payload": pack(msgpack.ExtType(3, pack(["x", 1, {}]))),
     "error": "unknown msgpack extension type 3"},
    {"name": "bad-field-type", "payload": pack(msgpack.ExtType(1, pack(["tests.Quote", 1, {"symbol": 1, "price": 2}]))),
     "error": "payload type 'tests.Quote': "},
]  # fmt: skip


def _part(name: str) -> bytes:
    return pack(next(e["array"] for e in VALID if e["name"] == name))


#: bundles: several session messages to one node in one P2P message, ``[1, 6, [message bytes, ...]]``
BUNDLES: list[dict[str, Any]] = [
    {"name": "confirm-data-end", "description": "a responder's first transition: confirm, 'pong 0', end",
     "parts": ["confirm", "data-str", "end"]},
    {"name": "init-and-data", "description": "an init, then data on an existing session",
     "parts": ["init-without-payload", "data-registered-type"]},
]  # fmt: skip

INVALID_BUNDLES: list[dict[str, Any]] = [
    {"name": "one-part", "array": [1, 6, [_part("end")]],
     "error": "a bundle holds an array of at least two session messages (bin)"},
    {"name": "part-not-bin", "array": [1, 6, [_part("end"), [1, 5, 1, 0]]],
     "error": "a bundle holds an array of at least two session messages (bin)"},
    {"name": "nested", "array": [1, 6, [_part("end"), pack([1, 6, [_part("end"), _part("end")]])]],
     "error": "bundle part 1: a bundle is not a session message here (a bundle cannot hold one)"},
    {"name": "bad-part", "array": [1, 6, [_part("end"), pack([1, 5, 1, 0, 0])]],
     "error": "bundle part 1: a end message has 4 fields, not 5"},
    {"name": "too-long", "array": [1, 6, [_part("end"), _part("end")], 0],
     "error": "a bundle message has 3 fields, not 4"},
]  # fmt: skip


def main() -> None:
    doc = {
        "description": "Golden vectors of protocol_spec/flow-sessions.md (generated by generate_flow_sessions.py)",
        "valid": [{k: v for k, v in e.items() if k != "array"} | {"hex": pack(e["array"]).hex()} for e in VALID],
        "invalid": [{"name": e["name"], "hex": pack(e["array"]).hex(), "error": e["error"]} for e in INVALID],
        "bad_payloads": [
            {"name": e["name"], "hex": pack([1, 2, 1, 0, e["payload"]]).hex(), "error": e["error"]}
            for e in BAD_PAYLOADS
        ],
        "bundles": [
            {"name": e["name"], "description": e["description"], "parts": e["parts"],
             "hex": pack([1, 6, [_part(n) for n in e["parts"]]]).hex()}
            for e in BUNDLES
        ],
        "invalid_bundles": [
            {"name": e["name"], "hex": pack(e["array"]).hex(), "error": e["error"]} for e in INVALID_BUNDLES
        ],
    }  # fmt: skip
    OUT.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
