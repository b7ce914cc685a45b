"""The pure message model: addresses, headers, wire mapping and the receiver's checks."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corda_trio import amqp, messaging


def test_addresses() -> None:
    assert messaging.inbox_address("DLabc") == "p2p.inbound.DLabc"
    assert messaging.outbound_queue("DLabc") == "internal.peers.DLabc"
    assert messaging.key_hash_of_address("p2p.inbound.DLabc") == "DLabc"
    assert messaging.key_hash_of_address("internal.peers.DLabc") == "DLabc"
    with pytest.raises(ValueError, match="neither"):
        messaging.key_hash_of_address("internal.peers.")


def test_wire_form_carries_corda_headers() -> None:
    out = messaging.OutgoingMessage(topic="t", data=b"body", dedup_id="N-1-2-3", headers={"x": "y"})
    wire = messaging.to_amqp(out, platform_version=4, release_version="0.1", sender_uuid="u", send_seq_no=7)
    decoded = amqp.Message.decode(wire.encode())
    props = decoded.application_properties
    assert decoded.header is not None and decoded.header.durable
    assert decoded.properties is not None and decoded.properties.message_id == "N-1-2-3"
    assert props == {
        "x": "y",
        "platform-topic": "t",
        "platform-version": 4,
        "corda-vendor": "corda-trio",
        "release-version": "0.1",
        "sender-uuid": "u",
        "send-seq-no": 7,
        "_AMQ_DUPL_ID": "N-1-2-3",
    }
    assert decoded.body == b"body"


@given(
    topic=st.text(max_size=20),
    data=st.binary(max_size=300),
    dedup=st.text(min_size=1, max_size=40),
    headers=st.dictionaries(
        st.text(max_size=8).filter(lambda k: k not in {"platform-topic"}), st.text(max_size=8)
    ),
    seq=st.integers(0, 2**63 - 1),
)
def test_round_trip(topic: str, data: bytes, dedup: str, headers: dict[str, str], seq: int) -> None:
    headers = {
        k: v
        for k, v in headers.items()
        if not k.startswith(("_AMQ", "platform", "corda", "sender", "send-", "release"))
    }
    out = messaging.OutgoingMessage(topic=topic, data=data, dedup_id=dedup, headers=headers)
    wire = messaging.to_amqp(out, platform_version=1, release_version="r", sender_uuid="s", send_seq_no=seq)
    stamped = messaging.stamp_validated_user(amqp.Message.decode(wire.encode()), "O=A, L=B, C=GB")
    got = messaging.from_amqp(amqp.Message.decode(stamped.encode()))
    assert (got.topic, got.data, got.dedup_id, got.send_seq_no, got.sender_uuid) == (
        topic,
        data,
        dedup,
        seq,
        "s",
    )
    assert got.validated_user == "O=A, L=B, C=GB"
    assert dict(got.headers) == headers


def test_reserved_headers_cannot_be_given() -> None:
    with pytest.raises(ValueError, match="_AMQ_VALIDATED_USER"):
        messaging.OutgoingMessage(topic="t", data=b"", dedup_id="d", headers={"_AMQ_VALIDATED_USER": "x"})


def test_checks_name_the_condition() -> None:
    good = messaging.to_amqp(
        messaging.OutgoingMessage(topic="t", data=b"x" * 100, dedup_id="d"),
        platform_version=1,
        release_version="r",
        sender_uuid="s",
        send_seq_no=1,
    )
    messaging.check_p2p_message(good, max_size=1000, encoded_size=len(good.encode()))
    with pytest.raises(messaging.InvalidMessageError) as info:
        messaging.check_p2p_message(good, max_size=10, encoded_size=len(good.encode()))
    assert info.value.condition == "amqp:link:message-size-exceeded"
    with pytest.raises(messaging.InvalidMessageError) as info:
        messaging.stamp_validated_user(
            messaging.stamp_validated_user(good, "O=A, L=B, C=GB"), "O=C, L=D, C=GB"
        )
    assert info.value.condition == "amqp:unauthorized-access"
    no_body = amqp.Message(application_properties=good.application_properties, body=None)
    with pytest.raises(messaging.InvalidMessageError, match="Data section"):
        messaging.check_p2p_message(no_body, max_size=1000, encoded_size=1)


_texts = st.text(max_size=300)
_extra_headers = st.dictionaries(
    st.text(min_size=1, max_size=20).map(lambda k: "x-" + k),
    _texts,
    max_size=20,  # not a reserved name
)


@given(
    topic=st.text(min_size=1, max_size=40),
    data=st.binary(max_size=3000),
    headers=_extra_headers,
    user=st.text(min_size=1, max_size=300),
    claim=st.booleans(),
)
def test_stamped_payload_equals_the_slow_stamp(
    topic: str, data: bytes, headers: dict[str, str], user: str, claim: bool
) -> None:
    """The in-place stamp gives exactly the bytes of decode -> stamp -> encode (map8 and map32 alike)."""
    wire = messaging.to_amqp(
        messaging.OutgoingMessage(topic=topic, data=data, dedup_id="d-1", headers=headers),
        platform_version=1,
        release_version="0.1.0",
        sender_uuid="u",
        send_seq_no=7,
    )
    if claim:
        wire = messaging.stamp_validated_user(wire, user)
    payload = wire.encode()
    message = amqp.Message.decode(payload)
    fast = messaging.stamped_payload(payload, message, user)
    assert fast == messaging.stamp_validated_user(message, user).encode()
    assert amqp.Message.decode(fast).application_properties[messaging.HEADER_VALIDATED_USER] == user
    if not claim:
        with pytest.raises(messaging.InvalidMessageError, match="claims"):
            messaging.stamped_payload(
                messaging.stamp_validated_user(message, user + "x").encode(),
                messaging.stamp_validated_user(message, user + "x"),
                user,
            )
