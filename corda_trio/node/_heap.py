"""Garbage collection for long-running processes (node, bridge, float).

CPython's full (generation 2) collection walks every tracked object, and a started node holds some 45,000
of them that live as long as the process: modules, classes, functions, configuration, TLS contexts. Walking
them took 20-28 ms of CPU per full collection in the P2P benchmark, a pause that every message in flight
at that moment waits out (the benchmark's worst latencies at half load were those pauses). Once the
process is ready, :func:`freeze_startup_heap` moves what survived start-up into the permanent generation,
which the collector never walks again: a full collection then costs 0.5-3.5 ms. Objects made later are
collected as before.
"""

from __future__ import annotations

import gc

__all__ = ["freeze_startup_heap"]


def freeze_startup_heap() -> None:
    """Collect start-up garbage, then freeze what is left: call once, when the process is ready to serve.

    Frozen objects are never collected by the cycle collector (reference counting still frees them), so
    call it in a process's entry point, not in a library or in a process that starts many nodes in turn.
    """
    gc.collect()
    gc.freeze()
