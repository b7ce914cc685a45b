"""Legal names that read alike: one spelling of a name is one identity, and a network holds at most one name
per confusable key (the same but for letter case or accents), whether the second comes from the operator's
bootstrap or is published to the map by a member whose doorman-issued certificate carries it."""

from __future__ import annotations

import sqlite3
import subprocess
from pathlib import Path

import pytest
import trio

from corda_trio import network, pki, rpc
from corda_trio.node._cli_network import create_network
from corda_trio.node._processes import open_node_processes
from tests.node.cli_helpers import CLI, run_cli
from tests.node.netutil import PASSWORD, make_network, open_map_process

from .conftest import ALICE, NOW, make_service, signed_node_info
from .test_server import http_call

ALICE_CASE = pki.CordaX500Name.parse("O=ALICE, L=London, C=GB")
ALICE_ACCENT = pki.CordaX500Name.parse("o=Alicé, l=london, c=GB")
ALICE_OPS = pki.CordaX500Name.parse("OU=Ops, O=Alice, L=London, C=GB")


async def test_the_map_refuses_a_name_confusable_with_one_it_holds_or_has_denied(
    map_server: tuple[network.NetworkMapService, int],
    creds: pki.NetworkCredentials,
    alice: pki.NodeCredentials,
) -> None:
    """Over HTTP: Alice holds her name; a member with a valid certificate for ``O=ALICE`` or ``O=Alicé`` (the
    doorman issued it) is refused with ``confusable-name``, also after the operator removed Alice."""
    service, port = map_server
    status, _, body = await http_call(port, "POST", "/network-map/publish", signed_node_info(alice, 10001, 1))
    assert status == 200 and body.startswith(b"added "), body
    for name in (ALICE_CASE, ALICE_ACCENT):
        shadow = creds.issue_node(name, now=NOW)
        status, _, body = await http_call(
            port, "POST", "/network-map/publish", signed_node_info(shadow, 10009)
        )
        assert (status, body.decode().rstrip("\n")) == (
            403,
            f"confusable-name: legal name {str(name)!r} is confusable with 'O=Alice, L=London, C=GB': they "
            "differ only in letter case or accents, and a network holds one of them",
        )
    # Alice herself may publish again, and another name of her company (an OU) is no look-alike.
    status, _, _ = await http_call(port, "POST", "/network-map/publish", signed_node_info(alice, 10001, 2))
    assert status == 200
    ops = creds.issue_node(ALICE_OPS, now=NOW)
    status, _, _ = await http_call(port, "POST", "/network-map/publish", signed_node_info(ops, 10002))
    assert status == 200
    assert service.store.legal_names() == sorted([str(ALICE), str(ALICE_OPS)])

    # The operator removes Alice: her name stays hers (deny-list), and so do its look-alikes.
    assert service.store.remove_node(str(ALICE))
    shadow = creds.issue_node(ALICE_CASE, now=NOW)
    status, _, body = await http_call(port, "POST", "/network-map/publish", signed_node_info(shadow, 10009))
    assert status == 403 and body.startswith(b"confusable-name: legal name 'O=ALICE, "), body
    assert service.store.legal_names() == [str(ALICE_OPS)]
    assert service.refused_publications == 3


def test_bootstrap_refuses_confusable_and_non_latin_names_in_one_line(tmp_path: Path) -> None:
    """``corda-trio network bootstrap`` (a real process): two names that differ only in case or accents, or a
    name with a Cyrillic look-alike letter, are a one-line error (exit 2) and no network is created."""
    for nodes, message in (
        (["O=Alice, L=London, C=GB", "O=Bob, L=London, C=GB", "o=ALICE,l=London,c=GB"],
         "corda-trio: error: legal name 'O=ALICE, L=London, C=GB' is confusable with "
         "'O=Alice, L=London, C=GB': they differ only in letter case or accents, and a network holds one "
         "of them"),
        (["O=Alice, L=London, C=GB", "O=Alicé, L=London, C=GB"],
         "corda-trio: error: legal name 'O=Alicé, L=London, C=GB' is confusable with "
         "'O=Alice, L=London, C=GB'"),
        (["O=Alice, L=London, C=GB", "O=\u0410lice, L=London, C=GB"],
         "corda-trio: error: --node 'O=\u0410lice, L=London, C=GB': O='\u0410lice': '\u0410' (U+0410 "
         "CYRILLIC CAPITAL LETTER A) is not of the Latin script; a legal name uses Latin letters, ASCII "
         "digits and common punctuation only (a letter of another script can look like a Latin one)"),
    ):  # fmt: skip
        net = tmp_path / "net"
        done = run_cli("network", "bootstrap", "--dir", str(net), *(a for n in nodes for a in ("--node", n)))
        assert done.returncode == 2, done
        assert done.stderr.startswith(message) and done.stderr.count("\n") == 1, done.stderr
        assert not net.exists() or not any(net.iterdir())


@pytest.mark.slow
async def test_a_real_map_process_keeps_a_look_alike_out_of_the_map_it_serves(tmp_path: Path) -> None:
    """Real processes: ``networkmap serve`` of a bootstrapped network (Alice, Bob). A certificate for
    ``O=ALICE`` minted with that network's doorman key (a careless operator) is valid, but the map refuses its
    NodeInfo, and ``networkmap list`` shows the two bootstrapped names only."""
    net = tmp_path / "net"
    built = create_network(net, [ALICE, pki.CordaX500Name.parse("O=Bob, L=London, C=GB")], map_port=0)
    assert built.map_address is not None
    doorman_dir = net / "doorman"
    doorman = pki.CertAndKey(
        cert=pki.read_certificate(doorman_dir / "doorman.cert.pem"),
        key=pki.read_private_key(
            doorman_dir / "doorman.key.pem", (doorman_dir / "passphrase").read_text().strip().encode()
        ),
    )
    root = pki.read_certificate(net / "network-root" / "root.cert.pem")
    # (only ``issue_node`` is used, which signs with the doorman)
    issuer = pki.NetworkCredentials(root=pki.CertAndKey(cert=root, key=doorman.key), doorman=doorman,
                                    network_map=doorman)  # fmt: skip
    shadow = issuer.issue_node(ALICE_CASE, now=NOW)
    async with open_map_process(net, max_age_seconds=1):
        for node in built.nodes:  # the bootstrapped nodes publish their NodeInfos
            data = (node.directory / network.node_info_file_name(node.legal_name)).read_bytes()
            status, _, _ = await http_call(built.map_address.port, "POST", "/network-map/publish", data)
            assert status == 200
        status, _, body = await http_call(
            built.map_address.port, "POST", "/network-map/publish", signed_node_info(shadow, 10009)
        )
        refusal = b"confusable-name: legal name 'O=ALICE, L=London, C=GB' is confusable with 'O=Alice, "
        assert status == 403 and body.startswith(refusal), body
    listed = await trio.run_process(
        [*CLI, "networkmap", "list", "--dir", str(net)], capture_stdout=True, stderr=subprocess.DEVNULL
    )
    assert listed.stdout.decode().splitlines() == ["O=Alice, L=London, C=GB", "O=Bob, L=London, C=GB"]


@pytest.mark.slow
async def test_a_flow_reaches_the_node_whatever_the_spelling_and_says_which_name_a_look_alike_means(
    tmp_path: Path,
) -> None:
    """Real processes (map service, Alice, Bob): ``PingPong`` started over RPC with Bob's name in another
    attribute order and key case reaches Bob through the one outbound queue; with ``O=bob`` (not in the map,
    and never admitted to it) the flow waits, and ``list_flows`` says which name it reads like."""
    net = tmp_path / "net"
    nodes = make_network(net, ["O=Alice,L=London,C=GB", "O=Bob,L=Paris,C=FR"], with_map=True)
    async with open_map_process(net, max_age_seconds=1), open_node_processes(nodes) as (alice_node, _):
        async with rpc.connect(alice_node.rpc_url, "ops", PASSWORD) as alice:
            with trio.fail_after(30):
                while len(await alice.network_map()) < 2:  # noqa: ASYNC110 (another process's state)
                    await trio.sleep(0.1)
                for spelling in ("O=Bob, L=Paris, C=FR", "c=FR, l=Paris, o=Bob", " O = Bob ,L=Paris,C=FR "):
                    assert await alice.start_flow("PingPong", recipient=spelling, rounds=1) == 1
            queues = [q for q in await alice.queue_statistics() if q["name"].startswith("internal.peers.")]
            assert len(queues) == 1, queues  # one peer, one queue, whatever the spelling

            flow_id = await alice.launch_flow("PingPong", recipient="O=bob, L=Paris, C=FR", rounds=1)
            with trio.fail_after(15):
                while True:
                    (info,) = [f for f in await alice.list_flows() if f["flow_id"] == flow_id]
                    if info["status"] == "retrying":
                        break
                    await trio.sleep(0.1)
            assert info["error"] == (
                "O=bob, L=Paris, C=FR is not in the network map; did you mean 'O=Bob, L=Paris, C=FR' (it "
                "differs only in case or accents)?"
            )


def test_names_a_map_already_holds_beside_a_look_alike_may_still_publish(
    creds: pki.NetworkCredentials, alice: pki.NodeCredentials, tmp_path: Path
) -> None:
    """A map database of an older build may hold ``O=Alice`` and ``O=ALICE`` both: neither is shut out when
    it publishes again (a new address, say); the operator decides with ``networkmap remove``."""
    service = make_service(creds, tmp_path / "map.db")
    assert service.handle("POST", "/network-map/publish", signed_node_info(alice, 10001, 1)).status == 200
    shadow = creds.issue_node(ALICE_CASE, now=NOW)
    old = network.verify_node_info(signed_node_info(shadow, 10009, 1), trust_root=creds.root.cert, now=NOW)
    with sqlite3.connect(tmp_path / "map.db") as db:  # (what an older build stored)
        db.execute(
            "INSERT INTO node_infos (legal_name, hash, serial, signed) VALUES (?, ?, ?, ?)",
            (str(ALICE_CASE), old.hash, 1, old.serialize()),
        )
    for node, port in ((alice, 10001), (shadow, 10009)):
        response = service.handle("POST", "/network-map/publish", signed_node_info(node, port, 2))
        assert response.status == 200 and response.body.startswith(b"replaced "), response
    assert service.store.legal_names() == sorted([str(ALICE_CASE), str(ALICE)])
    service.store.close()


def test_the_operator_can_remove_a_name_an_older_build_admitted_that_breaks_a_rule_added_since(
    tmp_path: Path,
) -> None:
    """``networkmap remove`` / ``readmit`` (real processes) take a name the map holds spelled as ``networkmap
    list`` prints it, also one with a Cyrillic letter that an older build admitted (the Latin-script rule is
    newer): before, ``--node`` was refused as an invalid name and the entry could not be removed."""
    net = tmp_path / "net"
    built = create_network(net, [ALICE], map_port=0)
    db = net / "network-map" / "networkmap.db"
    network.NetworkMapStore(db).close()
    own = (built.nodes[0].directory / network.node_info_file_name(ALICE)).read_bytes()
    old_name = "O=\u0410lice, L=London, C=GB"  # (Cyrillic A)
    with sqlite3.connect(db) as conn:  # what an older build stored (its NodeInfo gives the identity key)
        conn.execute(
            "INSERT INTO node_infos (legal_name, hash, serial, signed) VALUES (?, ?, 1, ?)",
            (old_name, "0" * 64, own),
        )
    listed = run_cli("networkmap", "list", "--dir", str(net))
    assert listed.stdout.splitlines() == [old_name], listed
    removed = run_cli("networkmap", "remove", "--dir", str(net), "--node", old_name)
    assert removed.returncode == 0 and removed.stdout.startswith(f"removed {old_name} (map serial "), removed
    readmitted = run_cli("networkmap", "readmit", "--dir", str(net), "--node", old_name)
    assert readmitted.returncode == 0 and readmitted.stdout.startswith(f"readmitted {old_name}: "), readmitted
    # A name the map does not hold is still checked: one line, exit 2.
    other = run_cli("networkmap", "remove", "--dir", str(net), "--node", "O=\u0412ob, L=London, C=GB")
    assert other.returncode == 2 and other.stderr.count("\n") == 1, other
    assert "(U+0412 CYRILLIC CAPITAL LETTER VE) is not of the Latin script" in other.stderr
