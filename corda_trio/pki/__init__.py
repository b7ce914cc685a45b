"""Identity and PKI of a corda-trio network: X.500 legal names, the certificate hierarchy with Corda's
role extension, certificate path validation, key hashes, keys on disk and mutual-TLS contexts.

Imports only the standard library and ``cryptography`` (see ``docs/architecture.md``).
"""

from ._certs import DEFAULT_VALIDITY as DEFAULT_VALIDITY
from ._certs import CaKey as CaKey
from ._certs import PublicKey as PublicKey
from ._certs import check_chain_roles as check_chain_roles
from ._certs import check_validity_period as check_validity_period
from ._certs import create_certificate as create_certificate
from ._certs import create_root_certificate as create_root_certificate
from ._certs import generate_ec_key as generate_ec_key
from ._certs import generate_ed25519_key as generate_ed25519_key
from ._certs import load_der_certificate as load_der_certificate
from ._certs import load_pem_certificates as load_pem_certificates
from ._certs import validate_cert_path as validate_cert_path
from ._errors import CertificateValidationError as CertificateValidationError
from ._errors import InvalidNameError as InvalidNameError
from ._errors import KeyStoreError as KeyStoreError
from ._errors import PeerIdentityError as PeerIdentityError
from ._errors import PkiError as PkiError
from ._identity import CertAndKey as CertAndKey
from ._identity import NetworkCredentials as NetworkCredentials
from ._identity import NodeCredentials as NodeCredentials
from ._keyhash import base58_decode as base58_decode
from ._keyhash import base58_encode as base58_encode
from ._keyhash import key_hash as key_hash
from ._keystore import check_key_pair as check_key_pair
from ._keystore import read_certificate as read_certificate
from ._keystore import read_certificates as read_certificates
from ._keystore import read_private_key as read_private_key
from ._keystore import write_certificates as write_certificates
from ._keystore import write_private_key as write_private_key
from ._lifetimes import OwnCertificate as OwnCertificate
from ._lifetimes import check_own_certificates as check_own_certificates
from ._lifetimes import format_time as format_time
from ._lifetimes import own_certificates as own_certificates
from ._names import ISO_3166_COUNTRY_CODES as ISO_3166_COUNTRY_CODES
from ._names import CordaX500Name as CordaX500Name
from ._names import confusable_names_message as confusable_names_message
from ._names import find_confusable as find_confusable
from ._roles import CERT_ROLE_OID as CERT_ROLE_OID
from ._roles import CertRole as CertRole
from ._roles import get_cert_role as get_cert_role
from ._tls import check_peer_is_network_node as check_peer_is_network_node
from ._tls import check_peer_legal_name as check_peer_legal_name
from ._tls import client_ssl_context as client_ssl_context
from ._tls import peer_certificate as peer_certificate
from ._tls import peer_chain as peer_chain
from ._tls import presented_chain as presented_chain
from ._tls import server_ssl_context as server_ssl_context

__all__ = [
    "CERT_ROLE_OID",
    "DEFAULT_VALIDITY",
    "ISO_3166_COUNTRY_CODES",
    "CaKey",
    "CertAndKey",
    "CertRole",
    "CertificateValidationError",
    "CordaX500Name",
    "InvalidNameError",
    "KeyStoreError",
    "NetworkCredentials",
    "NodeCredentials",
    "OwnCertificate",
    "PeerIdentityError",
    "PkiError",
    "PublicKey",
    "base58_decode",
    "base58_encode",
    "check_chain_roles",
    "check_key_pair",
    "check_own_certificates",
    "check_peer_is_network_node",
    "check_peer_legal_name",
    "check_validity_period",
    "client_ssl_context",
    "confusable_names_message",
    "create_certificate",
    "create_root_certificate",
    "find_confusable",
    "format_time",
    "generate_ec_key",
    "generate_ed25519_key",
    "get_cert_role",
    "key_hash",
    "load_der_certificate",
    "load_pem_certificates",
    "own_certificates",
    "peer_certificate",
    "peer_chain",
    "presented_chain",
    "read_certificate",
    "read_certificates",
    "read_private_key",
    "server_ssl_context",
    "validate_cert_path",
    "write_certificates",
    "write_private_key",
]
