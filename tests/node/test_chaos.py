"""A bounded chaos run (``tests.node.chaos``) of a real network: a minute of flows and plain messages under
seeded faults (kill -9, SIGSTOP, SIGTERM of nodes; kill -9 of the map service, with a float pair of the
active float), then its ledger: nothing lost, nothing doubled, every result right."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .chaos import Chaos

pytestmark = pytest.mark.slow


async def test_a_minute_of_faults_loses_and_doubles_nothing(tmp_path: Path) -> None:
    # (with the float pair: every kind of fault can strike; `python -m tests.node.chaos` without --float runs
    # the nodes alone, longer, with any seed; CI's budget keeps one minute here)
    chaos = Chaos(tmp_path / "net", minutes=1.0, seed=7, floats=True, settle=120)
    summary = await chaos.run()
    assert summary["problems"] == [], json.dumps(summary, indent=1)
    assert sum(summary["faults"].values()) >= 3, summary["faults"]
    assert summary["flows"]["started"] >= 50, summary["flows"]
    assert summary["flows"]["finished"] == summary["flows"]["started"], summary["flows"]
    assert all(m["accepted"] > 0 for m in summary["messages"].values()), summary["messages"]
