"""Mutual TLS between two nodes of one network over a real loopback socket, with the legal-name check."""

from __future__ import annotations

import datetime as dt
import os
import ssl
from pathlib import Path

import pytest
import trio

from corda_trio import pki

from .conftest import ALICE, BOB

# Contexts are built from certificates issued "now" in the real world, since OpenSSL checks validity
# against the system clock.
REAL_NOW = dt.datetime.now(dt.UTC)


@pytest.fixture(scope="module")
def live_network() -> pki.NetworkCredentials:
    return pki.NetworkCredentials.create(now=REAL_NOW)


@pytest.fixture(scope="module")
def live_alice(live_network: pki.NetworkCredentials) -> pki.NodeCredentials:
    return live_network.issue_node(ALICE, now=REAL_NOW)


@pytest.fixture(scope="module")
def live_bob(live_network: pki.NetworkCredentials) -> pki.NodeCredentials:
    return live_network.issue_node(BOB, now=REAL_NOW)


def _contexts(
    node: pki.NodeCredentials, root: pki.CertAndKey | None = None, *, tls: pki.CertAndKey | None = None
) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    root_cert = root.cert if root else None
    leaf = tls or node.tls
    chain = [leaf.cert, node.node_ca.cert, node.doorman_cert]
    kwargs = dict(cert_chain=chain, key=leaf.key, trust_root=root_cert)
    return pki.client_ssl_context(**kwargs), pki.server_ssl_context(**kwargs)  # type: ignore[arg-type]


async def _handshake(
    client_ctx: ssl.SSLContext, server_ctx: ssl.SSLContext
) -> tuple[
    pki.CordaX500Name | BaseException, pki.CordaX500Name | BaseException, trio.SSLStream, trio.SSLStream
]:
    """Connect over 127.0.0.1, run both handshakes, exchange one byte each way (TLS 1.3 reports a rejected
    client certificate only on the first read), and return what each side learnt about the other."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    results: dict[str, object] = {}

    async def server() -> None:
        raw = await listeners[0].accept()
        stream = trio.SSLStream(raw, server_ctx, server_side=True)
        try:
            await stream.do_handshake()
            name = pki.check_peer_is_network_node(stream)
            await stream.send_all(b"s")
            await stream.receive_some(1)
            results["server_saw"] = name
        except (trio.BrokenResourceError, pki.PeerIdentityError) as exc:
            results["server_saw"] = exc
        results["server_stream"] = stream
        await trio.aclose_forcefully(stream)

    async def client() -> None:
        raw = await trio.open_tcp_stream("127.0.0.1", port)
        stream = trio.SSLStream(raw, client_ctx, server_hostname=None)
        try:
            await stream.do_handshake()
            name = pki.check_peer_is_network_node(stream)
            await stream.send_all(b"c")
            await stream.receive_some(1)
            results["client_saw"] = name
        except (trio.BrokenResourceError, pki.PeerIdentityError) as exc:
            results["client_saw"] = exc
        results["client_stream"] = stream
        await trio.aclose_forcefully(stream)

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(server)
            nursery.start_soon(client)
    await listeners[0].aclose()
    return (
        results["client_saw"],  # type: ignore[return-value]
        results["server_saw"],
        results["client_stream"],  # type: ignore[return-value]
        results["server_stream"],  # type: ignore[return-value]
    )


async def test_mutual_tls_handshake_and_name_checks(
    live_network: pki.NetworkCredentials, live_alice: pki.NodeCredentials, live_bob: pki.NodeCredentials
) -> None:
    alice_client, _ = _contexts(live_alice, live_network.root)
    _, bob_server = _contexts(live_bob, live_network.root)
    client_saw, server_saw, client_stream, server_stream = await _handshake(alice_client, bob_server)
    assert client_saw == BOB
    assert server_saw == ALICE
    assert client_stream.version() in ("TLSv1.3", "TLSv1.2")
    # The outbound check against the expected name passes for Bob and fails for anyone else.
    assert pki.check_peer_legal_name(client_stream, BOB) == BOB
    carol = pki.CordaX500Name.parse("O=Carol, L=Paris, C=FR")
    with pytest.raises(pki.PeerIdentityError, match="'O=Bob, L=New York, C=US' but 'O=Carol, L=Paris, C=FR'"):
        pki.check_peer_legal_name(client_stream, carol)
    with pytest.raises(pki.PeerIdentityError, match="but 'O=Bob"):
        pki.check_peer_legal_name(server_stream, BOB)  # the server side sees Alice


async def test_tls12_also_works(
    live_network: pki.NetworkCredentials, live_alice: pki.NodeCredentials, live_bob: pki.NodeCredentials
) -> None:
    alice_client, _ = _contexts(live_alice, live_network.root)
    alice_client.maximum_version = ssl.TLSVersion.TLSv1_2
    _, bob_server = _contexts(live_bob, live_network.root)
    client_saw, server_saw, client_stream, _ = await _handshake(alice_client, bob_server)
    assert (client_saw, server_saw) == (BOB, ALICE)
    assert client_stream.version() == "TLSv1.2"


async def test_certificate_from_another_root_is_refused(
    live_network: pki.NetworkCredentials, live_bob: pki.NodeCredentials
) -> None:
    other = pki.NetworkCredentials.create(now=REAL_NOW)
    mallory = other.issue_node(ALICE, now=REAL_NOW)  # same legal name, wrong root
    # Mallory trusts our root (so she accepts Bob), but Bob must refuse her certificate.
    mallory_client, _ = _contexts(mallory, live_network.root)
    _, bob_server = _contexts(live_bob, live_network.root)
    client_saw, server_saw, _, _ = await _handshake(mallory_client, bob_server)
    assert isinstance(server_saw, trio.BrokenResourceError)
    assert isinstance(server_saw.__cause__, ssl.SSLError)
    assert (
        "certificate verify failed" in str(server_saw.__cause__)
        or "unknown ca" in str(server_saw.__cause__).lower()
    )
    # The rejected client learns nothing but a broken connection (TLS 1.3: on its first read).
    assert isinstance(client_saw, trio.BrokenResourceError)


async def test_server_with_other_root_is_refused_by_client(
    live_network: pki.NetworkCredentials, live_alice: pki.NodeCredentials
) -> None:
    other = pki.NetworkCredentials.create(now=REAL_NOW)
    impostor = other.issue_node(BOB, now=REAL_NOW)
    alice_client, _ = _contexts(live_alice, live_network.root)
    _, impostor_server = _contexts(impostor, other.root)
    client_saw, _, _, _ = await _handshake(alice_client, impostor_server)
    assert isinstance(client_saw, trio.BrokenResourceError)
    assert "certificate verify failed" in str(client_saw.__cause__)


async def test_identity_certificate_cannot_be_used_for_tls(
    live_network: pki.NetworkCredentials, live_alice: pki.NodeCredentials, live_bob: pki.NodeCredentials
) -> None:
    """A certificate from the right root but without the TLS role fails the post-handshake check."""
    not_tls = pki.generate_ec_key()
    cert = pki.create_certificate(
        role=pki.CertRole.LEGAL_IDENTITY, subject=ALICE, public_key=not_tls.public_key(),
        issuer_cert=live_alice.node_ca.cert, issuer_key=live_alice.node_ca.key, now=REAL_NOW,
    )  # fmt: skip
    alice_client, _ = _contexts(live_alice, live_network.root, tls=pki.CertAndKey(cert=cert, key=not_tls))
    _, bob_server = _contexts(live_bob, live_network.root)
    _, server_saw, _, _ = await _handshake(alice_client, bob_server)
    assert isinstance(server_saw, pki.PeerIdentityError)
    assert "role LEGAL_IDENTITY, not role TLS" in str(server_saw)


async def test_contexts_from_encrypted_files(
    tmp_path: Path,
    live_network: pki.NetworkCredentials,
    live_alice: pki.NodeCredentials,
    live_bob: pki.NodeCredentials,
) -> None:
    pki.write_certificates(tmp_path / "root.pem", [live_network.root.cert])
    pki.write_certificates(tmp_path / "alice-chain.pem", live_alice.tls_chain)
    pki.write_private_key(tmp_path / "alice-tls.key", live_alice.tls.key, b"secret")
    ctx = pki.client_ssl_context(
        cert_chain=tmp_path / "alice-chain.pem", key=tmp_path / "alice-tls.key",
        trust_root=tmp_path / "root.pem", passphrase=b"secret",
    )  # fmt: skip
    _, bob_server = _contexts(live_bob, live_network.root)
    client_saw, server_saw, _, _ = await _handshake(ctx, bob_server)
    assert (client_saw, server_saw) == (BOB, ALICE)
    with pytest.raises(pki.KeyStoreError, match="wrong passphrase"):
        pki.client_ssl_context(
            cert_chain=tmp_path / "alice-chain.pem", key=tmp_path / "alice-tls.key",
            trust_root=tmp_path / "root.pem", passphrase=b"not the passphrase",
        )  # fmt: skip
    # A key that is not the certificate's is said so, naming both files: OpenSSL's NO_CERTIFICATE_ASSIGNED
    # read 'cannot load TLS certificate ... (wrong passphrase, or a key that does not match ...?)'
    pki.write_private_key(tmp_path / "bob-tls.key", live_bob.tls.key, b"secret")
    with pytest.raises(pki.KeyStoreError) as info:
        pki.server_ssl_context(
            cert_chain=tmp_path / "alice-chain.pem", key=tmp_path / "bob-tls.key",
            trust_root=tmp_path / "root.pem", passphrase=b"secret",
        )  # fmt: skip
    assert str(info.value) == f"{tmp_path / 'bob-tls.key'} is not the key of {tmp_path / 'alice-chain.pem'}"
    # A path that names a directory says so (it said "does not exist").
    (tmp_path / "certs").mkdir()
    with pytest.raises(pki.KeyStoreError, match=r"certs' is a directory, not a file"):
        pki.client_ssl_context(
            cert_chain=tmp_path / "certs", key=tmp_path / "alice-tls.key",
            trust_root=tmp_path / "root.pem", passphrase=b"secret",
        )  # fmt: skip
    with pytest.raises(pki.KeyStoreError, match=r"nothing\.key' does not exist"):
        pki.client_ssl_context(
            cert_chain=tmp_path / "alice-chain.pem", key=tmp_path / "nothing.key",
            trust_root=tmp_path / "root.pem", passphrase=b"secret",
        )  # fmt: skip
    # A named pipe (which OpenSSL would wait on for ever) or a device is named for what it is; it said "a
    # named pipe, a device or a socket" whichever it was.
    os.mkfifo(tmp_path / "chain.fifo")
    for chain, kind in ((tmp_path / "chain.fifo", "a named pipe"), (Path("/dev/null"), "a character device")):
        with pytest.raises(pki.KeyStoreError) as refused:
            pki.client_ssl_context(
                cert_chain=chain, key=tmp_path / "alice-tls.key", trust_root=tmp_path / "root.pem",
                passphrase=b"secret",
            )  # fmt: skip
        assert str(refused.value) == f"TLS file {str(chain)!r}: not a regular file: {kind}"


def test_context_settings(live_network: pki.NetworkCredentials, live_alice: pki.NodeCredentials) -> None:
    client, server = _contexts(live_alice, live_network.root)
    for ctx in (client, server):
        assert ctx.verify_mode == ssl.CERT_REQUIRED
        assert ctx.check_hostname is False
        assert ctx.minimum_version == ssl.TLSVersion.TLSv1_2
        # Only the network root is trusted.
        assert [c["subject"] for c in ctx.get_ca_certs()] == [
            ((("countryName", "GB"),), (("localityName", "London"),), (("organizationName", "Corda Trio"),),
             (("commonName", "Corda Trio Root CA"),))
        ]  # fmt: skip


async def test_name_constraint_enforced_in_handshake(
    live_network: pki.NetworkCredentials, live_alice: pki.NodeCredentials, live_bob: pki.NodeCredentials
) -> None:
    """Alice's node CA issues a TLS certificate in Bob's name: OpenSSL refuses it (name constraint), so
    Alice cannot impersonate Bob even though the chain reaches the right root."""
    key = pki.generate_ec_key()
    forged = pki.create_certificate(
        role=pki.CertRole.TLS, subject=BOB, public_key=key.public_key(),
        issuer_cert=live_alice.node_ca.cert, issuer_key=live_alice.node_ca.key, now=REAL_NOW,
    )  # fmt: skip
    forger_client, _ = _contexts(live_alice, live_network.root, tls=pki.CertAndKey(cert=forged, key=key))
    _, bob_server = _contexts(live_bob, live_network.root)
    _, server_saw, _, _ = await _handshake(forger_client, bob_server)
    assert isinstance(server_saw, trio.BrokenResourceError)
    assert "permitted subtree violation" in str(server_saw.__cause__)


async def test_tls_certificate_issued_by_an_identity_certificate_is_refused(
    live_network: pki.NetworkCredentials, live_alice: pki.NodeCredentials, live_bob: pki.NodeCredentials
) -> None:
    """OpenSSL accepts it (the identity certificate is a CA); the role of every certificate is checked."""
    key = pki.generate_ec_key()
    cert = pki.create_certificate(
        role=pki.CertRole.TLS, subject=ALICE, public_key=key.public_key(),
        issuer_cert=live_alice.identity.cert, issuer_key=live_alice.identity.key, now=REAL_NOW,
    )  # fmt: skip
    chain = [cert, live_alice.identity.cert, live_alice.node_ca.cert, live_network.doorman.cert]
    alice_client = pki.client_ssl_context(cert_chain=chain, key=key, trust_root=live_network.root.cert)
    _, bob_server = _contexts(live_bob, live_network.root)
    _, server_saw, _, _ = await _handshake(alice_client, bob_server)
    assert isinstance(server_saw, pki.PeerIdentityError)
    assert "(wrong-role)" in str(server_saw) and "may not be issued by LEGAL_IDENTITY" in str(server_saw)


@pytest.mark.parametrize("side", ["inbound", "outbound"])
async def test_sybil_name_from_a_node_ca_is_refused(
    live_network: pki.NetworkCredentials,
    live_alice: pki.NodeCredentials,
    live_bob: pki.NodeCredentials,
    side: str,
) -> None:
    """Alice's node CA mints ``OU=Sybil, O=Alice, ...``: inside its name constraint, but not Alice."""
    sybil_name = pki.CordaX500Name.parse("OU=Sybil, O=Alice, L=London, C=GB")
    key = pki.generate_ec_key()
    cert = pki.create_certificate(
        role=pki.CertRole.TLS, subject=sybil_name, public_key=key.public_key(),
        issuer_cert=live_alice.node_ca.cert, issuer_key=live_alice.node_ca.key, now=REAL_NOW,
    )  # fmt: skip
    sybil = pki.CertAndKey(cert=cert, key=key)
    sybil_client, sybil_server = _contexts(live_alice, live_network.root, tls=sybil)
    bob_client, bob_server = _contexts(live_bob, live_network.root)
    if side == "inbound":
        _, seen, _, _ = await _handshake(sybil_client, bob_server)
    else:
        seen, _, _, _ = await _handshake(bob_client, sybil_server)
    assert isinstance(seen, pki.PeerIdentityError)
    assert "(name-mismatch)" in str(seen) and "exactly the name of its NODE_CA issuer" in str(seen)


def test_a_damaged_trust_root_is_a_keystore_error_naming_the_file(
    tmp_path: Path, live_network: pki.NetworkCredentials, live_alice: pki.NodeCredentials
) -> None:
    """A trust root whose subject is damaged (one bit of the PEM flipped: the CN's string tag became a
    context-specific one) loads lazily with ``cryptography`` but not with OpenSSL: the node's start ended in
    ``ssl.SSLError: no start line`` and a traceback (found by the corruption harness, seed 100100317)."""
    from cryptography.hazmat.primitives import serialization

    der = live_network.root.cert.public_bytes(serialization.Encoding.DER)
    cn = b"\x06\x03\x55\x04\x03\x0c"
    assert cn in der
    damaged = der.replace(cn, b"\x06\x03\x55\x04\x03\xbc", 1)
    (tmp_path / "root.pem").write_bytes(ssl.DER_cert_to_PEM_cert(damaged).encode())
    pki.write_certificates(tmp_path / "alice-chain.pem", live_alice.tls_chain)
    pki.write_private_key(tmp_path / "alice-tls.key", live_alice.tls.key, None)
    unreadable = r"root\.pem' does not hold PEM certificates: .*(issuer|subject)"
    with pytest.raises(pki.KeyStoreError, match=unreadable):
        pki.read_certificate(tmp_path / "root.pem")
    for make in (pki.client_ssl_context, pki.server_ssl_context):
        with pytest.raises(pki.KeyStoreError, match=r"root\.pem'"):
            make(
                cert_chain=tmp_path / "alice-chain.pem", key=tmp_path / "alice-tls.key",
                trust_root=tmp_path / "root.pem",
            )  # fmt: skip


def test_a_chain_cut_short_is_refused_and_a_root_with_garbage_after_it_is_used(
    tmp_path: Path, live_network: pki.NetworkCredentials, live_alice: pki.NodeCredentials
) -> None:
    """Found by tests/float/test_corruption.py: a TLS chain file cut inside its last certificate was read as
    the certificates before it (cryptography skips a block without its END line), so the float started and
    then failed every activation (OpenSSL: BAD_END_LINE); a trust root with bytes that are not ASCII after
    its END line was read, then every activation died of a UnicodeDecodeError, logged as a traceback."""
    pki.write_certificates(tmp_path / "chain.pem", live_alice.tls_chain)
    data = (tmp_path / "chain.pem").read_bytes()
    (tmp_path / "chain.pem").write_bytes(data[: len(data) - 60])
    with pytest.raises(pki.KeyStoreError, match=r"chain\.pem' does not hold PEM certificates: .*cut short"):
        pki.read_certificates(tmp_path / "chain.pem")
    pki.write_certificates(tmp_path / "chain.pem", live_alice.tls_chain)
    pki.write_private_key(tmp_path / "tls.key", live_alice.tls.key, None)
    pki.write_certificates(tmp_path / "root.pem", [live_network.root.cert])
    with open(tmp_path / "root.pem", "ab") as f:
        f.write(b"\xea\x01garbage\n")
    pki.server_ssl_context(
        cert_chain=tmp_path / "chain.pem", key=tmp_path / "tls.key", trust_root=tmp_path / "root.pem"
    )
