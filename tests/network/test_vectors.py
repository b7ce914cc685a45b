"""Golden vectors of protocol_spec/vectors/network-map.json: the wire forms must never change silently."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519

from corda_trio import network, pki
from corda_trio.network import _codec

VECTORS: dict[str, Any] = json.loads(
    (Path(__file__).resolve().parents[2] / "protocol_spec" / "vectors" / "network-map.json").read_text()
)


@pytest.mark.parametrize("case", VECTORS["key_hash"])
def test_key_hash(case: dict[str, str]) -> None:
    key = ed25519.Ed25519PrivateKey.from_private_bytes(bytes.fromhex(case["ed25519_seed_hex"])).public_key()
    assert pki.key_hash(key) == case["key_hash"]


@pytest.mark.parametrize("case", VECTORS["network_parameters"])
def test_network_parameters(case: dict[str, Any]) -> None:
    params = network.NetworkParameters(**case["fields"])
    data = bytes.fromhex(case["hex"])
    assert _codec.encode(params.to_wire()) == data
    assert network.NetworkParameters.from_wire(_codec.decode(data)) == params
    assert network.sha256_hex(data) == case["sha256"]


@pytest.mark.parametrize("case", VECTORS["network_map"])
def test_network_map(case: dict[str, Any]) -> None:
    m = network.NetworkMap(
        node_info_hashes=tuple(case["node_info_hashes"]),
        network_parameters_hash=case["network_parameters_hash"],
    )
    data = bytes.fromhex(case["hex"])
    assert _codec.encode(m.to_wire()) == data
    assert network.NetworkMap.from_wire(_codec.decode(data)) == m


@pytest.mark.parametrize("case", VECTORS["node_info"])
def test_node_info(case: dict[str, Any]) -> None:
    info = network.NodeInfo(
        addresses=tuple(network.NetworkHostAndPort.parse(a) for a in case["addresses"]),
        legal_identities=tuple(
            tuple(bytes.fromhex(c) for c in path) for path in case["legal_identities_hex"]
        ),
        platform_version=case["platform_version"],
        serial=case["serial"],
    )
    data = bytes.fromhex(case["hex"])
    assert _codec.encode(info.to_wire()) == data
    assert network.NodeInfo.from_wire(_codec.decode(data)) == info
    assert network.sha256_hex(data) == case["hash"]


@pytest.mark.parametrize("case", VECTORS["signed_node_info"])
def test_signed_node_info(case: dict[str, Any]) -> None:
    key = ed25519.Ed25519PrivateKey.from_private_bytes(bytes.fromhex(case["ed25519_seed_hex"]))
    raw = bytes.fromhex(case["node_info_hex"])
    signed = network.decode_signed_node_info(bytes.fromhex(case["hex"]))
    assert signed.raw == raw
    key.public_key().verify(signed.signatures[0], raw)  # Ed25519 is deterministic: same bytes every time
    assert signed.signatures[0] == key.sign(raw)
