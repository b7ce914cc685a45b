"""``ssl.SSLContext`` builders for node-to-node mutual TLS, and the post-handshake peer identity check.

Theory of operation
-------------------
Every node holds a TLS certificate (ECDSA P-256, role ``TLS``) issued by its node CA, which the doorman CA
issued, which the network root issued.  Both ends of a connection present their chain (leaf, node CA,
doorman CA) and trust *only* the network root: no system CA store is loaded.  The server requires a client
certificate (``CERT_REQUIRED`` set explicitly: ``Purpose.CLIENT_AUTH`` contexts default to ``CERT_NONE``).
OpenSSL then checks signatures, validity dates, CA flags, path lengths and the node CA's name constraint.

Host names mean nothing here (``check_hostname`` is off): a node is identified by its X.500 legal name,
which is the subject of its TLS certificate.  OpenSSL alone would therefore accept *any* certificate from the
network for *any* peer, so after the handshake the caller must run :func:`check_peer_legal_name` (outbound:
the peer we meant to dial) or :func:`check_peer_is_network_node` (inbound: any node of the network; the
name then becomes the authenticated sender).  Both read the whole chain OpenSSL verified and apply Corda's
rules to every certificate in it (:func:`check_chain_roles`): the leaf has the ``TLS`` role, each issuer has
the role that may issue its child (a TLS certificate issued by a legal identity is refused), and the leaf's
subject equals its node CA's exactly.

TLS 1.2 is the minimum and 1.3 is negotiated whenever both sides have it.  With TLS 1.3 a client whose
certificate the server rejects still completes ``do_handshake()`` and only fails on its first read: treat a
link as authenticated only after the peer's first bytes arrive.

``ssl`` only loads certificate chains and keys from files.  Paths are used directly (an encrypted key with a
passphrase is fine); in-memory certificates and keys are written to a private temporary directory (mode
0700, files 0600), loaded, and deleted before the builder returns.
"""

from __future__ import annotations

import os
import ssl
import tempfile
from collections.abc import Sequence
from typing import Final, Protocol

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from corda_trio.files import check_regular_file, read_small_file

from ._certs import check_chain_roles, load_der_certificate, load_pem_certificates
from ._errors import CertificateValidationError, InvalidNameError, KeyStoreError, PeerIdentityError
from ._keystore import check_key_pair, read_certificates, read_private_key
from ._names import CordaX500Name
from ._roles import CertRole, get_cert_role

__all__ = [
    "TLS_CIPHERS_TLS12",
    "PeerCertificateSource",
    "check_peer_is_network_node",
    "check_peer_legal_name",
    "client_ssl_context",
    "peer_certificate",
    "peer_chain",
    "presented_chain",
    "server_ssl_context",
]

#: Cipher suites for TLS 1.2 (TLS 1.3 suites are OpenSSL's defaults, all AEAD).  Corda pins
#: ECDHE-ECDSA with AES-128-GCM; we also allow AES-256-GCM and ChaCha20-Poly1305.
TLS_CIPHERS_TLS12: Final[str] = (
    "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-ECDSA-CHACHA20-POLY1305"
)

PathLike = str | os.PathLike[str]
PrivateKey = ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey | rsa.RSAPrivateKey


class PeerCertificateSource(Protocol):
    """Anything with ``getpeercert(binary_form=True)``: ``ssl.SSLObject``, ``ssl.SSLSocket``,
    ``trio.SSLStream`` (which forwards the call to its ``SSLObject``)."""

    def getpeercert(self, binary_form: bool = ...) -> object: ...


def client_ssl_context(
    *,
    cert_chain: PathLike | Sequence[x509.Certificate],
    key: PathLike | PrivateKey,
    trust_root: PathLike | x509.Certificate,
    passphrase: bytes | None = None,
) -> ssl.SSLContext:
    """Context for dialling a peer: presents our chain, trusts only ``trust_root``, no host-name check.

    Args:
        cert_chain: PEM file or certificates, leaf (our TLS certificate) first, then node CA and doorman
            CA; the root may be included but need not be.
        key: PEM file (encrypted if ``passphrase`` is given) or the private key of the leaf.
        trust_root: the network root certificate (PEM file or object); nothing else is trusted.
        passphrase: passphrase of an encrypted key file.

    Raises:
        KeyStoreError: a file is missing or unreadable, the key does not match the certificate, or the
            passphrase is wrong.
    """
    return _build(ssl.PROTOCOL_TLS_CLIENT, cert_chain, key, trust_root, passphrase)


def server_ssl_context(
    *,
    cert_chain: PathLike | Sequence[x509.Certificate],
    key: PathLike | PrivateKey,
    trust_root: PathLike | x509.Certificate,
    passphrase: bytes | None = None,
) -> ssl.SSLContext:
    """Context for accepting peers: like :func:`client_ssl_context`, and a client certificate is required.

    Raises:
        KeyStoreError: as for :func:`client_ssl_context`.
    """
    return _build(ssl.PROTOCOL_TLS_SERVER, cert_chain, key, trust_root, passphrase)


def _build(
    protocol: int,
    cert_chain: PathLike | Sequence[x509.Certificate],
    key: PathLike | PrivateKey,
    trust_root: PathLike | x509.Certificate,
    passphrase: bytes | None,
) -> ssl.SSLContext:
    ctx = ssl.SSLContext(protocol)  # PROTOCOL_TLS_CLIENT / PROTOCOL_TLS_SERVER
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.options |= ssl.OP_NO_COMPRESSION | ssl.OP_NO_TICKET
    if hasattr(ssl, "OP_NO_RENEGOTIATION"):
        ctx.options |= ssl.OP_NO_RENEGOTIATION
    ctx.set_ciphers(TLS_CIPHERS_TLS12)
    ctx.check_hostname = False  # identity is the legal name, checked after the handshake
    ctx.verify_mode = ssl.CERT_REQUIRED  # both roles: the server must ask for the client's certificate
    ctx.verify_flags |= ssl.VERIFY_X509_STRICT
    cadata = _root_pem(trust_root)
    try:
        ctx.load_verify_locations(cadata=cadata)
    except ssl.SSLError as exc:  # (cryptography parses a certificate lazily: OpenSSL may refuse what it read)
        where = "" if isinstance(trust_root, x509.Certificate) else f" {os.fspath(trust_root)!r}"
        raise KeyStoreError(
            f"trust root{where} is not a certificate OpenSSL can load (damaged?): {exc.reason or exc}"
        ) from exc
    _load_chain(ctx, cert_chain, key, passphrase)
    return ctx


def _root_pem(trust_root: PathLike | x509.Certificate) -> str:
    if isinstance(trust_root, x509.Certificate):
        return trust_root.public_bytes(serialization.Encoding.PEM).decode("ascii")
    try:
        data = read_small_file(trust_root)
        certs = load_pem_certificates(data)  # a clear error now rather than an opaque ssl one later
    except OSError as exc:
        raise KeyStoreError(f"cannot read trust root {os.fspath(trust_root)!r}: {exc.strerror}") from exc
    except ValueError as exc:
        raise KeyStoreError(f"trust root {os.fspath(trust_root)!r} is not a PEM certificate: {exc}") from exc
    # (what was parsed, written again: text around the PEM blocks, garbage appended say, is not ASCII)
    return "".join(c.public_bytes(serialization.Encoding.PEM).decode("ascii") for c in certs)


def _load_chain(
    ctx: ssl.SSLContext,
    cert_chain: PathLike | Sequence[x509.Certificate],
    key: PathLike | PrivateKey,
    passphrase: bytes | None,
) -> None:
    if isinstance(cert_chain, str | os.PathLike) and isinstance(key, str | os.PathLike):
        _load_files(ctx, os.fspath(cert_chain), os.fspath(key), passphrase)
        return
    with tempfile.TemporaryDirectory(prefix="corda-trio-tls-") as tmp:  # created with mode 0700
        if isinstance(cert_chain, str | os.PathLike):
            chain_path = os.fspath(cert_chain)
        else:
            chain_path = os.path.join(tmp, "chain.pem")
            _write_private(
                chain_path, b"".join(c.public_bytes(serialization.Encoding.PEM) for c in cert_chain)
            )
        if isinstance(key, str | os.PathLike):
            key_path = os.fspath(key)
        else:
            key_path = os.path.join(tmp, "key.pem")
            _write_private(
                key_path,
                key.private_bytes(
                    serialization.Encoding.PEM,
                    serialization.PrivateFormat.PKCS8,
                    serialization.NoEncryption(),
                ),
            )
            passphrase = None
        _load_files(ctx, chain_path, key_path, passphrase)


def _write_private(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _load_files(ctx: ssl.SSLContext, chain_path: str, key_path: str, passphrase: bytes | None) -> None:
    for path in (chain_path, key_path):
        try:
            check_regular_file(path)  # (OpenSSL would read a named pipe nobody writes for ever)
        except (FileNotFoundError, NotADirectoryError):
            raise KeyStoreError(f"TLS file {path!r} does not exist") from None
        except IsADirectoryError:
            raise KeyStoreError(f"TLS file {path!r} is a directory, not a file") from None
        except OSError as exc:  # (a symlink loop, a name too long: said as they are, not "does not exist";
            # check_regular_file says what a file that is not a regular file is: "a named pipe", ...)
            raise KeyStoreError(f"TLS file {path!r}: {exc.strerror}") from None
    try:
        # A callable password keeps OpenSSL from prompting on a terminal when none was given.
        ctx.load_cert_chain(chain_path, key_path, password=lambda: passphrase or b"")
    except ssl.SSLError as exc:
        raise _why_not_loaded(chain_path, key_path, passphrase, exc) from exc
    except OSError as exc:
        raise KeyStoreError(f"cannot read TLS files {chain_path!r}, {key_path!r}: {exc}") from exc


def _why_not_loaded(
    chain_path: str, key_path: str, passphrase: bytes | None, exc: ssl.SSLError
) -> KeyStoreError:
    """What OpenSSL's refusal of a chain and key means, read again here: a wrong passphrase, a file that is
    not what it should be, or a key that is not the certificate's (OpenSSL says NO_CERTIFICATE_ASSIGNED or
    KEY_VALUES_MISMATCH, naming neither file)."""
    try:
        check_key_pair(
            read_certificates(chain_path)[0],
            read_private_key(key_path, passphrase),
            cert_path=chain_path,
            key_path=key_path,
        )
    except KeyStoreError as error:
        return error
    return KeyStoreError(
        f"cannot load TLS certificate {chain_path!r} with key {key_path!r}: {exc.reason or exc}"
    )


def peer_certificate(ssl_object: PeerCertificateSource) -> x509.Certificate:
    """The peer's (already chain-verified) leaf certificate.

    Raises:
        PeerIdentityError: the peer presented no certificate (the handshake is not complete, or the context
            did not require one), or it cannot be parsed.
    """
    der = ssl_object.getpeercert(binary_form=True)
    if not der:
        raise PeerIdentityError("the TLS peer presented no certificate")
    if not isinstance(der, bytes):
        raise PeerIdentityError("getpeercert(binary_form=True) did not return DER bytes")
    try:
        return load_der_certificate(der)
    except ValueError as exc:
        raise PeerIdentityError(f"the TLS peer's certificate cannot be parsed: {exc}") from exc


def peer_chain(ssl_object: object) -> list[x509.Certificate]:
    """The chain OpenSSL verified for the peer: leaf first, our trust root last.

    Accepts an ``ssl.SSLObject`` / ``ssl.SSLSocket``, or a ``trio.SSLStream`` or the transport's TLS stream
    (through its SSL object).
    Python 3.13 has ``get_verified_chain()``; 3.11 and 3.12 have the same method on the object's private
    ``_sslobj``.  Fails closed when neither is there.

    Raises:
        PeerIdentityError: the chain cannot be read (no handshake yet, or an ``ssl`` without the method).
    """
    return _chain(ssl_object, "get_verified_chain", "verified certificate chain")


def presented_chain(ssl_object: object) -> list[x509.Certificate]:
    """The certificates the peer sent, *not verified*: only to say why a handshake failed (which of them
    expired, say).  A client sees the server's even when it refused them; a server keeps none of a client's
    it refused (OpenSSL drops them), so this is then empty.

    Raises:
        PeerIdentityError: the certificates cannot be read (an ``ssl`` without ``get_unverified_chain``).
    """
    return _chain(ssl_object, "get_unverified_chain", "certificates")


def _chain(ssl_object: object, method: str, what: str) -> list[x509.Certificate]:
    # the transport's TLS stream shows its SSLObject as ssl_object; trio.SSLStream keeps it in _ssl_object
    inner = getattr(ssl_object, "ssl_object", None) or getattr(ssl_object, "_ssl_object", ssl_object)
    getter = getattr(inner, method, None) or getattr(getattr(inner, "_sslobj", None), method, None)
    if getter is None:
        raise PeerIdentityError(f"cannot read the TLS peer's {what}")
    try:
        raw = getter() or []
        return [load_der_certificate(c if isinstance(c, bytes) else c.public_bytes(_DER)) for c in raw]
    except (ValueError, ssl.SSLError) as exc:
        raise PeerIdentityError(f"cannot read the TLS peer's {what}: {exc}") from exc


#: ``_ssl.ENCODING_DER`` (``public_bytes`` of the certificates ``get_verified_chain`` returns).
_DER: Final = 2


def check_peer_is_network_node(ssl_object: PeerCertificateSource) -> CordaX500Name:
    """Inbound check: the peer is a node of this network; returns its legal name.

    The chain was already verified against the network root during the handshake (signatures, dates, CA
    flags); this adds Corda's rules on every certificate of it: roles in their places (root -> doorman CA
    -> node CA -> TLS), the leaf's subject exactly its node CA's, and a valid legal name.

    Raises:
        PeerIdentityError: no certificate, a role missing or out of place, a name that differs from the node
            CA's, or a subject that is not a legal name.
    """
    cert = peer_certificate(ssl_object)
    subject = cert.subject.rfc4514_string()
    try:
        role = get_cert_role(cert)
    except CertificateValidationError as exc:
        raise PeerIdentityError(f"TLS peer {subject!r}: {exc}") from exc
    if role is not CertRole.TLS:
        shown = "no role extension" if role is None else f"role {role.name}"
        raise PeerIdentityError(f"TLS peer {subject!r} presented a certificate with {shown}, not role TLS")
    chain = peer_chain(ssl_object)
    if not chain or chain[0] != cert:
        raise PeerIdentityError(f"TLS peer {subject!r}: the verified chain does not start at its certificate")
    try:
        check_chain_roles(chain, leaf_role=CertRole.TLS)
    except CertificateValidationError as exc:
        raise PeerIdentityError(f"TLS peer {subject!r} refused ({exc.reason}): {exc}") from exc
    try:
        return CordaX500Name.from_x509_name(cert.subject)
    except InvalidNameError as exc:
        raise PeerIdentityError(f"TLS peer subject {subject!r} is not a valid legal name: {exc}") from exc


def check_peer_legal_name(ssl_object: PeerCertificateSource, expected: CordaX500Name) -> CordaX500Name:
    """Outbound check: the peer is exactly the node we meant to reach.

    Returns:
        The peer's legal name (equal to ``expected``).

    Raises:
        PeerIdentityError: as :func:`check_peer_is_network_node`, or the name differs from ``expected``.
    """
    actual = check_peer_is_network_node(ssl_object)
    if actual != expected:
        raise PeerIdentityError(f"TLS peer is {str(actual)!r} but {str(expected)!r} was expected")
    return actual
