"""freeze_startup_heap: start-up garbage is collected, what lives is frozen out of later full collections."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import gc, json, weakref
    from corda_trio.node import freeze_startup_heap

    class Node:
        pass

    garbage = Node(); garbage.self = garbage      # a cycle nobody refers to any more
    gone = weakref.ref(garbage); del garbage
    live = [Node() for _ in range(1000)]           # what the process keeps
    gc.disable()                                   # (no automatic collection may run in between)
    before = len(gc.get_objects())
    freeze_startup_heap()
    after_young = Node()                           # made after start-up: collected as before
    print(json.dumps({
        "garbage_collected": gone() is None,
        "frozen": gc.get_freeze_count(),
        "tracked_before": before,
        "tracked_after": len(gc.get_objects()),
        "young_tracked": gc.is_tracked(after_young),
    }))
    """
)


def test_freeze_collects_start_up_garbage_and_freezes_the_rest() -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True)
    result = __import__("json").loads(out.stdout.strip().splitlines()[-1])
    assert result["garbage_collected"]
    assert result["frozen"] >= 1000  # at least the live objects (plus modules, classes, functions)
    # the collector now walks only what was made after the freeze: the few objects made since
    assert result["tracked_after"] < 50 < result["tracked_before"]
    assert result["young_tracked"]
