"""Real processes, sockets and TLS: a receiver whose only way in is a float (``corda-trio float start``).

Knobs: ``FLOAT_MESSAGES`` (default 10000, the bulk run), ``FLOAT_FAILOVER_MESSAGES`` (default 3000),
``FLOAT_KILL_ROUNDS`` (default 3 kills of the active float, alternating between two).

The ledger: after the run the receiver's committed handler receipts are dumped (``node_child.py dump``): they
must be exactly the sender's messages 0..N-1, each once, in order. Outbound connections of the float are
watched from outside, in ``/proc``: every TCP socket the float process holds is a listener or was accepted on
one of its two ports (a connection it dialled would sit on an ephemeral local port).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import attrs
import pytest
import trio

from corda_trio import messaging, pki, testing
from corda_trio.bridge import float as fl
from tests.p2p_harness import NOW, wait_until
from tests.ports import free_port

CHILD = Path(__file__).with_name("node_child.py")
REPO = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def tcp_sockets(pid: int) -> list[tuple[int, int, str]]:
    """(local port, remote port, state hex) of every TCP socket process ``pid`` holds (``0A`` = LISTEN)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    found = []
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}") as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                if cols[9] in inodes:
                    found.append((int(cols[1].split(":")[1], 16), int(cols[2].split(":")[1], 16), cols[3]))
    return found


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@attrs.define(eq=False)
class Proc:
    argv: list[str]
    lines: list[str] = attrs.field(factory=list)
    process: trio.Process | None = None

    async def start(self, nursery: trio.Nursery) -> None:
        self.process = await trio.lowlevel.open_process(self.argv, stdout=subprocess.PIPE, env=ENV)
        nursery.start_soon(self._read, self.process)

    async def _read(self, process: trio.Process) -> None:
        assert process.stdout is not None
        buf = b""
        async for chunk in process.stdout:
            buf += chunk
            *complete, buf = buf.split(b"\n")
            if process is self.process:
                self.lines.extend(x.decode() for x in complete)

    async def wait_line(self, predicate: Callable[[str], bool], *, after: int = 0, within: float = 60) -> str:
        with trio.fail_after(within):
            while True:
                for line in self.lines[after:]:
                    if predicate(line):
                        return line
                await trio.sleep(0.02)

    async def kill(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.send_signal(signal.SIGKILL)
            await self.process.wait()


@attrs.define(eq=False)
class FloatProc(Proc):
    directory: Path = Path()
    control_port: int = 0
    public_port: int = 0

    def audit(self) -> list[dict[str, object]]:
        return [json.loads(x) for x in (self.directory / "audit.jsonl").read_text().splitlines()]


def write_float(
    base: Path,
    name: str,
    tunnel: fl.TunnelPki,
    receiver: pki.NodeCredentials,
    root: object,
    control: int = 0,
    *,
    idle_timeout_seconds: float | None = None,
) -> FloatProc:
    """A float's directory and float.toml; ``idle_timeout_seconds``: its ``[control]`` and ``[public]``
    ``idle_timeout_seconds`` (default: not set, 10 s)."""
    idle = "" if idle_timeout_seconds is None else f"idle_timeout_seconds = {idle_timeout_seconds}\n"
    d = base / name
    d.mkdir(parents=True)
    tunnel.issue("float", name, now=NOW).write(d, "tunnel")
    pki.write_certificates(d / "tunnel-ca.pem", [tunnel.ca.cert])
    pki.write_certificates(d / "tls.pem", receiver.tls_chain)
    pki.write_private_key(d / "tls.key", receiver.tls.key, None)
    pki.write_certificates(d / "root.pem", [root])  # type: ignore[list-item]
    public = free_port()
    (d / "float.toml").write_text(
        f"""
[control]
host = "127.0.0.1"
port = {control}
cert = "tunnel.pem"
key = "tunnel.key"
ca = "tunnel-ca.pem"
{idle}
[public]
host = "127.0.0.1"
port = {public}
{idle}
[tls.node]
cert_chain = "tls.pem"
key = "tls.key"
trust_root = "root.pem"

[audit]
path = "audit.jsonl"
latency_summary_seconds = 1
"""
    )
    argv = [sys.executable, "-m", "corda_trio", "float", "start", "--config", str(d / "float.toml")]
    return FloatProc(argv, directory=d, public_port=public)


async def start_float(proc: FloatProc, nursery: trio.Nursery) -> None:
    before = len(proc.lines)
    await proc.start(nursery)
    line = await proc.wait_line(lambda x: "control port listening" in x, after=before)
    proc.control_port = int(line.rsplit(":", 1)[1])


def write_node(
    base: Path,
    creds: pki.NodeCredentials,
    root: object,
    *,
    send: dict[str, object] | None = None,
    tunnel: fl.TunnelPki | None = None,
    floats: list[FloatProc] = (),  # type: ignore[assignment]
    expect: int = 0,
    idle_timeout_seconds: float | None = None,
    tunnel_backoff: tuple[float, float] | None = (0.1, 1.0),
    handshake_timeout_seconds: float | None = None,
) -> Proc:
    """A ``node_child.py`` node's directory; ``idle_timeout_seconds``: the AMQP idle timeout of its bridges,
    acceptor and float tunnel (default: not set, 10 s; it goes into send.json and tunnel.json, so a node
    with neither keeps the default). ``tunnel_backoff``: the tunnel's round backoff (initial, max), ``None``
    for a node's defaults; ``handshake_timeout_seconds``: the tunnel's (default: not set, 3 s)."""
    idle = {} if idle_timeout_seconds is None else {"idle_timeout_seconds": idle_timeout_seconds}
    d = base / creds.legal_name.organisation
    d.mkdir(parents=True)
    (d / "name").write_text(str(creds.legal_name))
    pki.write_certificates(d / "tls.pem", creds.tls_chain)
    pki.write_private_key(d / "tls.key", creds.tls.key, None)
    pki.write_certificates(d / "identity.pem", creds.identity_chain)
    pki.write_certificates(d / "root.pem", [root])  # type: ignore[list-item]
    if send is not None:
        (d / "send.json").write_text(json.dumps({**send, **idle}))
    if tunnel is not None:
        tunnel.issue("bridge", "bridge-" + creds.legal_name.organisation, now=NOW).write(d, "tunnel")
        pki.write_certificates(d / "tunnel-ca.pem", [tunnel.ca.cert])
        plan = {"floats": [["127.0.0.1", f.control_port] for f in floats], "expect": expect, **idle}
        if tunnel_backoff is not None:
            plan["backoff"] = list(tunnel_backoff)
        if handshake_timeout_seconds is not None:
            plan["handshake_timeout_seconds"] = handshake_timeout_seconds
        (d / "tunnel.json").write_text(json.dumps(plan))
    return Proc([sys.executable, str(CHILD), str(d), "run"])


def publish(base: Path, entries: list[tuple[pki.NodeCredentials, list[int]]]) -> None:
    peers = [
        messaging.Peer(
            legal_name=c.legal_name,
            key_hash=pki.key_hash(c.identity.cert.public_key()),
            addresses=[("127.0.0.1", p) for p in ports],
        )
        for c, ports in entries
    ]
    testing.write_peer_file(base / "peers.json", peers)


async def publish_sender_first(
    base: Path,
    sender: tuple[pki.NodeCredentials, list[int]],
    everyone: list[tuple[pki.NodeCredentials, list[int]]],
) -> None:
    """The receiver must know the sender before the sender can reach it (its node refuses a sender it does
    not know yet, and the sender dead-letters what is refused): the sender alone first, time for the receiver
    to read it (the file is polled every 50 ms; a busy machine may take longer), then everyone."""
    publish(base, [sender])
    await trio.sleep(1.0)
    publish(base, everyone)


async def dump(proc: Proc) -> list[list[str]]:
    result = await trio.run_process([*proc.argv[:-1], "dump"], capture_stdout=True, env=ENV)
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def last_sent(proc: Proc) -> int:
    return max((int(x.split()[1]) for x in proc.lines if x.startswith("sent ")), default=-1)


async def watch_float_sockets(flt: FloatProc, seen: set[tuple[int, int, str]]) -> None:
    assert flt.process is not None
    while flt.process.returncode is None:
        try:
            seen.update(tcp_sockets(flt.process.pid))
        except (FileNotFoundError, ProcessLookupError):
            return
        await trio.sleep(0.1)


def assert_only_accepted(flt: FloatProc, seen: set[tuple[int, int, str]]) -> None:
    ours = {flt.control_port, flt.public_port}
    dialled = [s for s in seen if s[2] != "0A" and s[0] not in ours]
    assert not dialled, f"the float holds connections it dialled: {dialled}"
    assert any(s[0] == flt.public_port and s[2] == "01" for s in seen), "no peer connection was seen"
    assert not [e for e in flt.audit() if e["event"] == "outbound-refused"]


@pytest.mark.slow
async def test_10k_messages_through_a_float_exactly_once_and_the_float_dials_nothing(
    tmp_path: Path,
    network: pki.NetworkCredentials,
    alice: pki.NodeCredentials,
    bob: pki.NodeCredentials,
    tunnel: fl.TunnelPki,
) -> None:
    n = int(os.environ.get("FLOAT_MESSAGES", "10000"))
    root = network.root.cert
    flt = write_float(tmp_path, "float-a", tunnel, bob, root)
    seen: set[tuple[int, int, str]] = set()
    async with trio.open_nursery() as nursery:
        try:
            await start_float(flt, nursery)
            assert not listening(flt.public_port)  # closed until activated
            b = write_node(tmp_path, bob, root, tunnel=tunnel, floats=[flt], expect=n)
            a = write_node(tmp_path, alice, root, send={"to": str(bob.legal_name), "count": n, "batch": 200})
            await b.start(nursery)
            await b.wait_line(lambda x: x.startswith("active "))
            await flt.wait_line(lambda x: "public listener open" in x)
            assert listening(flt.public_port)
            await a.start(nursery)
            alice_port = int((await a.wait_line(lambda x: x.startswith("ready "))).split()[1])
            await publish_sender_first(
                tmp_path, (alice, [alice_port]), [(alice, [alice_port]), (bob, [flt.public_port])]
            )
            nursery.start_soon(watch_float_sockets, flt, seen)
            assert b.process is not None
            bob_sockets = tcp_sockets(b.process.pid)
            assert not [s for s in bob_sockets if s[2] == "0A"], f"the receiver listens: {bob_sockets}"
            await b.wait_line(lambda x: x == "done", within=300)
            await a.wait_line(lambda x: x == "done", within=60)
        finally:
            for p in (a, b, flt):
                await p.kill()
            nursery.cancel_scope.cancel()
    assert await dump(b) == [[f"Alice-{i}", str(i)] for i in range(n)]
    assert_only_accepted(flt, seen)
    events = flt.audit()
    assert {"control-up", "public-open", "link-attached", "latency"} <= {e["event"] for e in events}
    assert any(
        e["event"] == "tls" and e["outcome"] == "ok" and e["legal_name"] == str(alice.legal_name)
        for e in events
    )


@pytest.mark.slow
@pytest.mark.crash
async def test_failover_to_the_standby_float_and_restart_of_the_inside(
    tmp_path: Path,
    network: pki.NetworkCredentials,
    alice: pki.NodeCredentials,
    bob: pki.NodeCredentials,
    tunnel: fl.TunnelPki,
) -> None:
    """Kill -9 the active float mid-stream: the inside activates the standby and the sender follows.
    Then kill -9 the receiver (the inside end): the float closes its public port; on restart it reopens."""
    n = int(os.environ.get("FLOAT_FAILOVER_MESSAGES", "3000"))
    root = network.root.cert
    fa = write_float(tmp_path, "float-a", tunnel, bob, root)
    fb = write_float(tmp_path, "float-b", tunnel, bob, root)
    async with trio.open_nursery() as nursery:
        try:
            await start_float(fa, nursery)
            await start_float(fb, nursery)
            b = write_node(tmp_path, bob, root, tunnel=tunnel, floats=[fa, fb], expect=n)
            a = write_node(
                tmp_path,
                alice,
                root,
                send={"to": str(bob.legal_name), "count": n, "batch": 50, "interval": 0.05},
            )
            await b.start(nursery)
            line = await b.wait_line(lambda x: x.startswith("active "))
            assert int(line.split()[2]) == fa.public_port
            assert not listening(fb.public_port)  # the standby keeps its public port closed
            await a.start(nursery)
            alice_port = int((await a.wait_line(lambda x: x.startswith("ready "))).split()[1])
            await publish_sender_first(
                tmp_path,
                (alice, [alice_port]),
                [(alice, [alice_port]), (bob, [fa.public_port, fb.public_port])],
            )

            with trio.fail_after(120):
                await wait_until(lambda: last_sent(a) >= n // 3)
            await fa.kill()  # the active float dies mid-stream
            seen = len(b.lines)
            line = await b.wait_line(lambda x: x.startswith("active "), after=seen)
            assert int(line.split()[2]) == fb.public_port
            assert listening(fb.public_port)

            with trio.fail_after(120):
                await wait_until(lambda: last_sent(a) >= 2 * n // 3)
            mark = len(fb.lines)
            await b.kill()  # the inside end dies: the float must close its public port
            await fb.wait_line(lambda x: "public listener closed" in x, after=mark)
            assert not listening(fb.public_port)
            b.lines.clear()
            await b.start(nursery)
            await b.wait_line(lambda x: x.startswith("active "))
            await fb.wait_line(lambda x: "public listener open" in x, after=mark)
            assert listening(fb.public_port)
            await b.wait_line(lambda x: x == "done", within=300)
            await a.wait_line(lambda x: x == "done", within=60)
        finally:
            for p in (a, b, fa, fb):
                await p.kill()
            nursery.cancel_scope.cancel()
    assert await dump(b) == [[f"Alice-{i}", str(i)] for i in range(n)]
    events = [e["event"] for e in fb.audit()]
    assert events.count("public-open") == 2 and events.count("control-down") >= 1


@pytest.mark.slow
@pytest.mark.crash
async def test_repeated_kill_9_of_the_active_float(
    tmp_path: Path,
    network: pki.NetworkCredentials,
    alice: pki.NodeCredentials,
    bob: pki.NodeCredentials,
    tunnel: fl.TunnelPki,
) -> None:
    """The active float is killed again and again mid-stream and restarted as the standby: each time the
    inside activates the other one, the sender follows, and the ledger stays exact."""
    rounds = int(os.environ.get("FLOAT_KILL_ROUNDS", "3"))
    n = 600 * (rounds + 1)
    root = network.root.cert
    floats = [write_float(tmp_path, f"float-{i}", tunnel, bob, root, control=free_port()) for i in (0, 1)]
    async with trio.open_nursery() as nursery:
        try:
            for f in floats:
                await start_float(f, nursery)
            b = write_node(tmp_path, bob, root, tunnel=tunnel, floats=floats, expect=n)
            a = write_node(
                tmp_path,
                alice,
                root,
                send={"to": str(bob.legal_name), "count": n, "batch": 50, "interval": 0.05},
            )
            await b.start(nursery)
            await b.wait_line(lambda x: x.startswith("active "))
            await a.start(nursery)
            alice_port = int((await a.wait_line(lambda x: x.startswith("ready "))).split()[1])
            await publish_sender_first(
                tmp_path,
                (alice, [alice_port]),
                [(alice, [alice_port]), (bob, [f.public_port for f in floats])],
            )
            active = 0
            for r in range(rounds):
                with trio.fail_after(120):
                    await wait_until(lambda r=r: last_sent(a) >= (r + 1) * n // (rounds + 1))
                victim, seen = floats[active], len(b.lines)
                await victim.kill()
                line = await b.wait_line(lambda x: x.startswith("active "), after=seen)
                active = 1 - active
                assert int(line.split()[2]) == floats[active].public_port
                await start_float(victim, nursery)  # back as the standby: its public port stays closed
                assert not listening(victim.public_port)
            await b.wait_line(lambda x: x == "done", within=300)
            await a.wait_line(lambda x: x == "done", within=60)
        finally:
            for p in (a, b, *floats):
                await p.kill()
            nursery.cancel_scope.cancel()
    assert await dump(b) == [[f"Alice-{i}", str(i)] for i in range(n)]


def test_the_outbound_guard_refuses_connections_in_its_process(tmp_path: Path) -> None:
    """Positive control for the guard the float process installs: a connect attempt fails and is reported."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        code = (
            "import socket, sys\n"
            "from corda_trio.bridge import float as fl\n"
            "fl.install_outbound_guard(lambda e, w: print('refused', e, w))\n"
            f"try:\n    socket.create_connection(('127.0.0.1', {port}))\n"
            "except PermissionError as exc:\n    print('error', exc)\n"
            "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); print('listen ok')\n"
        )
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=ENV, check=True
        )
    assert f"refused socket.connect 127.0.0.1:{port}" in out.stdout
    assert "the float makes no outbound connections" in out.stdout
    assert "listen ok" in out.stdout
