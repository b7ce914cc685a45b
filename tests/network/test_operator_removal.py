"""Identity rules and operator removals in the map: the service and the node-side client apply the same
checks; a removal sticks (deny-list by identity key) until ``readmit``; the map serial moves."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from corda_trio import network, pki

from .conftest import ALICE, BOB, NOW, make_service, signed_node_info
from .test_server import http_call
from .test_updater import _summary, _updater


def _sybil_node_info(creds: pki.NetworkCredentials, alice: pki.NodeCredentials) -> bytes:
    """A NodeInfo whose identity certificate Alice's node CA minted for ``OU=Sybil, O=Alice, ...``."""
    name = pki.CordaX500Name.parse("OU=Sybil, O=Alice, L=London, C=GB")
    key = pki.generate_ed25519_key()
    cert = pki.create_certificate(
        role=pki.CertRole.LEGAL_IDENTITY, subject=name, public_key=key.public_key(),
        issuer_cert=alice.node_ca.cert, issuer_key=alice.node_ca.key, now=NOW,
    )  # fmt: skip
    sybil = pki.NodeCredentials(
        legal_name=name, node_ca=alice.node_ca, tls=alice.tls, identity=pki.CertAndKey(cert=cert, key=key),
        doorman_cert=creds.doorman.cert,
    )  # fmt: skip
    return signed_node_info(sybil, 10009)


def test_a_node_ca_cannot_mint_another_identity_for_the_map_or_its_clients(
    creds: pki.NetworkCredentials, alice: pki.NodeCredentials, tmp_path: Path
) -> None:
    sybil = _sybil_node_info(creds, alice)
    service = make_service(creds, tmp_path / "map.db")
    response = service.handle("POST", "/network-map/publish", sybil)
    assert response.status == 403 and response.body.startswith(b"name-mismatch: ")
    # The node side verifies NodeInfos with the same function (a compromised map cannot slip one in).
    with pytest.raises(network.PayloadRejectedError) as info:
        network.verify_node_info(sybil, trust_root=creds.root.cert, now=NOW)
    assert info.value.reason == "name-mismatch"
    assert service.store.legal_names() == []


async def test_removal_sticks_until_readmit_and_clients_drop_the_node(
    map_server: tuple[network.NetworkMapService, int],
    creds: pki.NetworkCredentials,
    alice: pki.NodeCredentials,
    bob: pki.NodeCredentials,
    tmp_path: Path,
) -> None:
    service, port = map_server
    store = service.store
    watcher, _ = _updater(creds, tmp_path / "w.db", port=port)
    for node, p2p_port in ((alice, 10002), (bob, 10003)):
        info = signed_node_info(node, p2p_port, 1)
        status, _, _ = await http_call(port, "POST", "/network-map/publish", info)
        assert status == 200
    await watcher.poll_once()
    before = store.map_serial()
    _, headers, _ = await http_call(port, "GET", "/network-map")
    assert headers["x-corda-map-serial"] == str(before)

    assert store.remove_node(str(BOB))
    assert store.map_serial() > before
    # Bob republishes: the same NodeInfo, a newer serial, and a new identity key for the same name.
    rekeyed = creds.issue_node(BOB, now=NOW)
    for attempt in (
        signed_node_info(bob, 10003, 1), signed_node_info(bob, 10003, 2), signed_node_info(rekeyed, 10003, 3),
    ):  # fmt: skip
        status, _, body = await http_call(port, "POST", "/network-map/publish", attempt)
        assert status == 403 and body.startswith(b"removed-by-operator: O=Bob"), body
    assert store.legal_names() == [str(ALICE)]
    assert store.denied() == [(str(BOB), network.identity_key_hash(network.decode_signed_node_info(
        signed_node_info(bob, 10003, 1))))]  # fmt: skip
    events, _ = await watcher.poll_once()
    assert _summary(events) == [("NodeRemoved", str(BOB))]

    assert store.readmit_node(str(BOB)) and not store.readmit_node(str(BOB))
    status, _, body = await http_call(port, "POST", "/network-map/publish", signed_node_info(bob, 10003, 4))
    assert status == 200 and body.startswith(b"added ")
    events, _ = await watcher.poll_once()
    assert _summary(events) == [("NodeAdded", str(BOB))]


@pytest.mark.parametrize("map_port", [0, None], ids=["with-map", "directory-mode"])
def test_bootstrap_copies_node_infos_only_for_a_network_without_a_map(
    tmp_path: Path, map_port: int | None
) -> None:
    """A copy in additional-node-infos/ stays in a node's view whatever the map lists: with a map service,
    bootstrap writes none (the operator's removal would not reach the peers), without one every node gets
    every NodeInfo."""
    built = network.bootstrap_network(tmp_path / "net", [ALICE, BOB], now=NOW, map_port=map_port)
    for node in built.nodes:
        copies = sorted(p.name for p in (node.directory / "additional-node-infos").iterdir())
        expected = [] if map_port is not None else sorted(f"nodeInfo-{n.node_info_hash}" for n in built.nodes)
        assert copies == expected


def test_the_deny_list_survives_a_restart(
    creds: pki.NetworkCredentials, bob: pki.NodeCredentials, tmp_path: Path
) -> None:
    db = tmp_path / "map.db"
    service = make_service(creds, db)
    assert service.handle("POST", "/network-map/publish", signed_node_info(bob, 10003, 1)).status == 200
    assert service.store.remove_node(str(BOB))
    serial = service.store.map_serial()
    service.store.close()
    again = make_service(creds, db)
    assert again.store.map_serial() == serial
    assert again.handle("POST", "/network-map/publish", signed_node_info(bob, 10003, 2)).status == 403
    again.store.close()


@pytest.mark.parametrize("damage", ["garbage", "truncated", "other-sqlite"])
def test_a_damaged_map_database_is_one_clear_error(tmp_path: Path, damage: str) -> None:
    db = tmp_path / "networkmap.db"
    if damage == "garbage":
        db.write_bytes(b"this is not a database\n" * 100)
    elif damage == "truncated":
        store = network.NetworkMapStore(db)
        store.close()
        data = db.read_bytes()
        db.write_bytes(data[:100] + b"\xff" * (len(data) - 100))
    else:
        with sqlite3.connect(db) as other:
            other.execute("CREATE TABLE node_infos (something_else TEXT)")
    with pytest.raises(network.NetworkMapStoreError) as info:
        network.NetworkMapStore(db)
    assert str(db) in str(info.value) and "\n" not in str(info.value)
