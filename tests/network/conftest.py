"""A small network for the network-map tests (issued at the real current time: the server checks
certificates against the real clock)."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from corda_trio import network, pki
from corda_trio.network import _codec

NOW = dt.datetime.now(dt.UTC)
ALICE = pki.CordaX500Name.parse("O=Alice, L=London, C=GB")
BOB = pki.CordaX500Name.parse("O=Bob, L=New York, C=US")
PARAMS = network.NetworkParameters(
    minimum_platform_version=1, max_message_size=10 * 2**20, max_transaction_size=10 * 2**20,
    modified_time_ms=1_700_000_000_000, epoch=1, event_horizon_seconds=30 * 86400,
)  # fmt: skip


@pytest.fixture(scope="session")
def creds() -> pki.NetworkCredentials:
    return pki.NetworkCredentials.create(now=NOW)


@pytest.fixture(scope="session")
def alice(creds: pki.NetworkCredentials) -> pki.NodeCredentials:
    return creds.issue_node(ALICE, now=NOW)


@pytest.fixture(scope="session")
def bob(creds: pki.NetworkCredentials) -> pki.NodeCredentials:
    return creds.issue_node(BOB, now=NOW)


def der_path(certs: list) -> tuple[bytes, ...]:  # type: ignore[type-arg]
    from cryptography.hazmat.primitives import serialization

    return tuple(c.public_bytes(serialization.Encoding.DER) for c in certs)


def signed_node_info(
    node: pki.NodeCredentials,
    port: int = 10000,
    serial: int | None = None,
    *,
    hosts: tuple[str, ...] = ("127.0.0.1",),
) -> bytes:
    """``node``'s NodeInfo listing ``host:port`` for each of ``hosts``, signed by its identity key."""
    info = network.NodeInfo(
        addresses=tuple(network.NetworkHostAndPort(host=host, port=port) for host in hosts),
        legal_identities=(der_path(node.identity_chain),),
        platform_version=1,
        serial=time.time_ns() // 1000 if serial is None else serial,
    )
    return _codec.encode(network.sign_node_info(info, [node.identity.key]).to_wire())


def make_service(creds: pki.NetworkCredentials, db: Path, max_age: int = 7) -> network.NetworkMapService:
    store = network.NetworkMapStore(db)
    signed = network.sign_network_parameters(PARAMS, creds.network_map.key, [creds.network_map.cert])
    store.set_current_parameters(network.sha256_hex(signed.raw), signed)
    return network.NetworkMapService(
        store=store, trust_root=creds.root.cert, map_key=creds.network_map.key,
        map_cert_path=[creds.network_map.cert], max_age_seconds=max_age,
    )  # fmt: skip


@pytest.fixture
async def map_server(
    creds: pki.NetworkCredentials, tmp_path: Path, nursery: trio.Nursery
) -> AsyncIterator[tuple[network.NetworkMapService, int]]:
    service = make_service(creds, tmp_path / "map.db")
    listeners = await nursery.start(network.serve_network_map, service, 0)
    yield service, listeners[0].socket.getsockname()[1]
    nursery.cancel_scope.cancel()
