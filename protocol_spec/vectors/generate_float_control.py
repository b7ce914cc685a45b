# ruff: noqa: E501  (vector tables read better unwrapped)
"""Regenerate ``float-control.json``, the golden vectors of protocol_spec/float-control.md.

    .venv/bin/python protocol_spec/vectors/generate_float_control.py

Each positive vector is a control message (type and fields) or a forwarded-delivery envelope and its exact
encoding; each negative vector is bytes a receiver must refuse and the AMQP condition it answers with. The
encodings were checked by hand against the section layout in float-control.md (properties with subject,
application-properties with ``float-protocol``, one amqp-value map / one Data section).
"""

from __future__ import annotations

import json
from pathlib import Path

from corda_trio import amqp
from corda_trio.bridge import float as fl

INBOX = "p2p.inbound.DLBpB8hPJ6Wx5jS4qgWRFzNgz2BgR1iQtYxTsKn3vFBdC9"
MESSAGES = [
    fl.ActivateFloat(activation_id="a1", tls_ref="node", inboxes=(INBOX,), credit=256),
    fl.DeactivateFloat(reason="operator"),
    fl.FloatActivated(activation_id="a1", public_host="0.0.0.0", public_port=10002),
    fl.FloatActivationFailed(
        activation_id="a1", condition="amqp:not-found", description="no TLS material 'x'"
    ),
    fl.FloatDeactivated(reason="operator"),
]
FORWARDED = [
    fl.ForwardedDelivery(
        source="O=Alice, L=London, C=GB",
        target=INBOX,
        peer="192.0.2.7:40112",
        payload=b"\x00\x53\x75\xa0\x02hi",
    )
]


def _control(type_: str, fields: dict[str, object]) -> bytes:
    return amqp.Message(
        properties=amqp.Properties(subject=type_),
        application_properties={"float-protocol": 1},
        body=amqp.AmqpValue(fields),
    ).encode()


NEGATIVE = [
    ("unknown type", _control("OpenSesame", {}), "amqp:not-implemented"),
    (
        "version 2",
        amqp.Message(
            properties=amqp.Properties(subject="DeactivateFloat"),
            application_properties={"float-protocol": 2},
            body=amqp.AmqpValue({"reason": "x"}),
        ).encode(),
        "amqp:not-implemented",
    ),
    ("missing field", _control("DeactivateFloat", {}), "amqp:invalid-field"),
    ("extra field", _control("DeactivateFloat", {"reason": "x", "why": "y"}), "amqp:invalid-field"),
    ("credit as a string", _control("ActivateFloat", {"activation-id": "a", "tls-ref": "n", "inboxes": [], "credit": "9"}), "amqp:invalid-field"),
    ("zero credit", _control("ActivateFloat", {"activation-id": "a", "tls-ref": "n", "inboxes": [], "credit": 0}), "amqp:invalid-field"),
    ("inboxes not strings", _control("ActivateFloat", {"activation-id": "a", "tls-ref": "n", "inboxes": [1], "credit": 1}), "amqp:invalid-field"),
    ("data body", amqp.Message(properties=amqp.Properties(subject="DeactivateFloat"), application_properties={"float-protocol": 1}, body=b"x").encode(), "amqp:invalid-field"),
]  # fmt: skip


def main() -> None:
    out = {
        "about": "Golden vectors for protocol_spec/float-control.md. control: type + fields (wire names) -> "
        "hex of the AMQP message; forwarded: envelope fields + payload_hex -> hex; negative: hex a receiver "
        "refuses with condition. Regenerate with protocol_spec/vectors/generate_float_control.py.",
        "control": [
            {
                "type": m.TYPE,
                "fields": {k: list(v) if isinstance(v, tuple) else v for k, v in _wire_fields(m).items()},
                "hex": fl.encode_control(m).encode().hex(),
            }
            for m in MESSAGES
        ],
        "forwarded": [
            {"source": f.source, "target": f.target, "peer": f.peer, "payload_hex": f.payload.hex(), "hex": f.encode().hex()}
            for f in FORWARDED
        ],
        "negative": [{"name": n, "hex": b.hex(), "condition": c} for n, b, c in NEGATIVE],
    }  # fmt: skip
    path = Path(__file__).with_name("float-control.json")
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path}")


def _wire_fields(m: fl.ControlMessage) -> dict[str, object]:
    value = fl.encode_control(m).body.value
    return dict(value)


if __name__ == "__main__":
    main()
