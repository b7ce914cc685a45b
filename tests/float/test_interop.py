"""Third-party AMQP clients (Qpid Proton, rhea) at a float's public port, as at a node's.

A real float (``fl.Float``, with its audit log) is activated for Bob by the inside (``FloatTunnel``) over
real sockets and mutual TLS, in this process; the clients run as their own processes with a network node's
TLS identity (Alice's unless said otherwise) and dial the float's public port. Bob's messaging service does
not run: what the inside stored is read back from his inbox in the store. Each test compares with what the
node's own acceptor does for the same client (``tests/bridge/test_interop.py``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from corda_trio import amqp, messaging, pki, store
from corda_trio.bridge import float as fl
from tests.bridge.conftest import mallory as mallory
from tests.bridge.test_interop import PROTON_CLIENT, RHEA_CLIENT, client_tls
from tests.float.test_inprocess import node_tls
from tests.interop.conftest import PEERS, rhea_node_path
from tests.p2p_harness import NOW, running_node, wait_until

pytestmark = [pytest.mark.interop]


@attrs.define(eq=False)
class FloatedBob:
    """Bob behind an active float: its public port, the float, the inside and Bob's inbox."""

    flt: fl.Float
    tunnel: fl.FloatTunnel
    inbox: store.Queue
    port: int
    audit_path: Path

    def audit(self, *events: str) -> list[dict[str, Any]]:
        lines = [json.loads(ln) for ln in self.audit_path.read_text().splitlines()]
        return [ln for ln in lines if not events or ln["event"] in events]

    async def stored(self) -> list[messaging.ReceivedMessage]:
        return [messaging.from_amqp(amqp.Message.decode(d.payload)) async for d in self.inbox.browse()]


@contextlib.asynccontextmanager
async def bob_behind_float(
    bob: pki.NodeCredentials,
    network: pki.NetworkCredentials,
    float_creds: fl.TunnelCredentials,
    bridge_creds: fl.TunnelCredentials,
    directory: Path,
    members: list[pki.NodeCredentials],
) -> AsyncIterator[FloatedBob]:
    """A float activated for Bob; ``members`` are the senders in Bob's network map."""
    audit_path = directory / "audit.jsonl"
    flt = fl.Float(
        fl.FloatConfig(
            tunnel=float_creds,
            public_host="127.0.0.1",
            tls={"node": node_tls(bob, network.root.cert, directory / "tls")},
        ),
        audit=fl.AuditLog(audit_path),
    )
    peers = messaging.PeerDirectory()
    for member in members:
        key_hash = pki.key_hash(member.identity.cert.public_key())
        peers.put(
            messaging.Peer(legal_name=member.legal_name, key_hash=key_hash, addresses=[("127.0.0.1", 1)])
        )
    key_hash = pki.key_hash(bob.identity.cert.public_key())
    async with trio.open_nursery() as nursery:
        control_port = await nursery.start(flt.run)
        async with store.open_broker(directory / "bob") as broker:
            config = messaging.MessagingConfig(legal_name=bob.legal_name, key_hash=key_hash)
            service = await messaging.MessagingService.open(broker, config, peers)
            tunnel = fl.FloatTunnel(
                inbox=service.inbox,
                tunnel_context=bridge_creds.client_context(),
                config=fl.TunnelConfig(
                    floats=[("127.0.0.1", control_port)],
                    initial_backoff_seconds=0.05,
                    max_backoff_seconds=0.5,
                ),
                resolver=peers,
            )
            async with trio.open_nursery() as inside:
                await inside.start(tunnel.run)
                with trio.fail_after(30):
                    _, port = await tunnel.wait_active()
                yield FloatedBob(flt, tunnel, service.inbox, port, audit_path)
                inside.cancel_scope.cancel()
        nursery.cancel_scope.cancel()


async def proton(port: int, address: str, count: int, tls: Path, *more: str) -> dict[str, Any]:
    """``proton_p2p_client.py`` against ``port``: its JSON result line."""
    result = await trio.run_process(
        [sys.executable, str(PROTON_CLIENT), "--port", str(port), "--address", address, "--count", str(count),
         "--tls", str(tls), *more],
        capture_stdout=True, capture_stderr=True, check=False,
    )  # fmt: skip
    lines = [ln for ln in result.stdout.decode().splitlines() if ln.startswith("{")]
    assert result.returncode == 0 and lines, result.stderr.decode()[-2000:]
    return json.loads(lines[-1])  # type: ignore[no-any-return]


async def test_proton_delivers_through_the_float_exactly_once_and_is_refused_elsewhere(
    alice: pki.NodeCredentials,
    bob: pki.NodeCredentials,
    network: pki.NetworkCredentials,
    float_creds: fl.TunnelCredentials,
    bridge_creds: fl.TunnelCredentials,
    tmp_path: Path,
) -> None:
    n = 500
    tls = client_tls(tmp_path, alice, network)
    async with bob_behind_float(bob, network, float_creds, bridge_creds, tmp_path, [alice]) as b:
        with trio.fail_after(120):
            out = await proton(b.port, b.inbox.name, n, tls)
            refused = await proton(b.port, "internal.peers.DLsomeone", 1, tls)
            # receiver-settle-mode second proposed: the float states first, as the node's acceptor does
            second = await proton(b.port, b.inbox.name, 20, tls, "--rcv-settle-mode", "second")
        assert out == {**out, "sent": n, "accepted": n, "rejected": 0, "released": 0, "error": None}
        assert out["remote_rcv_settle_mode"] == "first"  # (as the node's acceptor states)
        assert refused["accepted"] == 0
        assert "amqp:unauthorized-access" in str(refused["error"]) and b.inbox.name in str(refused["error"])
        assert second == {**second, "accepted": 20, "error": None, "remote_rcv_settle_mode": "first"}
        stored = await b.stored()
        assert [m.data for m in stored] == [b"proton-%d" % i for i in range(n)] + [
            b"proton-%d" % i for i in range(20)
        ]
        assert {m.validated_user for m in stored} == {str(alice.legal_name)}
        assert b.tunnel.stored == n + 20 and b.flt.accepted == n + 20 and b.flt.forwarded == n + 20
        name = str(alice.legal_name)
        tls_ok = b.audit("tls")
        assert len(tls_ok) == 3 and {(e["outcome"], e["legal_name"]) for e in tls_ok} == {("ok", name)}
        attached = b.audit("link-attached")
        assert [(e["legal_name"], e["address"]) for e in attached] == [(name, b.inbox.name)] * 2
        [link_refused] = b.audit("link-refused")
        assert link_refused == {
            **link_refused, "legal_name": name, "address": "internal.peers.DLsomeone",
            "condition": "amqp:unauthorized-access",
        }  # fmt: skip
        with trio.fail_after(10):  # (the float writes its close line once it has seen the peer's close)
            await wait_until(lambda: len(b.audit("close")) == 3)
        assert [e["condition"] for e in b.audit("close")] == [None, None, None]  # (each a clean close)


async def test_proton_s_pre_settled_sender_is_refused_at_attach(
    alice: pki.NodeCredentials,
    bob: pki.NodeCredentials,
    network: pki.NetworkCredentials,
    float_creds: fl.TunnelCredentials,
    bridge_creds: fl.TunnelCredentials,
    tmp_path: Path,
) -> None:
    tls = client_tls(tmp_path, alice, network)
    async with bob_behind_float(bob, network, float_creds, bridge_creds, tmp_path, [alice]) as b:
        with trio.fail_after(60):
            out = await proton(b.port, b.inbox.name, 5, tls, "--snd-settle-mode", "settled")
        # the node's acceptor: the same condition and words (tests/bridge/test_interop.py)
        assert out["accepted"] == 0 and str(out["error"]).startswith("amqp:not-implemented: ")
        assert "pre-settled" in str(out["error"]) and "snd-settle-mode unsettled" in str(out["error"])
        assert await b.stored() == [] and b.flt.forwarded == 0
        assert b.flt.refused_links_by_condition == {"amqp:not-implemented": 1}
        [refused] = b.audit("link-refused")
        assert refused["condition"] == "amqp:not-implemented" and refused["address"] == b.inbox.name


@pytest.mark.parametrize("how", ["detach", "close"])
async def test_proton_detaching_mid_flight_and_attaching_again_loses_nothing(
    alice: pki.NodeCredentials,
    bob: pki.NodeCredentials,
    network: pki.NetworkCredentials,
    float_creds: fl.TunnelCredentials,
    bridge_creds: fl.TunnelCredentials,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    how: str,
) -> None:
    """Proton sends 200 messages, detaches its link without waiting for their outcomes (closed=false or
    true), attaches a link of the same name on the same connection (its attach on the wire before the old
    link's transfers and detach) and sends them again: as at the node's acceptor, the new link gets every
    one accepted, and the inbox holds each of them, the first link's stored ones as duplicates at most."""
    n = 200
    tls = client_tls(tmp_path, alice, network)
    async with bob_behind_float(bob, network, float_creds, bridge_creds, tmp_path, [alice]) as b:
        with trio.fail_after(120):
            out = await proton(b.port, b.inbox.name, n, tls, "--detach-first", how)
        assert out == {**out, "sent": n, "accepted": n, "rejected": 0, "released": 0, "error": None}
        stored = [m.data for m in await b.stored()]
        assert set(stored) == {b"proton-%d" % i for i in range(n)}
        assert len(stored) <= 2 * n and b.tunnel.stored == len(stored)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text[-3000:]


#: (small messages, many: 300 x 200 KB, as tests/interop/test_overrun_rhea.py sends, cross the socket no
#: faster than the float passes each on and grants credit again, so they never overrun it)
FLOOD_COUNT = 1500
FLOOD_BYTES = 1000
STEADY_COUNT = 200


async def test_rhea_flooding_beyond_its_credit_loses_that_link_only(
    alice: pki.NodeCredentials,
    bob: pki.NodeCredentials,
    network: pki.NetworkCredentials,
    float_creds: fl.TunnelCredentials,
    bridge_creds: fl.TunnelCredentials,
    tmp_path: Path,
) -> None:
    """rhea's ``flood`` link ignores its credit (1,500 messages at once), its ``steady`` link on the same
    connection does not; both to Bob's inbox. The float refuses the excess: the flood link is detached with
    amqp:link:transfer-limit-exceeded, the steady link delivers every message, the inbox holds nothing of
    the flood beyond the link's credit, and the float serves the next peer."""
    tls = client_tls(tmp_path, alice, network)
    env = {**os.environ, "NODE_PATH": rhea_node_path()}
    async with bob_behind_float(bob, network, float_creds, bridge_creds, tmp_path, [alice]) as b:
        args = [
            str(b.port),
            str(FLOOD_COUNT),
            str(FLOOD_BYTES),
            str(STEADY_COUNT),
            b.inbox.name,
            b.inbox.name,
        ]
        with trio.fail_after(180):
            result = await trio.run_process(
                ["node", str(PEERS / "rhea_overrun_client.js"), *args, str(tls)], capture_stdout=True,
                capture_stderr=True, env=env, check=False,
            )  # fmt: skip
        lines = [ln for ln in result.stdout.decode().splitlines() if ln.startswith("{")]
        assert result.returncode == 0 and lines, result.stderr.decode()[-3000:]
        out = json.loads(lines[-1])
        assert "error" not in out and "connection_error" not in out, out
        assert out["flood_error"] == str(amqp.Condition.TRANSFER_LIMIT_EXCEEDED), out
        assert out["steady_accepted"] == STEADY_COUNT, out
        stored = await b.stored()
        steady = [m.data for m in stored if m.data.startswith(b"steady")]
        flood = [m for m in stored if not m.data.startswith(b"steady")]
        assert steady == [b"steady %d" % i for i in range(STEADY_COUNT)]
        # at most the credit the float granted the flood link (a disposition still on its way when the link
        # went is not seen by rhea: it sends that one again, and the receiver drops the duplicate)
        credit = fl.FloatConfig.__attrs_attrs__.peer_link_window.default // 2
        assert 0 < out["flood_accepted"] <= len(flood) <= credit
        assert len({m.dedup_id for m in flood}) == len(flood)
        with trio.fail_after(60):  # the float keeps serving: the next peer's messages are all stored
            after = await proton(b.port, b.inbox.name, 50, tls)
        assert after == {**after, "accepted": 50, "error": None}
        assert b.flt.attached_links == 3 and b.flt.refused_links == 0
        # rhea's connection (its steady link served to the end) and Proton's ended with a clean close
        with trio.fail_after(10):
            await wait_until(lambda: len(b.audit("close")) == 2)
        assert [e["condition"] for e in b.audit("close")] == [None, None]
        # each link's end: the flood link's cut-off says why; the others were detached by their peers
        ended = {e["address"]: [] for e in b.audit("link-detached")}
        for e in b.audit("link-detached"):
            ended[e["address"]].append(e["condition"])
        [conditions] = ended.values()
        assert sorted(conditions, key=str) == [None, None, conditions[0]] and conditions[0] is not None
        assert "transfer-limit-exceeded" in conditions[0]


async def test_rhea_s_delivery_in_another_message_format_is_rejected_and_not_stored(
    alice: pki.NodeCredentials,
    bob: pki.NodeCredentials,
    network: pki.NetworkCredentials,
    float_creds: fl.TunnelCredentials,
    bridge_creds: fl.TunnelCredentials,
    tmp_path: Path,
) -> None:
    """As at the node's acceptor: of message-formats 0, 0x80013700 and 0, the middle one is rejected with
    amqp:not-implemented (at the float, never forwarded), the others stored."""
    tls = client_tls(tmp_path, alice, network)
    env = {**os.environ, "NODE_PATH": rhea_node_path()}
    async with bob_behind_float(bob, network, float_creds, bridge_creds, tmp_path, [alice]) as b:
        with trio.fail_after(60):
            result = await trio.run_process(
                ["node", str(RHEA_CLIENT), str(b.port), b.inbox.name, str(tls), "0", str(0x80013700), "0"],
                capture_stdout=True, capture_stderr=True, env=env, check=False,
            )  # fmt: skip
        lines = [ln for ln in result.stdout.decode().splitlines() if ln.startswith("{")]
        assert result.returncode == 0 and lines, result.stderr.decode()[-2000:]
        assert json.loads(lines[-1]) == {
            "outcomes": ["accepted", "amqp:not-implemented", "accepted"],
            "error": None,
        }
        assert [m.data for m in await b.stored()] == [b"rhea-0", b"rhea-2"]
        assert b.flt.forwarded == 2
        [refused] = b.audit("delivery-refused")
        assert refused == {**refused, "condition": "amqp:not-implemented", "message_format": 0x80013700}


def forged_tls(
    network: pki.NetworkCredentials, holder: pki.NodeCredentials, claimed: str
) -> pki.NodeCredentials:
    """``holder``'s node CA issues a TLS certificate for another legal name, ``claimed``."""
    key = pki.generate_ec_key()
    cert = pki.create_certificate(
        role=pki.CertRole.TLS, subject=pki.CordaX500Name.parse(claimed), public_key=key.public_key(),
        issuer_cert=holder.node_ca.cert, issuer_key=holder.node_ca.key, now=NOW,
    )  # fmt: skip
    return attrs.evolve(holder, tls=pki.CertAndKey(cert=cert, key=key))


async def test_peers_the_node_refuses_are_refused_the_same_way_at_the_float(
    alice: pki.NodeCredentials,
    bob: pki.NodeCredentials,
    carol: pki.NodeCredentials,
    network: pki.NetworkCredentials,
    mallory: tuple[pki.NodeCredentials, pki.NetworkCredentials],
    float_creds: fl.TunnelCredentials,
    bridge_creds: fl.TunnelCredentials,
    tmp_path: Path,
) -> None:
    """Proton with: a certificate of another network's root (Bob's own name); a TLS certificate Alice's node
    CA issued for another name; Alice's certificate, with messages that claim Carol as their validated user.
    Each one is refused by the float as by Bob's own acceptor (the same outcome for the client), and the
    float's audit log says so; nothing is stored."""
    other, _other_network = mallory
    for d in ("mallory", "forged", "alice"):
        (tmp_path / d).mkdir()
    forged = forged_tls(network, alice, "O=Dave, L=Rome, C=IT")
    clients = {
        "another root": client_tls(tmp_path / "mallory", other, network),
        "another name": client_tls(tmp_path / "forged", forged, network),
        "claims carol": client_tls(tmp_path / "alice", alice, network),
    }
    claims = ["--validated-user", str(carol.legal_name)]

    async def run_all(port: int, inbox: str) -> dict[str, dict[str, Any]]:
        with trio.fail_after(120):
            return {
                what: await proton(port, inbox, 3, tls, *(claims if what == "claims carol" else ()))
                for what, tls in clients.items()
            }

    async with running_node(bob, network.root.cert, tmp_path / "node", run_service=False) as node:
        at_node = await run_all(node.port, node.service.inbox.name)
        assert [d async for d in node.service.inbox.browse()] == []
    async with bob_behind_float(bob, network, float_creds, bridge_creds, tmp_path, [alice, carol]) as b:
        at_float = await run_all(b.port, b.inbox.name)
        assert await b.stored() == [] and b.flt.forwarded == 3
        tls_lines = b.audit("tls")
        assert [e["outcome"] for e in tls_lines] == ["refused", "refused", "ok"]
        # (OpenSSL's words: the chain does not reach the network root; the node CA's name constraint)
        assert "unable to get local issuer certificate" in tls_lines[0]["reason"]
        assert "permitted subtree violation" in tls_lines[1]["reason"]
    for what in clients:
        assert at_float[what] == at_node[what], what
    assert at_float["claims carol"] == {**at_float["claims carol"], "rejected": 3, "accepted": 0}
    assert at_float["claims carol"]["rejection"] == "amqp:unauthorized-access"
    for what in ("another root", "another name"):
        assert at_float[what]["accepted"] == 0 and at_float[what]["error"], at_float[what]


async def test_a_member_not_in_the_receiver_s_network_map_yet_is_released_at_the_float(
    alice: pki.NodeCredentials,
    bob: pki.NodeCredentials,
    network: pki.NetworkCredentials,
    float_creds: fl.TunnelCredentials,
    bridge_creds: fl.TunnelCredentials,
    tmp_path: Path,
) -> None:
    """Proton with a valid certificate of the network whose legal name Bob's network map does not list
    (yet): Bob's own acceptor takes its messages (it checks the certificate, not the map), but behind a
    float the inside checks the claimed sender against the map (the float may be compromised,
    docs/float.md section 1), so each is released, not rejected: the sender keeps it, nothing is stored."""
    dave = network.issue_node(pki.CordaX500Name.parse("O=Dave, L=Rome, C=IT"), now=NOW)
    tls = client_tls(tmp_path, dave, network)
    async with bob_behind_float(bob, network, float_creds, bridge_creds, tmp_path, [alice]) as b:
        with trio.fail_after(60):
            out = await proton(b.port, b.inbox.name, 3, tls)
        assert out == {**out, "accepted": 0, "rejected": 0, "released": 3, "error": None}
        assert await b.stored() == [] and b.tunnel.released == 3
        [tls_line] = b.audit("tls")
        assert tls_line == {**tls_line, "outcome": "ok", "legal_name": str(dave.legal_name)}


async def test_azure_s_pure_python_client_delivers_through_the_float(
    alice: pki.NodeCredentials,
    bob: pki.NodeCredentials,
    network: pki.NetworkCredentials,
    float_creds: fl.TunnelCredentials,
    bridge_creds: fl.TunnelCredentials,
    tmp_path: Path,
) -> None:
    """A third engine, azure-servicebus's pure-Python AMQP client (its own codec, SASL PLAIN over mutual
    TLS, one send at a time, each waiting for its outcome): every message stored once, in order."""
    n = 100
    tls = client_tls(tmp_path, alice, network)
    async with bob_behind_float(bob, network, float_creds, bridge_creds, tmp_path, [alice]) as b:
        with trio.fail_after(120):
            result = await trio.run_process(
                [sys.executable, str(PEERS / "pyamqp_client.py"), "--port", str(b.port),
                 "--address", b.inbox.name, "--count", str(n), "--tls", str(tls), "--client-cert", "--p2p"],
                capture_stdout=True, capture_stderr=True, check=False,
            )  # fmt: skip
        lines = [ln for ln in result.stdout.decode().splitlines() if ln.startswith("{")]
        assert result.returncode == 0 and lines, result.stderr.decode()[-2000:]
        out = json.loads(lines[-1])
        assert out == {**out, "sent": n, "accepted": n} and "error" not in out, result.stderr.decode()[-2000:]
        stored = await b.stored()
        assert [m.data for m in stored] == [b"pyamqp-%d" % i for i in range(n)]
        assert {m.validated_user for m in stored} == {str(alice.legal_name)}
        with trio.fail_after(10):
            await wait_until(lambda: len(b.audit("close")) == 1)
        [close] = b.audit("close")
        assert close["condition"] is None
