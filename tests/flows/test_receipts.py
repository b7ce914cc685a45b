"""The flow manager's deferred receipts of inbox messages (what the messaging service awaits before it
commits a message's id and acks it)."""

from __future__ import annotations

import pytest
import trio

from corda_trio.flows._manager import _Receipt


async def test_a_resolved_receipt_is_taken_even_by_a_waiter_being_cancelled() -> None:
    """Found by the chaos run (``tests.node.chaos``, seed 4 with ``--float``, node debug logs): after a
    clean stop (SIGTERM, flows drained, "node stopped cleanly") and a start, the node refused whole bundles
    of session messages as for an unknown session: their flow had consumed them and finished before the
    stop, but a bundle's deferred receipt awaits the receipts of its parts one after the other, and waiting
    on a resolved one still made a checkpoint, where the stop's cancellation was delivered; the messaging
    service then never committed the bundle's id and handed it over again. A resolved receipt's wait has no
    checkpoint."""
    parts = [_Receipt(), _Receipt()]
    for receipt in parts:
        receipt.resolve()
    with trio.CancelScope() as scope:
        scope.cancel()
        for receipt in parts:
            assert await receipt.wait() is None
    assert not scope.cancelled_caught
    failed = _Receipt()
    failed.resolve(RuntimeError("the checkpoint write failed"))
    with trio.CancelScope() as scope:
        scope.cancel()
        with pytest.raises(RuntimeError, match="checkpoint write failed"):
            await failed.wait()


async def test_an_unresolved_receipt_waits_and_is_cancelled_as_before() -> None:
    receipt = _Receipt()
    with trio.move_on_after(0.05) as scope:
        await receipt.wait()
    assert scope.cancelled_caught
