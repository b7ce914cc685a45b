"""Every golden vector of protocol_spec/vectors read by an independent AMQP 1.0 codec (Qpid Proton-C through
``proton.Data`` / ``proton.Message``), and the same values written by Proton read by ours.

``tests/amqp/test_vectors_amqp.py``, ``tests/bridge/test_control.py`` and ``tests/float/test_control.py``
check that our encoder writes exactly the vector bytes and our decoder reads them back; a vector that both
our sides agreed on but that means something else to another implementation would pass those. Here the
meaning comes from the specs, written out independently of our codecs (the bridge and float control
layouts below are transcribed from protocol_spec/bridge-control.md §2 and float-control.md §1 item 3-4).

Known Proton-binding limits worked around: ``Data.get_object`` fails on a map with binary keys (it builds a
dict of memoryviews), so values are walked with Data's cursor; ``Message.encode`` always writes a header
and properties section.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import proton
import pytest
from proton import Data

from corda_trio import amqp
from corda_trio.bridge import _control as bridge_control
from corda_trio.bridge import float as fl

from ..amqp.test_proton_interop_codec import from_proton, proton_encode, to_proton
from ..amqp.test_vectors_amqp import VECTORS, expected

pytestmark = pytest.mark.interop

ROOT = Path(__file__).resolve().parents[2]
BRIDGE = json.loads((ROOT / "protocol_spec/vectors/bridge-control.json").read_text(encoding="utf-8"))
FLOAT = json.loads((ROOT / "protocol_spec/vectors/float-control.json").read_text(encoding="utf-8"))


# --- Proton's reading --------------------------------------------------------------------------------------


def _walk(d: Data) -> Any:
    """The value at Data's cursor in our representation (maps by cursor: binary keys stay hashable)."""
    kind = d.type()
    if kind == Data.MAP:
        count = d.get_map()
        d.enter()
        out = {}
        for _ in range(count // 2):
            d.next()
            key = _walk(d)
            d.next()
            out[key] = _walk(d)
        d.exit()
        return out
    if kind == Data.LIST:
        count = d.get_list()
        d.enter()
        items = []
        for _ in range(count):
            d.next()
            items.append(_walk(d))
        d.exit()
        return items
    if kind == Data.DESCRIBED:
        d.enter()
        d.next()
        descriptor = _walk(d)
        d.next()
        value = _walk(d)
        d.exit()
        return amqp.Described(descriptor, value)
    return from_proton(d.get_object())


def proton_values(data: bytes) -> list[Any]:
    """Every top-level value Proton reads from ``data``, which it must consume exactly."""
    values = []
    offset = 0
    while offset < len(data):
        d = Data()
        consumed = d.decode(data[offset:])
        assert consumed > 0
        offset += consumed
        d.rewind()
        d.next()
        values.append(_walk(d))
    assert offset == len(data)
    return values


def proton_value(data: bytes) -> Any:
    (value,) = proton_values(data)
    return value


#: AMQP 1.0 §1.2: a descriptor is a symbol or its numeric code; the symbolic names the vectors use.
SYMBOLIC_DESCRIPTORS = {"amqp:accepted:list": 0x24}
#: AMQP 1.0 §3.2.1: the header's defaults, which a sender may write out (RabbitMQ writes durable=false).
FIELD_DEFAULTS = {0x70: {0: False, 1: amqp.UByte(4), 3: False, 4: amqp.UInt(0)}}


def generic(value: Any) -> Any:
    """A value as a plain AMQP value: a known described type (performative, outcome, section) as
    ``Described(code, fields)``, a symbolic descriptor as its code, a header field at its default as null,
    trailing nulls dropped (AMQP 1.0 §1.4:
    they may be left out, and the captures of RabbitMQ send them). Proton's reading of our canonical
    encoding of a spec value is the yardstick, so every known described type needs no table here."""
    if isinstance(value, amqp.Described):
        descriptor = value.descriptor
        if isinstance(descriptor, amqp.Symbol) and descriptor in SYMBOLIC_DESCRIPTORS:
            descriptor = amqp.ULong(SYMBOLIC_DESCRIPTORS[descriptor])
        fields = value.value
        if isinstance(fields, list):
            defaults = FIELD_DEFAULTS.get(descriptor, {})
            fields = [None if defaults.get(i, ...) == f else generic(f) for i, f in enumerate(fields)]
            while fields and fields[-1] is None:
                fields.pop()
        else:
            fields = generic(fields)
        return amqp.Described(descriptor, fields)
    if isinstance(value, list):
        return [generic(v) for v in value]
    if isinstance(value, dict):
        return {generic(k): generic(v) for k, v in value.items()}
    return value


def spec_meaning(value: Any) -> Any:
    """What a vector's value is as plain AMQP (a known described class via its canonical encoding)."""
    plain = value
    if type(value).__module__.startswith("corda_trio.amqp") and hasattr(value, "__attrs_attrs__"):
        plain = proton_value(amqp.encode_value(value))
    return generic(plain)


def proton_written(value: Any) -> bytes:
    """``value`` (plain AMQP) encoded by Proton, in its own choice of encodings."""
    return proton_encode(to_proton(value))


# --- amqp-codec.json ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("vec", VECTORS["values"], ids=[v["name"] for v in VECTORS["values"]])
def test_value_vectors_mean_the_same_to_proton(vec: dict[str, Any]) -> None:
    value = expected(vec["value"])
    got = proton_value(bytes.fromhex(vec["hex"]))
    assert generic(got) == spec_meaning(value)
    if not isinstance(got, amqp.Described):  # a scalar keeps its AMQP type (UInt is not ULong)
        assert type(got) is type(value)
    theirs = proton_written(spec_meaning(value))
    assert amqp.decode_value(theirs) == (value, len(theirs))


@pytest.mark.parametrize(
    "vec",
    [v for v in VECTORS["frames"] if not v.get("protocol_header")],
    ids=[v["name"] for v in VECTORS["frames"] if not v.get("protocol_header")],
)
def test_frame_vectors_mean_the_same_to_proton(vec: dict[str, Any]) -> None:
    data = bytes.fromhex(vec["hex"])
    size, doff, frame_type, channel = int.from_bytes(data[:4], "big"), data[4], data[5], data[6:8]
    assert (size, frame_type, int.from_bytes(channel, "big")) == (len(data), vec["type"], vec["channel"])
    performative = expected(vec["performative"])
    body = data[doff * 4 :]
    if performative is None:  # the empty (heartbeat) frame
        assert body == b""
        return
    assert generic(proton_value(body)) == spec_meaning(performative)
    theirs = proton_written(spec_meaning(performative))
    header = (8 + len(theirs)).to_bytes(4, "big") + bytes((2, frame_type)) + channel
    assert amqp.decode_frame(header + theirs) == amqp.Frame(vec["type"], vec["channel"], performative, b"")


def _sections(message: amqp.Message) -> list[Any]:
    return [generic(s) for s in proton_values(message.encode())]


@pytest.mark.parametrize("vec", VECTORS["messages"], ids=[v["name"] for v in VECTORS["messages"]])
def test_message_vectors_mean_the_same_to_proton(vec: dict[str, Any]) -> None:
    message = expected(vec["value"])
    data = bytes.fromhex(vec["hex"])
    sections = [generic(s) for s in proton_values(data)]
    assert sections == _sections(message)
    theirs = b"".join(proton_written(s) for s in sections)
    assert amqp.Message.decode(theirs) == message
    if data:
        pm = proton.Message()
        pm.decode(data)  # Proton's message layer takes it too


# --- bridge-control.json (protocol_spec/bridge-control.md §2) ---------------------------------------------

_BRIDGE_PREFIX = "corda-trio:bridge-control:"


def _bridge_entry(legal_name: str, queue_name: str, addresses: list[list[Any]]) -> list[Any]:
    return [legal_name, queue_name, [[host, amqp.UInt(port)] for host, port in addresses]]


def bridge_wire(message: dict[str, Any]) -> amqp.Described:
    """The spec's layout: a described list, descriptor ``corda-trio:bridge-control:<name>:v1``, strings as
    ``string``, ports as ``uint``."""
    kind = message["type"]
    if kind == "QueueQuery":
        name, fields = "queue-query", [message["query_id"], message["bridge_id"]]
    elif kind == "QueueSnapshot":
        name = "queue-snapshot"
        fields = [
            message["correlation_id"],
            [[legal, queue] for legal, queue in message["inbox_queues"]],
            [_bridge_entry(*entry) for entry in message["outbound_queues"]],
        ]
    elif kind == "BridgeRequest":
        name = "bridge-request"
        fields = _bridge_entry(message["legal_name"], message["queue_name"], message["addresses"])
    else:
        assert kind == "BridgeDelete"
        name, fields = "bridge-delete", [message["legal_name"], message["queue_name"]]
    return amqp.Described(amqp.Symbol(f"{_BRIDGE_PREFIX}{name}:v1"), fields)


def _proton_amqp_value(body: Any, *, subject: str | None = None, properties: Any = None) -> bytes:
    """A message written by Proton's message layer (it adds a header and a properties section)."""
    pm = proton.Message(subject=subject, properties=properties)
    pm.body = to_proton(body)
    return pm.encode()  # type: ignore[no-any-return]


@pytest.mark.parametrize("vec", BRIDGE["positive"], ids=[v["name"] for v in BRIDGE["positive"]])
def test_bridge_control_vectors_mean_the_same_to_proton(vec: dict[str, Any]) -> None:
    data = bytes.fromhex(vec["hex"])
    pm = proton.Message()
    pm.decode(data)
    assert pm.durable is False and pm.inferred is False  # no header: not durable; one amqp-value
    wire = bridge_wire(vec["message"])
    assert proton_values(data) == [amqp.Described(amqp.ULong(0x77), wire)]  # no other section
    ours = bridge_control.decode_control(data)
    assert bridge_control.decode_control(_proton_amqp_value(wire)) == ours


@pytest.mark.parametrize("vec", BRIDGE["extensions"], ids=[v["name"] for v in BRIDGE["extensions"]])
def test_bridge_control_extension_vectors_decode_in_proton(vec: dict[str, Any]) -> None:
    data = bytes.fromhex(vec["hex"])
    (section,) = proton_values(data)
    assert section.descriptor == 0x77 and isinstance(section.value, amqp.Described)
    assert isinstance(section.value.descriptor, amqp.Symbol)
    assert bridge_control.decode_control(_proton_amqp_value(section.value)) == bridge_control.decode_control(
        data
    )


# --- float-control.json (protocol_spec/float-control.md §1 items 3 and 4) ---------------------------------

_FLOAT_TYPES = {
    c.TYPE: c
    for c in (
        fl.ActivateFloat,
        fl.DeactivateFloat,
        fl.FloatActivated,
        fl.FloatActivationFailed,
        fl.FloatDeactivated,
    )
}


@pytest.mark.parametrize("vec", FLOAT["control"], ids=[v["type"] for v in FLOAT["control"]])
def test_float_control_vectors_mean_the_same_to_proton(vec: dict[str, Any]) -> None:
    data = bytes.fromhex(vec["hex"])
    pm = proton.Message()
    pm.decode(data)
    assert pm.subject == vec["type"]
    assert pm.properties == {"float-protocol": 1}
    assert type(pm.properties["float-protocol"]) is int  # a long
    assert pm.inferred is False  # one amqp-value body
    # the body: a map from field name to value in the spec's order, strings as ``string``, integers as
    # ``long`` (a plain int here, not Int), lists as ``list`` of ``string``
    body = from_proton(pm.body)
    assert body == vec["fields"] and list(body) == list(vec["fields"])
    for value in body.values():
        assert type(value) in (str, int) or (type(value) is list and all(type(v) is str for v in value))
    expected_message = _FLOAT_TYPES[vec["type"]](**{k.replace("-", "_"): v for k, v in vec["fields"].items()})
    theirs = _proton_amqp_value(vec["fields"], subject=vec["type"], properties={"float-protocol": 1})
    assert fl.decode_control(amqp.Message.decode(theirs)) == expected_message


@pytest.mark.parametrize("vec", FLOAT["forwarded"], ids=[v["peer"] for v in FLOAT["forwarded"]])
def test_forwarded_delivery_vectors_mean_the_same_to_proton(vec: dict[str, Any]) -> None:
    data = bytes.fromhex(vec["hex"])
    pm = proton.Message()
    pm.decode(data)
    assert pm.subject == "ForwardedDelivery"
    assert pm.properties == {
        "float-protocol": 1,
        "float-source": vec["source"],
        "float-target": vec["target"],
        "float-peer": vec["peer"],
    }
    assert pm.inferred is True and bytes(pm.body) == bytes.fromhex(vec["payload_hex"])  # one data section
    # written by Proton's message layer (with its header and properties sections), read by ours
    theirs = proton.Message(subject="ForwardedDelivery", properties=pm.properties, inferred=True)
    theirs.body = bytes.fromhex(vec["payload_hex"])
    envelope = fl.ForwardedDelivery.decode(theirs.encode())
    assert envelope == fl.ForwardedDelivery.decode(data)


@pytest.mark.parametrize("vec", FLOAT["negative"], ids=[v["name"] for v in FLOAT["negative"]])
def test_float_negative_vectors_are_whole_amqp_messages(vec: dict[str, Any]) -> None:
    """A refused vector is refused for the reason it names, not because it is not AMQP at all."""
    proton.Message().decode(bytes.fromhex(vec["hex"]))
