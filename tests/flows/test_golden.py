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

import msgpack
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


@pytest.mark.parametrize("new_ext", [False, True], ids=["same-types", "a-new-ext-type"])
def test_a_checkpoint_of_a_newer_format_is_named_as_such(new_ext: bool) -> None:
    """A checkpoint a newer build wrote (format 2; perhaps with an ext type this code lacks) is refused as a
    newer build's, which the flow manager lists and keeps: before, it read "not a flow checkpoint of format
    1" (or a payload error), as if it were damaged."""
    raw = bytes.fromhex(next(iter(SNAPSHOTS["pingpong"][1]["checkpoints"][A].values())))
    fields = msgpack.unpackb(raw, ext_hook=msgpack.ExtType, raw=False, strict_map_key=False)
    fields[0] = 2
    if new_ext:
        fields.append(msgpack.ExtType(99, b"\x01"))
    newer = msgpack.packb(fields, use_bin_type=True)
    with pytest.raises(flows.PayloadError) as caught:
        flows.decode_checkpoint(newer)
    assert str(caught.value) == (
        "flow checkpoint format 2 was written by a newer build of corda-trio (this build reads format 1): "
        "the checkpoint is kept as it is; run the newer build to resume it"
    )
