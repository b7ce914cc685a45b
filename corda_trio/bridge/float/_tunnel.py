"""The tunnel PKI: a small local-only CA and the certificates of the bridge <-> float control link.

Theory of operation
-------------------
The control link between the internal bridge manager and a float is mutual TLS, but *not* with the
network's certificates: a tunnel certificate must be worthless anywhere else, and a node certificate must
not open the tunnel. So the operator makes a separate CA (``corda-trio float tunnel-pki``), kept off the
network, and issues from it one certificate per float and one for the bridge manager::

    tunnel CA (self-signed, O=corda-trio tunnel)
      ├── float   CN=<float name>, OU=float    serverAuth
      └── bridge  CN=<bridge name>, OU=bridge  clientAuth

The float trusts only the tunnel CA and accepts only an ``OU=bridge`` certificate; the bridge trusts only
the tunnel CA and accepts only an ``OU=float`` certificate. None carries Corda's role extension, so a node
refuses a tunnel certificate as a TLS identity, and the network root never issued one, so no peer trusts it.
TLS contexts are the project's usual ones (``pki.client_ssl_context`` / ``pki.server_ssl_context``) with
the tunnel CA as the trust root.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any, Final, final

import attrs
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from corda_trio import pki

__all__ = [
    "TUNNEL_ORGANISATION",
    "TunnelCredentials",
    "TunnelPki",
    "check_tunnel_peer",
    "tunnel_role",
]

TUNNEL_ORGANISATION: Final = "corda-trio tunnel"
#: Tunnel certificates live a year: they are cheap to reissue and never leave the operator's hosts.
TUNNEL_VALIDITY: Final = dt.timedelta(days=365)
_BACKDATE: Final = dt.timedelta(hours=1)
ROLES: Final = ("float", "bridge")


def _name(common_name: str, unit: str | None) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, TUNNEL_ORGANISATION)]
    if unit is not None:
        attributes.append(x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, unit))
    attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attributes)


@final
@attrs.frozen(kw_only=True)
class TunnelCredentials:
    """One end's tunnel certificate, its key and the tunnel CA certificate it trusts."""

    cert: x509.Certificate
    key: pki.CaKey
    ca: x509.Certificate

    @property
    def role(self) -> str:
        return tunnel_role(self.cert)

    def client_context(self) -> Any:
        """The bridge manager's context for dialling a float."""
        return pki.client_ssl_context(cert_chain=[self.cert], key=self.key, trust_root=self.ca)  # type: ignore[arg-type]

    def server_context(self) -> Any:
        """The float's context for its control listener."""
        return pki.server_ssl_context(cert_chain=[self.cert], key=self.key, trust_root=self.ca)  # type: ignore[arg-type]

    def write(self, directory: Path, stem: str) -> tuple[Path, Path]:
        """Write ``<stem>.pem`` and ``<stem>.key`` (unencrypted, mode 0600) into ``directory``."""
        cert_path, key_path = directory / f"{stem}.pem", directory / f"{stem}.key"
        pki.write_certificates(cert_path, [self.cert])
        pki.write_private_key(key_path, self.key, None)
        return cert_path, key_path

    @classmethod
    def read(cls, cert: Path, key: Path, ca: Path) -> TunnelCredentials:
        """Read an end's files back.

        Raises:
            pki.KeyStoreError: a file is missing or unreadable, the key is not the certificate's, or the CA
                did not issue the certificate (said now, naming the files: the TLS context would name only
                the temporary copies it loads, and a CA that is not the tunnel's let the float start and
                refuse every bridge).
        """
        creds = cls(
            cert=pki.read_certificate(cert), key=pki.read_private_key(key, None), ca=pki.read_certificate(ca)
        )
        pki.check_key_pair(creds.cert, creds.key, cert_path=cert, key_path=key)
        try:
            creds.cert.verify_directly_issued_by(creds.ca)
        except (ValueError, TypeError, InvalidSignature):
            raise pki.KeyStoreError(f"{cert} was not issued by the tunnel CA {ca}") from None
        return creds


@final
@attrs.frozen(kw_only=True)
class TunnelPki:
    """The tunnel CA; issues float and bridge certificates. ``now`` is always an argument."""

    ca: pki.CertAndKey

    @classmethod
    def create(cls, *, now: dt.datetime, validity: dt.timedelta = TUNNEL_VALIDITY) -> TunnelPki:
        key = pki.generate_ec_key()
        cert = pki.create_root_certificate(
            _name("corda-trio tunnel CA", None), key, now=now, validity=validity
        )
        return cls(ca=pki.CertAndKey(cert=cert, key=key))

    def issue(
        self, role: str, name: str, *, now: dt.datetime, validity: dt.timedelta = TUNNEL_VALIDITY
    ) -> TunnelCredentials:
        """A certificate for a float (``role="float"``) or the bridge manager (``role="bridge"``)."""
        if role not in ROLES:
            raise ValueError(f"tunnel role must be one of {ROLES}, got {role!r}")
        key = pki.generate_ec_key()
        issuer = self.ca.cert
        usage = ExtendedKeyUsageOID.SERVER_AUTH if role == "float" else ExtendedKeyUsageOID.CLIENT_AUTH
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(name, role))
            .issuer_name(issuer.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(max(now - _BACKDATE, issuer.not_valid_before_utc))
            .not_valid_after(min(now + validity, issuer.not_valid_after_utc))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=True,
                    key_cert_sign=False,
                    crl_sign=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(
                    issuer.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
                ),
                critical=False,
            )
            .sign(self.ca.key, hashes.SHA256())  # the tunnel CA key is ECDSA P-256
        )
        return TunnelCredentials(cert=cert, key=key, ca=issuer)


def tunnel_role(cert: x509.Certificate) -> str:
    """``"float"`` or ``"bridge"``: the tunnel role a certificate was issued for.

    Raises:
        pki.PeerIdentityError: not a tunnel certificate.
    """
    orgs = [a.value for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)]
    units = [a.value for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)]
    if orgs != [TUNNEL_ORGANISATION] or len(units) != 1 or units[0] not in ROLES:
        raise pki.PeerIdentityError(f"{cert.subject.rfc4514_string()!r} is not a tunnel certificate")
    if pki.get_cert_role(cert) is not None:
        raise pki.PeerIdentityError(
            f"{cert.subject.rfc4514_string()!r} carries a Corda role: not a tunnel certificate"
        )
    return str(units[0])


def check_tunnel_peer(ssl_object: Any, role: str) -> str:
    """Post-handshake check of the control link: the peer holds a tunnel certificate of ``role``.

    Returns:
        The peer's common name.

    Raises:
        pki.PeerIdentityError: no certificate, not a tunnel certificate, or the other role.
    """
    cert = pki.peer_certificate(ssl_object)
    actual = tunnel_role(cert)
    if actual != role:
        raise pki.PeerIdentityError(
            f"tunnel peer {cert.subject.rfc4514_string()!r} is a {actual}, not a {role}"
        )
    return str(cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value)
