"""``corda-trio bridge start``: configuration errors name file and key; signals stop it cleanly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from corda_trio.node._cli import main
from corda_trio.node._cli_bridge import load_bridge_config
from tests.ports import refused_port

REPO = Path(__file__).resolve().parents[2]

GOOD = """
[node]
endpoint = "127.0.0.1:{port}"
username = "bridge"
password_file = "pw"
[p2p]
listen = "127.0.0.1:0"
[tls]
cert_chain = "tls.pem"
key = "tls.key"
trust_root = "root.pem"
"""


def write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "pw").write_text("secret")
    (tmp_path / "pw").chmod(0o600)
    path = tmp_path / "bridge.toml"
    path.write_text(text)
    return path


def test_the_idle_timeout_is_a_p2p_setting(tmp_path: Path) -> None:
    """``[p2p] idle_timeout_seconds`` (as in node.toml): the peers' connections and the one to the node."""
    cfg = load_bridge_config(
        write(tmp_path, GOOD.format(port=5).replace("[p2p]", "[p2p]\nidle_timeout_seconds = 4"))
    )
    assert cfg.idle_timeout_seconds == 4.0
    assert load_bridge_config(write(tmp_path, GOOD.format(port=5))).idle_timeout_seconds == 10.0


def test_a_good_file_loads(tmp_path: Path) -> None:
    cfg = load_bridge_config(write(tmp_path, GOOD.format(port=5)))
    assert cfg.endpoint.port == 5 and cfg.p2p_listen == ("127.0.0.1", 0)
    assert cfg.tls_key == tmp_path / "tls.key" and cfg.password.read() == b"secret"
    assert cfg.credit == 256 and cfg.key_passphrase is None


def test_metrics_address_is_optional(tmp_path: Path) -> None:
    """``[metrics] address`` (as in node.toml; port 0: any free port): without it, no /metrics."""
    assert load_bridge_config(write(tmp_path, GOOD.format(port=5))).metrics_address is None
    cfg = load_bridge_config(write(tmp_path, GOOD.format(port=5) + '[metrics]\naddress = "[::1]:0"\n'))
    assert cfg.metrics_address == ("::1", 0)


@pytest.mark.parametrize(
    ("change", "key"),
    [
        (lambda t: t + '[metrics]\naddress = "nowhere"\n', "metrics.address"),
        (lambda t: t + '[metrics]\naddress = "127.0.0.1:70000"\n', "metrics.address"),
        (lambda t: t + "[metrics]\naddress = 9100\n", "metrics.address"),
        (lambda t: t + "[metrics]\nenabled = true\n", "metrics.enabled"),
        (lambda t: t.replace('endpoint = "127.0.0.1', 'endpoint = "10.1.2.3'), "node.endpoint"),
        (lambda t: t.replace('username = "bridge"\n', ""), "node.username"),
        (lambda t: t.replace('password_file = "pw"', 'password_env = "A"\npassword_file = "pw"'), "node"),
        (lambda t: t.replace('listen = "127.0.0.1:0"', 'listen = "nowhere"'), "p2p.listen"),
        (lambda t: t + "[tuning]\ncredit = 0\n", "tuning.credit"),
        (lambda t: t + "[tuning]\nmax_backoff_seconds = 0.5\n", "tuning.max_backoff_seconds"),
        # beyond AMQP's uint the first peer's link failed silently (its connection was dropped)
        (lambda t: t + "[tuning]\ncredit = 99999999999999999999\n", "tuning.credit"),
        (lambda t: t + "[tuning]\ncredit = 65537\n", "tuning.credit"),
        (lambda t: t + "[tuning]\ninitial_backoff_seconds = nan\n", "tuning.initial_backoff_seconds"),
        (lambda t: t + "[tuning]\nmax_backoff_seconds = inf\n", "tuning.max_backoff_seconds"),
        (lambda t: t.replace("[p2p]", "[p2p]\nidle_timeout_seconds = 0"), "p2p.idle_timeout_seconds"),
        (lambda t: t.replace("[p2p]", "[p2p]\nidle_timeout_seconds = 1e9"), "p2p.idle_timeout_seconds"),
        (lambda t: t.replace("[p2p]", "[p2p]\nmax_message_size = 4294967296"), "p2p.max_message_size"),
        (lambda t: t.replace("[tls]", "[tls]\ncolour = 1"), "tls.colour"),
        (lambda t: "extra = 1\n" + t, "extra"),
    ],
)
def test_configuration_errors_name_file_and_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], change: object, key: str
) -> None:
    path = write(tmp_path, change(GOOD.format(port=5)))  # type: ignore[operator]
    assert main(["bridge", "start", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"corda-trio: error: {path}: {key}:"), err
    assert "\n" not in err


def test_missing_key_material_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, GOOD.format(port=5))
    assert main(["bridge", "start", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("corda-trio: error:") and ".pem" in err and "\n" not in err


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 0)])
async def test_signals_stop_the_bridge(
    tmp_path: Path, network: object, alice: object, signum: int, code: int
) -> None:
    """With no node to reach the bridge keeps retrying; a signal stops it with one line."""
    from corda_trio import pki

    creds: pki.NodeCredentials = alice  # type: ignore[assignment]
    pki.write_certificates(tmp_path / "tls.pem", creds.tls_chain)
    pki.write_private_key(tmp_path / "tls.key", creds.tls.key, None)
    pki.write_certificates(tmp_path / "root.pem", [network.root.cert])  # type: ignore[attr-defined]
    port = refused_port()  # nothing listens there: the bridge backs off and retries
    path = write(tmp_path, GOOD.format(port=port))
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    process = await trio.lowlevel.open_process(
        [sys.executable, "-m", "corda_trio", "bridge", "start", "--config", str(path)],
        stderr=subprocess.PIPE,
        env=env,
    )
    assert process.stderr is not None
    with trio.fail_after(30):
        seen = b""
        while b"could not connect to the node at" not in seen:
            chunk = await process.stderr.receive_some()
            assert chunk, seen
            seen += chunk
        process.send_signal(signum)
        rest = b""
        async for chunk in process.stderr:
            rest += chunk
        assert await process.wait() == code
    assert rest.decode().strip().splitlines()[-1] == ("interrupted" if code else "terminated")
    assert "Traceback" not in (seen + rest).decode()


async def test_a_node_with_several_inboxes_is_one_line_and_exit_1(
    tmp_path: Path, network: object, alice: object
) -> None:
    """The CLI against a real control-protocol server whose snapshot lists two inboxes: one line, exit 1."""
    from corda_trio import amqp, pki, transport
    from tests.bridge.test_external_inboxes import _node_with_two_inboxes

    creds: pki.NodeCredentials = alice  # type: ignore[assignment]
    pki.write_certificates(tmp_path / "tls.pem", creds.tls_chain)
    pki.write_private_key(tmp_path / "tls.key", creds.tls.key, None)
    pki.write_certificates(tmp_path / "root.pem", [network.root.cert])  # type: ignore[attr-defined]
    config = amqp.ConnectionConfig(
        sasl_mechanisms=("PLAIN",), sasl_plain_check=lambda user, password: password == "secret"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            lambda task_status: transport.serve_amqp(
                _node_with_two_inboxes, 0, host="127.0.0.1", config=config, task_status=task_status
            )
        )
        path = write(tmp_path, GOOD.format(port=transport.listener_port(listeners)))
        with trio.fail_after(60):
            done = await trio.run_process(
                [sys.executable, "-m", "corda_trio", "bridge", "start", "--config", str(path)],
                capture_stdout=True, capture_stderr=True, check=False, env=env,
            )  # fmt: skip
        nursery.cancel_scope.cancel()
    err = done.stderr.decode()
    assert done.returncode == 1, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("corda-trio: error:") and "one inbox" in last, err
    assert "p2p.inbound.DLaaa" in last and "p2p.inbound.DLbbb" in last, err
    assert "Traceback" not in err, err


@pytest.mark.parametrize("in_use", ["p2p", "metrics"])
async def test_an_address_in_use_is_one_line_and_exit_1(
    tmp_path: Path, network: object, alice: object, in_use: str
) -> None:
    """The acceptor cannot bind p2p.listen (another process has the port): the bridge stops at once with one
    line naming the address (it logged "Exceptions from Trio nursery (1 sub-exception)" and retried forever:
    the bind error came wrapped in the acceptor's nursery group and was not recognised as fatal)."""
    from corda_trio import amqp, pki, transport
    from tests.bridge.test_external_inboxes import node_listing

    creds: pki.NodeCredentials = alice  # type: ignore[assignment]
    pki.write_certificates(tmp_path / "tls.pem", creds.tls_chain)
    pki.write_private_key(tmp_path / "tls.key", creds.tls.key, None)
    pki.write_certificates(tmp_path / "root.pem", [network.root.cert])  # type: ignore[attr-defined]
    config = amqp.ConnectionConfig(
        sasl_mechanisms=("PLAIN",), sasl_plain_check=lambda user, password: password == "secret"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    taken = trio.socket.socket()
    await taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    busy = taken.getsockname()[1]
    with taken:
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(
                lambda task_status: transport.serve_amqp(
                    node_listing("p2p.inbound.DLaaa"),
                    0,
                    host="127.0.0.1",
                    config=config,
                    task_status=task_status,
                )
            )
            text = GOOD.format(port=transport.listener_port(listeners))
            if in_use == "p2p":
                text = text.replace('listen = "127.0.0.1:0"', f'listen = "127.0.0.1:{busy}"')
            else:
                text += f'[metrics]\naddress = "127.0.0.1:{busy}"\n'

            path = write(tmp_path, text)
            with trio.fail_after(60):
                done = await trio.run_process(
                    [sys.executable, "-m", "corda_trio", "bridge", "start", "--config", str(path)],
                    capture_stdout=True, capture_stderr=True, check=False, env=env,
                )  # fmt: skip
            nursery.cancel_scope.cancel()
    err = done.stderr.decode()
    assert done.returncode == 1, err
    where = "" if in_use == "p2p" else "for /metrics "
    expected = f"corda-trio: error: cannot listen {where}on 127.0.0.1:{busy}: Address already in use"
    assert err.strip().splitlines()[-1] == expected, err
    assert "Traceback" not in err and "sub-exception" not in err, err


@pytest.mark.parametrize("command", [["bridge", "start"], ["networkmap", "serve"]])
def test_a_config_file_that_is_not_utf8_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    """tomllib raises UnicodeDecodeError (not a TOMLDecodeError) on such bytes: it was a traceback."""
    path = tmp_path / "bad.toml"
    path.write_bytes(b"\xff\xfe[node]\n")
    assert main([*command, "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"corda-trio: error: {path}: not valid TOML: not UTF-8 text (byte 0)", err


@pytest.mark.parametrize(
    ("env", "text"),
    [
        ({}, "environment variable CT_BRIDGE_PW (the node endpoint password) is not set"),
        ({"CT_BRIDGE_PW": ""}, "environment variable CT_BRIDGE_PW (the node endpoint password) is empty"),
        ({"CT_BRIDGE_PW": "\udcff"}, "CT_BRIDGE_PW (the node endpoint password) is not UTF-8 text (byte 0)"),
    ],
)
def test_an_unreadable_bridge_password_is_one_line_naming_file_and_key(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    env: dict[str, str],
    text: str,
) -> None:
    """An unset password variable, or one whose bytes are not UTF-8 (a traceback before), is one line naming
    the file and node.password_env, and says password, not key passphrase."""
    monkeypatch.delenv("CT_BRIDGE_PW", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    path = write(
        tmp_path, GOOD.format(port=5).replace('password_file = "pw"', 'password_env = "CT_BRIDGE_PW"')
    )
    assert main(["bridge", "start", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"corda-trio: error: {path}: node.password_env: "), err
    assert text in err and "passphrase" not in err and "\n" not in err


async def _line_with(stream: trio.abc.ReceiveStream, text: bytes, seen: bytearray) -> str:
    """The first line of ``stream`` holding ``text`` (what came before it is added to ``seen``)."""
    while True:
        *lines, _partial = bytes(seen).split(b"\n")
        for line in lines:
            if text in line:
                return line.decode()
        chunk = await stream.receive_some()
        assert chunk, bytes(seen)
        seen += chunk


async def test_a_node_killed_under_the_bridge_is_named_by_what_happened(
    tmp_path: Path, network: object, alice: object
) -> None:
    """kill -9 of the node under a ``corda-trio bridge start``: the bridge's warning said only ``session
    with the node ended: Exceptions from Trio nursery (1 sub-exception)`` (found killing a node of the
    operator guide's external-bridge setup). It names the failure: its type and message."""
    from corda_trio import pki, testing
    from tests.bridge.test_processes import CHILD, _write_node

    creds: pki.NodeCredentials = alice  # type: ignore[assignment]
    directory = _write_node(tmp_path, creds, network.root.cert, {})  # type: ignore[attr-defined]
    testing.write_peer_file(tmp_path / "peers.json", [])
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    node = await trio.lowlevel.open_process(
        [sys.executable, str(CHILD), str(directory), "endpoint"], stdout=subprocess.PIPE, env=env
    )
    bridge = None
    try:
        assert node.stdout is not None
        with trio.fail_after(60):
            port = int((await _line_with(node.stdout, b"endpoint ", bytearray())).split()[1])
        path = write(directory, GOOD.format(port=port).replace('"pw"', '"bridge.password"'))
        bridge = await trio.lowlevel.open_process(
            [sys.executable, "-m", "corda_trio", "bridge", "start", "--config", str(path)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
        )  # fmt: skip
        assert bridge.stdout is not None and bridge.stderr is not None
        seen = bytearray()
        with trio.fail_after(60):
            await _line_with(bridge.stdout, b"corda-trio bridge: listening on", bytearray())
            node.send_signal(signal.SIGKILL)
            await node.wait()
            line = await _line_with(bridge.stderr, b"session with the node ended", seen)
        cause = line.split("session with the node ended: ", 1)[1]
        assert "Trio nursery" not in cause and "sub-exception" not in cause, line
        error_type, _, message = cause.partition(": ")
        assert error_type.endswith("Error") and message, line
        assert "Traceback" not in seen.decode()
    finally:
        for process in (node, bridge):
            if process is not None and process.returncode is None:
                process.send_signal(signal.SIGKILL)
                await process.wait()


def test_a_tls_key_that_is_not_the_certificate_s_is_one_line_naming_both_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], network: object, alice: object, bob: object
) -> None:
    """[tls] key naming another node's key: 'cannot load TLS certificate ... NO_CERTIFICATE_ASSIGNED (wrong
    passphrase, or a key that does not match the certificate?)' left the operator to guess which."""
    from corda_trio import pki

    creds: pki.NodeCredentials = alice  # type: ignore[assignment]
    other: pki.NodeCredentials = bob  # type: ignore[assignment]
    pki.write_certificates(tmp_path / "tls.pem", creds.tls_chain)
    pki.write_private_key(tmp_path / "tls.key", other.tls.key, None)
    pki.write_certificates(tmp_path / "root.pem", [network.root.cert])  # type: ignore[attr-defined]
    assert main(["bridge", "start", "--config", str(write(tmp_path, GOOD.format(port=5)))]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [f"corda-trio: error: {tmp_path}/tls.key is not the key of {tmp_path}/tls.pem"]
