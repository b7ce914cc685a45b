"""``corda-trio float``: tunnel-pki, start, configuration errors as one line, SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from corda_trio import pki
from corda_trio.bridge import float as fl

from .test_processes import ENV


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "corda_trio", *args], capture_output=True, text=True, env=ENV, timeout=60
    )


def test_tunnel_pki_makes_the_ca_and_the_certificates(tmp_path: Path) -> None:
    out = tmp_path / "tunnel"
    done = cli("float", "tunnel-pki", "--out", str(out), "--float", "fa", "--float", "fb", "--bridge", "br")
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in out.iterdir()) == [
        "br.key", "br.pem", "fa.key", "fa.pem", "fb.key", "fb.pem", "tunnel-ca.key", "tunnel-ca.pem",
    ]  # fmt: skip
    creds = fl.TunnelCredentials.read(out / "br.pem", out / "br.key", out / "tunnel-ca.pem")
    assert creds.role == "bridge"
    assert fl.TunnelCredentials.read(out / "fa.pem", out / "fa.key", out / "tunnel-ca.pem").role == "float"
    again = cli("float", "tunnel-pki", "--out", str(out))
    assert again.returncode == 2 and "is not empty" in again.stderr and len(again.stderr.splitlines()) == 1


CONFIG = """
[control]
port = {port}
cert = "t/fa.pem"
key = "t/fa.key"
ca = "t/tunnel-ca.pem"
[public]
port = 0
[tls.node]
cert_chain = "tls.pem"
key = "tls.key"
trust_root = "root.pem"
[audit]
path = "audit.jsonl"
"""


@pytest.fixture
def float_dir(tmp_path: Path, bob: pki.NodeCredentials, network: pki.NetworkCredentials) -> Path:
    assert cli("float", "tunnel-pki", "--out", str(tmp_path / "t"), "--float", "fa").returncode == 0
    pki.write_certificates(tmp_path / "tls.pem", bob.tls_chain)
    pki.write_private_key(tmp_path / "tls.key", bob.tls.key, None)
    pki.write_certificates(tmp_path / "root.pem", [network.root.cert])
    pki.write_private_key(tmp_path / "enc.key", bob.tls.key, b"s3cret")
    for name, text, mode in [("pass", "s3cret", 0o600), ("wrong", "nope", 0o600), ("open", "s3cret", 0o644)]:
        (tmp_path / name).write_text(text + "\n")
        (tmp_path / name).chmod(mode)
    return tmp_path


ENCRYPTED = 'key = "enc.key"\n'


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("port = {port}", 'port = "x"'), "key 'control.port': must be an integer"),
        (("port = {port}", "port = 70000"), "key 'control.port': port 70000 is out of range"),
        (('cert = "t/fa.pem"', 'cert = "t/none.pem"'), "key 'control.cert': file"),
        (
            ('cert = "t/fa.pem"\nkey = "t/fa.key"', 'cert = "t/bridge.pem"\nkey = "t/bridge.key"'),
            "not a float's",
        ),
        (('[audit]\npath = "audit.jsonl"', ""), "key 'audit.path': missing"),
        (("[public]", "[publik]"), "unknown section [publik]"),
        (("[control]", "[control"), "not valid TOML"),
        (('key = "tls.key"', ENCRYPTED), "key 'tls.node.key': private key"),
        (('key = "tls.key"', ENCRYPTED + 'passphrase_file = "wrong"'), "(wrong passphrase?)"),
        (
            ('key = "tls.key"', ENCRYPTED + 'passphrase_file = "open"'),
            "key 'tls.node.passphrase_file': passphrase file",
        ),
        (('key = "tls.key"', ENCRYPTED + 'passphrase_file = "none"'), "cannot read passphrase file"),
        (
            ('key = "tls.key"', ENCRYPTED + 'passphrase_env = "CORDA_TRIO_FLOAT_TEST_UNSET"'),
            "key 'tls.node.passphrase_env': environment variable CORDA_TRIO_FLOAT_TEST_UNSET",
        ),
        (('key = "tls.key"', ENCRYPTED + 'passphrase_env = "A-B"'), "must be a variable name"),
        (
            ('key = "tls.key"', ENCRYPTED + 'passphrase_env = "X"\npassphrase_file = "pass"'),
            "key 'tls.node': set at most one of passphrase_env and passphrase_file",
        ),
    ],
)
def test_configuration_errors_are_one_line_and_exit_2(
    float_dir: Path, change: tuple[str, str], message: str
) -> None:
    text = CONFIG.replace(*change).replace("{port}", "0")
    (float_dir / "float.toml").write_text(text)
    done = cli("float", "start", "--config", str(float_dir / "float.toml"))
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("key", ["plain", "encrypted"])
def test_start_writes_only_the_audit_log_and_exits_0_on_sigterm(float_dir: Path, key: str) -> None:
    config = CONFIG.replace("{port}", "0")
    if key == "encrypted":
        config = config.replace('key = "tls.key"', ENCRYPTED + 'passphrase_file = "pass"')
    (float_dir / "float.toml").write_text(config)
    before = {p for p in float_dir.rglob("*")}
    process = subprocess.Popen(
        [sys.executable, "-m", "corda_trio", "float", "start", "--config", str(float_dir / "float.toml")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
    )  # fmt: skip
    assert process.stdout is not None
    line = process.stdout.readline()
    assert line.startswith("float: control port listening on 127.0.0.1:"), line
    os.kill(process.pid, signal.SIGTERM)
    _, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    assert err.strip() == "terminated"
    assert {p for p in float_dir.rglob("*")} - before == {float_dir / "audit.jsonl"}
