"""Checkpoint goldens: snapshots (every checkpoint of both nodes plus the messages on the wire) taken after
each delivery of example flows, committed under tests/flows/golden/. Each must still decode, re-encode to the
same bytes, and resume to the right results with the current code: a change that breaks old checkpoints
shows here. Regenerate (after a deliberate format change, with a new format version) with
``FLOW_GOLDEN_REGENERATE=1``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from corda_trio import flows
from tests.flows.memnet import MemNet, restore, snapshot

GOLDEN = Path(__file__).with_name("golden") / "checkpoints.json"
A, B, C = "O=Alice, L=London, C=GB", "O=Bob, L=Paris, C=FR", "O=Carol, L=Rome, C=IT"


def _scenarios() -> dict[str, tuple[list[str], Any, Any]]:
    return {
        "pingpong": ([A, B], flows.PingPong(recipient=B, rounds=2), 2),
        "broadcast": (
            [A, B, C],
            flows.Broadcast(recipients=[B, C], message="hi"),
            [f"{B} got hi", f"{C} got hi"],
        ),
        "failing": ([A, B], flows.FailingFlow(recipient=B, reason="nope"), "nope"),
    }


def _generate() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, (nodes, flow, _expected) in _scenarios().items():
        net = MemNet.of(*nodes)
        net.start(A, flow)
        snaps = [snapshot(net)]
        while net.pending():
            net.deliver(sorted(net.pending())[0])
            snaps.append(snapshot(net))
        out[name] = snaps
    return out


if os.environ.get("FLOW_GOLDEN_REGENERATE"):
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(json.dumps(_generate(), indent=0, sort_keys=True) + "\n")

SNAPSHOTS = json.loads(GOLDEN.read_text())


@pytest.mark.parametrize(
    ("scenario", "step"), [(n, i) for n, snaps in SNAPSHOTS.items() for i in range(len(snaps))], ids=str
)
def test_golden_checkpoints_decode_and_resume(scenario: str, step: int) -> None:
    snap = SNAPSHOTS[scenario][step]
    for checkpoints in snap["checkpoints"].values():
        for data in checkpoints.values():
            raw = bytes.fromhex(data)
            assert flows.encode_checkpoint(flows.decode_checkpoint(raw)) == raw
    net = restore(snap)
    net.run()
    expected = _scenarios()[scenario][2]
    result = net.nodes[A].results.get("F1")
    if result is None:  # finished before this snapshot: its final record holds the outcome
        state = flows.decode_checkpoint(bytes.fromhex(snap["checkpoints"][A]["F1"]))
        result = state.result if state.status == "completed" else flows.FlowException(state.error[1])  # type: ignore[index]
    if isinstance(expected, str):
        assert isinstance(result, flows.FlowException) and str(result) == expected
    else:
        assert result == expected
