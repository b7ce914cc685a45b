"""Every mistake an operator can make on the command line is one clear line and a non-zero exit code, never a
traceback, and nothing half-written is left behind. One row per case: command, expected message, exit code.

The commands run as real processes against a prepared directory (``{d}`` in a command is replaced by it).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sqlite3
import subprocess
from pathlib import Path

import pytest
import trio

from corda_trio import store
from corda_trio.node._cli import shown
from tests.node.cli_helpers import CLI, run_cli, wait_for

ALICE = "O=Alice,L=London,C=GB"
BOB = "O=Bob,L=Paris,C=FR"
#: a file name longer than any file system takes (255 bytes): Path.exists() raises for it (ENAMETOOLONG)
LONG = "x" * 300

# (id, command, expected text in the one stderr line, exit code)
CASES: list[tuple[str, str, str, int]] = [
    # network bootstrap
    ("bootstrap-bad-host", f"network bootstrap --dir {{d}}/new1 --node {ALICE} --host no.such.host.invalid",
     "host 'no.such.host.invalid' cannot be listened on here", 2),
    # the host goes into every NodeInfo and the map URL: a wildcard there is one nobody can dial
    *((f"bootstrap-wildcard-host-{host}", f"network bootstrap --dir {{d}}/new5 --node {ALICE} --host {host}"
       + (" --no-map" if host == "::" else ""),
       f"host {host!r} is not an address peers can dial (it goes into every NodeInfo and the map URL): give "
       "the host they reach; to listen on every interface, set p2p.listen in each node.toml afterwards", 2)
      for host in ("0.0.0.0", "::", "0")),
    # a host that is no host name (an empty label): getaddrinfo's IDNA step raised UnicodeError, a traceback
    ("bootstrap-host-empty-label", f"network bootstrap --dir {{d}}/new6 --node {ALICE} --host a..b",
     "--host 'a..b': host 'a..b' is not a host name: label '' must be 1..63 letters", 2),
    ("bootstrap-host-ipv4-in-brackets",
     f"network bootstrap --dir {{d}}/new7 --node {ALICE} --host [127.0.0.1]",
     "--host '[127.0.0.1]': host '[127.0.0.1]' is not a host name", 2),
    ("bootstrap-parent-is-a-file", f"network bootstrap --dir {{d}}/afile/net --node {ALICE}",
     "afile is a file", 2),
    ("bootstrap-dir-is-a-file", f"network bootstrap --dir {{d}}/afile --node {ALICE}",
     "exists and is not an empty directory", 2),
    ("bootstrap-message-size-too-small",
     f"network bootstrap --dir {{d}}/new2 --node {ALICE} --max-message-size 1023",
     "--max-message-size 1023: must be in 1024..2147483647 bytes", 2),
    ("bootstrap-message-size-huge",
     f"network bootstrap --dir {{d}}/new3 --node {ALICE} --max-message-size 999999999999999999999",
     "--max-message-size 999999999999999999999: must be in 1024..2147483647 bytes", 2),
    ("bootstrap-bad-name", "network bootstrap --dir {d}/new4 --node O=Alice,L=London,C=XX",
     "not an ISO 3166-1 alpha-2 country code", 2),
    # a map URL whose host is no host name: the node started, then died of a UnicodeError traceback at its
    # first publish
    ("node-map-url-empty-label", "node start --config {d}/badmap-net/nodes/alice/node.toml",
     "network.map_url: host 'a..b' is not a host name", 2),
    # one configuration file given for another: node.toml's legal_name was 'keys.identity_cert_chain: unknown
    # setting' to the map service, networkmap.toml 'legal_name: is required' to a node
    ("node-start-given-networkmap-toml", "node start --config {d}/net/network-map/networkmap.toml",
     "{d}/net/network-map/networkmap.toml: this is a networkmap.toml, not a node.toml", 2),
    ("networkmap-serve-given-node-toml", "networkmap serve --config {d}/net/nodes/alice/node.toml",
     "{d}/net/nodes/alice/node.toml: this is a node.toml, not a networkmap.toml", 2),
    ("float-start-given-node-toml", "float start --config {d}/net/nodes/alice/node.toml",
     "{d}/net/nodes/alice/node.toml: this is a node.toml, not a float.toml", 2),
    ("bridge-start-given-node-toml", "bridge start --config {d}/net/nodes/alice/node.toml",
     "{d}/net/nodes/alice/node.toml: this is a node.toml, not a bridge.toml", 2),
    # network map service
    ("networkmap-corrupt-db-list", "networkmap list --dir {d}/corrupt-net",
     "networkmap.db is not a usable network map database", 1),
    ("networkmap-corrupt-db-serve", "networkmap serve --dir {d}/corrupt-net",
     "networkmap.db is not a usable network map database", 1),
    # a map database a newer build wrote (SQLite user_version above this build's): refused, left unread
    *((f"networkmap-newer-db-{cmd}", f"networkmap {cmd} --dir {{d}}/newer-net",
       "{d}/newer-net/network-map/networkmap.db: network map database format 2 was written by a newer "
       "build of corda-trio (this build reads format 1 and older); nothing was read or changed: run the "
       "newer build on it", 1)
      for cmd in ("list", "serve")),
    # --dir naming a file: it said 'no such directory'
    ("networkmap-dir-is-a-file", "networkmap list --dir {d}/afile",
     "--dir {d}/afile: exists and is not a directory", 2),
    ("networkmap-remove-unknown", f"networkmap remove --dir {{d}}/net --node {BOB.replace('Bob', 'Carol')}",
     "O=Carol, L=Paris, C=FR is not in the map", 1),
    ("networkmap-readmit-not-removed", f"networkmap readmit --dir {{d}}/net --node {BOB}",
     "O=Bob, L=Paris, C=FR was not removed from the map", 1),
    ("networkmap-bad-name", "networkmap remove --dir {d}/net --node nobody",
     "--node 'nobody'", 2),
    # a node and its certificates
    ("node-legal-name-mismatch", "node start --config {d}/renamed-net/nodes/alice/node.toml",
     "is not for O=Alicia, L=London, C=GB", 1),
    # its identity chain without its last certificate (the file cut before the doorman's BEGIN line): the
    # corruption harness (seed 100200680) got "our own NodeInfo does not verify: ...", naming no file
    ("node-identity-chain-cut", "node start --config {d}/cut-chain-net/nodes/alice/node.toml",
     "the identity certificate chain {d}/cut-chain-net/nodes/alice/certificates/identity.chain.pem does not "
     "chain to the network root {d}/cut-chain-net/nodes/alice/certificates/network-root.cert.pem: ", 1),
    # ... and its TLS chain (the node started, then every peer refused its handshakes)
    ("node-tls-chain-cut", "node start --config {d}/cut-tls-net/nodes/alice/node.toml",
     "the TLS certificate chain {d}/cut-tls-net/nodes/alice/certificates/tls.chain.pem does not "
     "chain to the network root {d}/cut-tls-net/nodes/alice/certificates/network-root.cert.pem: ", 1),
    ("node-foreign-root", "node start --config {d}/foreign-net/nodes/alice/node.toml",
     "do not verify", 1),
    ("node-cache-is-a-directory", "node start --config {d}/cache-dir-net/nodes/alice/node.toml",
     "node.toml: network.node_info_cache: {d}/cache-dir-net/nodes/alice/network-map-cache.db is a directory, "
     "not a file", 2),
    ("node-store-is-a-file", "node start --config {d}/store-file-net/nodes/alice/node.toml",
     "the store directory {d}/store-file-net/nodes/alice/store exists and is not a directory", 1),
    # a device where a small file belongs (/dev/zero is endless: it was read until the limit) and a huge
    # file: refused, never read until the machine runs out of memory (a node's files: in the copies below)
    ("node-config-endless", "node start --config /dev/zero",
     "/dev/zero: cannot read: not a regular file: a character device", 2),
    ("bridge-config-endless", "bridge start --config /dev/zero",
     "/dev/zero: cannot read: not a regular file: a character device", 2),
    ("float-config-endless", "float start --config /dev/zero",
     "/dev/zero: cannot read: not a regular file: a character device", 2),
    ("networkmap-config-endless", "networkmap serve --config /dev/zero",
     "/dev/zero: cannot read: not a regular file: a character device", 2),
    ("node-config-huge", "node start --config {d}/huge.toml",
     "{d}/huge.toml: cannot read: larger than 1 MiB", 2),
    ("node-trust-root-endless", "node start --config {d}/zero-net/nodes/alice/node.toml",
     "cannot read certificates '{d}/zero-net/nodes/alice/certificates/network-root.cert.pem': "
     "not a regular file: a character device",
     1),
    ("node-passphrase-huge", "node start --config {d}/zero-pass-net/nodes/alice/node.toml",
     "cannot read passphrase file '{d}/zero-pass-net/nodes/alice/certificates/passphrase': larger than 1 MiB",
     1),
    ("node-parameters-huge", "node start --config {d}/zero-params-net/nodes/alice/node.toml",
     "cannot read network parameters {d}/zero-params-net/nodes/alice/network-parameters: larger than 64 MiB",
     1),
    # demo: refused before anything starts
    ("demo-rounds-huge", "demo --dir {d}/demo1 --rounds 99999999999999999999 --no-progress",
     "--rounds 99999999999999999999: must be in 1..10,000", 2),
    ("demo-flows-zero", "demo --dir {d}/demo1 --flows 0 --no-progress",
     "--flows 0: must be in 1..100,000", 2),
    ("demo-records-is-a-file", "demo --dir {d}/demo1 --records {d}/afile --no-progress",
     "--records {d}/afile: exists and is not a directory", 2),
    # bench
    ("bench-scratch-is-a-file", "bench run codec --out {d}/out --scratch {d}/afile --duration 1",
     "--scratch {d}/afile: exists and is not a directory", 2),
    ("bench-out-is-a-file", "bench run codec --out {d}/afile --duration 1",
     "--out {d}/afile: exists and is not a directory", 2),
    ("bench-peers-too-many", "bench run loopback --out {d}/out --peers 100000 --duration 1",
     "--peers 100000: must be in 1..", 2),
    # (it was checked as the run began: the same line with exit 1, as for a run that failed)
    ("bench-run-id-bad", "bench run loopback --out {d}/out --run-id a/b --duration 1",
     "run id 'a/b' must match ", 2),
    ("bench-peers-zero", "bench run loopback --out {d}/out --peers 0 --duration 1",
     "--peers 0: must be in 1..", 2),
    ("bench-bad-param", "bench run wal --out {d}/out --param fsync=true --duration 1",
     "scenario wal: parameter fsync='true': must be one of always, none", 2),
    # a phase too long to schedule in nanoseconds: an OverflowError traceback (1e20: it ran for ever)
    *((f"bench-{flag}-huge", f"bench run codec --out {{d}}/out --duration 1 --{flag} 1e308",
       "duration, warm-up and drain must each be at most 604,800 s (a week), got 1e+308 s", 2)
      for flag in ("duration", "warmup", "drain")),
    # report
    ("report-no-input", "report --in {d}/nothing --out {d}/r.html",
     "input directory {d}/nothing does not exist or is not a directory", 2),
    ("report-no-records", "report --in {d}/net --out {d}/r.html", "no benchmark records in {d}/net", 2),
    # store
    ("store-not-a-store", "store check {d}/afile", "not a directory (a file)", 2),
    # a path whose name is too long for the file system: Path.exists() / is_dir() raised, a traceback
    *((f"name-too-long-{cid}", command, "File name too long: {d}/" + LONG, 2) for cid, command in (
        ("bootstrap", f"network bootstrap --dir {{d}}/{LONG} --node {ALICE}"),
        ("bootstrap-parent", f"network bootstrap --dir {{d}}/{LONG}/net --node {ALICE}"),
        ("network-show", f"network show --dir {{d}}/{LONG}"),
        ("networkmap-list", f"networkmap list --dir {{d}}/{LONG}"),
        ("networkmap-serve", f"networkmap serve --dir {{d}}/{LONG}"),
        ("bench-out", f"bench run codec --out {{d}}/{LONG} --duration 1"),
        ("bench-scratch", f"bench run codec --out {{d}}/out --scratch {{d}}/{LONG} --duration 1"),
        ("report-in", f"report --in {{d}}/{LONG} --out {{d}}/r.html"),
        ("demo-dir", f"demo --dir {{d}}/{LONG} --no-progress"),
        ("demo-records", f"demo --dir {{d}}/demo1 --records {{d}}/{LONG} --no-progress"),
    )),
    ("store-compact-not-a-broker", "store compact {d}/net", "not a broker directory", 1),
    # a node's directory, the one at hand, where its store directory belongs: said where the store is
    *((f"store-{cmd}-of-a-node-directory", f"store {cmd} {{d}}/net/nodes/alice",
       "{d}/net/nodes/alice: not a " + ("broker" if cmd == "compact" else "store") + " directory (no "
       "broker.lock" + ("" if cmd == "compact" else " and no queue segments") + " in it); it is a node's "
       "directory: its store is {d}/net/nodes/alice/store", 1)
      for cmd in ("check", "list", "compact")),
]  # fmt: skip


def _sparse(path: Path, size: int) -> None:
    """A regular file of ``size`` zero bytes (sparse: it takes no disk space), mode 0600."""
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
        f.truncate(size)


def _prepare(d: Path) -> None:
    (d / "afile").write_text("not a directory\n")
    made = run_cli("network", "bootstrap", "--dir", str(d / "net"), "--node", ALICE, "--node", BOB)
    assert made.returncode == 0, made.stderr
    other = run_cli("network", "bootstrap", "--dir", str(d / "other-net"), "--node", ALICE)
    assert other.returncode == 0, other.stderr
    # A map database that is not one.
    shutil.copytree(d / "net", d / "corrupt-net")
    (d / "corrupt-net" / "network-map" / "networkmap.db").write_bytes(b"\x00garbage, not SQLite\n" * 64)
    # A map database of a newer build's format (the bootstrap's has one: list opens it).
    shutil.copytree(d / "net", d / "newer-net")
    assert run_cli("networkmap", "list", "--dir", str(d / "newer-net")).returncode == 0
    with contextlib.closing(sqlite3.connect(d / "newer-net" / "network-map" / "networkmap.db")) as db:
        db.execute("PRAGMA user_version = 2")
    # A node.toml whose legal name is not the one in its certificates.
    shutil.copytree(d / "net", d / "renamed-net")
    toml = d / "renamed-net" / "nodes" / "alice" / "node.toml"
    toml.write_text(
        "\n".join(
            'legal_name = "O=Alicia, L=London, C=GB"' if line.startswith("legal_name") else line
            for line in toml.read_text(encoding="utf-8").splitlines()
        ),
        encoding="utf-8",
    )
    # A node whose map URL names a host with an empty label.
    shutil.copytree(d / "net", d / "badmap-net")
    _set(d / "badmap-net" / "nodes" / "alice" / "node.toml", "map_url", '"http://a..b:40000"')
    # A node whose network map cache is a directory.
    shutil.copytree(d / "net", d / "cache-dir-net")
    (d / "cache-dir-net" / "nodes" / "alice" / "network-map-cache.db").mkdir()
    # A node whose store directory is a file.
    shutil.copytree(d / "net", d / "store-file-net")
    (d / "store-file-net" / "nodes" / "alice" / "store").write_text("not a directory\n")
    # A node whose trust root is /dev/zero, whose passphrase file or network parameters are 200 MB (sparse),
    # and a node.toml of 200 MB.
    for copy, file in (
        ("zero-net", "certificates/network-root.cert.pem"),
        ("zero-pass-net", "certificates/passphrase"),
        ("zero-params-net", "network-parameters"),
    ):
        shutil.copytree(d / "net", d / copy)
        (d / copy / "nodes" / "alice" / file).unlink()
        if copy == "zero-net":
            (d / copy / "nodes" / "alice" / file).symlink_to("/dev/zero")
        else:
            _sparse(d / copy / "nodes" / "alice" / file, 200 << 20)
    _sparse(d / "huge.toml", 200 << 20)
    # A node whose identity chain lost its last certificate.
    shutil.copytree(d / "net", d / "cut-chain-net")
    chain = d / "cut-chain-net" / "nodes" / "alice" / "certificates" / "identity.chain.pem"
    text = chain.read_bytes()
    chain.write_bytes(text[: text.rindex(b"-----BEGIN CERTIFICATE-----") + 5])
    shutil.copytree(d / "net", d / "cut-tls-net")
    chain = d / "cut-tls-net" / "nodes" / "alice" / "certificates" / "tls.chain.pem"
    text = chain.read_bytes()
    chain.write_bytes(text[: text.rindex(b"-----BEGIN CERTIFICATE-----") + 5])
    # A node whose trust root is another network's.
    shutil.copytree(d / "net", d / "foreign-net")
    foreign_root = d / "other-net" / "nodes" / "alice" / "certificates" / "network-root.cert.pem"
    shutil.copy(
        foreign_root, d / "foreign-net" / "nodes" / "alice" / "certificates" / "network-root.cert.pem"
    )


@pytest.fixture(scope="module")
def playground(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("cli-errors")
    _prepare(d)
    return d


@pytest.mark.parametrize(("command", "message", "code"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_operator_mistake_is_one_line(playground: Path, command: str, message: str, code: int) -> None:
    before = sorted(p.name for p in playground.iterdir())
    done = run_cli(*command.format(d=playground).split())
    lines = done.stderr.splitlines()
    assert "Traceback" not in done.stderr, done.stderr
    assert len(lines) == 1, done.stderr
    assert message.format(d=playground) in lines[0], lines[0]
    assert lines[0].startswith("corda-trio: error: ")
    assert done.returncode == code
    # Nothing half-written: no new directory, no temporary sibling of a network.
    after = sorted(p.name for p in playground.iterdir())
    assert [n for n in after if n != "out"] == [n for n in before if n != "out"]


PIPE = "not a regular file: a named pipe"
DEVICE = "not a regular file: a character device"
ALICE_TOML = "node start --config {n}/nodes/alice/node.toml"
# (id, file of a network copy put out of place, what is there instead, command, text of the one line, code)
OUT_OF_PLACE: list[tuple[str, str, str, str, str, int]] = [
    ("node-config-pipe", "nodes/alice/node.toml", "fifo", ALICE_TOML,
     "{n}/nodes/alice/node.toml: cannot read: " + PIPE, 2),
    ("node-passphrase-pipe", "nodes/alice/certificates/passphrase", "fifo", ALICE_TOML,
     "cannot read passphrase file '{n}/nodes/alice/certificates/passphrase': " + PIPE, 1),
    ("node-trust-root-pipe", "nodes/alice/certificates/network-root.cert.pem", "fifo", ALICE_TOML,
     "cannot read certificates '{n}/nodes/alice/certificates/network-root.cert.pem': " + PIPE, 1),
    ("node-tls-key-pipe", "nodes/alice/certificates/tls.key.pem", "fifo", ALICE_TOML,
     "cannot read private key '{n}/nodes/alice/certificates/tls.key.pem': " + PIPE, 1),
    ("node-parameters-pipe", "nodes/alice/network-parameters", "fifo", ALICE_TOML,
     "cannot read network parameters {n}/nodes/alice/network-parameters: " + PIPE, 1),
    ("node-store-record-pipe", "nodes/alice/store.json", "fifo", ALICE_TOML,
     "{n}/nodes/alice/store.json: cannot be read: " + PIPE, 1),
    ("node-store-record-directory", "nodes/alice/store.json", "dir", ALICE_TOML,
     "{n}/nodes/alice/store.json: cannot be read: Is a directory", 1),
    ("node-log-pipe", "nodes/alice/logs/node.log", "fifo", ALICE_TOML,
     "cannot open the log file {n}/nodes/alice/logs/node.log: a named pipe that nobody reads", 2),
    ("node-config-nested", "nodes/alice/node.toml", "nested-toml", ALICE_TOML,
     "{n}/nodes/alice/node.toml: not valid TOML: nested too deeply to read", 2),
    ("networkmap-config-nested", "network-map/networkmap.toml", "nested-toml", "networkmap list --dir {n}",
     "{n}/network-map/networkmap.toml: not valid TOML: nested too deeply to read", 2),
    ("node-store-record-nested", "nodes/alice/store.json", "nested-json", ALICE_TOML,
     "{n}/nodes/alice/store.json is not the store record the node writes", 1),
    ("network-show-pipe", "nodes/alice/node.toml", "fifo", "network show --dir {n}",
     "{n}/nodes/alice/node.toml: cannot read: " + PIPE, 2),
    ("networkmap-config-pipe", "network-map/networkmap.toml", "fifo", "networkmap list --dir {n}",
     "{n}/network-map/networkmap.toml: cannot read: " + PIPE, 2),
    ("networkmap-key-pipe", "network-map/map.key.pem", "fifo", "networkmap serve --dir {n}",
     "cannot read private key '{n}/network-map/map.key.pem': " + PIPE, 2),
    ("bridge-config-pipe", "bridge.toml", "fifo", "bridge start --config {n}/bridge.toml",
     "{n}/bridge.toml: cannot read: " + PIPE, 2),
    ("float-config-pipe", "float.toml", "fifo", "float start --config {n}/float.toml",
     "{n}/float.toml: cannot read: " + PIPE, 2),
    # the SQLite databases: SQLite said 'disk I/O error' (and the map 'restore it from a backup')
    ("networkmap-db-pipe", "network-map/networkmap.db", "fifo", "networkmap list --dir {n}",
     "cannot open the network map database {n}/network-map/networkmap.db: " + PIPE, 1),
    ("networkmap-db-dev-zero", "network-map/networkmap.db", "dev-zero", "networkmap serve --dir {n}",
     "cannot open the network map database {n}/network-map/networkmap.db: " + DEVICE, 1),
    ("node-map-cache-pipe", "nodes/alice/network-map-cache.db", "fifo", ALICE_TOML,
     "cannot open the network map cache {n}/nodes/alice/network-map-cache.db: " + PIPE, 1),
    ("node-map-cache-dev-zero", "nodes/alice/network-map-cache.db", "dev-zero", ALICE_TOML,
     "cannot open the network map cache {n}/nodes/alice/network-map-cache.db: " + DEVICE, 1),
]  # fmt: skip


@pytest.mark.parametrize(
    ("file", "kind", "command", "message", "code"),
    [c[1:] for c in OUT_OF_PLACE],
    ids=[c[0] for c in OUT_OF_PLACE],
)
def test_a_file_out_of_place_is_refused_at_once(
    playground: Path, tmp_path: Path, file: str, kind: str, command: str, message: str, code: int
) -> None:
    """A named pipe nobody writes to where a file belongs made every command wait in its open() for ever
    (node start, networkmap, bridge and float start, network show), and so did one nobody reads as the
    node's log file; the store record's errors read '[Errno 21] Is a directory: ...'; the map database and
    the node's map cache, a pipe or /dev/zero, were a 'disk I/O error' (to restore from a backup); a
    node.toml, networkmap.toml or store record nested 100,000 (30,000) levels deep was a RecursionError
    traceback. Now: one line naming the file and what it is, at once; the file is left alone."""
    net = tmp_path / "net"
    shutil.copytree(playground / "net", net)
    target = net / file
    target.parent.mkdir(exist_ok=True)
    target.unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "dev-zero":
        target.symlink_to("/dev/zero")
    elif kind == "dir":
        target.mkdir()
    else:  # 100,000 levels of arrays (the store record's limit is 64 KiB: 30,000)
        depth = 100_000 if kind == "nested-toml" else 30_000
        target.write_text(("a = " if kind == "nested-toml" else "") + "[" * depth + "]" * depth + "\n")
    done = run_cli(*command.format(n=net).split(), timeout=30)
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stderr.splitlines() == [done.stderr.strip()], done.stderr
    assert done.stderr.startswith("corda-trio: error: ") and message.format(n=net) in done.stderr, done.stderr
    assert done.returncode == code
    if kind == "dev-zero":
        assert os.readlink(target) == "/dev/zero"  # (not moved aside as a damaged database)
    else:
        assert target.is_fifo() if kind == "fifo" else target.is_dir() if kind == "dir" else target.is_file()


def test_a_float_audit_log_that_is_a_pipe_nobody_reads_is_refused(playground: Path, tmp_path: Path) -> None:
    """`float start` with [audit] path naming a named pipe that nobody reads waited in open() for ever."""
    made = run_cli("float", "tunnel-pki", "--out", str(tmp_path / "tunnel"), "--float", "float-a")
    assert made.returncode == 0, made.stderr
    bob = playground / "net" / "nodes" / "bob" / "certificates"
    (tmp_path / "float.toml").write_text(
        f"""[control]
host = "127.0.0.1"
port = 0
cert = "{tmp_path}/tunnel/float-a.pem"
key = "{tmp_path}/tunnel/float-a.key"
ca = "{tmp_path}/tunnel/tunnel-ca.pem"

[public]
host = "127.0.0.1"
port = 0

[tls.node]
cert_chain = "{bob}/tls.chain.pem"
key = "{bob}/tls.key.pem"
trust_root = "{bob}/network-root.cert.pem"
passphrase_file = "{bob}/passphrase"

[audit]
path = "audit.jsonl"
""",
        encoding="utf-8",
    )
    os.mkfifo(tmp_path / "audit.jsonl")
    done = run_cli("float", "start", "--config", str(tmp_path / "float.toml"), timeout=30)
    assert done.stderr == (
        f"corda-trio: error: {tmp_path}/float.toml: key 'audit.path': cannot open {tmp_path}/audit.jsonl: "
        "a named pipe that nobody reads\n"
    ), done.stderr
    assert done.returncode == 2
    assert (tmp_path / "audit.jsonl").is_fifo()


def test_a_part_list_nested_too_deeply_is_reported_and_repaired(tmp_path: Path) -> None:
    """A parts.json of 100,000 nested arrays: `store check` and `store compact` ended in a RecursionError
    traceback. Now the part list is reported as damaged, and `store check --repair` writes it anew."""

    async def make() -> None:
        async with store.open_broker(tmp_path / "st") as broker:
            queue = await broker.declare_queue("inbox")
            await queue.enqueue(b"kept")

    trio.run(make)
    parts = tmp_path / "st" / "parts.json"
    parts.write_text("[" * 100_000 + "]" * 100_000)
    nested = f"{parts}: not the part list the store writes: nested too deeply to read"
    checked = run_cli("store", "check", str(tmp_path / "st"))
    assert (checked.returncode, checked.stderr) == (1, ""), checked.stderr
    assert f"CORRUPT  parts.json: {nested}" in checked.stdout, checked.stdout
    compacted = run_cli("store", "compact", str(tmp_path / "st"))
    assert compacted.returncode == 1
    assert compacted.stderr == (
        f"corda-trio: error: {nested}; run 'corda-trio store check --repair' first\n"
    ), compacted.stderr
    repaired = run_cli("store", "check", "--repair", str(tmp_path / "st"))
    assert repaired.returncode == 0 and "Traceback" not in repaired.stderr, repaired.stderr

    async def read() -> list[bytes]:
        async with store.open_broker(tmp_path / "st") as broker:
            return [m.payload async for m in broker.get_queue("inbox").browse()]

    assert trio.run(read) == [b"kept"]


def test_a_node_json_nested_too_deeply_is_passed_over(
    playground: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`node info --base-dir` reads the running node's node.json for its RPC address; one of 100,000 nested
    arrays was a RecursionError traceback. Now it is passed over as any unreadable node.json is: the address
    comes from node.toml (no node listens there: one line)."""
    shutil.copytree(playground / "net", tmp_path / "net")
    alice = tmp_path / "net" / "nodes" / "alice"
    (alice / "node.json").write_text("[" * 100_000 + "]" * 100_000)
    monkeypatch.setenv("CORDA_TRIO_RPC_PASSWORD", "x")
    done = run_cli("node", "info", "--base-dir", str(alice), "--user", "x", timeout=60)
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("corda-trio: error: ws://127.0.0.1:"), done.stderr
    assert "unavailable: cannot connect to ws://127.0.0.1:" in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1 and done.returncode == 1


def test_a_stray_directory_in_a_store_is_reported_and_left_alone(tmp_path: Path) -> None:
    async def make() -> None:
        async with store.open_broker(tmp_path / "st") as broker:
            queue = await broker.declare_queue("inbox")
            await queue.enqueue(b"kept")

    trio.run(make)
    (tmp_path / "st" / "My Photos").mkdir()
    (tmp_path / "st" / "notes.txt").write_text("x")
    done = run_cli("store", "check", str(tmp_path / "st"))
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert f"not a queue, left alone: {tmp_path / 'st' / 'My Photos'}" in done.stdout
    assert f"not a queue, left alone: {tmp_path / 'st' / 'notes.txt'}" in done.stdout
    assert (tmp_path / "st" / "My Photos").is_dir()


def test_an_interrupted_bootstrap_leaves_nothing(tmp_path: Path) -> None:
    """Ctrl-C while the network is being written: no network directory, no temporary sibling."""
    names = [f"O=Node{i},L=London,C=GB" for i in range(40)]
    args = [arg for name in names for arg in ("--node", name)]
    proc = subprocess.Popen(
        [*CLI, "network", "bootstrap", "--dir", str(tmp_path / "net"), *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip

    def partial_exists() -> bool:
        return any(p.name.startswith(".net.partial-") for p in tmp_path.iterdir())

    wait_for(partial_exists, proc, what="the partial network directory")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert (err, proc.returncode) == ("interrupted\n", 130)
    assert list(tmp_path.iterdir()) == []


def test_a_bootstrap_killed_hard_is_cleaned_up_and_two_at_once_are_refused(tmp_path: Path) -> None:
    """kill -9 while the network is written left '.net.partial-XXXX' (every node's keys and passphrases)
    beside it for ever, and the next bootstrap into the same directory said nothing of it; a second
    bootstrap into the same directory while the first ran was not told about it either. Now the second is
    refused in one line, and the next after the kill removes the leftover and says so."""
    names = [f"O=Node{i},L=London,C=GB" for i in range(100)]
    args = [arg for name in names for arg in ("--node", name)]
    proc = subprocess.Popen(
        [*CLI, "network", "bootstrap", "--dir", str(tmp_path / "net"), *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip

    def partials() -> list[Path]:
        return [p for p in tmp_path.iterdir() if p.name.startswith(".net.partial-")]

    try:
        wait_for(lambda: bool(partials()), proc, what="the partial network directory")
        proc.send_signal(signal.SIGSTOP)  # (held half-way, however fast or slow this machine is)
        [partial] = partials()
        second = run_cli("network", "bootstrap", "--dir", str(tmp_path / "net"), "--node", ALICE)
        assert second.returncode == 1 and second.stderr == (
            f"corda-trio: error: another bootstrap (pid {proc.pid}) is writing {tmp_path / 'net'} "
            f"(into {partial})\n"
        ), second.stderr
    finally:
        proc.kill()
        proc.communicate(timeout=60)
    assert partials() == [partial] and not (tmp_path / "net").exists()
    again = run_cli("network", "bootstrap", "--dir", str(tmp_path / "net"), "--node", ALICE)
    assert again.returncode == 0, again.stderr
    assert again.stderr == (
        f"corda-trio: warning: removed {partial}, left by a bootstrap that was interrupted\n"
    ), again.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["net"]
    listed = run_cli("network", "show", "--dir", str(tmp_path / "net"))
    assert listed.returncode == 0 and "O=Alice, L=London, C=GB" in listed.stdout, listed.stderr


def test_a_bootstrap_passphrase_too_long_for_a_key_names_the_option(tmp_path: Path) -> None:
    """It said only cryptography's 'Passwords longer than 1023 bytes are not supported by this backend'."""
    env = {**os.environ, "H2_LONG_PASSPHRASE": "p" * 1024}
    done = subprocess.run(
        [*CLI, "network", "bootstrap", "--dir", str(tmp_path / "net"), "--node", ALICE,
         "--passphrase-env", "H2_LONG_PASSPHRASE"],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr == (
        "corda-trio: error: --passphrase-env H2_LONG_PASSPHRASE: the passphrase is 1,024 bytes; a key's "
        "passphrase is at most 1,023\n"
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("value", [None, ""])
def test_a_bootstrap_passphrase_variable_named_but_not_set_is_refused(
    tmp_path: Path, value: str | None
) -> None:
    """`--passphrase-env MY_PASS` with MY_PASS not exported (or empty) made a network whose keys were under
    generated passphrases, stored in files beside them, exit 0: not what the operator asked for."""
    env = {k: v for k, v in os.environ.items() if k != "H2_UNSET_PASSPHRASE"}
    if value is not None:
        env["H2_UNSET_PASSPHRASE"] = value
    done = subprocess.run(
        [*CLI, "network", "bootstrap", "--dir", str(tmp_path / "net"), "--node", ALICE,
         "--passphrase-env", "H2_UNSET_PASSPHRASE"],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr == (
        "corda-trio: error: --passphrase-env H2_UNSET_PASSPHRASE: $H2_UNSET_PASSPHRASE is not set "
        "(or empty): export it, or leave the option out to have passphrases generated\n"
    )
    assert list(tmp_path.iterdir()) == []


def test_the_map_database_is_untouched_by_a_refused_open(playground: Path) -> None:
    db = playground / "corrupt-net" / "network-map" / "networkmap.db"
    before = db.read_bytes()
    run_cli("networkmap", "list", "--dir", str(playground / "corrupt-net"))
    assert db.read_bytes() == before
    with pytest.raises(sqlite3.DatabaseError):
        sqlite3.connect(db).execute("SELECT 1 FROM sqlite_master").fetchall()


def test_a_newer_builds_map_database_is_left_as_it_is(playground: Path) -> None:
    """Its format (SQLite's user_version) is above this build's: before, the build opened it as its own
    (journal mode, schema) and read it with its own rules."""
    db = playground / "newer-net" / "network-map" / "networkmap.db"
    before = {p.name: p.read_bytes() for p in db.parent.glob("networkmap.db*")}
    assert run_cli("networkmap", "list", "--dir", str(playground / "newer-net")).returncode == 1
    assert {p.name: p.read_bytes() for p in db.parent.glob("networkmap.db*")} == before


def test_a_benchmark_stopped_by_the_machine_says_why_without_an_errno() -> None:
    """`bench run --out` on a full disk said 'scenario wal failed: [Errno 28] No space left on device'."""
    from corda_trio.node._cli import error_text

    assert error_text(OSError(28, "No space left on device")) == "No space left on device"
    assert error_text(OSError(2, "No such file or directory", "/x/y")) == "No such file or directory: /x/y"
    assert error_text(ValueError("two\n  lines")) == "two lines"
    assert error_text(RuntimeError()) == "RuntimeError"


def test_a_bootstrap_on_a_full_disk_is_one_line_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The disk filling up half-way (as on a 64 KiB tmpfs) gave a traceback from the key store's write."""
    from corda_trio import pki
    from corda_trio.node._cli import main

    written = 0
    real = pki.write_certificates

    def fill_up(path: object, certs: object) -> None:
        nonlocal written
        written += 1
        if written > 3:
            raise OSError(28, "No space left on device")
        real(path, certs)  # type: ignore[arg-type]

    monkeypatch.setattr(pki, "write_certificates", fill_up)
    code = main(["network", "bootstrap", "--dir", str(tmp_path / "net"), "--node", ALICE, "--node", BOB])
    assert code == 1
    err = capsys.readouterr().err
    assert err == f"corda-trio: error: cannot write the network into {tmp_path}: No space left on device\n"
    assert list(tmp_path.iterdir()) == []  # nothing half-written


@pytest.mark.parametrize("section", ["p2p", "rpc", "metrics"])
def test_a_port_already_taken_is_named_with_its_role(playground: Path, tmp_path: Path, section: str) -> None:
    """The p2p listener's error came out of its nursery wrapped in an exception group, which the node's
    `except OSError` missed: the line said only 'Address already in use', not which address."""
    import re
    import socket

    shutil.copytree(playground / "net", tmp_path / "net")
    toml = tmp_path / "net" / "nodes" / "alice" / "node.toml"
    text = toml.read_text(encoding="utf-8")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        # the section's address line (the first 'address = ...' after its header) now names the taken port
        text = re.sub(rf"(\[{section}\]\naddress = )\"[^\"]*\"", rf'\g<1>"127.0.0.1:{port}"', text)
        toml.write_text(text, encoding="utf-8")
        done = run_cli("node", "start", "--config", str(toml), timeout=60)
    role = {"p2p": "peers", "rpc": "RPC", "metrics": "/metrics"}[section]
    assert done.returncode == 1, done.stderr
    *before, last = done.stderr.strip().splitlines()
    assert last == (
        f"corda-trio: error: O=Alice, L=London, C=GB: cannot listen for {role} on 127.0.0.1:{port}: "
        "Address already in use"
    ), done.stderr
    # (no map runs here: the node may have said so before it stopped)
    warning = "corda-trio node: WARNING corda_trio.network.cache:"
    assert all(line.startswith(warning) for line in before), before
    assert "Traceback" not in done.stderr


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def _set(toml: Path, key: str, value: str) -> None:
    """Set ``key = value`` (the first line that sets ``key``) in ``toml``."""
    lines = toml.read_text(encoding="utf-8").splitlines()
    i = next(i for i, line in enumerate(lines) if line.startswith(f"{key} = "))
    lines[i] = f"{key} = {value}"
    toml.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _replace(toml: Path, old: str, new: str) -> None:
    text = toml.read_text(encoding="utf-8")
    assert old in text, old
    toml.write_text(text.replace(old, new, 1), encoding="utf-8")


IN_USE = "Address already in use"
# (id, how to break a node that never ran (its directory and node.toml), expected text of the one line, code)
REFUSED_STARTS: list[tuple[str, object, str, int]] = [
    ("node-infos-is-a-file", lambda n, t: _set(t, "additional_node_infos", '"node.toml"'),
     "node.toml: network.additional_node_infos: {n}/node.toml is not a directory", 2),
    ("no-base-directory-no-passphrase",
     lambda n, t: (_set(t, "base_directory", f'"{n}/gone"'), _set(t, "passphrase_file", '"nowhere"')),
     "cannot read passphrase file '{n}/gone/nowhere': No such file or directory", 1),
    ("passphrase-env-unset",
     lambda n, t: (t.write_text(t.read_text().replace('passphrase_file = "certificates/passphrase"',
                                                      'passphrase_env = "H4_NO_SUCH_VARIABLE"')),),
     "environment variable H4_NO_SUCH_VARIABLE (the key passphrase) is not set", 1),
    # the passwords of [bridge] were read only once the store and log were written, and the first was
    # called "the key passphrase"
    ("bridge-password-env-unset",
     lambda n, t: _replace(t, 'mode = "in-process"',
                           'mode = "external"\npassword_env = "H10_NO_SUCH_VARIABLE"'),
     "environment variable H10_NO_SUCH_VARIABLE (the bridge endpoint password) is not set", 1),
    ("proxy-password-file-missing",
     lambda n, t: _replace(t, 'mode = "in-process"',
                           'proxy = "socks5://corda@127.0.0.1:1080"\nproxy_password_file = "nowhere"'),
     "cannot read password file '{n}/nowhere': No such file or directory", 1),
    ("wrong-passphrase", lambda n, t: (n / "certificates" / "passphrase").write_text("wrong\n"),
     "cannot be decrypted or parsed (wrong passphrase?)", 1),
    # a TLS key that is not the certificate's: the line named the temporary copies OpenSSL was given
    # ('cannot load TLS certificate '/tmp/corda-trio-tls-.../chain.pem' with key '/tmp/...')
    ("tls-key-not-the-certificates", lambda n, t: _set(t, "tls_key", '"certificates/identity.key.pem"'),
     "{n}/certificates/identity.key.pem is not the key of {n}/certificates/tls.chain.pem", 1),
    ("passphrase-readable-by-others", lambda n, t: (n / "certificates" / "passphrase").chmod(0o644),
     "must not be readable by group or others", 1),
    ("no-network-parameters", lambda n, t: (n / "network-parameters").unlink(),
     "cannot read network parameters {n}/network-parameters: No such file or directory", 1),
    # a name too long, a symlink loop: Path.exists() raised the first (a traceback), Path.resolve() raised
    # RuntimeError on the second once the node had run (a traceback)
    ("node-infos-name-too-long", lambda n, t: _set(t, "additional_node_infos", f'"{LONG}"'),
     "node.toml: network.additional_node_infos: {n}/" + LONG + ": File name too long", 2),
    ("base-directory-name-too-long", lambda n, t: _set(t, "base_directory", f'"{LONG}"'),
     "node.toml: network.additional_node_infos: {n}/" + LONG + "/additional-node-infos: File name too long",
     2),
    ("map-cache-symlink-loop",
     lambda n, t: ((n / "loop").symlink_to(n / "loop"), _set(t, "node_info_cache", '"loop"')),
     "node.toml: network.node_info_cache: {n}/loop: Too many levels of symbolic links", 2),
    ("store-symlink-loop",
     lambda n, t: ((n / "loop").symlink_to(n / "loop"), _set(t, "directory", '"loop"'),
                   (n / "store.json").write_text('{"store_directory": "store"}\n')),
     "node.toml: store.directory: {n}/loop: Too many levels of symbolic links", 2),
    ("store-recorded-but-missing",
     lambda n, t: (n / "store.json").write_text('{"store_directory": "store"}\n'),
     "the store {n}/store is missing or empty, but this node has run with it", 1),
    # p2p.address is what the NodeInfo advertises: a wildcard there is refused, naming where it belongs
    ("p2p-address-wildcard", lambda n, t: _set(t, "address", '"0.0.0.0:40001"'),
     'node.toml: p2p.address: 0.0.0.0:40001 is not an address peers can dial: set the host:port they reach; '
     'to listen on every interface, set p2p.listen = "0.0.0.0:40001"', 2),
    ("p2p-port-taken", "p2p", "cannot listen for peers on 127.0.0.1:{port}: " + IN_USE, 1),
    ("rpc-port-taken", "rpc", "cannot listen for RPC on 127.0.0.1:{port}: " + IN_USE, 1),
    ("metrics-port-taken", "metrics", "cannot listen for /metrics on 127.0.0.1:{port}: " + IN_USE, 1),
]  # fmt: skip


@pytest.mark.parametrize(
    ("breaks", "message", "code"), [c[1:] for c in REFUSED_STARTS], ids=[c[0] for c in REFUSED_STARTS]
)
def test_a_refused_node_start_creates_nothing(
    playground: Path, tmp_path: Path, breaks: object, message: str, code: int
) -> None:
    """A start refused for its configuration, keys, parameters, store record or a taken port is one line and
    leaves the node's directory as it was: before, the log directory and file were created first (also for a
    base directory that did not exist), then the base directory and its lock file, and a taken port was
    found only after the store and its record were created too."""
    import re
    import socket

    shutil.copytree(playground / "net", tmp_path / "net")
    node = tmp_path / "net" / "nodes" / "alice"
    toml = node / "node.toml"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        if isinstance(breaks, str):  # a section whose address now names the taken port
            text = toml.read_text(encoding="utf-8")
            text = re.sub(rf"(\[{breaks}\]\naddress = )\"[^\"]*\"", rf'\g<1>"127.0.0.1:{port}"', text)
            toml.write_text(text, encoding="utf-8")
        else:
            breaks(node, toml)  # type: ignore[operator]
        before = _tree(tmp_path)
        done = run_cli("node", "start", "--config", str(toml), timeout=60)
    assert done.stderr.splitlines() == [done.stderr.strip()] and done.stderr.startswith(
        "corda-trio: error: "
    ), done.stderr
    assert message.format(n=node, port=port) in done.stderr, done.stderr
    assert done.returncode == code
    assert _tree(tmp_path) == before


def test_a_file_name_that_is_not_utf8_is_shown_as_its_bytes(tmp_path: Path) -> None:
    """A path with a byte that is not UTF-8 (0xff) appears as ``\\xff`` in the error line, as ``ls -b``
    shows it, not as the ``\\udcff`` Python carries it as internally."""
    odd = Path(os.fsdecode(bytes(tmp_path) + b"/st\xff"))
    odd.mkdir()
    for args in (["store", "check", str(odd)], ["node", "start", "--config", str(odd / "node.toml")]):
        out = subprocess.run([*CLI, *args], capture_output=True, timeout=120)
        line = out.stderr.decode("utf-8")  # (what a terminal shows: valid UTF-8)
        assert out.returncode != 0 and line.count("\n") == 1, line
        assert "st\\xff" in line and "udc" not in line, line


def test_shown_survives_a_lone_surrogate_that_no_file_name_made() -> None:
    assert shown("a\udcffb") == "a\\xffb"
    assert shown("x\ud800y") == "x\\ud800y"
