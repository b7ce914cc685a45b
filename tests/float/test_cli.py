"""``corda-trio float``: tunnel-pki, start, configuration errors as one line, SIGTERM."""

from __future__ import annotations

import datetime as dt
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from corda_trio import pki
from corda_trio.bridge import float as fl
from corda_trio.node._cli_bridge import _build, load_bridge_config
from corda_trio.node._cli_float import load_float_config
from tests.node.cli_helpers import read_past
from tests.p2p_harness import NOW

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


def test_tunnel_pki_into_a_path_that_cannot_be_a_directory_is_one_line_and_exit_2(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x")
    for out, message in (
        (tmp_path / "afile", f"--out {tmp_path / 'afile'}: exists and is not a directory"),
        (tmp_path / "afile" / "t", f"--out {tmp_path / 'afile' / 't'}: Not a directory"),
    ):
        done = cli("float", "tunnel-pki", "--out", str(out))
        assert done.returncode == 2, done.stderr
        assert done.stderr.strip().splitlines() == [f"corda-trio: error: {message}"], done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


NAME_RULE = "a name is 1..64 letters, digits, '.', '_' or '-', not starting with '.'"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        # the float's certificate and key were written over the tunnel CA's: exit 0, and no CA left
        (["--float", "tunnel-ca"], "--float 'tunnel-ca': the tunnel CA's files are tunnel-ca.pem/.key"),
        (["--bridge", "tunnel-ca"], "--bridge 'tunnel-ca': the tunnel CA's files are tunnel-ca.pem/.key"),
        # longer than a certificate's common name takes: a traceback (cryptography's ValueError), --out left
        (["--float", "f" * 65], f"--float '{'f' * 65}': {NAME_RULE}"),
        # a line break, a right-to-left mark, a hidden file: written as they came, exit 0
        (["--float", "a\nb"], f"--float 'a\\nb': {NAME_RULE}"),
        (["--float", "a\u202eb"], f"--float 'a\\u202eb': {NAME_RULE}"),
        (["--bridge", ".hidden"], f"--bridge '.hidden': {NAME_RULE}"),
        (["--float", ""], f"--float '': {NAME_RULE}"),
        (["--float", "../up"], f"--float '../up': {NAME_RULE}"),
    ],
    ids=["float-tunnel-ca", "bridge-tunnel-ca", "too-long", "newline", "rtl-mark", "hidden", "empty", "path"],
)
def test_tunnel_pki_refuses_a_name_that_cannot_be_a_file_or_certificate_name(
    tmp_path: Path, args: list[str], message: str
) -> None:
    done = cli("float", "tunnel-pki", "--out", str(tmp_path / "t"), *args)
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith(f"corda-trio: error: {message}"), line
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_tunnel_pki_takes_a_name_of_64_characters(tmp_path: Path) -> None:
    name = "f" * 64
    assert cli("float", "tunnel-pki", "--out", str(tmp_path / "t"), "--float", name).returncode == 0
    creds = fl.TunnelCredentials.read(
        tmp_path / "t" / f"{name}.pem", tmp_path / "t" / f"{name}.key", tmp_path / "t" / "tunnel-ca.pem"
    )
    assert creds.role == "float"


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


@pytest.fixture(scope="module")
def _float_files(
    tmp_path_factory: pytest.TempPathFactory, bob: pki.NodeCredentials, network: pki.NetworkCredentials
) -> Path:
    """The files a float.toml names, made once (``float tunnel-pki`` is a process: a second each)."""
    tmp_path = tmp_path_factory.mktemp("float-files")
    assert cli("float", "tunnel-pki", "--out", str(tmp_path / "t"), "--float", "fa").returncode == 0
    pki.write_certificates(tmp_path / "tls.pem", bob.tls_chain)
    pki.write_private_key(tmp_path / "tls.key", bob.tls.key, None)
    pki.write_certificates(tmp_path / "root.pem", [network.root.cert])
    pki.write_private_key(tmp_path / "enc.key", bob.tls.key, b"s3cret")
    for name, text, mode in [("pass", "s3cret", 0o600), ("wrong", "nope", 0o600), ("open", "s3cret", 0o644)]:
        (tmp_path / name).write_text(text + "\n")
        (tmp_path / name).chmod(mode)
    (tmp_path / "binary").write_bytes(b"\xeb\x01\n")  # not UTF-8 text
    (tmp_path / "binary").chmod(0o600)
    return tmp_path


@pytest.fixture
def float_dir(tmp_path: Path, _float_files: Path) -> Path:
    """A copy of the files for one test (a test may change or damage them)."""
    shutil.copytree(_float_files, tmp_path, dirs_exist_ok=True)  # (copies the modes too)
    return tmp_path


def test_idle_timeouts_of_the_control_link_and_of_peers_are_settings(float_dir: Path) -> None:
    """float.toml ``[control] idle_timeout_seconds`` (the inside's link) and ``[public]`` (each peer's)."""
    text = CONFIG.replace("{port}", "0").replace("[public]", "[public]\nidle_timeout_seconds = 3")
    (float_dir / "float.toml").write_text(text.replace("[control]", "[control]\nidle_timeout_seconds = 2"))
    config, *_ = load_float_config(float_dir / "float.toml")
    assert (config.control_idle_timeout_seconds, config.public_idle_timeout_seconds) == (2.0, 3.0)
    (float_dir / "float.toml").write_text(CONFIG.replace("{port}", "0"))
    config, *_ = load_float_config(float_dir / "float.toml")
    assert config.control_idle_timeout_seconds == config.public_idle_timeout_seconds == 10.0


def test_hosts_may_be_ipv6_with_or_without_brackets(float_dir: Path) -> None:
    """``[control] host = "[::1]"`` made ``float start`` exit at once (getaddrinfo of '[::1]')."""
    text = CONFIG.replace("{port}", "0").replace("[control]", '[control]\nhost = "[::1]"')
    (float_dir / "float.toml").write_text(text.replace("[public]", '[public]\nhost = "::"'))
    config, *_ = load_float_config(float_dir / "float.toml")
    assert (config.control_host, config.public_host) == ("::1", "::")


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
        # another tunnel key: the line named the TLS context's temporary copies (/tmp/corda-trio-tls-...)
        (('key = "t/fa.key"', 'key = "t/bridge.key"'), "t/bridge.key is not the key of "),
        # a CA that is not the tunnel's (the network root): the float started, and refused every bridge
        (('ca = "t/tunnel-ca.pem"', 'ca = "root.pem"'), "t/fa.pem was not issued by the tunnel CA "),
        # a name too long: 'File name too long: PATH', naming no key (it was a traceback before that)
        (('cert = "t/fa.pem"', f'cert = "{"c" * 300}"'), f"/{'c' * 300}: File name too long"),
        (('[audit]\npath = "audit.jsonl"', ""), "key 'audit.path': missing"),
        (("[public]", "[publik]"), "unknown section [publik]"),
        # A misspelt optional key is refused, not silently left at its default (as in node.toml).
        (
            ("[public]", "[public]\npeer_link_windw = 8"),
            "key 'public.peer_link_windw': unknown setting (allowed: host, idle_timeout_seconds, "
            "max_handshakes_per_address, max_links_per_member, max_message_size, peer_link_window, port)",
        ),
        (("[audit]", "[audit]\nbackup = 2"), "key 'audit.backup': unknown setting (allowed: backups, "),
        (('trust_root = "root.pem"', 'trust_root = "root.pem"\npassphrase = "x"'), "'tls.node.passphrase'"),
        (("[control]", "[control]\nhots = '10.0.0.5'"), "key 'control.hots': unknown setting"),
        (("[tls.node]", "[tls]\nnode2 = 5\n[tls.node]"), "key 'tls.node2': must be a table ([tls.node2])"),
        (
            ("[public]", "[public]\nmax_links_per_member = 0"),
            "key 'public.max_links_per_member': must be at least 1",
        ),
        (("[public]", "[public]\nmax_handshakes_per_address = 0"), "max_handshakes_per_address': must be at"),
        (("[public]", '[public]\nmax_handshakes_per_address = "x"'), "'public.max_handshakes_per_address'"),
        (("[control]", "[control"), "not valid TOML"),
        # (a host that is no host name failed when the listener was opened: a UnicodeError traceback)
        (("[control]", "[control]\nhost = 'a..b'"), "key 'control.host': host 'a..b' is not a host name"),
        (("[public]", "[public]\nhost = '[10.0.0.5]'"), "key 'public.host': host '[10.0.0.5]' is not a host"),
        (
            ("[public]", "[public]\nidle_timeout_seconds = 0"),
            "key 'public.idle_timeout_seconds': must be a number of seconds in 1..3600, got 0",
        ),
        (
            ("[control]", "[control]\nidle_timeout_seconds = 'x'"),
            "'control.idle_timeout_seconds': must be a num",
        ),
        (('key = "tls.key"', ENCRYPTED), "key 'tls.node.key': private key"),
        (('key = "tls.key"', ENCRYPTED + 'passphrase_file = "wrong"'), "(wrong passphrase?)"),
        (
            ('key = "tls.key"', ENCRYPTED + 'passphrase_file = "open"'),
            "key 'tls.node.passphrase_file': passphrase file",
        ),
        (('key = "tls.key"', ENCRYPTED + 'passphrase_file = "none"'), "cannot read passphrase file"),
        (('key = "tls.key"', ENCRYPTED + 'passphrase_file = "binary"'), "is not UTF-8 text (byte 0)"),
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


def test_a_configuration_that_is_not_utf8_is_one_line_and_exit_2(float_dir: Path) -> None:
    good = CONFIG.replace("{port}", "0").encode()
    (float_dir / "float.toml").write_bytes(good + b"# \xff\n")
    done = cli("float", "start", "--config", str(float_dir / "float.toml"))
    assert done.returncode == 2, done.stderr
    expected = f"{float_dir / 'float.toml'}: not valid TOML: not UTF-8 text (byte {len(good) + 2})"
    assert done.stderr.strip().splitlines() == [f"corda-trio: error: {expected}"], done.stderr


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
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("float: control port listening on 127.0.0.1:"), line
        # At once: the signal lands while the float is still finishing its start (it once hung there).
        os.kill(process.pid, signal.SIGTERM)
        _, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:  # never leave it running after a failure
            process.kill()
            process.wait()
    assert process.returncode == 0, err
    assert err.strip() == "terminated"
    assert {p for p in float_dir.rglob("*")} - before == {float_dir / "audit.jsonl"}


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full here")
def test_an_audit_log_that_cannot_be_written_stops_the_float_in_one_line(float_dir: Path) -> None:
    """The float does not run without its audit trail: a disk that is full (``/dev/full``) stops it with one
    line, exit 1 (it printed a 'cannot listen' line, then a traceback from closing the file)."""
    config = CONFIG.replace("{port}", "0").replace('path = "audit.jsonl"', 'path = "/dev/full"')
    (float_dir / "float.toml").write_text(config)
    done = cli("float", "start", "--config", str(float_dir / "float.toml"))
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines() == [
        "corda-trio: error: cannot write the audit log /dev/full: No space left on device; the float stopped"
    ], done.stderr


BRIDGE_TOML = """
[node]
endpoint = "127.0.0.1:5"
username = "bridge"
password_file = "pw"
[tls]
cert_chain = "tls.pem"
key = "tls.key"
trust_root = "root.pem"
[float]
control = ["127.0.0.1:10010", "127.0.0.1:10011"]
tunnel_cert = "tunnel/br.pem"
tunnel_key = "tunnel/br.key"
tunnel_ca = "tunnel/tunnel-ca.pem"
"""


def _bridge_dir(tmp_path: Path, tunnel: fl.TunnelPki, network: pki.NetworkCredentials, bob: object) -> Path:
    (tmp_path / "pw").write_text("secret")
    (tmp_path / "pw").chmod(0o600)
    (tmp_path / "tunnel").mkdir()
    tunnel.issue("bridge", "br", now=NOW).write(tmp_path / "tunnel", "br")
    tunnel.issue("float", "fa", now=NOW).write(tmp_path / "tunnel", "fa")
    pki.write_certificates(tmp_path / "tunnel" / "tunnel-ca.pem", [tunnel.ca.cert])
    pki.write_certificates(tmp_path / "tls.pem", bob.tls_chain)  # type: ignore[attr-defined]
    pki.write_private_key(tmp_path / "tls.key", bob.tls.key, None)  # type: ignore[attr-defined]
    pki.write_certificates(tmp_path / "root.pem", [network.root.cert])
    return tmp_path


def test_a_bridge_process_behind_floats_is_configured_by_a_float_section(
    tmp_path: Path, tunnel: fl.TunnelPki, network: pki.NetworkCredentials, bob: pki.NodeCredentials
) -> None:
    d = _bridge_dir(tmp_path, tunnel, network, bob)
    (d / "bridge.toml").write_text(BRIDGE_TOML)
    cfg = load_bridge_config(d / "bridge.toml")
    assert cfg.p2p_listen is None and cfg.floats is not None
    assert [(a.host, a.port) for a in cfg.floats.control] == [("127.0.0.1", 10010), ("127.0.0.1", 10011)]
    ext = _build(cfg)  # reads the tunnel files: a bridge certificate
    assert ext.config.floats is not None and ext.tunnel_ssl_context is not None
    assert ext.config.floats.floats == (("127.0.0.1", 10010), ("127.0.0.1", 10011))
    assert ext.config.floats.tls_ref == "node"
    # the tunnel's timeouts: a frozen standby float is skipped within 3 s, not the peers' 10 s
    assert ext.config.floats.handshake_timeout_seconds == fl.DEFAULT_TUNNEL_HANDSHAKE_TIMEOUT_SECONDS == 3.0
    assert ext.config.floats.idle_timeout_seconds == 10.0
    # the tunnel's rounds wait at most 5 s (floats are DMZ hosts of the node's own), the peers' bridges 60 s
    assert ext.config.floats.max_backoff_seconds == fl.TUNNEL_MAX_BACKOFF_SECONDS == 5.0
    assert ext.config.bridges.max_backoff_seconds == 60.0
    (d / "bridge.toml").write_text(
        BRIDGE_TOML.replace(
            "[float]", "[float]\nidle_timeout_seconds = 2\nhandshake_timeout_seconds = 0.5"
        ).replace("[tls]", "[p2p]\nidle_timeout_seconds = 5\n[tls]")
    )
    ext = _build(load_bridge_config(d / "bridge.toml"))
    assert ext.config.floats is not None
    assert (ext.config.floats.idle_timeout_seconds, ext.config.floats.handshake_timeout_seconds) == (2.0, 0.5)
    assert ext.config.bridges.idle_timeout_seconds == ext.config.p2p.idle_timeout_seconds == 5.0


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda t: t.replace("[tls]", '[p2p]\nlisten = "127.0.0.1:0"\n[tls]'),
            "p2p.listen: not used behind a float",
        ),
        (
            lambda t: t.replace('control = ["127.0.0.1:10010", "127.0.0.1:10011"]', "control = []"),
            "float.control",
        ),
        (lambda t: t.replace("[float]", "[float]\ncolour = 1"), "float.colour"),
        (
            lambda t: t.replace("[float]", "[float]\nhandshake_timeout_seconds = 301"),
            "float.handshake_timeout_seconds: must be a number of seconds in 0.5..300, got 301",
        ),
        (lambda t: t.replace("[float]", "[float]\nidle_timeout_seconds = 0.9"), "float.idle_timeout_seconds"),
        (
            lambda t: t.replace("tunnel/br.pem", "tunnel/fa.pem").replace("tunnel/br.key", "tunnel/fa.key"),
            "a 'float' tunnel certificate, not a bridge's",
        ),
        (lambda t: t.replace("tunnel/br.pem", "tunnel/none.pem"), "none.pem"),
        # the tunnel files are checked as the float checks its own (they were handed to the TLS context)
        (lambda t: t.replace("tunnel/br.key", "tunnel/fa.key"), "tunnel/fa.key is not the key of "),
        (
            lambda t: t.replace("tunnel/tunnel-ca.pem", "root.pem"),
            "tunnel/br.pem was not issued by the tunnel",
        ),
        # [tls] files: a name too long and a device were 'does not exist'
        (lambda t: t.replace('key = "tls.key"', f'key = "{"k" * 300}"'), "': File name too long"),
        (
            lambda t: t.replace('key = "tls.key"', 'key = "/dev/null"'),
            "'/dev/null': not a regular file: a character device",
        ),
    ],
)
def test_bridge_float_section_errors_are_one_line_and_exit_2(
    tmp_path: Path,
    tunnel: fl.TunnelPki,
    network: pki.NetworkCredentials,
    bob: pki.NodeCredentials,
    change: Callable[[str], str],
    message: str,
) -> None:
    d = _bridge_dir(tmp_path, tunnel, network, bob)
    (d / "bridge.toml").write_text(change(BRIDGE_TOML))
    done = cli("bridge", "start", "--config", str(d / "bridge.toml"))
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], done.stderr


@pytest.mark.parametrize("which", ["tls.node", "control"])
def test_an_expired_certificate_is_refused_at_start_in_one_line(
    float_dir: Path, network: pki.NetworkCredentials, which: str
) -> None:
    """The node TLS material a float presents, or its tunnel certificate, expired: refused before it listens
    (it would otherwise fail every peer's or the bridge's handshake)."""
    if which == "tls.node":  # expired fifty minutes ago
        stale = network.issue_node(
            pki.CordaX500Name.parse("O=Bob,L=Paris,C=FR"), now=NOW, validity=TEN_MINUTES
        )
        pki.write_certificates(float_dir / "tls.pem", stale.tls_chain)
        pki.write_private_key(float_dir / "tls.key", stale.tls.key, None)
        cert, file = stale.tls.cert, float_dir / "tls.pem"
    else:
        creds = fl.TunnelPki.create(now=NOW).issue("float", "fa", now=NOW, validity=TEN_MINUTES)
        creds.write(float_dir / "t", "fa")
        pki.write_certificates(float_dir / "t" / "tunnel-ca.pem", [creds.ca])
        cert, file = creds.cert, float_dir / "t" / "fa.pem"
    (float_dir / "float.toml").write_text(CONFIG.replace("{port}", "0"))
    done = cli("float", "start", "--config", str(float_dir / "float.toml"))
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert f"[{which}]: {file}: certificate " in line, line
    assert f"expired at {cert.not_valid_after_utc.isoformat()}" in line, line
    assert not (float_dir / "audit.jsonl").exists()


TEN_MINUTES = dt.timedelta(minutes=10)


@pytest.mark.parametrize("which", ["tls.node", "control"])
async def test_float_start_says_when_a_certificate_expires(
    float_dir: Path, network: pki.NetworkCredentials, bob: pki.NodeCredentials, which: str
) -> None:
    """A certificate of the float expiring soon gave no warning at start and no line when it expired while the
    float ran (the node and the map service say both): now a warning at start names the file, the certificate
    and when, and one error line at expiry says what stops working."""
    now = dt.datetime.now(dt.UTC)
    if which == "tls.node":  # Bob's TLS certificate re-issued by his node CA, for 5 s
        cert = pki.create_certificate(
            role=pki.CertRole.TLS, subject=bob.tls.cert.subject, public_key=bob.tls.key.public_key(),
            issuer_cert=bob.node_ca.cert, issuer_key=bob.node_ca.key, now=now, validity=FIVE_SECONDS,
        )  # fmt: skip
        pki.write_certificates(float_dir / "tls.pem", [cert, *bob.tls_chain[1:]])
        file, consequence = float_dir / "tls.pem", "peers refuse this float's TLS"
    else:
        creds = fl.TunnelPki.create(now=NOW).issue("float", "fa", now=now, validity=FIVE_SECONDS)
        creds.write(float_dir / "t", "fa")
        pki.write_certificates(float_dir / "t" / "tunnel-ca.pem", [creds.ca])
        cert, file, consequence = creds.cert, float_dir / "t" / "fa.pem", "refuse each other's control link"
    not_after = cert.not_valid_after_utc.isoformat()
    (float_dir / "float.toml").write_text(CONFIG.replace("{port}", "0"))
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-m", "corda_trio", "float", "start", "--config", str(float_dir / "float.toml")],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=ENV,
    )  # fmt: skip
    assert proc.stderr is not None
    try:  # (one line, not one per second)
        lines = (await read_past(proc.stderr, f"expired at {not_after}")).splitlines()
    finally:
        proc.terminate()
        await proc.wait()
    (warning,) = [line for line in lines if "WARNING" in line]
    assert f"{file}: certificate {cert.subject.rfc4514_string()!r} expires at {not_after}" in warning, lines
    assert "have it renewed before then" in warning, warning
    (error,) = [line for line in lines if "ERROR" in line]
    assert f"{file}: certificate " in error and consequence in error, error


FIVE_SECONDS = dt.timedelta(seconds=5)
