"""Corruption of the network map service's files: each file ``networkmap serve`` reads, damaged the ways disks
and people damage them, then the real command started on the copy.

The files: ``networkmap.toml``, the map's certificate chain, key and passphrase file, the signed
``network-parameters``, the network root certificate, and the map database (``networkmap.db``, SQLite, with
two published NodeInfos; its ``older`` copy is one taken when it held one). The damages: a bit flipped, a
truncation, a zeroed 4 KiB aligned range, garbage appended, the file deleted, emptied, replaced by a
directory, an older copy put back. For the database a bit is also flipped inside a stored NodeInfo and inside
the stored network parameters (a random flip mostly lands in free space), and its third page is zeroed.

A trial passes when the service either starts and serves only what verifies (the map signed by the map's key
under the network root, each NodeInfo it lists, fetched by its hash, verifying and hashing to it, the
current parameters verifying), or refuses in one line naming the file (exit 1 or 2; 2 for a configuration
that is wrong, 1 for a database that cannot be used) leaving every file as it was. Never a traceback, a
hang, or a map that serves damaged bytes to nodes.

While it runs, a database damaged under it (a stored NodeInfo's bytes changed on disk between two polls of a
node) must not reach a polling node either: the node refuses what does not verify with a line naming it and
keeps the map it had.

A suite run tries the kinds of ``tests.damage.SUITE_DAMAGES`` on every file (CI's time is bounded);
``CORDA_TRIO_CORRUPTION=all pytest tests/...`` tries every kind.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import trio

from corda_trio import network, pki
from corda_trio.node import _config
from tests.damage import campaign_damages, damage_file

CLI = [sys.executable, "-c", "import sys; from corda_trio.node._cli import main; sys.exit(main())"]
NAMES = {"alice": "O=Alice,L=London,C=GB", "bob": "O=Bob,L=Paris,C=FR", "carol": "O=Carol,L=Rome,C=IT"}
#: the nodes the map holds (Carol publishes while it runs, in the last test)
PUBLISHED = ("alice", "bob")
SERVE_SECONDS = 15.0

#: the files ``networkmap serve`` reads, relative to the network directory
FILES = (
    "network-map/networkmap.toml",
    "network-map/map.chain.pem",
    "network-map/map.key.pem",
    "network-map/passphrase",
    "network-map/network-parameters",
    "network-map/networkmap.db",
    "network-root/root.cert.pem",
)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop(_config.DEFAULT_PASSPHRASE_ENV, None)
    return env


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60, env=_env())


def _serve(net: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*CLI, "networkmap", "serve", "--dir", str(net)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
    )  # fmt: skip


def _stop(process: subprocess.Popen[str]) -> tuple[int, str]:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        _, err = process.communicate(timeout=20)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return process.returncode, err


def _publish(url: str, net: Path, node: str) -> None:
    data = next((net / "nodes" / node).glob("nodeInfo-*")).read_bytes()
    request = urllib.request.Request(f"{url}/network-map/publish", data=data, method="POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200


def _serving_line(process: subprocess.Popen[str]) -> str:
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line.startswith("corda-trio networkmap: serving http://"):
        _, err = _stop(process)
        raise AssertionError(line + err)
    return line


@pytest.fixture(scope="module")
def network_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A bootstrapped network (Alice, Bob, Carol) whose map holds Alice and Bob (stopped), with ``older.db``:
    the map's database when it held Alice only (a copy taken after a clean stop, as a backup is)."""
    base = tmp_path_factory.mktemp("map")
    net = base / "net"
    args = ["network", "bootstrap", "--dir", str(net)]
    for name in NAMES.values():
        args += ["--node", name]
    done = _cli(*args)
    assert done.returncode == 0, done.stderr
    for node in PUBLISHED:
        process = _serve(net)
        try:
            url = _serving_line(process).split()[3]
            _publish(url, net, node)
        finally:
            code, err = _stop(process)
        assert code == 0, err
        if node == "alice":
            shutil.copy(net / "network-map" / "networkmap.db", base / "older.db")
    assert not (net / "network-map" / "networkmap.db-wal").exists()
    return net


def _tree(root: Path) -> dict[str, str]:
    out = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        out[rel] = "dir" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def _blob_offset(data: bytes, blob: bytes) -> int:
    """Where the middle of ``blob`` is in ``data`` (SQLite keeps a small record on one page)."""
    at = data.find(blob[100:200])
    assert at >= 0, "the record is not stored contiguously"
    return at + 50


def _damage(path: Path, kind: str, rng: random.Random, older: Path) -> str:
    data = path.read_bytes()
    if kind in ("flip-node-info", "flip-parameters"):
        with sqlite3.connect(path) as db:
            query = (
                "SELECT signed FROM node_infos ORDER BY legal_name LIMIT 1"
                if kind == "flip-node-info"
                else "SELECT signed FROM network_parameters WHERE current = 1"
            )
            blob = bytes(db.execute(query).fetchone()[0])
        db.close()
        at = _blob_offset(data, blob)
        path.write_bytes(data[:at] + bytes([data[at] ^ 0x10]) + data[at + 1 :])
        return f"bit flipped in byte {at}"
    if kind == "zero-page-3":  # (a b-tree page: SQLite's check reports it on two lines)
        path.write_bytes(data[:8192] + bytes(4096) + data[12288:])
        return "bytes 8192..12288 zeroed"
    return damage_file(path, kind, rng, older)


def _fetch(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _check_served(url: str, net: Path, expected: dict[str, str]) -> list[str]:
    """What the map serves, each piece verified as a node verifies it; returns the legal names served.
    ``expected``: legal name -> NodeInfo hash of what was published."""
    root = pki.read_certificate(net / "nodes" / "alice" / "certificates" / "network-root.cert.pem")
    now = dt.datetime.now(dt.UTC)
    status, body = _fetch(f"{url}/network-map")
    assert status == 200, body
    signed = network.verify_network_map(body, trust_root=root, now=now)
    status, body = _fetch(f"{url}/network-map/network-parameters/{signed.network_parameters_hash}")
    assert status == 200, f"the current parameters are not served: {status} {body!r}"
    _, params_hash = network.verify_network_parameters(body, trust_root=root, now=now)
    assert params_hash == signed.network_parameters_hash
    names = []
    for hash_hex in signed.node_info_hashes:
        status, body = _fetch(f"{url}/network-map/node-info/{hash_hex}")
        assert status == 200, f"listed NodeInfo {hash_hex} not served: {status} {body!r}"
        node = network.verify_node_info(body, trust_root=root, now=now)
        assert node.hash == hash_hex, f"NodeInfo {hash_hex} served with the bytes of {node.hash}"
        assert expected.get(str(node.legal_name)) == node.hash
        names.append(str(node.legal_name))
    return sorted(names)


def _published(net: Path) -> dict[str, str]:
    out = {}
    for node in PUBLISHED:
        data = next((net / "nodes" / node).glob("nodeInfo-*")).read_bytes()
        decoded = network.decode_signed_node_info(data)
        info = network.verify_node_info(
            decoded,
            trust_root=pki.read_certificate(net / "network-root" / "root.cert.pem"),
            now=dt.datetime.now(dt.UTC),
        )
        out[str(info.legal_name)] = info.hash
    return out


# (the database deleted or emptied: the service makes a new, empty map, and must say so)
CASES = [(f, d) for f in FILES for d in campaign_damages() if d != "older" or f.endswith(".db")]
CASES += [("network-map/networkmap.db", d) for d in ("delete", "empty") if d not in campaign_damages()] + [
    ("network-map/networkmap.db", "flip-node-info"),
    ("network-map/networkmap.db", "flip-parameters"),
    ("network-map/networkmap.db", "zero-page-3"),
]


@pytest.mark.parametrize(("rel", "kind"), CASES, ids=[f"{Path(f).name}-{d}" for f, d in CASES])
def test_a_damaged_file_is_refused_in_one_line_or_only_what_verifies_is_served(
    network_dir: Path, tmp_path: Path, rel: str, kind: str
) -> None:
    net = tmp_path / "net"
    shutil.copytree(network_dir, net)
    rng = random.Random(f"{rel}/{kind}")
    what = _damage(net / rel, kind, rng, network_dir.parent / "older.db")
    before = _tree(net)
    process = _serve(net)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()  # (empty once it exited)
        served = None
        if line.startswith("corda-trio networkmap: serving http://"):
            served = _check_served(line.split()[3], net, _published(net))
    finally:
        code, err = _stop(process)
    context = f"{rel} ({what}): exit {code}, stdout {line!r}, stderr:\n{err}"
    assert "Traceback" not in err, context
    if served is not None:
        assert code == 0, context
        lines = [x for x in err.splitlines() if x and x != "terminated"]
        assert all(" INFO " in x or " WARNING " in x for x in lines), context
        if rel.endswith(".db") and kind in ("delete", "empty"):  # (what it recovered: a new, empty map)
            assert served == [], context
            assert "networkmap.db did not exist or was empty: a new, empty map database was made" in err, (
                context
            )
        return
    assert code in (1, 2), context
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("corda-trio: error: "), context
    assert Path(rel).name in lines[0], f"the line does not name {Path(rel).name}: {context}"
    assert _tree(net) == before, f"a refused start changed the files: {context}"


async def test_a_record_damaged_while_the_map_runs_reaches_no_node(
    network_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Between two polls of a node, Carol publishes and her stored NodeInfo is then damaged (one bit of it
    changed in the database, by another connection: what the service reads next): the map refuses to serve
    it (500, one error line naming it), and the node's poll fails with a line naming it and keeps the map it
    had. The map listed Carol's hash: before, the service served the damaged bytes."""
    net = tmp_path / "net"
    shutil.copytree(network_dir, net)
    root = pki.read_certificate(net / "network-root" / "root.cert.pem")
    send, receive = trio.open_memory_channel[network.MapEvent](100)
    process = _serve(net)
    try:
        url = _serving_line(process).split()[3]
        updater = network.NetworkMapUpdater(
            trust_root=root,
            cache=network.NodeInfoCache(tmp_path / "cache.db"),
            events=send,
            client=network.NetworkMapClient(url),
        )
        async with trio.open_nursery() as nursery:
            await nursery.start(updater.run)
            with trio.fail_after(20):
                async for _ in receive:
                    if len(updater.nodes()) == 2:
                        break
            good = updater.nodes()
            await trio.to_thread.run_sync(_publish, url, net, "carol")
            with sqlite3.connect(net / "network-map" / "networkmap.db") as db:
                (blob,) = db.execute(
                    "SELECT signed FROM node_infos WHERE legal_name LIKE 'O=Carol%'"
                ).fetchone()
                at = len(blob) // 2
                damaged = blob[:at] + bytes([blob[at] ^ 0x10]) + blob[at + 1 :]
                db.execute("UPDATE node_infos SET signed = ? WHERE legal_name LIKE 'O=Carol%'", (damaged,))
            db.close()
            carol = network.decode_signed_node_info(blob).hash
            status, body = await trio.to_thread.run_sync(_fetch, f"{url}/network-map/node-info/{carol}")
            assert (status, body) != (200, damaged), "the map served the damaged NodeInfo"
            assert status == 500 and b"damaged" in body, (status, body)
            caplog.clear()
            updater.poll_soon()
            with trio.fail_after(20):
                while not [r for r in caplog.records if carol in r.getMessage()]:  # noqa: ASYNC110
                    await trio.sleep(0.05)
            assert updater.nodes() == good, "the node did not keep the map it had"
            nursery.cancel_scope.cancel()
    finally:
        code, err = _stop(process)
    line = next(r for r in caplog.records if carol in r.getMessage())
    assert "network map poll failed" in line.getMessage() and line.levelno >= logging.WARNING, line
    assert f"NodeInfo {carol} is damaged" in line.getMessage(), line.getMessage()
    assert code == 0 and "Traceback" not in err, err
    errors = [x for x in err.splitlines() if " ERROR " in x]
    assert len(errors) == 1 and carol in errors[0] and "damaged" in errors[0], err
