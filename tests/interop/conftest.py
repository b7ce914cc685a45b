"""Real AMQP 1.0 peers for the interop suite, started and stopped by the tests themselves.

Session-scoped fixtures start each peer on 127.0.0.1 with free ports chosen here, wait until it really
speaks AMQP, and stop it (by the process id we started) at the end:

* ``proton_broker`` / ``proton_tls_broker``: ``peers/proton_broker.py`` on the project's own
  ``python-qpid-proton`` (the ``test`` extra);
* ``rabbitmq``: Debian's ``rabbitmq-server`` (3.10, AMQP 1.0 plugin) in a temp dir, with its own epmd port;
* ``rhea_broker``: ``peers/rhea_broker.js`` on node with rhea 3.0.5 (``$CORDA_TRIO_NODE_PATH``, installed by
  ``.ci/run``).

A peer that cannot start fails the test with the reason (CI never skips interop tests).
"""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest
import trustme

from corda_trio import amqp, transport
from tests.ports import free_port

PEERS = Path(__file__).resolve().parent / "peers"
RABBITMQ_SERVER = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")
NODE_PATH_CANDIDATES = [
    os.environ.get("CORDA_TRIO_NODE_PATH", ""),
    str(Path.home() / ".cache/corda-trio/node/node_modules"),
    "/tmp/peers-node/node_modules",
]


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


@attrs.frozen
class Peer:
    """A running peer: where it listens and how our client must talk to it."""

    name: str
    port: int
    config: amqp.ConnectionConfig
    address_prefix: str = ""
    log: Path | None = None
    #: How our receivers top up credit with this peer. RabbitMQ 3.x sometimes sends more transfers than
    #: granted when a flow crosses transfers in flight (rabbitmq-server#2597, fixed in 4.0): with it we grant
    #: new credit only once all of it was used, so nothing is in flight when the flow arrives.
    refill: transport.RefillPolicy = "half"

    def address(self, name: str) -> str:
        return f"{self.address_prefix}{name}"


def _wait_ready(proc: subprocess.Popen[bytes], what: str, log: Path, timeout: float = 20.0) -> None:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    buf = b""
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.1)
        if ready:
            chunk = os.read(proc.stdout.fileno(), 4096)
            buf += chunk
            if b"READY" in buf:
                return
            if not chunk and proc.poll() is not None:
                break
        elif proc.poll() is not None:
            break
    proc.kill()
    err = log.read_text(errors="replace")[-2000:] if log.exists() else ""
    pytest.fail(f"{what} did not start (exit {proc.poll()}): {buf.decode(errors='replace')}\n{err}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def _client_config(**kw: object) -> amqp.ConnectionConfig:
    return amqp.ConnectionConfig(**kw)  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def tls_pems(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, trustme.CA, trustme.LeafCert]:
    """A throwaway CA with a server certificate (localhost) and a client certificate, as PEM files."""
    d = tmp_path_factory.mktemp("tls")
    ca = trustme.CA()
    server = ca.issue_cert("localhost", "127.0.0.1")
    client = ca.issue_cert("interop-client.example")
    ca.cert_pem.write_to_path(str(d / "ca.pem"))
    server.private_key_pem.write_to_path(str(d / "server.key"))
    with open(d / "server.pem", "wb") as f:
        for blob in server.cert_chain_pems:
            f.write(blob.bytes())
    client.private_key_pem.write_to_path(str(d / "client.key"))
    (d / "client.pem").write_bytes(b"".join(blob.bytes() for blob in client.cert_chain_pems))
    return d, ca, client


def _start_proton(tmp: Path, *extra: str) -> Iterator[tuple[int, Path]]:
    port = free_port()
    log = tmp / f"proton-{port}.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, str(PEERS / "proton_broker.py"), "--port", str(port), *extra],
            stdout=subprocess.PIPE,
            stderr=err,
            stdin=subprocess.DEVNULL,
        )
    try:
        _wait_ready(proc, "Proton broker", log)
        yield port, log
    finally:
        _stop(proc)


# Proton as a server offers only ANONYMOUS and EXTERNAL (no Cyrus SASL in the PyPI build).
PROTON_CONFIG = dict(sasl_mechanisms=("PLAIN", "ANONYMOUS"))


@pytest.fixture(scope="session")
def proton_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Peer]:
    """Proton broker, plain TCP, with a 2 s idle timeout (so it advertises 1 s and we must heartbeat)."""
    for port, log in _start_proton(tmp_path_factory.mktemp("proton"), "--idle-timeout", "2"):
        yield Peer("proton", port, _client_config(**PROTON_CONFIG), log=log)


@pytest.fixture(scope="session")
def proton_tls_broker(
    tmp_path_factory: pytest.TempPathFactory, tls_pems: tuple[Path, object, object]
) -> Iterator[Peer]:
    """Proton broker over TLS that requires a client certificate from the test CA (mutual TLS)."""
    d = tls_pems[0]
    for port, log in _start_proton(
        tmp_path_factory.mktemp("proton-tls"), "--tls", str(d), "--require-client-cert"
    ):
        yield Peer("proton-tls", port, _client_config(**PROTON_CONFIG), log=log)


def rhea_node_path() -> str:
    """The ``NODE_PATH`` that holds rhea (fails the test with how to install it when there is none)."""
    node_path = next((p for p in NODE_PATH_CANDIDATES if p and (Path(p) / "rhea").is_dir()), None)
    if node_path is None:
        pytest.fail("rhea is not installed: run .ci/run (npm install rhea@3.0.5) or set CORDA_TRIO_NODE_PATH")
    return node_path


@pytest.fixture(scope="session")
def rhea_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Peer]:
    """rhea broker (pure JavaScript AMQP 1.0)."""
    node_path = rhea_node_path()
    tmp = tmp_path_factory.mktemp("rhea")
    port = free_port()
    log = tmp / "rhea.log"
    env = {**os.environ, "NODE_PATH": node_path}
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            ["node", str(PEERS / "rhea_broker.js"), str(port)],
            stdout=subprocess.PIPE,
            stderr=err,
            stdin=subprocess.DEVNULL,
            env=env,
        )
    try:
        _wait_ready(proc, "rhea broker", log)
        yield Peer("rhea", port, _client_config(sasl_mechanisms=("PLAIN",)), log=log)
    finally:
        _stop(proc)


@pytest.fixture(scope="session")
def rabbitmq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Peer]:
    """RabbitMQ 3.10 with the AMQP 1.0 plugin, in a temp dir, loopback only, its own epmd port."""
    if not RABBITMQ_SERVER.exists():
        pytest.fail(f"{RABBITMQ_SERVER} missing: apt-get install rabbitmq-server (.ci/run does)")
    d = tmp_path_factory.mktemp("rabbitmq")
    port, dist_port, epmd_port = free_port(), free_port(), free_port()
    (d / "log").mkdir()
    (d / "mnesia").mkdir()
    (d / "rabbitmq.conf").write_text(
        f"listeners.tcp.1 = 127.0.0.1:{port}\n"
        "loopback_users.guest = true\n"
        "amqp1_0.default_user = guest\n"
        "amqp1_0.default_vhost = /\n"
        "log.console = false\n"
        "log.file.level = warning\n"
    )
    (d / "enabled_plugins").write_text("[rabbitmq_amqp1_0].\n")
    env = {
        **os.environ,
        "HOME": str(d),
        "RABBITMQ_NODENAME": f"interop{port}@localhost",
        "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
        "RABBITMQ_NODE_PORT": str(port),
        "RABBITMQ_DIST_PORT": str(dist_port),
        "RABBITMQ_CONFIG_FILE": str(d / "rabbitmq.conf"),
        "RABBITMQ_ENABLED_PLUGINS_FILE": str(d / "enabled_plugins"),
        "RABBITMQ_MNESIA_BASE": str(d / "mnesia"),
        "RABBITMQ_LOG_BASE": str(d / "log"),
        "RABBITMQ_PID_FILE": str(d / "beam.pid"),
        "RABBITMQ_CONF_ENV_FILE": "/dev/null",
        "ERL_EPMD_ADDRESS": "127.0.0.1",
        "ERL_EPMD_PORT": str(epmd_port),
        "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
    }
    log = d / "log" / "stdout.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(RABBITMQ_SERVER)],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=d,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 90
        while not port_open(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text(errors="replace")[-3000:]
                pytest.fail(f"RabbitMQ did not open 127.0.0.1:{port} (exit {proc.poll()}):\n{tail}")
            time.sleep(0.2)
        yield Peer(
            "rabbitmq",
            port,
            _client_config(sasl_mechanisms=("PLAIN",), sasl_username="guest", sasl_password="guest"),
            address_prefix="/queue/",
            log=log,
            refill="empty",
        )
    finally:
        # beam.smp, its wrapper shell and the epmd on our private port all run in the session we created.
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
        subprocess.run(
            ["epmd", "-kill"],
            env={**os.environ, "ERL_EPMD_PORT": str(epmd_port)},
            capture_output=True,
            timeout=10,
            check=False,
        )


@pytest.fixture(params=["proton", "rabbitmq", "rhea"])
def peer(request: pytest.FixtureRequest) -> Peer:
    """Each third-party peer in turn."""
    fixture = {"proton": "proton_broker", "rabbitmq": "rabbitmq", "rhea": "rhea_broker"}[request.param]
    return request.getfixturevalue(fixture)  # type: ignore[no-any-return]
