# ruff: noqa: E501  (vector tables read better unwrapped)
"""Regenerate ``amqp-codec.json``, the golden vectors of protocol_spec/amqp-codec.md.

    .venv/bin/python protocol_spec/vectors/generate_amqp_codec.py [CAPTURES_DIR]

Sources: hand-checked spec encodings (listed below), and the bytes real peers sent (Qpid Proton-C 0.40,
RabbitMQ 3.10 and rhea 3.0.5 captures, kept in ``captures/`` beside this file). Every capture-derived message is
decoded by Proton too, and the generator stops if Proton and corda_trio disagree, so the expected values are
checked against an independent implementation. The captures' bytes are copied into the JSON; a test checks
that every frame the peers sent in the probes is among the vectors and decodes to the captured performative.

Values are written as Python expressions over the names exported by ``corda_trio.amqp`` (plus ``UUID``):
``repr()`` of the decoded value, which the tests ``eval`` in that namespace only.
"""

from __future__ import annotations

import json
import re
import sys
import uuid
from pathlib import Path
from typing import Any

from corda_trio import amqp
from corda_trio.amqp import (
    Array,
    Byte,
    Char,
    Decimal32,
    Decimal64,
    Decimal128,
    Described,
    Float,
    Int,
    Short,
    Symbol,
    Timestamp,
    UByte,
    UInt,
    ULong,
    UShort,
)  # fmt: skip

HERE = Path(__file__).resolve().parent
U = uuid.UUID("00112233-4455-6677-8899-aabbccddeeff")

# (name, spec section, value): canonical; our encoding is the expected hex (checked by hand, see the doc).
VALUES: list[tuple[str, str, Any]] = [
    ("null", "1.6.1", None),
    ("true", "1.6.2", True),
    ("false", "1.6.2", False),
    ("ubyte", "1.6.3", UByte(7)),
    ("ushort", "1.6.4", UShort(0x1234)),
    ("uint0", "1.6.5", UInt(0)),
    ("smalluint", "1.6.5", UInt(255)),
    ("uint", "1.6.5", UInt(256)),
    ("ulong0", "1.6.6", ULong(0)),
    ("smallulong", "1.6.6", ULong(1)),
    ("ulong max", "1.6.6", ULong(2**64 - 1)),
    ("byte", "1.6.7", Byte(-1)),
    ("short", "1.6.8", Short(-2)),
    ("smallint", "1.6.9", Int(-128)),
    ("int", "1.6.9", Int(128)),
    ("smalllong 0", "1.6.10", 0),
    ("smalllong -128", "1.6.10", -128),
    ("long", "1.6.10", 128),
    ("long min", "1.6.10", -(2**63)),
    ("float", "1.6.11", Float(1.5)),
    ("double", "1.6.12", 1.5),
    ("double -0.0", "1.6.12", -0.0),
    ("decimal32", "1.6.13", Decimal32(b"\x22\x50\x00\x01")),
    ("decimal64", "1.6.14", Decimal64(b"\x01" * 8)),
    ("decimal128", "1.6.15", Decimal128(b"\x02" * 16)),
    ("char", "1.6.16", Char("€")),
    ("timestamp", "1.6.17", Timestamp(1311704463521)),
    ("uuid", "1.6.18", U),
    ("vbin8 empty", "1.6.19", b""),
    ("vbin8", "1.6.19", b"\x01\x02"),
    ("vbin32", "1.6.19", b"x" * 256),
    ("str8 empty", "1.6.20", ""),
    ("str8 utf-8", "1.6.20", "héllo"),
    ("str32", "1.6.20", "y" * 300),
    ("sym8", "1.6.21", Symbol("PLAIN")),
    ("sym32", "1.6.21", Symbol("s" * 256)),
    ("list0", "1.6.22", []),
    ("list8", "1.6.22", [None, True]),
    ("list32", "1.6.22", [0] * 200),
    ("map8 empty", "1.6.23", {}),
    ("map8", "1.6.23", {Symbol("a"): 1}),
    ("map32", "1.6.23", {f"k{i}": i for i in range(60)}),
    ("array8 sym8", "1.6.24", Array("symbol", [Symbol("ANONYMOUS")])),
    ("array8 uint", "1.6.24", Array("uint", [UInt(1), UInt(300)])),
    ("array8 smalluint", "1.6.24", Array("uint", [UInt(1), UInt(2)])),
    ("array8 boolean", "1.6.24", Array("boolean", [True, False])),
    ("array8 empty", "1.6.24", Array("long", [])),
    ("array32", "1.6.24", Array("string", ["a" * 100, "b" * 100, "c" * 100])),
    ("array of described", "1.6.24", Array("ulong", [ULong(1)], descriptor=Symbol("d"))),
    ("array of lists", "1.6.24", Array("list", [[1], []])),
    ("described symbolic", "1.2", Described(Symbol("x:y"), "v")),
    ("described numeric ulong", "1.2", Described(ULong(0x1234), None)),
    ("described numeric small", "1.2", Described(ULong(0x99), [UInt(1)])),
]

# (name, spec, hex, expected value): valid but not canonical; decode only.
NON_CANONICAL: list[tuple[str, str, str, Any]] = [
    ("boolean 0x56 false", "1.6.2", "5600", False),
    ("boolean 0x56 true", "1.6.2", "5601", True),
    ("uint wide zero", "1.6.5", "7000000000", UInt(0)),
    ("smalluint zero", "1.6.5", "5200", UInt(0)),
    ("ulong wide", "1.6.6", "800000000000000001", ULong(1)),
    ("int wide", "1.6.9", "7100000001", Int(1)),
    ("long wide", "1.6.10", "810000000000000001", 1),
    ("vbin32 empty", "1.6.19", "b000000000", b""),
    ("str32 short", "1.6.20", "b10000000161", "a"),
    ("sym32 short", "1.6.21", "b30000000161", Symbol("a")),
    ("list8 empty", "1.6.22", "c00100", []),
    ("list32 empty", "1.6.22", "d00000000400000000", []),
    ("list32", "1.6.22", "d0000000060000000241" + "42", [True, False]),
    ("map32 empty", "1.6.23", "d10000000400000000", {}),
    ("array32 uint", "1.6.24", "f000000009000000017000000005", Array("uint", [UInt(5)])),
    ("array of uint0", "1.6.24", "e0020343", Array("uint", [UInt(0)] * 3)),
    ("descriptor as ulong", "1.2", "00800000000000000024" + "45", amqp.Accepted()),
    ("descriptor as symbol", "1.2", "00a3" + "12" + b"amqp:accepted:list".hex() + "45", amqp.Accepted()),
]

NEGATIVE_VALUES: list[tuple[str, str, str]] = [
    ("empty input", "", "amqp:decode-error"),
    ("reserved constructor 0xff", "ff", "amqp:decode-error"),
    ("reserved constructor 0x01", "01", "amqp:decode-error"),
    ("boolean byte 0x02", "5602", "amqp:decode-error"),
    ("truncated uint", "700000", "amqp:decode-error"),
    ("vbin8 past end", "a005616263", "amqp:decode-error"),
    ("vbin32 declares 4 GiB", "b0ffffffff00", "amqp:decode-error"),
    ("list32 declares 4 GiB", "d0fffffff0ffffffff", "amqp:decode-error"),
    ("list count cannot fit", "c00202404040", "amqp:decode-error"),
    ("list size larger than elements", "c0030140", "amqp:decode-error"),
    ("odd map count", "c10301a100", "amqp:decode-error"),
    ("duplicate map key", "c1050241014102", "amqp:decode-error"),
    ("unhashable map key", "c10602c0010040", "amqp:decode-error"),
    ("invalid utf-8", "a102c328", "amqp:decode-error"),
    ("non-ascii symbol", "a301ff", "amqp:decode-error"),
    ("char beyond U+10FFFF", "7300110000", "amqp:decode-error"),
    ("array element constructor invalid", "e0020199", "amqp:decode-error"),
    ("array of 16M zero-width elements", "f00000000500ffffff40", "amqp:resource-limit-exceeded"),
    ("array of 4G uints in 1 byte", "f000000005ffffffff70", "amqp:decode-error"),
    ("list8 size 0", "c000", "amqp:decode-error"),
    ("described descriptor", "000040", "amqp:decode-error"),
    ("open missing container-id", "005310" + "45", "amqp:invalid-field"),
    ("open container-id is a uint", "005310c0020143", "amqp:decode-error"),
    ("close error is not an error", "005318c00201005324" + "45", "amqp:invalid-field"),
]

ERR = amqp.ErrorCondition(condition=amqp.Condition.NOT_ALLOWED, description="no", info={Symbol("k"): 1})
PERFORMATIVES: list[tuple[str, int, Any]] = [
    ("open minimal", 0, amqp.Open(container_id="c")),
    ("open corda-trio", 0, amqp.Open(
        container_id="corda-trio:5d1b4c3e", hostname="bank-a", max_frame_size=131072, channel_max=1,
        idle_time_out=5000, offered_capabilities=(Symbol("ANONYMOUS-RELAY"),), properties={Symbol("product"): "x"},
    )),
    ("begin", 0, amqp.Begin(next_outgoing_id=0, incoming_window=2048, outgoing_window=2048)),
    ("begin reply", 1, amqp.Begin(remote_channel=0, next_outgoing_id=1, incoming_window=2, outgoing_window=3)),
    ("attach sender", 1, amqp.Attach(
        name="internal.peers.DLabc->p2p.inbound.DLabc", handle=0, role=amqp.Role.SENDER, snd_settle_mode=0,
        rcv_settle_mode=0, source=amqp.Source(address="internal.peers.DLabc"),
        target=amqp.Target(address="p2p.inbound.DLabc"), initial_delivery_count=0, max_message_size=10485760,
    )),
    ("attach every field", 1, amqp.Attach(
        name="link", handle=1, role=amqp.Role.RECEIVER, snd_settle_mode=0, rcv_settle_mode=1,
        source=amqp.Source(
            address="a", durable=2, expiry_policy=Symbol("never"), timeout=9, dynamic=True,
            dynamic_node_properties={Symbol("n"): 1}, distribution_mode=Symbol("move"),
            filter={Symbol("f"): Described(Symbol("apache.org:selector-filter:string"), "a = 1")},
            default_outcome=amqp.Released(), outcomes=(Symbol("amqp:accepted:list"),),
            capabilities=(Symbol("queue"),),
        ),
        target=amqp.Target(address="t", durable=1, expiry_policy=Symbol("link-detach"), timeout=1, dynamic=True,
                           dynamic_node_properties={Symbol("m"): 2}, capabilities=(Symbol("topic"),)),
        unsettled={b"tag": amqp.Accepted()}, incomplete_unsettled=True, initial_delivery_count=5,
        max_message_size=10485760, offered_capabilities=(Symbol("o"),), desired_capabilities=(Symbol("d"),),
        properties={Symbol("q"): True},
    )),
    ("flow link", 1, amqp.Flow(next_incoming_id=0, incoming_window=2048, next_outgoing_id=0,
                               outgoing_window=2048, handle=0, delivery_count=0, link_credit=1000)),
    ("flow every field", 1, amqp.Flow(
        next_incoming_id=1, incoming_window=2, next_outgoing_id=3, outgoing_window=4, handle=5,
        delivery_count=6, link_credit=1000, available=8, drain=True, echo=True, properties={Symbol("z"): 0})),
    ("transfer", 1, amqp.Transfer(handle=0, delivery_id=17, delivery_tag=b"\x00\x00\x00\x11", message_format=0,
                                  settled=False)),
    ("transfer every field", 1, amqp.Transfer(
        handle=1, delivery_id=2**32 - 1, delivery_tag=b"\x00" * 32, message_format=0, settled=True, more=True,
        rcv_settle_mode=1, state=amqp.Received(section_number=1, section_offset=2**40), resume=True,
        aborted=True, batchable=True)),
    ("disposition accepted range", 1, amqp.Disposition(role=True, first=0, last=1, settled=True,
                                                       state=amqp.Accepted())),
    ("disposition rejected", 1, amqp.Disposition(role=True, first=3, settled=True, state=amqp.Rejected(
        error=amqp.ErrorCondition(condition=amqp.Condition.UNAUTHORIZED_ACCESS, description="claimed sender differs")))),
    ("disposition released", 1, amqp.Disposition(role=True, first=4, settled=True, state=amqp.Released())),
    ("disposition modified", 1, amqp.Disposition(role=True, first=4, state=amqp.Modified(
        delivery_failed=True, undeliverable_here=False, message_annotations={Symbol("x"): 1}))),
    ("detach", 1, amqp.Detach(handle=0, closed=True)),
    ("detach error", 1, amqp.Detach(handle=2, closed=True, error=amqp.ErrorCondition(
        condition=amqp.Condition.UNAUTHORIZED_ACCESS, description="not this node's inbox"))),
    ("end", 1, amqp.End()),
    ("end error", 1, amqp.End(error=amqp.ErrorCondition(condition=amqp.Condition.WINDOW_VIOLATION))),
    ("close", 0, amqp.Close()),
    ("close error", 0, amqp.Close(error=ERR)),
    ("sasl-mechanisms", 0, amqp.SaslMechanisms(
        sasl_server_mechanisms=(Symbol("PLAIN"), Symbol("ANONYMOUS"), Symbol("EXTERNAL")))),
    ("sasl-init PLAIN (Corda)", 0, amqp.SaslInit(
        mechanism=Symbol("PLAIN"), initial_response=b"\x00SystemUsers/Peer\x00SystemUsers/Peer")),
    ("sasl-init ANONYMOUS", 0, amqp.SaslInit(mechanism=Symbol("ANONYMOUS"), hostname="localhost")),
    ("sasl-challenge", 0, amqp.SaslChallenge(challenge=b"c")),
    ("sasl-response", 0, amqp.SaslResponse(response=b"r")),
    ("sasl-outcome ok", 0, amqp.SaslOutcome(code=int(amqp.SaslCode.OK))),
    ("sasl-outcome auth", 0, amqp.SaslOutcome(code=int(amqp.SaslCode.AUTH), additional_data=b"why")),
]  # fmt: skip

NEGATIVE_FRAMES: list[tuple[str, str, str]] = [
    ("SIZE below 8", "0000000402000000", "amqp:connection:framing-error"),
    ("DOFF below 2", "0000000801000000", "amqp:connection:framing-error"),
    ("DOFF past SIZE", "0000000803000000", "amqp:connection:framing-error"),
    ("unknown frame type", "0000000802070000", "amqp:connection:framing-error"),
    ("SIZE above max-frame-size 512", "0000020102000000", "amqp:connection:framing-error"),
    ("4 GiB SIZE", "ffffffff02000000", "amqp:connection:framing-error"),
    ("open without container-id", "0000000c0200000000531045", "amqp:invalid-field"),
    ("close in a SASL frame", "0000000c0201000000531845", "amqp:decode-error"),
    ("sasl-outcome in an AMQP frame", "0000001002000000005344c003015000", "amqp:decode-error"),
    ("body not described", "0000000c0200000040404040", "amqp:decode-error"),
    ("close not a list", "0000000d020000000053185001", "amqp:decode-error"),
    ("close.error a uint", "0000000f02000000005318c0025201", "amqp:decode-error"),
    ("truncated inside frame", "0000000f0200000000531dc00201a1", "amqp:decode-error"),
    ("list size past frame end", "0000000f02000000005318c0ff0140", "amqp:decode-error"),
]

MESSAGES: list[tuple[str, Any]] = [
    ("empty message", amqp.Message()),
    ("corda p2p message", amqp.Message(
        header=amqp.Header(durable=True),
        properties=amqp.Properties(message_id="N-5f2c-3-1", to="p2p.inbound.DLabc", user_id=b"O=Bank A",
                                   creation_time=1700000000000),
        application_properties={
            "platform-topic": "platform.session", "platform-version": Int(4), "corda-vendor": "Corda Open Source",
            "release-version": "4.12", "sender-uuid": "f0a1", "send-seq-no": 7, "corda_p2p_message_type": "session",
            "_AMQ_DUPL_ID": "N-5f2c-3-1", "_AMQ_VALIDATED_USER": "O=Bank A, L=London, C=GB",
        },
        body=b"\x82\xa1k\xa1v",
    )),
    ("every section", amqp.Message(
        header=amqp.Header(durable=True, priority=9, ttl=1000, first_acquirer=True, delivery_count=2),
        delivery_annotations={Symbol("x-opt-a"): 1},
        message_annotations={Symbol("x-opt-b"): "2", ULong(7): None},
        properties=amqp.Properties(
            message_id=ULong(5), user_id=b"u", to="t", subject="s", reply_to="r", correlation_id=U,
            content_type=Symbol("application/octet-stream"), content_encoding=Symbol("binary"),
            absolute_expiry_time=2, creation_time=1, group_id="g", group_sequence=3, reply_to_group_id="rg"),
        application_properties={"k": "v"},
        body=(b"part1", b"part2"),
        footer={Symbol("f"): b"sig"},
    )),
    ("amqp-value body", amqp.Message(body=amqp.AmqpValue({"a": [1, 2]}))),
    ("amqp-sequence bodies", amqp.Message(body=(amqp.AmqpSequence([1]), amqp.AmqpSequence(["x"])))),
    ("1 KiB data body (32-bit size)", amqp.Message(body=bytes(range(256)) * 4)),
]  # fmt: skip

NEGATIVE_MESSAGES: list[tuple[str, str, str]] = [
    ("header after properties", "005373" + "45" + "005370" + "45", "amqp:decode-error"),
    ("two headers", "005370" + "45" + "005370" + "45", "amqp:decode-error"),
    ("data then amqp-value", "005375a000" + "00537740", "amqp:decode-error"),
    ("data then amqp-sequence", "005375a000" + "00537645", "amqp:decode-error"),
    ("unknown section", "00537945", "amqp:decode-error"),
    ("not described", "a000", "amqp:decode-error"),
    ("data section is a string", "005375a100", "amqp:decode-error"),
    ("data section declares 4 GiB", "005375b0ffffffff", "amqp:decode-error"),
    ("truncated section", "0053", "amqp:decode-error"),
]


def _unescape_proton(text: str) -> bytes:
    """Invert Proton's pn_quote: printable ASCII stays, everything else is \\xNN."""
    out = bytearray()
    i = 0
    while i < len(text):
        if text.startswith("\\x", i):
            if i + 4 > len(text):  # an escape cut by the trace's truncation
                break
            out.append(int(text[i + 2 : i + 4], 16))
            i += 4
        else:
            out.append(ord(text[i]))
            i += 1
    return bytes(out)


_TRANSFER = re.compile(r"AMQP:FRAME:\d+ (<-|->) @transfer\(20\) \[(.*?)\] \((\d+)\) (.*)$")


def capture_messages(captures: Path) -> list[dict[str, Any]]:
    import proton

    out = []
    for trace in sorted(captures.glob("*-trace.txt")):
        taken: dict[str, int] = {}
        for line in trace.read_text().splitlines():
            m = _TRANSFER.search(line)
            if not m:
                continue
            direction, _fields, _length, escaped = m.groups()
            # The trace shows only the start of a payload ("... (truncated)"), and the 1 KiB body is
            # random: keep the sections before the body, which carry the peer's own encodings.
            escaped = escaped.removesuffix(" ... (truncated)")
            payload = _before_body(_unescape_proton(escaped))
            if taken.get(direction, 0) == 2:  # the first two per direction: message ids 0 (ulong0) and 1
                continue
            taken[direction] = taken.get(direction, 0) + 1
            msg = amqp.Message.decode(payload)
            pm = proton.Message()
            pm.decode(payload)
            _check_against_proton(msg, pm)
            sender = "proton client" if direction == "->" else trace.name.split("-")[0]
            out.append({
                "name": f"{trace.stem} {direction} transfer payload without its body ({sender} encoding)",
                "source": f"capture {trace.name} ({sender})",
                "hex": payload.hex(),
                "value": repr(msg),
                "canonical": msg.encode() == payload,
            })  # fmt: skip
    return out


def _before_body(payload: bytes) -> bytes:
    pos = 0
    while not payload.startswith(b"\x00\x53\x75", pos):
        pos = amqp.decode_value(payload, pos)[1]
    return payload[:pos]


def _check_against_proton(msg: amqp.Message, pm: Any) -> None:
    """The independent oracle: Proton must decode the same bytes to the same values."""
    props = msg.properties or amqp.Properties()
    assert pm.id == props.message_id, (pm.id, props.message_id)
    assert (pm.subject, pm.content_type) == (props.subject, props.content_type)
    assert (pm.durable, pm.priority) == (
        (msg.header.durable, msg.header.priority) if msg.header else (False, 4)
    )
    assert dict(pm.properties or {}) == dict(msg.application_properties or {})
    assert pm.body is None and msg.body is None, "body differs"


def capture_frames(captures: Path) -> list[dict[str, Any]]:
    out = []
    seen: set[str] = set()
    for probe in sorted(captures.glob("*-probe*.json")):
        data = json.loads(probe.read_text())
        peer = probe.name.split("-")[0]
        for header_key in ("sasl_header_reply", "amqp_header_reply"):
            if data.get(header_key) and data[header_key] not in seen:
                seen.add(data[header_key])
                out.append({"name": f"{peer} {header_key}", "source": f"capture {probe.name}",
                            "hex": data[header_key], "protocol_header": True})  # fmt: skip
        for frame in data["frames"]:
            if frame["hex"] in seen:
                continue
            seen.add(frame["hex"])
            decoded = amqp.decode_frame(bytes.fromhex(frame["hex"]))
            out.append({
                "name": f"{peer} {frame['what']}",
                "source": f"capture {probe.name} (peer's own encoding: {frame['decoded']})",
                "hex": frame["hex"],
                "type": decoded.type,
                "channel": decoded.channel,
                "performative": repr(decoded.performative),
                "canonical": amqp.encode_frame(decoded.performative, decoded.channel) == bytes.fromhex(frame["hex"]),
            })  # fmt: skip
    return out


def main() -> None:
    captures = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "captures"
    vectors: dict[str, Any] = {
        "about": "Golden vectors for protocol_spec/amqp-codec.md. Values are Python expressions over the names of "
        "corda_trio.amqp (plus UUID). canonical=true: encoding the value gives exactly hex; false: decode only. "
        "Regenerate with protocol_spec/vectors/generate_amqp_codec.py.",
        "values": [],
        "negative_values": [],
        "frames": [],
        "negative_frames": [],
        "messages": [],
        "negative_messages": [],
    }
    for name, spec, value in VALUES:
        vectors["values"].append({"name": name, "spec": spec, "source": "spec", "value": repr(value),
                                  "hex": amqp.encode_value(value).hex(), "canonical": True})  # fmt: skip
    for name, spec, hexed, value in NON_CANONICAL:
        assert amqp.decode_value(bytes.fromhex(hexed)) == (value, len(hexed) // 2), name
        vectors["values"].append({"name": name, "spec": spec, "source": "spec", "value": repr(value),
                                  "hex": hexed, "canonical": False})  # fmt: skip
    for name, hexed, condition in NEGATIVE_VALUES:
        vectors["negative_values"].append({"name": name, "hex": hexed, "condition": condition})
    for name, channel, perf in PERFORMATIVES:
        vectors["frames"].append({"name": name, "source": "spec 2.7 / 5.3.3", "type": 1 if type(perf) in amqp.SASL_FRAMES else 0,
                                  "channel": channel, "performative": repr(perf),
                                  "hex": amqp.encode_frame(perf, channel).hex(), "canonical": True})  # fmt: skip
    vectors["frames"] += capture_frames(captures)
    heartbeat = {"name": "empty frame (heartbeat)", "source": "spec 2.4.5", "type": 0, "channel": 0,
                 "performative": "None", "hex": amqp.encode_empty_frame().hex(), "canonical": True}  # fmt: skip
    vectors["frames"].append(heartbeat)
    for name, hexed, condition in NEGATIVE_FRAMES:
        vectors["negative_frames"].append({"name": name, "hex": hexed, "condition": condition,
                                           "max_frame_size": 512})  # fmt: skip
    for name, msg in MESSAGES:
        vectors["messages"].append({"name": name, "source": "spec 3.2", "value": repr(msg),
                                    "hex": msg.encode().hex(), "canonical": True})  # fmt: skip
    vectors["messages"] += capture_messages(captures)
    for name, hexed, condition in NEGATIVE_MESSAGES:
        vectors["negative_messages"].append({"name": name, "hex": hexed, "condition": condition})
    out = HERE / "amqp-codec.json"
    out.write_text(json.dumps(vectors, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    counts = {k: len(v) for k, v in vectors.items() if isinstance(v, list)}
    print(f"wrote {out}: {counts}")


if __name__ == "__main__":
    main()
