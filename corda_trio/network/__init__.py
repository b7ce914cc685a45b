"""The network map: NodeInfo and network parameters (signed, canonical msgpack), the map HTTP service
(h11 under Trio), the node-side client, cache and updater, and the development-network bootstrapper.

Wire contract: ``protocol_spec/network-map.md``.
"""

from ._bootstrap import DEFAULT_MAX_MESSAGE_SIZE_BYTES as DEFAULT_MAX_MESSAGE_SIZE_BYTES
from ._bootstrap import NODE_VALIDITY_RANGE as NODE_VALIDITY_RANGE
from ._bootstrap import PLATFORM_VERSION as PLATFORM_VERSION
from ._bootstrap import BootstrapError as BootstrapError
from ._bootstrap import BootstrappedNetwork as BootstrappedNetwork
from ._bootstrap import BootstrappedNode as BootstrappedNode
from ._bootstrap import bootstrap_network as bootstrap_network
from ._cache import EARLY_POLL_SPACING_SECONDS as EARLY_POLL_SPACING_SECONDS
from ._cache import MapEvent as MapEvent
from ._cache import NetworkMapUpdater as NetworkMapUpdater
from ._cache import NetworkParametersChanged as NetworkParametersChanged
from ._cache import NodeAdded as NodeAdded
from ._cache import NodeChanged as NodeChanged
from ._cache import NodeInfoCache as NodeInfoCache
from ._cache import NodeRemoved as NodeRemoved
from ._cache import node_info_file_name as node_info_file_name
from ._client import MapResponse as MapResponse
from ._client import NetworkMapClient as NetworkMapClient
from ._codec import MAX_PAYLOAD_BYTES as MAX_PAYLOAD_BYTES
from ._errors import MalformedPayloadError as MalformedPayloadError
from ._errors import NetworkMapError as NetworkMapError
from ._errors import NetworkMapHttpError as NetworkMapHttpError
from ._errors import PayloadRejectedError as PayloadRejectedError
from ._model import MAX_ADDRESSES as MAX_ADDRESSES
from ._model import MAX_SERIAL as MAX_SERIAL
from ._model import MESSAGE_SIZE_RANGE_BYTES as MESSAGE_SIZE_RANGE_BYTES
from ._model import NetworkHostAndPort as NetworkHostAndPort
from ._model import NetworkMap as NetworkMap
from ._model import NetworkParameters as NetworkParameters
from ._model import NodeInfo as NodeInfo
from ._model import SignedNodeInfo as SignedNodeInfo
from ._model import SignedWithCert as SignedWithCert
from ._model import check_host as check_host
from ._model import host_port_text as host_port_text
from ._model import next_serial as next_serial
from ._model import parse_host as parse_host
from ._model import sha256_hex as sha256_hex
from ._model import split_host_port as split_host_port
from ._ports import ephemeral_port_range as ephemeral_port_range
from ._ports import free_ports as free_ports
from ._server import DEFAULT_MAX_CONNECTIONS as DEFAULT_MAX_MAP_CONNECTIONS
from ._server import HttpResponse as HttpResponse
from ._server import NetworkMapService as NetworkMapService
from ._server import serve_network_map as serve_network_map
from ._signing import VerifiedNodeInfo as VerifiedNodeInfo
from ._signing import decode_signed_node_info as decode_signed_node_info
from ._signing import identity_key_hash as identity_key_hash
from ._signing import sign_network_map as sign_network_map
from ._signing import sign_network_parameters as sign_network_parameters
from ._signing import sign_node_info as sign_node_info
from ._signing import stored_damage as stored_damage
from ._signing import verify_network_map as verify_network_map
from ._signing import verify_network_parameters as verify_network_parameters
from ._signing import verify_node_info as verify_node_info
from ._store import NetworkMapStore as NetworkMapStore
from ._store import NetworkMapStoreError as NetworkMapStoreError

__all__ = [
    "DEFAULT_MAX_MAP_CONNECTIONS",
    "DEFAULT_MAX_MESSAGE_SIZE_BYTES",
    "EARLY_POLL_SPACING_SECONDS",
    "MAX_ADDRESSES",
    "MAX_PAYLOAD_BYTES",
    "MAX_SERIAL",
    "MESSAGE_SIZE_RANGE_BYTES",
    "NODE_VALIDITY_RANGE",
    "PLATFORM_VERSION",
    "BootstrapError",
    "BootstrappedNetwork",
    "BootstrappedNode",
    "HttpResponse",
    "MalformedPayloadError",
    "MapEvent",
    "MapResponse",
    "NetworkHostAndPort",
    "NetworkMap",
    "NetworkMapClient",
    "NetworkMapError",
    "NetworkMapHttpError",
    "NetworkMapService",
    "NetworkMapStore",
    "NetworkMapStoreError",
    "NetworkMapUpdater",
    "NetworkParameters",
    "NetworkParametersChanged",
    "NodeAdded",
    "NodeChanged",
    "NodeInfo",
    "NodeInfoCache",
    "NodeRemoved",
    "PayloadRejectedError",
    "SignedNodeInfo",
    "SignedWithCert",
    "VerifiedNodeInfo",
    "bootstrap_network",
    "check_host",
    "decode_signed_node_info",
    "ephemeral_port_range",
    "free_ports",
    "host_port_text",
    "identity_key_hash",
    "next_serial",
    "node_info_file_name",
    "parse_host",
    "serve_network_map",
    "sha256_hex",
    "sign_network_map",
    "sign_network_parameters",
    "sign_node_info",
    "split_host_port",
    "stored_damage",
    "verify_network_map",
    "verify_network_parameters",
    "verify_node_info",
]
