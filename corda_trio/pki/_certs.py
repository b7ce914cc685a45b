"""The certificate hierarchy of a Corda network, and validation of certificate paths.

Theory of operation
-------------------
::

    network root (self-signed, no role)
      ├── doorman CA            role DOORMAN_CA
      │     └── node CA          role NODE_CA, subject = legal name, name-constrained to the legal name
      │           ├── TLS        role TLS, ECDSA P-256, subject = legal name, serverAuth + clientAuth
      │           └── identity   role LEGAL_IDENTITY, Ed25519, subject = legal name (a CA: it may issue
      │                          confidential identities)
      └── network map            role NETWORK_MAP (signs the network map and the network parameters)

CA keys are ECDSA P-256 (signed with SHA-256) so that every TLS stack can verify the TLS chain; the legal
identity key is Ed25519, as in Corda.  Certificates carry subject and authority key identifiers and critical
basic-constraints and key-usage extensions, so OpenSSL's strict mode accepts them.

:func:`validate_cert_path` applies Corda's rules on top of plain X.509 path validation: the path must end at
the *pinned* root (compared byte for byte, never by name), each certificate must be signed by the next, be
within its validity period at ``now`` (an argument, never read from a clock), have an issuer that is a CA
allowed to sign (basic constraints, path length, key usage), carry a role whose allowed parent is its
issuer's role, fall inside every name constraint above it, and (TLS and identity certificates) carry
exactly the subject of the node CA that issued them: every attribute, so a node CA cannot mint
``OU=Sybil,O=Alice,...`` although that name lies inside its name constraint.  The first rule broken is
reported as a :class:`CertificateValidationError` whose ``reason`` is stable enough for tests and HTTP
responses.
"""

from __future__ import annotations

import datetime as dt
import re
import warnings
from collections.abc import Callable, Sequence
from typing import Final, TypeVar

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from cryptography.utils import CryptographyDeprecationWarning
from cryptography.x509.oid import ExtendedKeyUsageOID

from ._errors import CertificateValidationError
from ._names import CordaX500Name
from ._roles import CertRole, get_cert_role, role_extension

__all__ = [
    "DEFAULT_VALIDITY",
    "CaKey",
    "PublicKey",
    "check_chain_roles",
    "check_validity_period",
    "create_certificate",
    "create_root_certificate",
    "generate_ec_key",
    "generate_ed25519_key",
    "load_der_certificate",
    "load_pem_certificates",
    "validate_cert_path",
]

CaKey = ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey
PublicKey = ec.EllipticCurvePublicKey | ed25519.Ed25519PublicKey

#: Default validity of issued certificates: ten years (a development network; Corda's dev certificates
#: are valid for ten years too).
DEFAULT_VALIDITY: Final[dt.timedelta] = dt.timedelta(days=3650)
#: Certificates start this much before "now" so a peer whose clock is a little behind accepts them.
BACKDATE: Final[dt.timedelta] = dt.timedelta(hours=1)


_T = TypeVar("_T")


def load_der_certificate(der: bytes) -> x509.Certificate:
    """Parse one DER certificate, strictly: what ``cryptography`` only warns about when it parses a
    certificate (a serial number that is zero or negative, which RFC 5280 forbids) is an error here.

    Raises:
        ValueError: not a certificate, or one that breaks such a rule (the message says which).
    """
    return _strictly(x509.load_der_x509_certificate, der)


def load_pem_certificates(data: bytes) -> list[x509.Certificate]:
    """Parse every PEM certificate in ``data``, as strictly as :func:`load_der_certificate`.

    Raises:
        ValueError: no certificate, a malformed one, or one that breaks such a rule.
    """
    certs = _strictly(x509.load_pem_x509_certificates, data)
    begun = data.count(b"-----BEGIN CERTIFICATE-----")
    if begun != len(certs):  # (cryptography skips a block without its END line: a file cut short)
        raise ValueError(f"{begun} certificates begin in it but {len(certs)} are whole (cut short?)")
    return certs


def _strictly(load: Callable[[bytes], _T], data: bytes) -> _T:
    with warnings.catch_warnings():
        warnings.simplefilter("error", CryptographyDeprecationWarning)
        try:
            loaded = load(data)
            for cert in loaded if isinstance(loaded, list) else [loaded]:
                _parse_fully(cert)
            return loaded
        except CryptographyDeprecationWarning as exc:
            # (cryptography's text goes on about its future releases: keep what is wrong)
            raise ValueError(str(exc).split(". ")[0].strip()) from None
        except ValueError as exc:
            raise ValueError(_readable_parse_error(str(exc))) from None


_PARSE_ERROR: Final = re.compile(r"^error parsing asn1 value: ParseError \{ kind: (\w+)(.*)\}$", re.DOTALL)
_PARSE_KINDS: Final = {
    "InvalidValue": "a value not in DER form",
    "ShortData": "cut short",
    "ExtraData": "bytes after its end",
    "UnexpectedTag": "an unexpected field",
    "InvalidLength": "a bad length",
    "IntegerOverflow": "a number too large",
}


def _readable_parse_error(message: str) -> str:
    """cryptography's ASN.1 parser says what broke as the Rust debug form of its error
    (``ParseError { kind: InvalidValue, location: ["Certificate::tbs_cert", "TbsCertificate::serial"] }``):
    say it in words, naming the innermost field."""
    match = _PARSE_ERROR.match(message.strip())
    if match is None:
        return message
    kind, rest = match.groups()
    where = re.findall(r'"([^"]+)"', rest)
    said = _PARSE_KINDS.get(kind, kind)
    return f"not a well-formed DER certificate: {said}" + (f" in {where[-1]}" if where else "")


def _parse_fully(cert: x509.Certificate) -> None:
    """Parse what ``cryptography`` parses only when it is first used (the names, the extensions): a damaged
    certificate is refused as it is read, with the file it came from, not later by whatever touches it first
    (OpenSSL, loading it as a trust root, said only "no start line")."""
    try:
        cert.subject  # noqa: B018
        cert.issuer  # noqa: B018
        cert.extensions  # noqa: B018
    except x509.DuplicateExtension as exc:
        raise ValueError(f"duplicate extension {exc.oid.dotted_string}") from None


def generate_ec_key() -> ec.EllipticCurvePrivateKey:
    """A new ECDSA key on P-256 (secp256r1): CA and TLS keys."""
    return ec.generate_private_key(ec.SECP256R1())


def generate_ed25519_key() -> ed25519.Ed25519PrivateKey:
    """A new Ed25519 key: legal identity keys."""
    return ed25519.Ed25519PrivateKey.generate()


def _hash_for(key: CaKey) -> hashes.HashAlgorithm | None:
    return None if isinstance(key, ed25519.Ed25519PrivateKey) else hashes.SHA256()


def _x509_name(name: CordaX500Name | x509.Name) -> x509.Name:
    return name.to_x509_name() if isinstance(name, CordaX500Name) else name


def _ca_key_usage() -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True, content_commitment=False, key_encipherment=False, data_encipherment=False,
        key_agreement=False, key_cert_sign=True, crl_sign=True, encipher_only=False, decipher_only=False,
    )  # fmt: skip


def create_root_certificate(
    subject: CordaX500Name | x509.Name,
    key: CaKey,
    *,
    now: dt.datetime,
    validity: dt.timedelta = DEFAULT_VALIDITY,
) -> x509.Certificate:
    """A self-signed network root certificate (no role extension, as in Corda).

    Args:
        subject: the root's name.
        key: the root's private key (ECDSA P-256 recommended).
        now: the issue time (timezone-aware UTC).
        validity: how long the root is valid from ``now``.
    """
    name = _x509_name(subject)
    public = key.public_key()
    ski = x509.SubjectKeyIdentifier.from_public_key(public)
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + validity)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(_ca_key_usage(), critical=True)
        .add_extension(ski, critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False)
        .sign(key, _hash_for(key))
    )


def create_certificate(
    *,
    role: CertRole,
    subject: CordaX500Name | x509.Name,
    public_key: PublicKey,
    issuer_cert: x509.Certificate,
    issuer_key: CaKey,
    now: dt.datetime,
    validity: dt.timedelta = DEFAULT_VALIDITY,
) -> x509.Certificate:
    """Issue a certificate for ``role`` with the extensions Corda expects for it.

    A ``NODE_CA`` certificate is name-constrained to its own subject (the node's legal name); ``TLS``
    certificates get serverAuth + clientAuth; CA roles get keyCertSign.  The validity is clipped to the
    issuer's, so a child never outlives its parent.

    Raises:
        ValueError: the issuer certificate does not belong to ``issuer_key``.
    """
    if issuer_cert.public_key() != issuer_key.public_key():
        raise ValueError("issuer_key does not match issuer_cert")
    name = _x509_name(subject)
    not_after = min(now + validity, issuer_cert.not_valid_after_utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer_cert.subject)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(max(now - BACKDATE, issuer_cert.not_valid_before_utc))
        .not_valid_after(not_after)
        .add_extension(role_extension(role), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(
                issuer_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
            ),
            critical=False,
        )
    )
    if role in (CertRole.DOORMAN_CA, CertRole.NODE_CA, CertRole.LEGAL_IDENTITY):
        # Path lengths: doorman -> node CA -> identity -> confidential identity.
        path_length = {CertRole.DOORMAN_CA: 2, CertRole.NODE_CA: 1, CertRole.LEGAL_IDENTITY: 0}[role]
        builder = builder.add_extension(
            x509.BasicConstraints(ca=True, path_length=path_length), critical=True
        )
        builder = builder.add_extension(_ca_key_usage(), critical=True)
    else:
        builder = builder.add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        tls = role is CertRole.TLS
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=tls,
                data_encipherment=False, key_agreement=tls, key_cert_sign=False, crl_sign=False,
                encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )  # fmt: skip
        if tls:
            builder = builder.add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                critical=False,
            )
    if role is CertRole.NODE_CA:
        builder = builder.add_extension(
            x509.NameConstraints(permitted_subtrees=[x509.DirectoryName(name)], excluded_subtrees=None),
            critical=True,
        )
    return builder.sign(issuer_key, _hash_for(issuer_key))


def _der(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.DER)


def _describe(cert: x509.Certificate) -> str:
    return repr(cert.subject.rfc4514_string())


def _within(subject: x509.Name, base: x509.Name) -> bool:
    """RFC 5280 §4.2.1.10 directoryName: ``base`` is a prefix of ``subject``'s RDN sequence."""
    return list(subject.rdns[: len(base.rdns)]) == list(base.rdns)


def check_validity_period(cert: x509.Certificate, *, now: dt.datetime) -> None:
    """Check that ``now`` lies within ``cert``'s validity period (both ends included, as RFC 5280 §4.1.2.5).

    Args:
        now: the time to check at (timezone-aware UTC; never read from a clock here).

    Raises:
        CertificateValidationError: ``reason`` ``expired`` (the message gives the not-after time) or
            ``not-yet-valid`` (it gives the not-before time); the message names the certificate's subject.
    """
    if now < cert.not_valid_before_utc:
        raise CertificateValidationError(
            f"certificate {_describe(cert)} is not valid before {cert.not_valid_before_utc.isoformat()}",
            reason="not-yet-valid",
        )
    if now > cert.not_valid_after_utc:
        raise CertificateValidationError(
            f"certificate {_describe(cert)} expired at {cert.not_valid_after_utc.isoformat()}",
            reason="expired",
        )


def validate_cert_path(
    path: Sequence[x509.Certificate],
    *,
    trust_root: x509.Certificate,
    now: dt.datetime,
    leaf_role: CertRole | None = None,
) -> CertRole | None:
    """Validate a certificate path against the pinned network root with Corda's rules.

    Args:
        path: leaf first, then each issuer; the root may be the last element (it must then be byte-equal to
            ``trust_root``) or be left out.
        trust_root: the pinned network root.
        now: the validation time (timezone-aware UTC).
        leaf_role: if given, the role the leaf must have.

    Returns:
        The leaf's role (``None`` only when ``path`` is just the root).

    Raises:
        CertificateValidationError: the first rule broken; ``reason`` is one of ``empty``, ``untrusted-root``,
            ``wrong-parent``, ``bad-signature``, ``expired``, ``not-yet-valid``, ``not-a-ca``,
            ``path-length``, ``missing-role``, ``wrong-role``, ``name-constraint``, ``name-mismatch``,
            ``malformed``.
    """
    if not path:
        raise CertificateValidationError("empty certificate path", reason="empty")
    for cert in path:
        _check_parses(cert)
    root_der = _der(trust_root)
    certs = list(path)
    if _der(certs[-1]) == root_der:
        certs.pop()
    elif certs[-1].issuer == certs[-1].subject:
        raise CertificateValidationError(
            f"path ends at root {_describe(certs[-1])}, which is not this network's root",
            reason="untrusted-root",
        )
    full = [*certs, trust_root]
    for cert in full:
        check_validity_period(cert, now=now)
    for index, child in enumerate(certs):
        parent = full[index + 1]
        if child.issuer != parent.subject:
            reason = "untrusted-root" if parent is trust_root else "wrong-parent"
            raise CertificateValidationError(
                f"certificate {_describe(child)} was issued by {child.issuer.rfc4514_string()!r}, "
                f"not by {_describe(parent)}",
                reason=reason,
            )
        try:
            child.verify_directly_issued_by(parent)
        except (ValueError, TypeError, InvalidSignature) as exc:
            reason = "untrusted-root" if parent is trust_root else "bad-signature"
            raise CertificateValidationError(
                f"certificate {_describe(child)} is not signed by the key of {_describe(parent)}",
                reason=reason,
            ) from exc
        # RFC 5280 §4.2.1.9: intermediate CAs between ``parent`` and the leaf (the leaf never counts).
        _check_issuer_is_ca(parent, cas_below=sum(1 for c in certs[1 : index + 1] if _is_ca(c)))
        _check_name_constraints(parent, certs[: index + 1])
        _check_role_and_name(child, parent, parent_is_root=parent is trust_root)
    leaf = certs[0] if certs else None
    role = get_cert_role(leaf) if leaf is not None else None
    if leaf_role is not None and role is not leaf_role:
        shown = "no role" if role is None else role.name
        raise CertificateValidationError(
            f"expected a {leaf_role.name} certificate, got {shown}", reason="wrong-role"
        )
    return role


#: Roles whose certificate a node CA (or, for confidential identities, the legal identity) issues for the
#: node itself: their subject must equal the issuer's exactly (Corda: a node CA issues only for its own name).
_SAME_NAME_AS_ISSUER: Final = frozenset(
    {CertRole.TLS, CertRole.LEGAL_IDENTITY, CertRole.CONFIDENTIAL_LEGAL_IDENTITY}
)


def _check_role_and_name(child: x509.Certificate, parent: x509.Certificate, *, parent_is_root: bool) -> None:
    """``child`` carries a role that ``parent``'s role may issue, and a node CA's children carry its name."""
    child_role = get_cert_role(child)
    parent_role = None if parent_is_root else get_cert_role(parent)
    if child_role is None:
        raise CertificateValidationError(
            f"certificate {_describe(child)} has no Corda role extension", reason="missing-role"
        )
    if not parent_is_root and parent_role is None:
        raise CertificateValidationError(
            f"certificate {_describe(parent)} issues {_describe(child)} but has no Corda role extension "
            "and is not the network root",
            reason="missing-role",
        )
    if parent_role not in child_role.allowed_parents:
        parent_shown = "the root" if parent_role is None else parent_role.name
        raise CertificateValidationError(
            f"a {child_role.name} certificate ({_describe(child)}) may not be issued by {parent_shown}",
            reason="wrong-role",
        )
    if (
        child_role in _SAME_NAME_AS_ISSUER
        and parent_role in (CertRole.NODE_CA, CertRole.LEGAL_IDENTITY)
        and child.subject != parent.subject
    ):
        # Every attribute, in order: OU=Sybil,O=Alice,... under Alice's node CA is a different identity
        # even though it falls inside the node CA's name constraint (a prefix match, RFC 5280).
        raise CertificateValidationError(
            f"a {child_role.name} certificate ({_describe(child)}) must carry exactly the name of its "
            f"{parent_role.name} issuer ({_describe(parent)})",
            reason="name-mismatch",
        )


def check_chain_roles(
    chain: Sequence[x509.Certificate], *, leaf_role: CertRole | None = None
) -> CertRole | None:
    """Corda's role, position and name rules for a chain whose signatures and dates were checked elsewhere
    (by OpenSSL during a TLS handshake): leaf first, the root last.

    Every certificate's role must be one its issuer's role may issue (root -> doorman CA -> node CA -> TLS /
    legal identity -> confidential identity; root -> network map / service identity / parameters), only
    the last certificate may lack a role, and a node CA's children carry exactly its subject.

    Returns:
        The leaf's role.

    Raises:
        CertificateValidationError: ``empty``, ``missing-role``, ``wrong-role``, ``name-mismatch`` or
            ``malformed``, naming the certificate out of place.
    """
    if not chain:
        raise CertificateValidationError("empty certificate path", reason="empty")
    for cert in chain:
        _check_parses(cert)
    for index, child in enumerate(chain[:-1]):
        _check_role_and_name(child, chain[index + 1], parent_is_root=index + 1 == len(chain) - 1)
    root_role = get_cert_role(chain[-1])
    if root_role is not None and len(chain) > 1:
        raise CertificateValidationError(
            f"the chain ends at {_describe(chain[-1])} with role {root_role.name}, not at the network root",
            reason="wrong-role",
        )
    role = get_cert_role(chain[0]) if len(chain) > 1 else None
    if leaf_role is not None and role is not leaf_role:
        shown = "no role" if role is None else role.name
        raise CertificateValidationError(
            f"expected a {leaf_role.name} certificate, got {shown}", reason="wrong-role"
        )
    return role


def _check_parses(cert: x509.Certificate) -> None:
    """cryptography parses some fields lazily: touch them all so that a malformed certificate fails here,
    as ``malformed``, and not later with a bare ``ValueError``."""
    try:
        cert.subject.rdns  # noqa: B018
        cert.issuer.rdns  # noqa: B018
        cert.extensions  # noqa: B018
        cert.public_key()
        cert.not_valid_before_utc  # noqa: B018
        cert.not_valid_after_utc  # noqa: B018
        cert.signature_hash_algorithm  # noqa: B018
    except (ValueError, TypeError, x509.UnsupportedGeneralNameType, UnsupportedAlgorithm) as exc:
        raise CertificateValidationError(f"malformed certificate: {exc}", reason="malformed") from None


def _is_ca(cert: x509.Certificate) -> bool:
    try:
        return cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        return False


def _check_issuer_is_ca(parent: x509.Certificate, *, cas_below: int) -> None:
    try:
        constraints = parent.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        constraints = None
    if constraints is None or not constraints.ca:
        raise CertificateValidationError(f"issuer {_describe(parent)} is not a CA", reason="not-a-ca")
    if constraints.path_length is not None and cas_below > constraints.path_length:
        raise CertificateValidationError(
            f"issuer {_describe(parent)} allows {constraints.path_length} CA(s) below it, found {cas_below}",
            reason="path-length",
        )
    try:
        usage = parent.extensions.get_extension_for_class(x509.KeyUsage).value
    except x509.ExtensionNotFound:
        return
    if not usage.key_cert_sign:
        raise CertificateValidationError(
            f"issuer {_describe(parent)} has no keyCertSign key usage", reason="not-a-ca"
        )


def _check_name_constraints(constrainer: x509.Certificate, below: Sequence[x509.Certificate]) -> None:
    try:
        constraints = constrainer.extensions.get_extension_for_class(x509.NameConstraints).value
    except x509.ExtensionNotFound:
        return
    permitted = [g.value for g in constraints.permitted_subtrees or () if isinstance(g, x509.DirectoryName)]
    excluded = [g.value for g in constraints.excluded_subtrees or () if isinstance(g, x509.DirectoryName)]
    for cert in below:
        if permitted and not any(_within(cert.subject, base) for base in permitted):
            raise CertificateValidationError(
                f"certificate {_describe(cert)} is outside the name constraint of {_describe(constrainer)}",
                reason="name-constraint",
            )
        if any(_within(cert.subject, base) for base in excluded):
            raise CertificateValidationError(
                f"certificate {_describe(cert)} is excluded by the name constraint of "
                f"{_describe(constrainer)}",
                reason="name-constraint",
            )
