"""Bundles of keys and certificates: the network's CAs and one node's credentials.

These are what ``corda-trio network bootstrap`` creates and what tests use to build small networks
in memory.  Issuing is pure computation (no files, no clock: ``now`` is an argument).
"""

from __future__ import annotations

import datetime as dt
from typing import final

import attrs
from cryptography import x509

from ._certs import (
    DEFAULT_VALIDITY,
    CaKey,
    create_certificate,
    create_root_certificate,
    generate_ec_key,
    generate_ed25519_key,
)
from ._names import CordaX500Name
from ._roles import CertRole

__all__ = ["CertAndKey", "NetworkCredentials", "NodeCredentials"]


@final
@attrs.frozen(kw_only=True)
class CertAndKey:
    """A certificate and its private key."""

    cert: x509.Certificate
    key: CaKey


@final
@attrs.frozen(kw_only=True)
class NodeCredentials:
    """One node's legal name, node CA, TLS and legal identity certificates and keys."""

    legal_name: CordaX500Name
    node_ca: CertAndKey
    tls: CertAndKey
    identity: CertAndKey
    doorman_cert: x509.Certificate

    @property
    def tls_chain(self) -> list[x509.Certificate]:
        """TLS leaf, node CA, doorman CA (what the node presents in the TLS handshake)."""
        return [self.tls.cert, self.node_ca.cert, self.doorman_cert]

    @property
    def identity_chain(self) -> list[x509.Certificate]:
        """Legal identity, node CA, doorman CA (the certificate path published in the NodeInfo)."""
        return [self.identity.cert, self.node_ca.cert, self.doorman_cert]


@final
@attrs.frozen(kw_only=True)
class NetworkCredentials:
    """The network root, the doorman CA under it and the network map signing certificate."""

    root: CertAndKey
    doorman: CertAndKey
    network_map: CertAndKey

    @classmethod
    def create(
        cls,
        *,
        now: dt.datetime,
        root_name: CordaX500Name | None = None,
        validity: dt.timedelta = DEFAULT_VALIDITY,
    ) -> NetworkCredentials:
        """New keys and certificates for a development network.

        Args:
            now: issue time (timezone-aware UTC).
            root_name: name of the root (default ``CN=Corda Trio Root CA, O=Corda Trio, L=London, C=GB``);
                the doorman and map get the same name with another CN.
            validity: validity of all three certificates.
        """
        base = root_name or CordaX500Name(
            common_name="Corda Trio Root CA", organisation="Corda Trio", locality="London", country="GB"
        )
        root_key = generate_ec_key()
        root_cert = create_root_certificate(base, root_key, now=now, validity=validity)
        doorman_key = generate_ec_key()
        doorman_cert = create_certificate(
            role=CertRole.DOORMAN_CA,
            subject=attrs.evolve(base, common_name="Corda Trio Doorman CA"),
            public_key=doorman_key.public_key(),
            issuer_cert=root_cert,
            issuer_key=root_key,
            now=now,
            validity=validity,
        )
        map_key = generate_ec_key()
        map_cert = create_certificate(
            role=CertRole.NETWORK_MAP,
            subject=attrs.evolve(base, common_name="Corda Trio Network Map"),
            public_key=map_key.public_key(),
            issuer_cert=root_cert,
            issuer_key=root_key,
            now=now,
            validity=validity,
        )
        return cls(
            root=CertAndKey(cert=root_cert, key=root_key),
            doorman=CertAndKey(cert=doorman_cert, key=doorman_key),
            network_map=CertAndKey(cert=map_cert, key=map_key),
        )

    def issue_node(
        self, legal_name: CordaX500Name, *, now: dt.datetime, validity: dt.timedelta = DEFAULT_VALIDITY
    ) -> NodeCredentials:
        """Issue a node CA for ``legal_name`` and, under it, the node's TLS and legal identity certs."""
        ca_key = generate_ec_key()
        ca_cert = create_certificate(
            role=CertRole.NODE_CA, subject=legal_name, public_key=ca_key.public_key(),
            issuer_cert=self.doorman.cert, issuer_key=self.doorman.key, now=now, validity=validity,
        )  # fmt: skip
        tls_key = generate_ec_key()
        tls_cert = create_certificate(
            role=CertRole.TLS, subject=legal_name, public_key=tls_key.public_key(),
            issuer_cert=ca_cert, issuer_key=ca_key, now=now, validity=validity,
        )  # fmt: skip
        id_key = generate_ed25519_key()
        id_cert = create_certificate(
            role=CertRole.LEGAL_IDENTITY, subject=legal_name, public_key=id_key.public_key(),
            issuer_cert=ca_cert, issuer_key=ca_key, now=now, validity=validity,
        )  # fmt: skip
        return NodeCredentials(
            legal_name=legal_name,
            node_ca=CertAndKey(cert=ca_cert, key=ca_key),
            tls=CertAndKey(cert=tls_cert, key=tls_key),
            identity=CertAndKey(cert=id_cert, key=id_key),
            doorman_cert=self.doorman.cert,
        )
