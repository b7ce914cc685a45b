"""Property tests over generated certificate chains: every role permutation, every extra subject attribute.

The expected outcome comes from the written-out hierarchy below, not from the code's parent table.
"""

from __future__ import annotations

import itertools
import string
from collections.abc import Sequence

import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corda_trio import pki
from corda_trio.pki import CertRole

from .conftest import ALICE, NOW

R = CertRole
#: The only role sequences (from just below the root down to the leaf) a Corda network issues.
VALID_FROM_ROOT: frozenset[tuple[CertRole, ...]] = frozenset(
    {
        (R.DOORMAN_CA,),
        (R.DOORMAN_CA, R.NODE_CA),
        (R.DOORMAN_CA, R.NODE_CA, R.TLS),
        (R.DOORMAN_CA, R.NODE_CA, R.LEGAL_IDENTITY),
        (R.DOORMAN_CA, R.NODE_CA, R.LEGAL_IDENTITY, R.CONFIDENTIAL_LEGAL_IDENTITY),
        (R.DOORMAN_CA, R.LEGAL_IDENTITY),  # a doorman-issued identity (a service's)
        (R.DOORMAN_CA, R.LEGAL_IDENTITY, R.CONFIDENTIAL_LEGAL_IDENTITY),
        (R.NETWORK_MAP,),
        (R.SERVICE_IDENTITY,),
        (R.NETWORK_PARAMETERS,),
    }
)
ROLES = list(CertRole)
# One key per depth: chains are cheap to build, and reusing keys does not change what is checked.
_KEYS = [pki.generate_ec_key() for _ in range(5)]


ROOT_NAME = pki.CordaX500Name.parse("O=Network Root, L=London, C=GB")
FIRST_NAME = pki.CordaX500Name.parse("O=Doorman, L=London, C=GB")


@pytest.fixture(scope="module")
def root() -> pki.CertAndKey:
    key = _KEYS[0]
    return pki.CertAndKey(cert=pki.create_root_certificate(ROOT_NAME, key, now=NOW), key=key)


def _chain(root: pki.CertAndKey, roles: Sequence[CertRole]) -> list[x509.Certificate]:
    """Certificates for ``roles`` (root side first), each issued by the one before; returned leaf first."""
    issuer_cert, issuer_key = root.cert, root.key
    built = []
    for depth, role in enumerate(roles, 1):
        key = _KEYS[depth]
        # Below the root's child everything is Alice's: names never decide a role test.
        subject = (FIRST_NAME if depth == 1 else ALICE).to_x509_name()
        cert = pki.create_certificate(
            role=role, subject=subject, public_key=key.public_key(), issuer_cert=issuer_cert,
            issuer_key=issuer_key, now=NOW,
        )  # fmt: skip
        built.append(cert)
        issuer_cert, issuer_key = cert, key
    return built[::-1]


def _outcome(root: pki.CertAndKey, chain: list[x509.Certificate]) -> str:
    try:
        pki.check_chain_roles([*chain, root.cert])
    except pki.CertificateValidationError as exc:
        return exc.reason
    return "ok"


@pytest.mark.parametrize("length", [1, 2, 3])
def test_every_role_permutation_up_to_three_deep(root: pki.CertAndKey, length: int) -> None:
    for roles in itertools.product(ROLES, repeat=length):
        chain = _chain(root, roles)
        outcome = _outcome(root, chain)
        if roles in VALID_FROM_ROOT:
            assert outcome == "ok", roles
            # Full validation (signatures, CA flags, path lengths, dates) agrees on the good ones.
            assert pki.validate_cert_path(chain, trust_root=root.cert, now=NOW) is roles[-1]
        else:
            # (a child named after an issuer that is itself out of place may be reported for its name)
            assert outcome in ("wrong-role", "name-mismatch"), (roles, outcome)
            with pytest.raises(pki.CertificateValidationError):
                pki.validate_cert_path(chain, trust_root=root.cert, now=NOW)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(roles=st.lists(st.sampled_from(ROLES), min_size=4, max_size=5))
def test_deeper_role_sequences(root: pki.CertAndKey, roles: list[CertRole]) -> None:
    chain = _chain(root, roles[:4])
    expected_ok = tuple(roles[:4]) in VALID_FROM_ROOT
    assert (_outcome(root, chain) == "ok") is expected_ok
    if not expected_ok:
        with pytest.raises(pki.CertificateValidationError):
            pki.validate_cert_path(chain, trust_root=root.cert, now=NOW)


def test_a_role_less_intermediate_is_not_the_root(root: pki.CertAndKey) -> None:
    """A CA certificate without a role is not the network root, even when its child's parent may be."""
    key = _KEYS[1]
    anonymous_ca = (
        x509.CertificateBuilder()
        .subject_name(ALICE.to_x509_name()).issuer_name(root.cert.subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(root.cert.not_valid_before_utc).not_valid_after(root.cert.not_valid_after_utc)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(root.key, pki._certs._hash_for(root.key))  # type: ignore[attr-defined]
    )  # fmt: skip
    doorman = pki.create_certificate(
        role=R.DOORMAN_CA, subject=ALICE, public_key=_KEYS[2].public_key(), issuer_cert=anonymous_ca,
        issuer_key=key, now=NOW,
    )  # fmt: skip
    assert _outcome(root, [doorman, anonymous_ca]) == "missing-role"
    with pytest.raises(pki.CertificateValidationError) as info:
        pki.validate_cert_path([doorman, anonymous_ca], trust_root=root.cert, now=NOW)
    assert info.value.reason == "missing-role"


# Attribute types a certificate subject may carry (RFC 5280 / 4519 and common extras).
_EXTRA_OIDS = [
    NameOID.COMMON_NAME, NameOID.ORGANIZATIONAL_UNIT_NAME, NameOID.ORGANIZATION_NAME, NameOID.LOCALITY_NAME,
    NameOID.STATE_OR_PROVINCE_NAME, NameOID.SERIAL_NUMBER, NameOID.STREET_ADDRESS, NameOID.TITLE,
    NameOID.GIVEN_NAME, NameOID.SURNAME, NameOID.PSEUDONYM, NameOID.DOMAIN_COMPONENT, NameOID.EMAIL_ADDRESS,
    NameOID.USER_ID, NameOID.POSTAL_CODE, NameOID.BUSINESS_CATEGORY, NameOID.DN_QUALIFIER,
    NameOID.JURISDICTION_LOCALITY_NAME, NameOID.ORGANIZATION_IDENTIFIER, NameOID.INITIALS,
]  # fmt: skip


@pytest.fixture(scope="module")
def alice_ca(root: pki.CertAndKey) -> tuple[x509.Certificate, x509.Certificate]:
    """A doorman and Alice's node CA under ``root`` (node CA first)."""
    node_ca, doorman = _chain(root, [R.DOORMAN_CA, R.NODE_CA])
    return node_ca, doorman


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    oid=st.sampled_from(_EXTRA_OIDS),
    value=st.text(string.ascii_letters + string.digits, min_size=1, max_size=12),
    position=st.integers(min_value=0, max_value=3),
    role=st.sampled_from([R.TLS, R.LEGAL_IDENTITY]),
)
def test_every_extra_subject_attribute_is_refused(
    root: pki.CertAndKey,
    alice_ca: tuple[x509.Certificate, x509.Certificate],
    oid: x509.ObjectIdentifier,
    value: str,
    position: int,
    role: CertRole,
) -> None:
    """OU=Sybil,O=Alice,... (and every other extra attribute, anywhere) is not Alice, though it lies in
    the node CA's name constraint when appended."""
    node_ca, doorman = alice_ca
    rdns = list(node_ca.subject.rdns)
    rdns.insert(min(position, len(rdns)), x509.RelativeDistinguishedName([x509.NameAttribute(oid, value)]))
    sybil = x509.Name(rdns)
    leaf = pki.create_certificate(
        role=role, subject=sybil, public_key=_KEYS[3].public_key(), issuer_cert=node_ca,
        issuer_key=_KEYS[2], now=NOW,
    )  # fmt: skip
    assert _outcome(root, [leaf, node_ca, doorman]) == "name-mismatch"
    with pytest.raises(pki.CertificateValidationError) as info:
        pki.validate_cert_path([leaf, node_ca, doorman], trust_root=root.cert, now=NOW)
    assert info.value.reason in ("name-mismatch", "name-constraint")


@pytest.mark.parametrize(
    "change",
    ["drop-locality", "reorder", "other-case", "other-organisation"],
)
def test_any_other_name_under_the_node_ca_is_refused(
    root: pki.CertAndKey, alice_ca: tuple[x509.Certificate, x509.Certificate], change: str
) -> None:
    node_ca, doorman = alice_ca
    rdns = list(node_ca.subject.rdns)
    if change == "drop-locality":
        rdns = [r for r in rdns if next(iter(r)).oid != NameOID.LOCALITY_NAME]
    elif change == "reorder":
        rdns = rdns[::-1]
    elif change == "other-case":
        rdns = [
            x509.RelativeDistinguishedName([x509.NameAttribute(a.oid, str(a.value).lower()) for a in r])
            if next(iter(r)).oid == NameOID.ORGANIZATION_NAME else r
            for r in rdns
        ]  # fmt: skip
    else:
        rdns = [
            x509.RelativeDistinguishedName([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Alicia")])
            if next(iter(r)).oid == NameOID.ORGANIZATION_NAME else r
            for r in rdns
        ]  # fmt: skip
    leaf = pki.create_certificate(
        role=R.TLS, subject=x509.Name(rdns), public_key=_KEYS[3].public_key(), issuer_cert=node_ca,
        issuer_key=_KEYS[2], now=NOW,
    )  # fmt: skip
    assert _outcome(root, [leaf, node_ca, doorman]) == "name-mismatch"
    with pytest.raises(pki.CertificateValidationError):
        pki.validate_cert_path([leaf, node_ca, doorman], trust_root=root.cert, now=NOW)
