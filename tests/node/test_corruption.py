"""The corruption harness (tests/node/corruption.py), CI-sized: one corpus of real node directories (after
real traffic, clean stops and a kill -9), then 30 seeded trials, each damaging one file of a copy and running
the real ``corda-trio`` on it (``node start``, ``store check``, ``store check --repair``, ``store compact``).
Each must recover with everything acknowledged intact (or a documented torn-tail loss), or refuse in one line
naming the file without changing it. A failing seed is printed: ``python -m tests.node.corruption --corpus
DIR --only SEED`` runs it again; without ``--only`` it runs several hundred."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from .corruption import build_corpus, run_trial

pytestmark = [pytest.mark.slow, pytest.mark.crash]

TRIALS = 30
SEED_BASE = 7_000_000


async def test_thirty_seeded_corruption_trials(tmp_path: Path) -> None:
    with trio.fail_after(120):
        snapshots = await build_corpus(tmp_path / "corpus")
    outcomes = [
        await trio.to_thread.run_sync(run_trial, snapshots, SEED_BASE + i, tmp_path / "trials")
        for i in range(TRIALS)
    ]
    failed = [o for o in outcomes if not o.ok]
    assert not failed, "\n".join(
        f"seed={o.seed} {o.snapshot} {o.command} {o.file} [{o.damage}]: {o.why}\n{o.detail}" for o in failed
    )
    # the trials did run the commands (not only refusals): some started nodes, some refused
    assert {o.command for o in outcomes} == {"start", "check", "repair", "compact"}
