"""Certificate hierarchy and Corda path validation: the good chains and each way a chain can be wrong."""

from __future__ import annotations

import base64
import datetime as dt
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from corda_trio import pki
from corda_trio.pki import CertRole

from .conftest import ALICE, BOB, NOW


def _reason(
    path: list[x509.Certificate], root: x509.Certificate, now: dt.datetime = NOW, **kw: object
) -> str:
    with pytest.raises(pki.CertificateValidationError) as info:
        pki.validate_cert_path(path, trust_root=root, now=now, **kw)  # type: ignore[arg-type]
    return info.value.reason


def test_good_chains(network: pki.NetworkCredentials, alice: pki.NodeCredentials) -> None:
    root = network.root.cert
    assert pki.validate_cert_path(alice.tls_chain, trust_root=root, now=NOW) is CertRole.TLS
    assert pki.validate_cert_path(alice.identity_chain, trust_root=root, now=NOW) is CertRole.LEGAL_IDENTITY
    # The pinned root may also be given explicitly at the end of the path.
    with_root = [*alice.identity_chain, root]
    assert pki.validate_cert_path(with_root, trust_root=root, now=NOW, leaf_role=CertRole.LEGAL_IDENTITY)
    assert (
        pki.validate_cert_path([network.network_map.cert], trust_root=root, now=NOW) is CertRole.NETWORK_MAP
    )
    assert pki.validate_cert_path([alice.node_ca.cert, network.doorman.cert], trust_root=root, now=NOW) is (
        CertRole.NODE_CA
    )


def test_roles_and_extensions(network: pki.NetworkCredentials, alice: pki.NodeCredentials) -> None:
    assert pki.get_cert_role(network.root.cert) is None
    assert pki.get_cert_role(network.doorman.cert) is CertRole.DOORMAN_CA
    assert pki.get_cert_role(network.network_map.cert) is CertRole.NETWORK_MAP
    assert pki.get_cert_role(alice.node_ca.cert) is CertRole.NODE_CA
    assert pki.get_cert_role(alice.tls.cert) is CertRole.TLS
    assert pki.get_cert_role(alice.identity.cert) is CertRole.LEGAL_IDENTITY
    ext = alice.tls.cert.extensions.get_extension_for_oid(pki.CERT_ROLE_OID)
    assert not ext.critical and ext.value.value == bytes.fromhex("020103")  # DER INTEGER 3
    # Key types: TLS ECDSA P-256, identity Ed25519; subjects are the legal name.
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519

    assert isinstance(alice.tls.cert.public_key(), ec.EllipticCurvePublicKey)
    assert alice.tls.cert.public_key().curve.name == "secp256r1"  # type: ignore[union-attr]
    assert isinstance(alice.identity.cert.public_key(), ed25519.Ed25519PublicKey)
    for cert in (alice.node_ca.cert, alice.tls.cert, alice.identity.cert):
        assert pki.CordaX500Name.from_x509_name(cert.subject) == ALICE
    tls_usage = alice.tls.cert.extensions.get_extension_for_class(x509.KeyUsage).value
    assert tls_usage.digital_signature and not tls_usage.key_cert_sign
    eku = alice.tls.cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert {o.dotted_string for o in eku} == {"1.3.6.1.5.5.7.3.1", "1.3.6.1.5.5.7.3.2"}
    constraints = alice.node_ca.cert.extensions.get_extension_for_class(x509.NameConstraints)
    assert constraints.critical
    assert constraints.value.permitted_subtrees == [x509.DirectoryName(ALICE.to_x509_name())]


def test_wrong_role(network: pki.NetworkCredentials) -> None:
    """A TLS certificate issued straight by the doorman (skipping the node CA) is refused."""
    key = pki.generate_ec_key()
    tls = pki.create_certificate(
        role=CertRole.TLS, subject=ALICE, public_key=key.public_key(),
        issuer_cert=network.doorman.cert, issuer_key=network.doorman.key, now=NOW,
    )  # fmt: skip
    assert _reason([tls, network.doorman.cert], network.root.cert) == "wrong-role"
    # A node CA issued by the root directly is refused as well.
    node_ca = pki.create_certificate(
        role=CertRole.NODE_CA, subject=ALICE, public_key=key.public_key(),
        issuer_cert=network.root.cert, issuer_key=network.root.key, now=NOW,
    )  # fmt: skip
    assert _reason([node_ca], network.root.cert) == "wrong-role"


def test_expected_leaf_role(network: pki.NetworkCredentials, alice: pki.NodeCredentials) -> None:
    assert _reason(alice.tls_chain, network.root.cert, leaf_role=CertRole.LEGAL_IDENTITY) == "wrong-role"


def test_wrong_parent(
    network: pki.NetworkCredentials, alice: pki.NodeCredentials, bob: pki.NodeCredentials
) -> None:
    """Alice's TLS certificate with Bob's node CA as its claimed issuer."""
    assert (
        _reason([alice.tls.cert, bob.node_ca.cert, network.doorman.cert], network.root.cert) == "wrong-parent"
    )


def test_bad_signature_same_issuer_name(network: pki.NetworkCredentials, alice: pki.NodeCredentials) -> None:
    """An impostor node CA with Alice's name but another key: names chain, signatures do not."""
    impostor_key = pki.generate_ec_key()
    impostor = pki.create_certificate(
        role=CertRole.NODE_CA, subject=ALICE, public_key=impostor_key.public_key(),
        issuer_cert=network.doorman.cert, issuer_key=network.doorman.key, now=NOW,
    )  # fmt: skip
    assert _reason([alice.tls.cert, impostor, network.doorman.cert], network.root.cert) == "bad-signature"


def test_expired_and_not_yet_valid(network: pki.NetworkCredentials, alice: pki.NodeCredentials) -> None:
    root = network.root.cert
    assert _reason(alice.tls_chain, root, now=NOW + dt.timedelta(days=3651)) == "expired"
    assert _reason(alice.tls_chain, root, now=NOW - dt.timedelta(days=1)) == "not-yet-valid"
    short_key = pki.generate_ec_key()
    short = pki.create_certificate(
        role=CertRole.TLS, subject=ALICE, public_key=short_key.public_key(),
        issuer_cert=alice.node_ca.cert, issuer_key=alice.node_ca.key, now=NOW, validity=dt.timedelta(days=1),
    )  # fmt: skip
    chain = [short, alice.node_ca.cert, network.doorman.cert]
    assert pki.validate_cert_path(chain, trust_root=root, now=NOW + dt.timedelta(hours=23))
    assert _reason(chain, root, now=NOW + dt.timedelta(days=2)) == "expired"


def test_other_root(
    network: pki.NetworkCredentials, other_network: pki.NetworkCredentials, alice: pki.NodeCredentials
) -> None:
    # Same names, different keys: the issuer name matches but the pinned root did not sign it.
    assert _reason(alice.tls_chain, other_network.root.cert) == "untrusted-root"
    assert _reason([*alice.tls_chain, network.root.cert], other_network.root.cert) == "untrusted-root"
    other_root = pki.create_root_certificate(
        pki.CordaX500Name.parse("CN=Evil Root, O=Evil, L=Paris, C=FR"), pki.generate_ec_key(), now=NOW
    )
    assert _reason(alice.tls_chain, other_root) == "untrusted-root"


def test_name_constraint_violation(network: pki.NetworkCredentials, alice: pki.NodeCredentials) -> None:
    """Alice's node CA issues a TLS certificate in Bob's name."""
    key = pki.generate_ec_key()
    forged = pki.create_certificate(
        role=CertRole.TLS, subject=BOB, public_key=key.public_key(),
        issuer_cert=alice.node_ca.cert, issuer_key=alice.node_ca.key, now=NOW,
    )  # fmt: skip
    assert _reason([forged, alice.node_ca.cert, network.doorman.cert], network.root.cert) == "name-constraint"
    # A name with an extra CN below Alice's DN stays inside the constraint (RDN prefix rule), but it is not
    # Alice's name: a node CA issues only for its own legal name.
    sub = pki.CordaX500Name.parse("CN=Alice TLS, O=Alice, L=London, C=GB")
    inside = pki.create_certificate(
        role=CertRole.TLS, subject=sub, public_key=key.public_key(),
        issuer_cert=alice.node_ca.cert, issuer_key=alice.node_ca.key, now=NOW,
    )  # fmt: skip
    assert _reason([inside, alice.node_ca.cert, network.doorman.cert], network.root.cert) == "name-mismatch"


def test_issuer_must_be_a_ca(network: pki.NetworkCredentials, alice: pki.NodeCredentials) -> None:
    """A certificate 'issued' by a TLS (end-entity) certificate is refused even if roles were right."""
    key = pki.generate_ec_key()
    child = pki.create_certificate(
        role=CertRole.TLS, subject=ALICE, public_key=key.public_key(),
        issuer_cert=alice.tls.cert, issuer_key=alice.tls.key, now=NOW,
    )  # fmt: skip
    assert _reason([child, *alice.tls_chain], network.root.cert) == "not-a-ca"


def test_missing_role_and_empty(network: pki.NetworkCredentials) -> None:
    key = pki.generate_ec_key()
    plain = (
        x509.CertificateBuilder()
        .subject_name(ALICE.to_x509_name())
        .issuer_name(network.root.cert.subject)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(NOW - dt.timedelta(hours=1))
        .not_valid_after(NOW + dt.timedelta(days=1))
        .sign(network.root.key, pki._certs.hashes.SHA256())  # type: ignore[attr-defined]
    )
    assert _reason([plain], network.root.cert) == "missing-role"
    assert _reason([], network.root.cert) == "empty"


def test_malformed_role_extension(network: pki.NetworkCredentials) -> None:
    key = pki.generate_ec_key()
    for value in (b"\x02\x01\x09", b"\x04\x01\x03", b"\x02\x05\x03"):
        cert = (
            x509.CertificateBuilder()
            .subject_name(ALICE.to_x509_name())
            .issuer_name(network.root.cert.subject)
            .public_key(key.public_key())
            .serial_number(2)
            .not_valid_before(NOW - dt.timedelta(hours=1))
            .not_valid_after(NOW + dt.timedelta(days=1))
            .add_extension(x509.UnrecognizedExtension(pki.CERT_ROLE_OID, value), critical=False)
            .sign(network.root.key, pki._certs.hashes.SHA256())  # type: ignore[attr-defined]
        )
        assert _reason([cert], network.root.cert) == "malformed"


def test_child_validity_clipped_to_issuer(network: pki.NetworkCredentials) -> None:
    key = pki.generate_ec_key()
    cert = pki.create_certificate(
        role=CertRole.DOORMAN_CA, subject=ALICE, public_key=key.public_key(),
        issuer_cert=network.root.cert, issuer_key=network.root.key, now=NOW,
        validity=dt.timedelta(days=99999),
    )  # fmt: skip
    assert cert.not_valid_after_utc == network.root.cert.not_valid_after_utc


def test_key_hash(alice: pki.NodeCredentials) -> None:
    h = pki.key_hash(alice.identity.cert.public_key())
    assert h.startswith("DL") and 40 < len(h) < 50
    assert h == pki.key_hash(alice.identity.key.public_key())
    assert h != pki.key_hash(alice.tls.cert.public_key())
    import hashlib

    from cryptography.hazmat.primitives import serialization

    spki = alice.identity.cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    assert pki.base58_decode(h[2:]) == hashlib.sha256(spki).digest()


@pytest.mark.parametrize(
    ("raw", "text"),
    [  # Bitcoin Base58 reference vectors (bitcoin/src/test/data/base58_encode_decode.json)
        (b"", ""),
        (bytes.fromhex("61"), "2g"),
        (bytes.fromhex("626262"), "a3gV"),
        (bytes.fromhex("636363"), "aPEr"),
        (bytes.fromhex("73696d706c792061206c6f6e6720737472696e67"), "2cFupjhnEsSn59qHXstmK2ffpLv2"),
        (
            bytes.fromhex("00eb15231dfceb60925886b67d065299925915aeb172c06647"),
            "1NS17iag9jJgTHD1VXjvLCEnZuQ3rJDE9L",
        ),
        (bytes.fromhex("516b6fcd0f"), "ABnLTmg"),
        (bytes.fromhex("bf4f89001e670274dd"), "3SEo3LWLoPntC"),
        (bytes.fromhex("572e4794"), "3EFU7m"),
        (bytes.fromhex("ecac89cad93923c02321"), "EJDM8drfXA6uyA"),
        (bytes.fromhex("10c8511e"), "Rt5zm"),
        (bytes.fromhex("00000000000000000000"), "1111111111"),
    ],
)
def test_base58_vectors(raw: bytes, text: str) -> None:
    assert pki.base58_encode(raw) == text
    assert pki.base58_decode(text) == raw


def test_base58_rejects_bad_characters() -> None:
    with pytest.raises(ValueError, match="'0' is not a Base58 character"):
        pki.base58_decode("10")


def test_path_length_is_enforced(network: pki.NetworkCredentials) -> None:
    """A node CA restricted to path length 0 cannot have an identity CA below it that issues again."""
    from cryptography.hazmat.primitives import hashes

    from corda_trio.pki._roles import role_extension

    def issue(subject_key, issuer_cert, issuer_key, role, *, ca: bool, path_length: int | None):  # type: ignore[no-untyped-def]
        builder = (
            x509.CertificateBuilder()
            .subject_name(ALICE.to_x509_name())
            .issuer_name(issuer_cert.subject)
            .public_key(subject_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(NOW - dt.timedelta(hours=1))
            .not_valid_after(NOW + dt.timedelta(days=1))
            .add_extension(role_extension(role), critical=False)
            .add_extension(
                x509.BasicConstraints(ca=ca, path_length=path_length if ca else None), critical=True
            )
        )
        return builder.sign(issuer_key, hashes.SHA256())

    ca_key, id_key, conf_key = pki.generate_ec_key(), pki.generate_ec_key(), pki.generate_ec_key()
    node_ca = issue(
        ca_key, network.doorman.cert, network.doorman.key, CertRole.NODE_CA, ca=True, path_length=0
    )
    identity = issue(id_key, node_ca, ca_key, CertRole.LEGAL_IDENTITY, ca=True, path_length=0)
    conf = issue(conf_key, identity, id_key, CertRole.CONFIDENTIAL_LEGAL_IDENTITY, ca=False, path_length=None)
    root = network.root.cert
    # identity directly under the node CA: no intermediate, fine.
    assert pki.validate_cert_path([identity, node_ca, network.doorman.cert], trust_root=root, now=NOW)
    # confidential identity: one intermediate CA (identity) below a path-length-0 node CA.
    assert _reason([conf, identity, node_ca, network.doorman.cert], root) == "path-length"


def test_confidential_identity_chain(network: pki.NetworkCredentials, alice: pki.NodeCredentials) -> None:
    key = pki.generate_ed25519_key()
    conf = pki.create_certificate(
        role=CertRole.CONFIDENTIAL_LEGAL_IDENTITY, subject=ALICE, public_key=key.public_key(),
        issuer_cert=alice.identity.cert, issuer_key=alice.identity.key, now=NOW,
    )  # fmt: skip
    path = [conf, *alice.identity_chain]
    assert (
        pki.validate_cert_path(path, trust_root=network.root.cert, now=NOW)
        is CertRole.CONFIDENTIAL_LEGAL_IDENTITY
    )
    # ... but not issued by the node CA directly.
    wrong = pki.create_certificate(
        role=CertRole.CONFIDENTIAL_LEGAL_IDENTITY, subject=ALICE, public_key=key.public_key(),
        issuer_cert=alice.node_ca.cert, issuer_key=alice.node_ca.key, now=NOW,
    )  # fmt: skip
    assert _reason([wrong, alice.node_ca.cert, network.doorman.cert], network.root.cert) == "wrong-role"


def _with_negative_serial(cert: x509.Certificate) -> bytes:
    """``cert``'s DER with its serial number's first byte 0x80: a negative serial, which RFC 5280 forbids
    and ``cryptography`` only warns about. (Setting only the top bit would turn a first byte 0x7f followed by
    one with its top bit set into a non-minimal 0xff..., which cryptography refuses as bad DER instead.)"""
    der = bytearray(cert.public_bytes(serialization.Encoding.DER))
    at = der.index(b"\xa0\x03\x02\x01\x02\x02") + 6  # [0] version v3, then the serial's INTEGER: length
    der[at + 1] = 0x80
    return bytes(der)


def test_a_certificate_with_a_negative_serial_is_refused_not_warned_about(
    tmp_path: Path, alice: pki.NodeCredentials
) -> None:
    import warnings

    bad = _with_negative_serial(alice.tls.cert)
    pem = tmp_path / "tls.pem"
    body = base64.encodebytes(bad).decode("ascii").replace("\n", "")
    lines = "\n".join(body[i : i + 64] for i in range(0, len(body), 64))
    pem.write_text(f"-----BEGIN CERTIFICATE-----\n{lines}\n-----END CERTIFICATE-----\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match=r"^Parsed a serial number which wasn't positive"):
            pki.load_der_certificate(bad)
        with pytest.raises(pki.KeyStoreError, match=r"tls\.pem.* serial number which wasn't positive"):
            pki.read_certificate(pem)
        good = alice.tls.cert.public_bytes(serialization.Encoding.DER)
        assert pki.load_der_certificate(good) == alice.tls.cert
        assert pki.load_pem_certificates(alice.tls.cert.public_bytes(serialization.Encoding.PEM)) == [
            alice.tls.cert
        ]


def test_a_certificate_that_is_not_der_is_said_in_words_naming_the_field(alice: pki.NodeCredentials) -> None:
    """cryptography's parser reports bad DER in the Rust debug form of its error; the user reads words."""
    der = bytearray(alice.tls.cert.public_bytes(serialization.Encoding.DER))
    at = der.index(b"\xa0\x03\x02\x01\x02\x02") + 6
    der[at + 1 : at + 3] = b"\xff\x80"  # a negative serial with a redundant leading 0xff: not minimal
    with pytest.raises(ValueError) as raised:
        pki.load_der_certificate(bytes(der))
    said = "not a well-formed DER certificate: a value not in DER form in TbsCertificate::serial"
    assert str(raised.value) == said
    with pytest.raises(ValueError, match=r"^not a well-formed DER certificate: cut short$"):
        pki.load_der_certificate(alice.tls.cert.public_bytes(serialization.Encoding.DER)[:-5])
