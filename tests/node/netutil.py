"""Create small bootstrapped networks whose nodes have RPC users, and run their network map service, for the
node process tests."""

from __future__ import annotations

import contextlib
import datetime as dt
import signal
import subprocess
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import attrs
import trio
from cryptography import x509
from prometheus_client.parser import text_string_to_metric_families

from corda_trio import messaging, pki, rpc, transport
from corda_trio.node import _config
from corda_trio.node._cli_network import create_network
from corda_trio.node._processes import NodeProcess
from corda_trio.pki import _certs as pki_certs

from .cli_helpers import CLI

PASSWORD = "demo-password"
_HASH = rpc.hash_password(PASSWORD)
USERS = (
    rpc.RpcUser(username="ops", password_hash=_HASH, permissions=frozenset({"admin"})),
    rpc.RpcUser(username="reader", password_hash=_HASH, permissions=frozenset({"read"})),
)


def make_network(
    directory: Path, names: Sequence[str], *, with_map: bool = False, **overrides: object
) -> list[tuple[Path, _config.NodeConfig]]:
    """Bootstrap ``names`` in ``directory`` (directory mode unless ``with_map``); returns (path, config)."""
    net = create_network(
        directory, [pki.CordaX500Name.parse(n) for n in names], map_port=0 if with_map else None
    )
    out = []
    for node in net.nodes:
        path = node.directory / "node.toml"
        settings: dict[str, object] = {"rpc_users": USERS, "shutdown_timeout_seconds": 5.0, **overrides}
        cfg = attrs.evolve(_config.load_node_config(path), **settings)
        path.write_text(_config.dump_node_config(cfg, node.directory), encoding="utf-8")
        out.append((path, _config.load_node_config(path)))
    return out


@contextlib.asynccontextmanager
async def open_map_process(net: Path, *, max_age_seconds: int) -> AsyncIterator[trio.Process]:
    """``corda-trio networkmap serve --dir net`` (a network made ``with_map``) with the map's ``max-age`` (the
    nodes' poll interval) set, serving until the block ends (SIGTERM, then SIGKILL after 10 s)."""
    set_map_max_age(net, max_age_seconds)
    proc = await start_map_process(net)
    try:
        yield proc
    finally:
        proc.terminate()
        with trio.CancelScope(shield=True), trio.move_on_after(10):
            await proc.wait()
        if proc.returncode is None:
            proc.kill()


def set_map_max_age(net: Path, max_age_seconds: int) -> None:
    """Set the ``max-age`` of a bootstrapped network's map (the nodes' poll interval; 30 s as made)."""
    toml = net / "network-map" / "networkmap.toml"
    text = toml.read_text(encoding="utf-8")
    assert "max_age_seconds = 30" in text, text
    toml.write_text(text.replace("max_age_seconds = 30", f"max_age_seconds = {max_age_seconds}"), "utf-8")


async def start_map_process(net: Path) -> trio.Process:
    """Start ``corda-trio networkmap serve --dir net`` and wait until it serves (killed if it does not); the
    caller stops it."""
    proc = await trio.lowlevel.open_process(
        [*CLI, "networkmap", "serve", "--dir", str(net)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    try:
        assert proc.stdout is not None
        line = b""
        with trio.fail_after(60):
            while b"\n" not in line:
                chunk = await proc.stdout.receive_some(4096)
                assert chunk, "networkmap serve exited before serving"
                line += chunk
        assert b"serving http://" in line, line
    except BaseException:
        proc.kill()
        with trio.CancelScope(shield=True):
            await proc.wait()
        raise
    return proc


async def scrape_metrics(url: str) -> dict[str, float]:
    """GET a node's ``/metrics``: ``{"name,label=value,...": value}``."""
    stream = await trio.open_tcp_stream("127.0.0.1", int(url.split(":")[2].split("/")[0]))
    async with stream:
        await stream.send_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n")
        data = b""
        while chunk := await stream.receive_some(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    samples = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            key = s.name + "".join(f",{k}={v}" for k, v in sorted(s.labels.items()))
            samples[key] = s.value
    return samples


def reissue_tls_certificate(
    node_dir: Path, *, not_after: dt.datetime, not_before: dt.datetime | None = None
) -> x509.Certificate:
    """Replace a bootstrapped node's TLS certificate (same key, issued by its node CA through ``pki``) by one
    valid from ``not_before`` (default: the node CA's; never earlier) to ``not_after``; returns it."""
    certs = node_dir / "certificates"
    passphrase = (certs / "passphrase").read_text().strip().encode()
    node_ca = pki.read_certificates(certs / "node-ca.chain.pem")[0]
    not_before = not_before or node_ca.not_valid_before_utc
    chain = pki.read_certificates(certs / "tls.chain.pem")
    issued_at = not_before + pki_certs.BACKDATE  # (create_certificate backdates by BACKDATE)
    cert = pki.create_certificate(
        role=pki.CertRole.TLS,
        subject=chain[0].subject,
        public_key=pki.read_private_key(certs / "tls.key.pem", passphrase).public_key(),
        issuer_cert=node_ca,
        issuer_key=pki.read_private_key(certs / "node-ca.key.pem", passphrase),
        now=issued_at,
        validity=not_after - issued_at,
    )
    assert cert.not_valid_before_utc == not_before.replace(microsecond=0), cert.not_valid_before_utc
    pki.write_certificates(certs / "tls.chain.pem", [cert, *chain[1:]])
    return cert


def reissue_map_certificate(net: Path, *, not_after: dt.datetime) -> x509.Certificate:
    """Replace a bootstrapped network's map signing certificate (same key, issued by the root) by one valid
    from the root's not-before to ``not_after``; returns it."""
    root_dir, map_dir = net / "network-root", net / "network-map"
    root = pki.read_certificate(root_dir / "root.cert.pem")
    old = pki.read_certificates(map_dir / "map.chain.pem")[0]
    issued_at = root.not_valid_before_utc + pki_certs.BACKDATE
    cert = pki.create_certificate(
        role=pki.CertRole.NETWORK_MAP,
        subject=old.subject,
        public_key=old.public_key(),
        issuer_cert=root,
        issuer_key=pki.read_private_key(
            root_dir / "root.key.pem", (root_dir / "passphrase").read_text().strip().encode()
        ),
        now=issued_at,
        validity=not_after - issued_at,
    )
    pki.write_certificates(map_dir / "map.chain.pem", [cert])
    return cert


async def stop(process: trio.Process, timeout_seconds: float = 10) -> None:
    """SIGTERM ``process`` (unless it has exited), SIGKILL if it still runs ``timeout_seconds`` later, and
    reap it."""
    if process.returncode is None:
        process.send_signal(signal.SIGTERM)
        with trio.move_on_after(timeout_seconds):
            await process.wait()
        if process.returncode is None:
            process.kill()
    await process.wait()


@contextlib.asynccontextmanager
async def open_inbox_sender(
    config: _config.NodeConfig, victim: NodeProcess
) -> AsyncIterator[transport.Sender]:
    """A sender to ``victim``'s inbox over a connection dialled to its advertised P2P address as the node of
    ``config`` (that node's TLS identity): what a peer's bridge opens."""
    tls = pki.client_ssl_context(
        cert_chain=pki.read_certificates(config.tls_cert_chain),
        key=pki.read_private_key(config.tls_key, config.key_passphrase.read()),
        trust_root=pki.read_certificate(config.trust_root),
    )
    host, port = victim.addresses["p2p"].rsplit(":", 1)
    async with transport.open_amqp_connection(host, int(port), ssl_context=tls) as conn:
        yield await conn.open_sender(messaging.inbox_address(victim.addresses["key_hash"]))
