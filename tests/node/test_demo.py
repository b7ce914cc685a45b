"""``corda-trio demo`` as a user runs it: a real process, real sockets, mutual TLS, durable queues."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def _demo(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "corda_trio", "demo", *args],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def _inbox_depth(stdout: str) -> int:
    match = re.search(r"O=Bob, L=New York, C=US: p2p\.inbound\.DL\w+ = (\d+)", stdout)
    assert match, stdout
    return int(match.group(1))


def test_demo_moves_messages_durably_and_keeps_them_across_runs(tmp_path: Path) -> None:
    net, records = tmp_path / "net", tmp_path / "records"
    first = _demo("--dir", str(net), "--messages", "300", "--size", "700", "--records", str(records))
    assert first.returncode == 0, first.stderr
    assert "created a network of 2 nodes" in first.stdout
    assert re.search(
        r"O=Alice, L=London, C=GB -> O=Bob, L=New York, C=US: 300 messages of 700 B", first.stdout
    )
    # Alice's outbound queue is empty (every message was accepted, then acked); Bob's inbox holds them all.
    assert re.search(r"O=Alice, L=London, C=GB: internal\.peers\.DL\w+ = 0", first.stdout), first.stdout
    assert _inbox_depth(first.stdout) == 300

    (records_file,) = records.glob("run-*.records.jsonl")
    lines = [json.loads(line) for line in records_file.read_text().splitlines()]
    assert len(lines) == 300 and {r["size_bytes"] for r in lines} == {700}
    for r in lines:
        assert r["created_ns"] <= r["enqueued_ns"] <= r["sent_ns"] <= r["accepted_ns"], r
        assert r["delivered_ns"] <= r["accepted_ns"], "accepted only after the message is durable at the peer"
    (meta_file,) = records.glob("run-*.meta.json")
    meta = json.loads(meta_file.read_text())
    assert meta["schema_version"] == 1 and meta["scenario"] == "p2p-demo"
    assert meta["links"] == ["O=Alice, L=London, C=GB -> O=Bob, L=New York, C=US"]
    assert meta["config"]["sizes"] == "700:1" and meta["summary"]["recorded_ops"] == 300
    assert meta["started_at"] <= meta["finished_at"]
    ends = sorted(max(v for k, v in r.items() if k.endswith("_ns") and v) - r["intended_ns"] for r in lines)
    assert meta["summary"]["latency_ns"]["max"] == ends[-1]

    # Second run on the same network: the inbox is durable, so it now holds both runs' messages.
    second = _demo("--dir", str(net), "--messages", "50")
    assert second.returncode == 0, second.stderr
    assert "created a network" not in second.stdout
    assert _inbox_depth(second.stdout) == 350


def test_demo_rejects_bad_arguments_clearly(tmp_path: Path) -> None:
    bad = _demo("--dir", str(tmp_path / "n"), "--messages", "0")
    assert bad.returncode == 2
    assert "--messages must be at least 1" in bad.stderr
    bad_name = _demo(
        "--dir", str(tmp_path / "n"), "--node", "O=Alice,L=London", "--node", "O=Bob,L=Paris,C=FR"
    )
    assert bad_name.returncode == 2 and "C is required" in bad_name.stderr
    assert not (tmp_path / "n").exists() or not any((tmp_path / "n").iterdir())


def test_demo_reports_a_taken_port_clearly(tmp_path: Path) -> None:
    net = tmp_path / "net"
    assert _demo("--dir", str(net), "--messages", "1").returncode == 0
    bob_toml = (net / "nodes" / "bob" / "node.toml").read_text()
    port = int(re.search(r'\[p2p\]\naddress = "127\.0\.0\.1:(\d+)"', bob_toml).group(1))  # type: ignore[union-attr]
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # the last run left TIME_WAITs
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        taken = _demo("--dir", str(net), "--messages", "1")
    assert taken.returncode == 1
    assert f"O=Bob, L=New York, C=US: cannot listen on 127.0.0.1:{port}" in taken.stderr
    assert "Traceback" not in taken.stderr
