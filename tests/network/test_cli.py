"""End to end: ``corda-trio network bootstrap`` and ``corda-trio networkmap serve`` as real processes, an
ordinary HTTP client, and mutual TLS between two bootstrapped nodes."""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import trio

from corda_trio import network, pki
from corda_trio.node import _config
from tests.ipv6 import needs_ipv6

# The console script's entry point (``python -m corda_trio.node._cli`` would load _cli twice, as __main__
# and as itself, and CliError raised by the groups would not be caught as an operator error).
CLI = [sys.executable, "-c", "import sys; from corda_trio.node._cli import main; sys.exit(main())"]
ALICE = "O=Alice,L=London,C=GB"
BOB = "O=Bob,L=New York,C=US"


def _cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args],
        capture_output=True, text=True, timeout=timeout, env=env,
    )  # fmt: skip


def _env_without_passphrase() -> dict[str, str]:
    env = dict(os.environ)
    env.pop(_config.DEFAULT_PASSPHRASE_ENV, None)
    return env


def test_bootstrap_then_serve_publish_and_fetch(tmp_path: Path) -> None:
    net = tmp_path / "net"
    done = _cli("network", "bootstrap", "--dir", str(net), "--node", ALICE, "--node", BOB,
                env=_env_without_passphrase())  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "created network" in done.stdout and "O=Bob, L=New York, C=US" in done.stdout
    alice_cfg = _config.load_node_config(net / "nodes" / "alice" / "node.toml")
    bob_cfg = _config.load_node_config(net / "nodes" / "bob" / "node.toml")
    assert alice_cfg.legal_name == pki.CordaX500Name.parse(ALICE)
    assert (
        alice_cfg.p2p_address != bob_cfg.p2p_address and alice_cfg.network_map_url == bob_cfg.network_map_url
    )
    assert alice_cfg.network_map_url is not None
    assert oct(alice_cfg.tls_key.stat().st_mode & 0o777) == "0o600"

    server = subprocess.Popen(
        [*CLI, "networkmap", "serve", "--dir", str(net)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env_without_passphrase(),
    )  # fmt: skip
    try:
        assert server.stdout is not None
        line = server.stdout.readline()  # printed once listening
        assert line.startswith("corda-trio networkmap: serving http://"), line + (
            server.stderr.read() if server.poll() else ""
        )
        url = alice_cfg.network_map_url
        assert url in line
        for cfg in (alice_cfg, bob_cfg):
            node_info = (cfg.base_directory / network.node_info_file_name(cfg.legal_name)).read_bytes()
            request = urllib.request.Request(f"{url}/network-map/publish", data=node_info, method="POST")
            with urllib.request.urlopen(request, timeout=10) as response:
                assert response.status == 200 and response.read().startswith(b"added ")
        with urllib.request.urlopen(f"{url}/network-map", timeout=10) as response:
            assert response.headers["Cache-Control"] == "max-age=30"
            signed_map = response.read()
        root = pki.read_certificate(alice_cfg.trust_root)
        now = dt.datetime.now(dt.UTC)
        network_map = network.verify_network_map(signed_map, trust_root=root, now=now)
        names = set()
        for h in network_map.node_info_hashes:
            with urllib.request.urlopen(f"{url}/network-map/node-info/{h}", timeout=10) as response:
                names.add(str(network.verify_node_info(response.read(), trust_root=root, now=now).legal_name))
        assert names == {"O=Alice, L=London, C=GB", "O=Bob, L=New York, C=US"}
        with urllib.request.urlopen(
            f"{url}/network-map/network-parameters/{network_map.network_parameters_hash}", timeout=10
        ) as response:
            params, _ = network.verify_network_parameters(response.read(), trust_root=root, now=now)
        assert params.max_message_size == 10 * 1024 * 1024
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(
                urllib.request.Request(f"{url}/network-map/publish", data=b"junk", method="POST"), timeout=10
            )
        assert info.value.code == 400
    finally:
        server.send_signal(signal.SIGTERM)
        _, err = server.communicate(timeout=20)
    assert server.returncode == 0, err
    listed = _cli("networkmap", "list", "--dir", str(net), env=_env_without_passphrase())
    assert listed.stdout.splitlines() == ["O=Alice, L=London, C=GB", "O=Bob, L=New York, C=US"]
    removed = _cli("networkmap", "remove", "--dir", str(net), "--node", BOB, env=_env_without_passphrase())
    assert removed.returncode == 0 and "removed O=Bob" in removed.stdout
    again = _cli("networkmap", "remove", "--dir", str(net), "--node", BOB, env=_env_without_passphrase())
    assert again.returncode == 1 and "is not in the map" in again.stderr


def test_bootstrap_errors(tmp_path: Path) -> None:
    bad = _cli("network", "bootstrap", "--dir", str(tmp_path / "n"), "--node", "O=Alice,L=London,C=XX")
    assert bad.returncode == 2 and "not an ISO 3166-1 alpha-2 country code" in bad.stderr
    dup = _cli(
        "network",
        "bootstrap",
        "--dir",
        str(tmp_path / "n"),
        "--node",
        ALICE,
        "--node",
        "O=Alice, L=London, C=GB",
    )
    assert dup.returncode == 2 and "more than once" in dup.stderr
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    full = _cli("network", "bootstrap", "--dir", str(tmp_path / "full"), "--node", ALICE)
    assert full.returncode == 2 and "not an empty directory" in full.stderr
    missing = _cli("networkmap", "serve", "--dir", str(tmp_path / "nothing"))
    assert missing.returncode == 2 and "nothing: no such directory" in missing.stderr
    other = _cli("networkmap", "list", "--dir", str(tmp_path / "full"))
    assert other.returncode == 2 and "full: not a network directory (no network-map/ in it)" in other.stderr
    gone = _cli("networkmap", "list", "--config", str(tmp_path / "networkmap.toml"))
    assert gone.returncode == 2 and "configuration file not found" in gone.stderr


def test_networkmap_commands_on_a_network_without_a_map_say_so(tmp_path: Path) -> None:
    """``--no-map`` writes no networkmap.toml: each networkmap command says there is no map service, not
    just that a configuration file is missing (an operator followed the guide's ``networkmap list``)."""
    net = tmp_path / "net"
    done = _cli("network", "bootstrap", "--dir", str(net), "--node", ALICE, "--no-map")
    assert done.returncode == 0, done.stderr
    for command, use in (
        (["list"], "list"),
        (["serve"], "serve"),
        (["remove", "--node", ALICE], "remove a node from"),
        (["readmit", "--node", ALICE], "readmit a node to"),
    ):
        answer = _cli("networkmap", *command, "--dir", str(net))
        assert answer.returncode == 2 and answer.stdout == ""
        assert answer.stderr == (
            f"corda-trio: error: {net}: no network map service, so no map to {use}: there is no "
            f"{net / 'network-map' / 'networkmap.toml'} (a network bootstrapped with --no-map has none; its "
            "nodes find each other through their additional-node-infos/ directories)\n"
        )
    assert not (net / "network-map" / "networkmap.db").exists()  # nothing created by asking


def test_bootstrap_speed_and_env_passphrase(tmp_path: Path) -> None:
    """Three nodes with an operator passphrase: configs name the variable, no passphrase files."""
    env = dict(os.environ, MY_PASS="an operator passphrase")
    started = time.perf_counter()
    nodes = ["--node", ALICE, "--node", BOB, "--node", "O=Carol,L=Paris,C=FR"]
    done = _cli("network", "bootstrap", "--dir", str(tmp_path / "n"), *nodes, "--passphrase-env", "MY_PASS",
                "--no-map", env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert time.perf_counter() - started < 10  # whole process, interpreter start included (~1 s here)
    cfg = _config.load_node_config(tmp_path / "n" / "nodes" / "carol" / "node.toml")
    assert cfg.network_map_url is None
    assert cfg.key_passphrase.env == "MY_PASS"
    assert not list((tmp_path / "n").rglob("passphrase"))
    key = pki.read_private_key(
        cfg.identity_key, cfg.key_passphrase.read({"MY_PASS": "an operator passphrase"})
    )
    assert pki.read_certificates(cfg.identity_cert_chain)[0].public_key() == key.public_key()
    assert len(list(cfg.additional_node_infos.iterdir())) == 3
    with pytest.raises(_config.ConfigError, match="MY_PASS"):
        cfg.key_passphrase.read({})


@pytest.mark.parametrize(
    ("host", "loopback", "other"),
    [("127.0.0.1", "127.0.0.1", "::1"), pytest.param("[::1]", "::1", "127.0.0.1", marks=needs_ipv6)],
)
def test_every_loopback_listener_of_a_bootstrapped_node_is_of_the_networks_family(
    tmp_path: Path, host: str, loopback: str, other: str
) -> None:
    """``--host ::1`` left the external bridge's local endpoint (``[bridge] endpoint``, not written: the
    default) on ``127.0.0.1:0``, which a host without IPv4 cannot bind, as /metrics was: a node switched to
    ``mode = "external"`` could not start there. Every address of every listener, written or the default,
    is now of the network's family; a network on IPv4 gets the same node.toml as before (no endpoint line)."""
    done = _cli("network", "bootstrap", "--dir", str(tmp_path / "n"), "--node", ALICE, "--host", host,
                "--no-map")  # fmt: skip
    assert done.returncode == 0, done.stderr
    path = tmp_path / "n" / "nodes" / "alice" / "node.toml"
    text = path.read_text()
    assert other not in text, text
    assert ("endpoint = " in text) is (loopback == "::1"), text
    cfg = _config.load_node_config(path)
    listeners = [cfg.p2p_listen.host, cfg.rpc_address.host, cfg.bridge_endpoint[0]]
    assert cfg.metrics_address is not None
    assert [*listeners, cfg.metrics_address[0]] == [loopback] * 4
    assert (cfg.metrics_address[1], cfg.bridge_endpoint[1]) == (0, 0)
    external = text.replace('mode = "in-process"', 'mode = "external"\npassword_env = "BRIDGE_PASSWORD"')
    assert external != text
    path.write_text(external)
    assert _config.load_node_config(path).bridge_endpoint == (loopback, 0)


def _contexts(cfg: _config.NodeConfig) -> tuple[object, object]:
    passphrase = cfg.key_passphrase.read()
    kwargs = dict(
        cert_chain=cfg.tls_cert_chain, key=cfg.tls_key, trust_root=cfg.trust_root, passphrase=passphrase
    )
    return pki.client_ssl_context(**kwargs), pki.server_ssl_context(**kwargs)  # type: ignore[arg-type]


async def test_bootstrapped_nodes_mutual_tls(tmp_path: Path) -> None:
    result = network.bootstrap_network(
        tmp_path / "n", [pki.CordaX500Name.parse(ALICE), pki.CordaX500Name.parse(BOB)],
        now=dt.datetime.now(dt.UTC), map_port=None,
    )  # fmt: skip
    from corda_trio.node import _cli_network

    for node in result.nodes:
        _cli_network._write_node_config(result, node)
    alice = _config.load_node_config(result.nodes[0].directory / "node.toml")
    bob = _config.load_node_config(result.nodes[1].directory / "node.toml")
    alice_client, _ = _contexts(alice)
    _, bob_server = _contexts(bob)
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    seen: dict[str, object] = {}

    async def serve_one() -> None:
        stream = trio.SSLStream(await listeners[0].accept(), bob_server, server_side=True)  # type: ignore[arg-type]
        await stream.do_handshake()
        seen["bob saw"] = pki.check_peer_is_network_node(stream)
        await stream.send_all(b"hi")
        await stream.aclose()

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve_one)
            stream = trio.SSLStream(await trio.open_tcp_stream("127.0.0.1", port), alice_client)  # type: ignore[arg-type]
            await stream.do_handshake()
            assert pki.check_peer_legal_name(stream, bob.legal_name) == bob.legal_name
            with pytest.raises(pki.PeerIdentityError, match="but 'O=Alice, L=London, C=GB' was expected"):
                pki.check_peer_legal_name(stream, alice.legal_name)
            assert await stream.receive_some(2) == b"hi"
            await stream.aclose()
    await listeners[0].aclose()
    assert seen["bob saw"] == alice.legal_name


def test_each_ca_key_has_its_own_passphrase_and_the_root_key_can_leave(tmp_path: Path) -> None:
    net = tmp_path / "net"
    done = _cli("network", "bootstrap", "--dir", str(net), "--node", ALICE, env=_env_without_passphrase())
    assert done.returncode == 0, done.stderr
    keys = {
        "root": net / "network-root",
        "doorman": net / "doorman",
        "map": net / "network-map",
    }
    key_files = {"root": "root.key.pem", "doorman": "doorman.key.pem", "map": "map.key.pem"}
    passphrases = {name: (d / "passphrase").read_bytes().strip() for name, d in keys.items()}
    assert len(set(passphrases.values())) == 3
    for name, directory in keys.items():
        assert oct((directory / "passphrase").stat().st_mode & 0o777) == "0o600"
        pki.read_private_key(directory / key_files[name], passphrases[name])
        for other, passphrase in passphrases.items():
            if other != name:
                with pytest.raises(pki.KeyStoreError):
                    pki.read_private_key(directory / key_files[name], passphrase)
    # Nothing at runtime reads the root key: move it (and its passphrase) away, the map still serves.
    offline = tmp_path / "offline"
    offline.mkdir()
    for name in ("root.key.pem", "passphrase"):
        (net / "network-root" / name).rename(offline / name)
    server = subprocess.Popen(
        [*CLI, "networkmap", "serve", "--dir", str(net)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env_without_passphrase(),
    )  # fmt: skip
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        assert line.startswith("corda-trio networkmap: serving http://"), line
        url = line.split()[3]
        own_file = network.node_info_file_name(pki.CordaX500Name.parse(ALICE))
        node_info = (net / "nodes" / "alice" / own_file).read_bytes()
        request = urllib.request.Request(f"{url}/network-map/publish", data=node_info, method="POST")
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 200
    finally:
        server.send_signal(signal.SIGTERM)
        _, err = server.communicate(timeout=20)
    assert server.returncode == 0, err


def test_serve_started_in_the_background_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    """`corda-trio networkmap serve ... &` in a script starts with SIGINT ignored (a non-interactive shell
    does that for background jobs); SIGTERM must still stop it as usual: one line, exit 0 (it printed a page
    of Trio tracebacks, "Nursery misnesting detected")."""
    net = tmp_path / "net"
    done = _cli("network", "bootstrap", "--dir", str(net), "--node", ALICE, env=_env_without_passphrase())
    assert done.returncode == 0, done.stderr
    command = " ".join(f"'{part}'" for part in [*CLI, "networkmap", "serve", "--dir", str(net)])
    server = subprocess.Popen(
        ["/bin/sh", "-c", f"trap '' INT; exec {command}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env_without_passphrase(),
        start_new_session=True,
    )  # fmt: skip
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        assert line.startswith("corda-trio networkmap: serving http://"), line
        url = line.split()[3]
        with urllib.request.urlopen(f"{url}/network-map", timeout=10) as response:
            assert response.status == 200
        server.send_signal(signal.SIGTERM)
        _, err = server.communicate(timeout=30)
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
    assert err == "terminated\n", err
    assert server.returncode == 0


def test_serve_with_a_map_key_that_is_not_the_map_certificate_s_is_one_line_naming_both_files(
    tmp_path: Path,
) -> None:
    net = tmp_path / "net"
    done = _cli("network", "bootstrap", "--dir", str(net), "--node", ALICE, env=_env_without_passphrase())
    assert done.returncode == 0, done.stderr
    map_dir = net / "network-map"
    passphrase = (map_dir / "passphrase").read_bytes().strip()
    other = pki.generate_ec_key()
    pki.write_private_key(map_dir / "map.key.pem", other, passphrase)
    served = _cli("networkmap", "serve", "--dir", str(net), env=_env_without_passphrase())
    assert served.returncode == 2, served.stderr
    assert served.stderr == (
        f"corda-trio: error: {map_dir / 'map.key.pem'} is not the key of {map_dir / 'map.chain.pem'}\n"
    ), served.stderr
