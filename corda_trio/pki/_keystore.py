"""Keys and certificates on disk as PEM.

Private keys are PKCS#8 PEM encrypted with ``BestAvailableEncryption(passphrase)``.  With cryptography 50
and OpenSSL 3 that is PBES2: PBKDF2-HMAC-SHA256 with 2048 iterations and AES-256-CBC (checked with
``openssl asn1parse``).  Measured here: ~0.5 ms to write and ~0.4 ms to read a key, so a three-node
bootstrap (twelve keys) spends ~6 ms on encryption.  The flip side is that 2048 PBKDF2 iterations slow a
guessing attack very little: the passphrase must carry the entropy itself.  The bootstrapper therefore
generates 192-bit random passphrases unless the operator supplies one through an environment variable.
Without a passphrase a key is written unencrypted, which the caller must ask for explicitly
(``passphrase=None``).

Every file is written atomically (temporary file in the same directory, ``fsync``, ``rename``) with mode
0600 for private keys, 0644 for certificates.  Reading a private key refuses one that group or others can
read, as OpenSSH does, because a key that leaked once cannot be made secret again.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from corda_trio.files import read_small_file, write_file_atomically

from ._certs import CaKey, load_pem_certificates
from ._errors import KeyStoreError

__all__ = [
    "PRIVATE_FILE_MODE",
    "read_certificate",
    "read_certificates",
    "read_private_key",
    "write_certificates",
    "write_private_key",
]

#: Mode of private key files (and the only mode accepted when reading, apart from stricter ones).
PRIVATE_FILE_MODE: Final[int] = 0o600
#: Mode of certificate files (public data).
PUBLIC_FILE_MODE: Final[int] = 0o644


def write_private_key(path: str | os.PathLike[str], key: CaKey, passphrase: bytes | None) -> None:
    """Write ``key`` as PKCS#8 PEM, encrypted with ``passphrase`` (``None``: unencrypted), mode 0600."""
    if passphrase is not None and not passphrase:
        raise KeyStoreError("an empty passphrase cannot encrypt a key (pass None for an unencrypted key)")
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(passphrase) if passphrase else serialization.NoEncryption()
    )
    data = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)
    write_file_atomically(path, data, PRIVATE_FILE_MODE)


def read_private_key(path: str | os.PathLike[str], passphrase: bytes | None) -> CaKey:
    """Read a key written by :func:`write_private_key`.

    Raises:
        KeyStoreError: missing file, group/world-accessible file, wrong or missing passphrase, not a PEM
            private key, or an unsupported key type.
    """
    path = Path(path)
    try:
        st = path.stat()
        data = read_small_file(path)
    except OSError as exc:
        raise KeyStoreError(f"cannot read private key {str(path)!r}: {exc.strerror}") from exc
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise KeyStoreError(
            f"private key {str(path)!r} has mode {stat.S_IMODE(st.st_mode):04o}; it must not be accessible "
            f"by group or others (chmod 600)"
        )
    try:
        key = serialization.load_pem_private_key(data, password=passphrase or None)
    except TypeError as exc:  # encrypted but no passphrase, or a passphrase for a plain key
        raise KeyStoreError(f"private key {str(path)!r}: {exc}") from exc
    except ValueError as exc:
        raise KeyStoreError(
            f"private key {str(path)!r} cannot be decrypted or parsed (wrong passphrase?)"
        ) from exc
    if not isinstance(key, ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey):
        raise KeyStoreError(f"private key {str(path)!r} is a {type(key).__name__}; expected ECDSA or Ed25519")
    return key


def check_key_pair(
    cert: x509.Certificate, key: CaKey, *, cert_path: str | os.PathLike[str], key_path: str | os.PathLike[str]
) -> None:
    """Check that ``key`` (read from ``key_path``) is the key of ``cert`` (the first of ``cert_path``).

    Raises:
        KeyStoreError: it is not, naming both files (OpenSSL's refusal of the pair names neither, or only the
            temporary copies it was given).
    """
    if cert.public_key() != key.public_key():
        raise KeyStoreError(f"{os.fspath(key_path)} is not the key of {os.fspath(cert_path)}")


def write_certificates(path: str | os.PathLike[str], certs: Sequence[x509.Certificate]) -> None:
    """Write one or more certificates (leaf first) as concatenated PEM, mode 0644."""
    data = b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certs)
    write_file_atomically(path, data, PUBLIC_FILE_MODE)


def read_certificates(path: str | os.PathLike[str]) -> list[x509.Certificate]:
    """Read a PEM file of one or more certificates, in file order.

    Raises:
        KeyStoreError: missing file, or no / malformed certificates.
    """
    try:
        data = read_small_file(path)
    except OSError as exc:
        raise KeyStoreError(f"cannot read certificates {os.fspath(path)!r}: {exc.strerror}") from exc
    try:
        certs = load_pem_certificates(data)
    except ValueError as exc:
        # (cryptography's message ends with a link to its FAQ: not for an operator's one-line error)
        reason = re.sub(r"\s*See https?://\S+ for more details\.", "", str(exc)).strip()
        raise KeyStoreError(f"{os.fspath(path)!r} does not hold PEM certificates: {reason}") from exc
    return certs


def read_certificate(path: str | os.PathLike[str]) -> x509.Certificate:
    """Read a PEM file holding exactly one certificate.

    Raises:
        KeyStoreError: as :func:`read_certificates`, or the file holds more than one certificate.
    """
    certs = read_certificates(path)
    if len(certs) != 1:
        raise KeyStoreError(f"{os.fspath(path)!r} holds {len(certs)} certificates, expected exactly one")
    return certs[0]
