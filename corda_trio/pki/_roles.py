"""Corda's certificate role extension (OID 1.3.6.1.4.1.50530.1.1).

The extension is non-critical and holds one DER ``INTEGER``: the role of the certificate.  Values and the
allowed parent roles follow Corda 4's ``net.corda.core.internal.CertRole``; ``None`` as a parent means "a
certificate without the extension", i.e. the network root.
"""

from __future__ import annotations

import enum
from typing import Final

from cryptography import x509

from ._errors import CertificateValidationError

__all__ = ["CERT_ROLE_OID", "CertRole", "get_cert_role", "role_extension"]

#: Corda's private enterprise arc 50530, ``1.1`` = certificate role.
CERT_ROLE_OID: Final[x509.ObjectIdentifier] = x509.ObjectIdentifier("1.3.6.1.4.1.50530.1.1")


class CertRole(enum.IntEnum):
    """Role of a certificate in a Corda network (the integer is what the extension carries)."""

    DOORMAN_CA = 1
    NODE_CA = 2
    TLS = 3
    LEGAL_IDENTITY = 4
    CONFIDENTIAL_LEGAL_IDENTITY = 5
    NETWORK_MAP = 6
    SERVICE_IDENTITY = 7
    NETWORK_PARAMETERS = 8

    @property
    def allowed_parents(self) -> frozenset[CertRole | None]:
        """Roles its issuer may have (``None``: an issuer without the extension, i.e. the root)."""
        return _PARENTS[self]


_PARENTS: Final[dict[CertRole, frozenset[CertRole | None]]] = {
    CertRole.DOORMAN_CA: frozenset({None}),
    CertRole.NODE_CA: frozenset({CertRole.DOORMAN_CA}),
    CertRole.TLS: frozenset({CertRole.NODE_CA}),
    CertRole.LEGAL_IDENTITY: frozenset({CertRole.DOORMAN_CA, CertRole.NODE_CA}),
    CertRole.CONFIDENTIAL_LEGAL_IDENTITY: frozenset({CertRole.LEGAL_IDENTITY}),
    CertRole.NETWORK_MAP: frozenset({None}),
    CertRole.SERVICE_IDENTITY: frozenset({None}),
    CertRole.NETWORK_PARAMETERS: frozenset({None}),
}


def role_extension(role: CertRole) -> x509.UnrecognizedExtension:
    """The extension value for ``role``: DER ``INTEGER`` (tag 0x02, length 1, value 1..8)."""
    return x509.UnrecognizedExtension(CERT_ROLE_OID, bytes((0x02, 0x01, int(role))))


def get_cert_role(cert: x509.Certificate) -> CertRole | None:
    """The role carried by ``cert``, or ``None`` if it has no role extension (a root).

    Raises:
        CertificateValidationError: the extension is present but not a DER INTEGER naming a known role
            (``reason="malformed"``).
    """
    try:
        ext = cert.extensions.get_extension_for_oid(CERT_ROLE_OID)
    except x509.ExtensionNotFound:
        return None
    value = ext.value.value if isinstance(ext.value, x509.UnrecognizedExtension) else b""
    # DER INTEGER: tag 0x02, short length, big-endian two's complement content without redundant bytes.
    if len(value) < 3 or value[0] != 0x02 or value[1] != len(value) - 2 or value[1] > 8:
        raise CertificateValidationError(
            f"certificate {cert.subject.rfc4514_string()!r}: role extension is not a DER INTEGER",
            reason="malformed",
        )
    number = int.from_bytes(value[2:], "big", signed=True)
    try:
        return CertRole(number)
    except ValueError:
        raise CertificateValidationError(
            f"certificate {cert.subject.rfc4514_string()!r}: unknown Corda role {number}", reason="malformed"
        ) from None
