"""Corruption of the float's files: each file ``float start`` reads or appends to, damaged the ways disks and
people damage them, then the real command started on the copy and, when it starts, activated by a real
tunnel (the node's inside end, in this process).

The files: ``float.toml``; the tunnel certificate, key and CA of ``[control]``; the node's TLS chain, its
(encrypted) key, its passphrase file and the network root of ``[tls.node]``; the audit log the float appends
to (one a float wrote before). The damages: a bit flipped, a truncation, a zeroed 4 KiB aligned range,
garbage appended, the file deleted, emptied, replaced by a directory, an older copy put back (the audit log
before the last run; the tunnel files of the tunnel PKI made before the current one); and the node's TLS
chain cut inside its last certificate's BEGIN line (read as the certificates before it).

A trial passes when the float either starts and works (it is activated: its public port opens and a peer's
TLS handshake there succeeds, the chain it presents reaching the network root; the audit
log it appended to gets whole JSON lines, whatever the damage left at its end) or refuses in one line naming
the file (exit 2: a configuration or its material that is wrong; 1: the audit log cannot be written) and
leaves every file as it was. Never a traceback or a hang.

A suite run tries the kinds of ``tests.damage.SUITE_DAMAGES`` on every file (CI's time is bounded);
``CORDA_TRIO_CORRUPTION=all pytest tests/...`` tries every kind.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import signal
import ssl
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from corda_trio import messaging, pki
from corda_trio.bridge import float as fl
from tests.damage import campaign_damages, damage_file

from .test_inprocess import receiver_behind_float
from .test_processes import ENV

CONFIG = """
[control]
port = 0
cert = "t/fa.pem"
key = "t/fa.key"
ca = "t/tunnel-ca.pem"
[public]
host = "127.0.0.1"
port = 0
[tls.node]
cert_chain = "tls.pem"
key = "tls.key"
trust_root = "root.pem"
passphrase_file = "pass"
[audit]
path = "audit.jsonl"
"""
FILES = (
    "float.toml",
    "t/fa.pem",
    "t/fa.key",
    "t/tunnel-ca.pem",
    "tls.pem",
    "tls.key",
    "pass",
    "root.pem",
    "audit.jsonl",
)
#: files an older copy of which exists: the audit log, and the tunnel PKI made before the current one
HAS_OLDER = ("audit.jsonl", "t/fa.pem", "t/fa.key", "t/tunnel-ca.pem")
START_SECONDS = 20.0
ACTIVATION_SECONDS = 15.0


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "corda_trio", *args], capture_output=True, text=True, env=ENV, timeout=60
    )


def _start(directory: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "corda_trio", "float", "start", "--config", str(directory / "float.toml")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
    )  # fmt: skip


def _stop(process: subprocess.Popen[str]) -> tuple[int, str, str]:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        out, err = process.communicate(timeout=20)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return process.returncode, out, err


@pytest.fixture(scope="module")
def float_dir(
    tmp_path_factory: pytest.TempPathFactory, bob: pki.NodeCredentials, network: pki.NetworkCredentials
) -> Path:
    """A float's directory whose audit log a run of the float wrote, and ``older/``: the audit log before
    that run and the tunnel files of an earlier tunnel PKI."""
    base = tmp_path_factory.mktemp("float")
    d = base / "float"
    older = base / "older"
    for out in (older / "t", d / "t"):
        done = _cli("float", "tunnel-pki", "--out", str(out), "--float", "fa", "--bridge", "br")
        assert done.returncode == 0, done.stderr
    pki.write_certificates(d / "tls.pem", bob.tls_chain)
    pki.write_private_key(d / "tls.key", bob.tls.key, b"s3cret")
    pki.write_certificates(d / "root.pem", [network.root.cert])
    (d / "pass").write_text("s3cret\n")
    (d / "pass").chmod(0o600)
    (d / "float.toml").write_text(CONFIG)
    for _ in range(2):
        if (d / "audit.jsonl").exists():
            shutil.copy(d / "audit.jsonl", older / "audit.jsonl")
        process = _start(d)
        assert process.stdout is not None
        line = process.stdout.readline()
        code, _, err = _stop(process)
        assert line.startswith("float: control port listening on") and code == 0, line + err
    return d


def _tree(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
    }


def _damage(path: Path, kind: str, rng: random.Random, older: Path) -> str:
    if kind == "cut-last":  # (before the last certificate's BEGIN line is whole: read as the ones before it)
        data = path.read_bytes()
        at = data.rindex(b"-----BEGIN CERTIFICATE-----") + 5
        path.write_bytes(data[:at])
        return f"truncated at {at} of {len(data)}, inside the last BEGIN line"
    return damage_file(path, kind, rng, older)


async def _activate(
    directory: Path, control: str, bob: pki.NodeCredentials, peer: ssl.SSLContext
) -> tuple[str, int] | None:
    """Activate the float at ``control`` (``HOST:PORT``) as Bob's inside end does, then complete a peer's TLS
    handshake on its public port with ``peer``; its public address, or None when it was not activated within
    ACTIVATION_SECONDS."""
    host, _, port = control.rpartition(":")
    bridge_creds = fl.TunnelCredentials.read(
        directory / "t" / "br.pem", directory / "t" / "br.key", directory / "t" / "tunnel-ca.pem"
    )
    async with receiver_behind_float(
        bob, directory.parent / "inside", [(host, int(port))], bridge_creds, messaging.PeerDirectory()
    ) as inside:
        with trio.move_on_after(ACTIVATION_SECONDS):
            public = await inside.tunnel.wait_active()
            stream = await trio.open_ssl_over_tcp_stream(*public, ssl_context=peer)
            try:
                await stream.do_handshake()  # (the peer checks the chain the float presents up to the root)
            finally:
                await trio.aclose_forcefully(stream)
            return public
    return None


CASES = [(f, d) for f in FILES for d in campaign_damages() if d != "older" or f in HAS_OLDER]
CASES += [("tls.pem", "cut-last")]


@pytest.mark.parametrize(("rel", "kind"), CASES, ids=[f"{Path(f).name}-{d}" for f, d in CASES])
async def test_a_damaged_file_is_refused_in_one_line_or_the_float_works(
    float_dir: Path,
    tmp_path: Path,
    alice: pki.NodeCredentials,
    bob: pki.NodeCredentials,
    network: pki.NetworkCredentials,
    rel: str,
    kind: str,
) -> None:
    d = tmp_path / "float"
    shutil.copytree(float_dir, d)
    rng = random.Random(f"{rel}/{kind}")
    what = _damage(d / rel, kind, rng, float_dir.parent / "older" / rel)
    before = _tree(d)
    damaged_audit = (d / "audit.jsonl").read_bytes() if (d / "audit.jsonl").is_file() else b""
    process = _start(d)
    activated = None
    try:
        assert process.stdout is not None
        with trio.fail_after(START_SECONDS):
            line = await trio.to_thread.run_sync(process.stdout.readline)
        if line.startswith("float: control port listening on "):
            peer = pki.client_ssl_context(
                cert_chain=alice.tls_chain, key=alice.tls.key, trust_root=network.root.cert
            )
            activated = await _activate(d, line.split()[-1], bob, peer)
    finally:
        code, out, err = _stop(process)
    context = f"{rel} ({what}): exit {code}, stdout {line + out!r}, stderr:\n{err}"
    assert "Traceback" not in err, context
    if line.startswith("float: control port listening on "):
        assert activated is not None, f"not activated: {context}"
        assert "float: public listener open on" in out, context
        assert code == 0 and err.strip() == "terminated", context
        audit = (d / "audit.jsonl").read_bytes()
        assert audit.startswith(damaged_audit), context
        added = audit[len(damaged_audit) :]
        if damaged_audit and not damaged_audit.endswith(b"\n"):
            assert added.startswith(b"\n"), f"the first new line was glued to a torn one: {context}"
        events = [json.loads(x)["event"] for x in added.splitlines() if x]
        assert events[0] == "control-listening" and "public-open" in events, context
        return
    assert code in (1, 2), context
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("corda-trio: error: "), context
    assert Path(rel).name in lines[0], f"the line does not name {Path(rel).name}: {context}"
    if kind == "directory":
        assert "does not exist" not in lines[0], f"a directory said to be missing: {context}"
    assert _tree(d) == before, f"a refused start changed the files: {context}"
