"""The float control protocol: golden vectors, round trips, strict decoding, the state table, tunnel PKI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corda_trio import amqp, pki
from corda_trio.bridge import float as fl
from tests.p2p_harness import NOW

VECTORS: dict[str, Any] = json.loads(
    (Path(__file__).resolve().parents[2] / "protocol_spec" / "vectors" / "float-control.json").read_text()
)
TYPES = {
    c.TYPE: c
    for c in (
        fl.ActivateFloat,
        fl.DeactivateFloat,
        fl.FloatActivated,
        fl.FloatActivationFailed,
        fl.FloatDeactivated,
    )
}


@pytest.mark.parametrize("case", VECTORS["control"], ids=lambda c: c["type"])
def test_control_vectors(case: dict[str, Any]) -> None:
    message = TYPES[case["type"]](**{k.replace("-", "_"): v for k, v in case["fields"].items()})
    data = bytes.fromhex(case["hex"])
    assert fl.encode_control(message).encode() == data
    assert fl.decode_control(amqp.Message.decode(data)) == message


@pytest.mark.parametrize("case", VECTORS["forwarded"], ids=lambda c: c["peer"])
def test_forwarded_vectors(case: dict[str, Any]) -> None:
    envelope = fl.ForwardedDelivery(
        source=case["source"],
        target=case["target"],
        peer=case["peer"],
        payload=bytes.fromhex(case["payload_hex"]),
    )
    data = bytes.fromhex(case["hex"])
    assert envelope.encode() == data
    assert fl.ForwardedDelivery.decode(data) == envelope


@pytest.mark.parametrize("case", VECTORS["negative"], ids=lambda c: c["name"])
def test_negative_vectors(case: dict[str, Any]) -> None:
    with pytest.raises(fl.ControlProtocolError) as info:
        fl.decode_control(amqp.Message.decode(bytes.fromhex(case["hex"])))
    assert info.value.condition == case["condition"]


def test_forwarded_envelope_refusals() -> None:
    good = fl.ForwardedDelivery(source="O=A, L=B, C=GB", target="p2p.inbound.DLx", peer="h:1", payload=b"m")
    with pytest.raises(fl.ControlProtocolError, match="malformed") as info:
        fl.ForwardedDelivery.decode(b"\x00\x53")
    assert info.value.condition == "amqp:decode-error"
    # a control message is not an envelope
    with pytest.raises(fl.ControlProtocolError, match="expected a ForwardedDelivery"):
        fl.ForwardedDelivery.decode(fl.encode_control(fl.DeactivateFloat(reason="x")).encode())
    message = amqp.Message.decode(good.encode())
    props = dict(message.application_properties or {})
    del props["float-source"]
    with pytest.raises(fl.ControlProtocolError, match="float-source"):
        fl.ForwardedDelivery.decode(
            amqp.Message(properties=message.properties, application_properties=props, body=b"m").encode()
        )


@given(st.text(max_size=60), st.text(max_size=80), st.binary(max_size=600))
def test_wrapping_a_payload_behind_a_link_prefix_is_the_envelope(
    source: str, target: str, payload: bytes
) -> None:
    whole = fl.ForwardedDelivery(source=source, target=target, peer="h:1", payload=payload)
    assert (
        fl.ForwardedDelivery.wrap(fl.ForwardedDelivery.prefix(source, target, "h:1"), payload)
        == whole.encode()
    )
    assert fl.ForwardedDelivery.decode(whole.encode()) == whole


def _decoded_or_error(decode: Any, data: bytes) -> object:
    try:
        return decode(data)
    except fl.ControlProtocolError as exc:
        return (exc.condition, exc.description)


@given(
    st.lists(
        st.tuples(st.sampled_from(["O=A, L=B, C=GB", "O=C, L=D, C=FR"]), st.sampled_from(["h:1", "h:22"]))
    ),
    st.lists(st.tuples(st.integers(0, 3), st.binary(max_size=700)), min_size=1, max_size=12),
    st.data(),
)
def test_the_envelope_reader_decodes_exactly_as_the_decoder(
    links: list[tuple[str, str]], sends: list[tuple[int, bytes]], data: st.DataObject
) -> None:
    """Remembered prefixes change nothing: for envelopes of several links (payloads across the vbin8/vbin32
    boundary) and for mangled ones (a byte changed, cut short, extended, the body re-encoded long), the
    reader gives exactly what ForwardedDelivery.decode gives, value or error."""
    reader = fl.EnvelopeReader()
    links = links or [("O=A, L=B, C=GB", "h:1")]
    for which, payload in sends:
        source, peer = links[which % len(links)]
        good = fl.ForwardedDelivery(source=source, target="p2p.inbound.DLx", peer=peer, payload=payload)
        encoded = good.encode()
        assert reader.decode(encoded) == good
        variants = [encoded[:-1], encoded + b"\x00", encoded[: len(encoded) // 2]]
        i = data.draw(st.integers(0, len(encoded) - 1))
        variants.append(encoded[:i] + bytes([encoded[i] ^ data.draw(st.integers(1, 255))]) + encoded[i + 1 :])
        prefix = fl.ForwardedDelivery.prefix(source, "p2p.inbound.DLx", peer)
        variants.append(prefix + b"\x00\x53\x75\xb0" + len(payload).to_bytes(4, "big") + payload)
        for variant in variants:
            assert _decoded_or_error(reader.decode, variant) == _decoded_or_error(
                fl.ForwardedDelivery.decode, variant
            )


def test_the_envelope_reader_skips_the_decoder_for_a_remembered_prefix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reader = fl.EnvelopeReader()
    link = {"source": "O=A, L=B, C=GB", "target": "p2p.inbound.DLx", "peer": "h:1"}
    reader.decode(fl.ForwardedDelivery(**link, payload=b"first").encode())

    def no_decoding(data: bytes) -> fl.ForwardedDelivery:
        raise AssertionError("decoded in full")

    monkeypatch.setattr(fl.ForwardedDelivery, "decode", no_decoding)
    for size in (0, 1, 255, 256, 70_000):
        envelope = fl.ForwardedDelivery(
            **link, payload=bytes(range(256)) * (size // 256) + b"x" * (size % 256)
        )
        assert reader.decode(envelope.encode()) == envelope


names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)


@given(
    st.one_of(
        st.builds(
            fl.ActivateFloat,
            activation_id=names,
            tls_ref=names,
            inboxes=st.lists(names, max_size=4),
            credit=st.integers(1, 2**62),
        ),
        st.builds(fl.DeactivateFloat, reason=names),
        st.builds(
            fl.FloatActivated, activation_id=names, public_host=names, public_port=st.integers(1, 65535)
        ),
        st.builds(fl.FloatActivationFailed, activation_id=names, condition=names, description=names),
        st.builds(fl.FloatDeactivated, reason=names),
    )
)
def test_control_round_trip(message: fl.ControlMessage) -> None:
    assert fl.decode_control(amqp.Message.decode(fl.encode_control(message).encode())) == message


@given(st.binary(max_size=200))
def test_random_bytes_raise_only_protocol_errors(data: bytes) -> None:
    try:
        fl.ForwardedDelivery.decode(data)
    except fl.ControlProtocolError:
        pass
    try:
        fl.decode_control(amqp.Message.decode(data))
    except (fl.ControlProtocolError, amqp.DecodeError):
        pass


@pytest.mark.parametrize("state", list(fl.FloatState))
@pytest.mark.parametrize("event", list(fl.FloatInput))
def test_every_state_and_input_is_a_legal_step_or_a_precondition_failure(
    state: fl.FloatState, event: fl.FloatInput
) -> None:
    if (state, event) in fl.FLOAT_TRANSITIONS:
        effect, after = fl.float_transition(state, event)
        # the public port is open exactly in ACTIVE: opening leads there, and leaving it closes
        assert (effect == "open") == (after is fl.FloatState.ACTIVE and state is not fl.FloatState.ACTIVE)
        assert (effect == "close") == (state is fl.FloatState.ACTIVE and after is not fl.FloatState.ACTIVE)
    else:
        with pytest.raises(fl.ControlProtocolError) as info:
            fl.float_transition(state, event)
        assert info.value.condition == "amqp:precondition-failed"


def test_losing_the_control_link_always_ends_idle() -> None:
    for state in (fl.FloatState.CONNECTED, fl.FloatState.ACTIVE):
        assert fl.float_transition(state, fl.FloatInput.CONTROL_DOWN)[1] is fl.FloatState.IDLE


# --- tunnel PKI ------------------------------------------------------------------------------------------


class _Cert:
    def __init__(self, cert: Any) -> None:
        from cryptography.hazmat.primitives import serialization

        self.der = cert.public_bytes(serialization.Encoding.DER)

    def getpeercert(self, binary_form: bool = True) -> bytes:
        return self.der


def test_tunnel_certificates_open_only_the_tunnel(
    tunnel: fl.TunnelPki,
    float_creds: fl.TunnelCredentials,
    bridge_creds: fl.TunnelCredentials,
    alice: pki.NodeCredentials,
) -> None:
    assert fl.check_tunnel_peer(_Cert(bridge_creds.cert), "bridge") == "bridge-bob"
    assert fl.check_tunnel_peer(_Cert(float_creds.cert), "float") == "float-a"
    with pytest.raises(pki.PeerIdentityError, match="is a float, not a bridge"):
        fl.check_tunnel_peer(_Cert(float_creds.cert), "bridge")
    # a node's TLS certificate does not open the tunnel, and a tunnel certificate is no node identity
    with pytest.raises(pki.PeerIdentityError, match="not a tunnel certificate"):
        fl.check_tunnel_peer(_Cert(alice.tls.cert), "bridge")
    with pytest.raises(pki.PeerIdentityError, match="no role extension"):
        pki.check_peer_is_network_node(_Cert(bridge_creds.cert))
    with pytest.raises(ValueError, match="tunnel role"):
        tunnel.issue("node", "x", now=NOW)


def test_tunnel_credentials_round_trip_through_files(tunnel: fl.TunnelPki, tmp_path: Path) -> None:
    creds = tunnel.issue("float", "f1", now=NOW)
    cert, key = creds.write(tmp_path, "f1")
    pki.write_certificates(tmp_path / "ca.pem", [tunnel.ca.cert])
    back = fl.TunnelCredentials.read(cert, key, tmp_path / "ca.pem")
    assert back.cert == creds.cert and back.ca == tunnel.ca.cert and back.role == "float"
    back.server_context()  # loads: key matches the certificate
    assert (key.stat().st_mode & 0o777) == 0o600
