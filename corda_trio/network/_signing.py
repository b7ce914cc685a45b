"""Signing and verification of NodeInfos, network parameters and the network map.

Theory of operation
-------------------
* A NodeInfo is signed by the key of each of its legal identities, over the canonical bytes of the NodeInfo
  (``SignedNodeInfo.raw``).  To verify one we decode it, validate each identity's certificate path against
  the pinned network root (leaf role ``LEGAL_IDENTITY``, Corda's role and name-constraint rules, dates at
  ``now``), then check each signature with the key of its identity certificate.  The result,
  :class:`VerifiedNodeInfo`, carries the parsed legal name and key hash so that nothing downstream parses
  certificates again.
* The network map and the network parameters are ``SignedWithCert``: signed by the network map key, whose
  certificate (role ``NETWORK_MAP``, issued by the root) travels with the signature.
* Signatures: Ed25519 (legal identities) or ECDSA P-256 with SHA-256 (the map key).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import final

import attrs
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from corda_trio import pki

from . import _codec
from ._errors import MalformedPayloadError, PayloadRejectedError
from ._model import NetworkMap, NetworkParameters, NodeInfo, SignedNodeInfo, SignedWithCert, sha256_hex

__all__ = [
    "VerifiedNodeInfo",
    "decode_signed_node_info",
    "identity_key_hash",
    "sign_network_map",
    "sign_network_parameters",
    "sign_node_info",
    "stored_damage",
    "verify_network_map",
    "verify_network_parameters",
    "verify_node_info",
]


def _sign(key: pki.CaKey, data: bytes) -> bytes:
    if isinstance(key, ed25519.Ed25519PrivateKey):
        return key.sign(data)
    return key.sign(data, ec.ECDSA(hashes.SHA256()))


def _verify(public_key: object, signature: bytes, data: bytes) -> bool:
    try:
        if isinstance(public_key, ed25519.Ed25519PublicKey):
            public_key.verify(signature, data)
        elif isinstance(public_key, ec.EllipticCurvePublicKey):
            public_key.verify(signature, data, ec.ECDSA(hashes.SHA256()))
        else:
            return False
    except InvalidSignature:
        return False
    return True


def _load_path(ders: Sequence[bytes], what: str) -> list[x509.Certificate]:
    try:
        return [pki.load_der_certificate(d) for d in ders]
    except (ValueError, x509.InvalidVersion) as exc:
        raise MalformedPayloadError(f"{what}: certificate is not valid DER: {exc}") from None


@final
@attrs.frozen(kw_only=True)
class VerifiedNodeInfo:
    """A NodeInfo whose signatures and certificate paths were checked against the network root.

    Attributes:
        signed: the envelope as received (``serialize()`` gives its exact bytes back).
        node_info: the decoded NodeInfo.
        legal_name: the main legal identity's name.
        identity_key_hash: ``DL…`` hash of the main identity key (names the peer's queues).
        hash: upper-case hex SHA-256 of ``signed.raw``: the NodeInfo's key in the map.
    """

    signed: SignedNodeInfo
    node_info: NodeInfo
    legal_name: pki.CordaX500Name
    identity_key_hash: str
    hash: str

    def serialize(self) -> bytes:
        """The canonical bytes of the signed envelope (what is published and stored)."""
        return _codec.encode(self.signed.to_wire())


def sign_node_info(node_info: NodeInfo, identity_keys: Sequence[pki.CaKey]) -> SignedNodeInfo:
    """Serialise ``node_info`` and sign it with the key of each legal identity, in order.

    Raises:
        ValueError: the number of keys differs from the number of identities.
    """
    if len(identity_keys) != len(node_info.legal_identities):
        raise ValueError(f"{len(node_info.legal_identities)} identities but {len(identity_keys)} keys")
    raw = _codec.encode(node_info.to_wire())
    return SignedNodeInfo(raw=raw, signatures=tuple(_sign(k, raw) for k in identity_keys))


def decode_signed_node_info(data: bytes) -> SignedNodeInfo:
    """Parse the bytes of a signed NodeInfo (no verification).

    Raises:
        MalformedPayloadError: the bytes are not a signed NodeInfo in canonical form.
    """
    return SignedNodeInfo.from_wire(_codec.decode(data, what="signed node info"))


def verify_node_info(
    signed: SignedNodeInfo | bytes,
    *,
    trust_root: x509.Certificate,
    now: dt.datetime,
    minimum_platform_version: int = 1,
) -> VerifiedNodeInfo:
    """Decode and verify a signed NodeInfo.

    Raises:
        MalformedPayloadError: not a NodeInfo in canonical wire form (HTTP 400).
        PayloadRejectedError: a certificate path does not chain to ``trust_root`` with Corda's rules
            (``reason`` from :class:`pki.CertificateValidationError`), a signature is wrong
            (``bad-signature``), an address is a wildcard no peer can dial (``invalid-address``:
            :attr:`NetworkHostAndPort.is_unspecified`), or the platform version is too low
            (``platform-version``) (HTTP 403).
    """
    if isinstance(signed, bytes):
        signed = decode_signed_node_info(signed)
    node_info = NodeInfo.from_wire(_codec.decode(signed.raw, what="node info"))
    if len(signed.signatures) != len(node_info.legal_identities):
        raise PayloadRejectedError(
            f"{len(node_info.legal_identities)} legal identities but {len(signed.signatures)} signatures",
            reason="bad-signature",
        )
    names = []
    for index, (ders, signature) in enumerate(
        zip(node_info.legal_identities, signed.signatures, strict=True)
    ):
        path = _load_path(ders, f"legal identity {index}")
        try:
            pki.validate_cert_path(
                path, trust_root=trust_root, now=now, leaf_role=pki.CertRole.LEGAL_IDENTITY
            )
            name = pki.CordaX500Name.from_x509_name(path[0].subject)
        except pki.CertificateValidationError as exc:
            raise PayloadRejectedError(f"legal identity {index}: {exc}", reason=exc.reason) from None
        except pki.InvalidNameError as exc:
            raise PayloadRejectedError(f"legal identity {index}: {exc}", reason="invalid-name") from None
        if not _verify(path[0].public_key(), signature, signed.raw):
            raise PayloadRejectedError(
                f"signature {index} is not by the key of legal identity {str(name)!r}", reason="bad-signature"
            )
        names.append(name)
    undialable = [str(a) for a in node_info.addresses if a.is_unspecified]
    if undialable:  # (dialling 0.0.0.0 or :: reaches the dialler's own host, not this node)
        raise PayloadRejectedError(
            f"address {', '.join(undialable)} of {str(names[0])!r} is a wildcard to bind to, which no peer "
            "can dial (it reaches the dialler's own host); advertise a host name or IP address peers reach",
            reason="invalid-address",
        )
    if node_info.platform_version < minimum_platform_version:
        raise PayloadRejectedError(
            f"platform version {node_info.platform_version} is below the network's minimum "
            f"{minimum_platform_version}",
            reason="platform-version",
        )
    return VerifiedNodeInfo(
        signed=signed,
        node_info=node_info,
        legal_name=names[0],
        identity_key_hash=identity_key_hash(signed),
        hash=signed.hash,
    )


def identity_key_hash(signed: SignedNodeInfo) -> str:
    """``DL…`` hash of the main legal identity's key of a (decoded, not necessarily verified) NodeInfo.

    Raises:
        MalformedPayloadError: the NodeInfo or its first certificate cannot be decoded.
    """
    node_info = NodeInfo.from_wire(_codec.decode(signed.raw, what="node info"))
    if not node_info.legal_identities or not node_info.legal_identities[0]:
        raise MalformedPayloadError("the NodeInfo has no legal identity")
    (main_cert,) = _load_path(node_info.legal_identities[0][:1], "legal identity 0")
    return pki.key_hash(main_cert.public_key())


def _sign_with_cert(raw: bytes, key: pki.CaKey, cert_path: Sequence[x509.Certificate]) -> SignedWithCert:
    from cryptography.hazmat.primitives import serialization

    return SignedWithCert(
        raw=raw,
        signature=_sign(key, raw),
        cert_path=tuple(c.public_bytes(serialization.Encoding.DER) for c in cert_path),
    )


def _verify_with_cert(
    signed: SignedWithCert | bytes, *, trust_root: x509.Certificate, now: dt.datetime, what: str
) -> bytes:
    if isinstance(signed, bytes):
        signed = SignedWithCert.from_wire(_codec.decode(signed, what=f"signed {what}"))
    path = _load_path(signed.cert_path, f"{what} signer")
    try:
        pki.validate_cert_path(path, trust_root=trust_root, now=now, leaf_role=pki.CertRole.NETWORK_MAP)
    except pki.CertificateValidationError as exc:
        raise PayloadRejectedError(f"{what} signer: {exc}", reason=exc.reason) from None
    if not _verify(path[0].public_key(), signed.signature, signed.raw):
        raise PayloadRejectedError(f"{what}: signature is not by the network map key", reason="bad-signature")
    return signed.raw


def sign_network_parameters(
    parameters: NetworkParameters, key: pki.CaKey, cert_path: Sequence[x509.Certificate]
) -> SignedWithCert:
    """Sign parameters with the network map key (``cert_path``: map certificate, root excluded)."""
    return _sign_with_cert(_codec.encode(parameters.to_wire()), key, cert_path)


def verify_network_parameters(
    signed: SignedWithCert | bytes, *, trust_root: x509.Certificate, now: dt.datetime
) -> tuple[NetworkParameters, str]:
    """Verify signed parameters; returns them and their hash (hex SHA-256 of the raw bytes).

    Raises:
        MalformedPayloadError: not in wire form.
        PayloadRejectedError: signer not a NETWORK_MAP certificate of this root, or a bad signature.
    """
    raw = _verify_with_cert(signed, trust_root=trust_root, now=now, what="network parameters")
    return NetworkParameters.from_wire(_codec.decode(raw, what="network parameters")), sha256_hex(raw)


def sign_network_map(
    network_map: NetworkMap, key: pki.CaKey, cert_path: Sequence[x509.Certificate]
) -> SignedWithCert:
    """Sign the map with the network map key."""
    return _sign_with_cert(_codec.encode(network_map.to_wire()), key, cert_path)


def verify_network_map(
    signed: SignedWithCert | bytes, *, trust_root: x509.Certificate, now: dt.datetime
) -> NetworkMap:
    """Verify a signed map.

    Raises:
        MalformedPayloadError: not in wire form.
        PayloadRejectedError: signer not a NETWORK_MAP certificate of this root, or a bad signature.
    """
    raw = _verify_with_cert(signed, trust_root=trust_root, now=now, what="network map")
    return NetworkMap.from_wire(_codec.decode(raw, what="network map"))


#: The refusals of a stored NodeInfo or parameters that say their bytes changed: a signature or a certificate
#: that no longer verifies (the hash covers a NodeInfo's certificates, not its signatures nor the parameters'
#: signer's path). The others are the rules of the day (a date, an address, a name, a platform version that a
#: newer rule or the clock refuses): no damage; the node that fetches the entry judges them.
_DAMAGE = frozenset({"bad-signature", "wrong-parent", "untrusted-root", "malformed", "empty"})


def stored_damage(
    kind: str, data: bytes, hash_hex: str, *, trust_root: x509.Certificate, now: dt.datetime
) -> str | None:
    """What is wrong with the bytes the map stored under ``hash_hex`` (``kind``: ``"node-info"`` or
    ``"network-parameters"``), or ``None`` when they are what was accepted: they decode, hash to ``hash_hex``
    and their signatures and certificates verify under ``trust_root`` (a refusal by a rule that says nothing
    of the bytes, a certificate that has expired since, an address a newer rule refuses, is no damage: the
    node that fetches them judges it).

    The hash covers the signed bytes only, not the signatures nor (parameters) the signer's certificates:
    those are checked by verifying them.
    """
    try:
        if kind == "node-info":
            signed_node_info = decode_signed_node_info(data)
            found = signed_node_info.hash
            if found == hash_hex.upper():
                verify_node_info(signed_node_info, trust_root=trust_root, now=now)
        else:
            signed = SignedWithCert.from_wire(_codec.decode(data, what="signed network parameters"))
            found = sha256_hex(signed.raw)
            if found == hash_hex.upper():
                verify_network_parameters(signed, trust_root=trust_root, now=now)
    except MalformedPayloadError as exc:
        return str(exc)
    except PayloadRejectedError as exc:
        return str(exc) if exc.reason in _DAMAGE else None
    if found != hash_hex.upper():
        return f"its bytes hash to {found}"
    return None
