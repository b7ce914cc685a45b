"""``corda-trio demo`` as a user runs it: three node processes, flows over RPC, records, a clean stop."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ENV = {**os.environ, "COLUMNS": "200", "TERM": "dumb"}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_demo_runs_flows_on_three_node_processes_and_writes_records(tmp_path: Path) -> None:
    net, records = tmp_path / "devnet", tmp_path / "records"
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "corda_trio", "demo", "--dir", str(net), "--flows", "10", "--rounds", "3",
         "--records", str(records), "--no-progress"],
        capture_output=True, text=True, timeout=180, check=False, env=ENV,
    )  # fmt: skip
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert time.monotonic() - started < 60, "the demo must stay under a minute"
    assert "created a network of 3 nodes" in out
    assert "every node sees all 3 nodes in the network map" in out
    assert re.search(r"33 flows finished, 0 failed, in [\d.]+ s", out), out
    ledger = {"sent": 0, "received": 0}
    for name in ("Alice", "Bob", "Carol"):
        assert re.search(rf"{name} Broadcast answers: \[", out), out
        sent = re.search(rf"{name} /metrics: P2P messages sent ([\d,]+), received ([\d,]+)", out)
        assert sent and int(sent.group(1).replace(",", "")) > 0, out
        ledger["sent"] += int(sent.group(1).replace(",", ""))
        ledger["received"] += int(sent.group(2).replace(",", ""))
    # read once settled: every message one node sent (its peer acknowledged) another received, none in flight
    assert ledger["sent"] == ledger["received"], out
    total = f"{ledger['sent']:,} messages sent and {ledger['received']:,} received across the 3 nodes"
    assert f"P2P counters read once settled: {total}" in out, out
    pids = [int(p) for p in re.findall(r"pid (\d+)", out)]
    assert len(pids) == 3 and not any(_alive(p) for p in pids)

    (records_file,) = records.glob("run-*.records.jsonl")
    lines = [json.loads(line) for line in records_file.read_text().splitlines()]
    assert len(lines) == 33 and {r["outcome"] for r in lines} == {"ok"}
    assert all(r["created_ns"] <= r["flow_finished_ns"] for r in lines)
    assert {r["link"] for r in lines} >= {"O=Alice, L=London, C=GB -> O=Bob, L=Paris, C=FR PingPong"}
    (meta_file,) = records.glob("run-*.meta.json")
    meta = json.loads(meta_file.read_text())
    assert meta["scenario"] == "flows-demo" and meta["summary"]["recorded_ops"] == 33

    # Run again on the same network: it is reused, the nodes keep their stores.
    again = subprocess.run(
        [sys.executable, "-m", "corda_trio", "demo", "--dir", str(net), "--flows", "2", "--rounds", "1",
         "--no-progress"],
        capture_output=True, text=True, timeout=180, check=False, env=ENV,
    )  # fmt: skip
    assert again.returncode == 0, again.stdout + again.stderr
    assert "created a network" not in again.stdout and "9 flows finished, 0 failed" in again.stdout


def test_ctrl_c_stops_the_demo_and_every_node(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "corda_trio", "demo", "--dir", str(tmp_path / "devnet"), "--flows", "300",
         "--rounds", "20", "--no-progress"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
    )  # fmt: skip
    assert proc.stdout is not None
    seen = ""
    deadline = time.monotonic() + 120
    while "every node sees all 3 nodes" not in seen and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen += line
    assert "every node sees all 3 nodes" in seen, seen
    pids = [int(p) for p in re.findall(r"pid (\d+)", seen)]
    assert len(pids) == 3 and all(_alive(p) for p in pids)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, out + err
    assert err.strip().splitlines()[-1] == "interrupted", err
    assert not any(_alive(p) for p in pids), "a node process outlived the demo"
