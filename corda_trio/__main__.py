"""The process entry point: ``python -m corda_trio`` and the ``corda-trio`` console script.

A command's own SIGTERM / Ctrl-C handling (:func:`corda_trio.node._cli.main`) is in place only once its
modules are imported, which takes tens of milliseconds (argparse, logging, the package). A SIGTERM in that
window used to end the process with the default action (exit 143, not a word). So this module, which
imports nothing but ``signal``, ``sys`` and the small :mod:`corda_trio.interrupts`, installs a SIGTERM handler
first, then imports the command line and runs it: a SIGTERM or Ctrl-C that arrives while it loads unwinds
the import and ends the process the way the command line promises, one line (``terminated``, exit 0;
``interrupted``, exit 130). What remains is the interpreter's own start-up (before any code of ours runs),
where the default action still applies.

While modules load, a signal is only noted (:class:`~corda_trio.interrupts.signals_deferred`) and raised once
the import is done: a ``KeyboardInterrupt`` raised by a handler in the middle of an import can land in the
import lock's weakref callback, where Python prints "Exception ignored" and goes on (seen: SIGTERM 50 ms
after the start, and the node started and ran as if it had never come).
"""

from __future__ import annotations

import signal
import sys
from types import FrameType

from corda_trio.interrupts import note_terminated, say_interrupted, signals_deferred

__all__ = ["main"]


def main() -> int:
    """Install the early SIGTERM handler, then load and run the command line (see the module docstring)."""

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        note_terminated()
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        with signals_deferred():
            from corda_trio.node._cli import main as cli_main

        # (it installs its own handler at once and restores this one when it returns)
        return cli_main()
    except KeyboardInterrupt:  # (while loading, before the command line took the signals over)
        return say_interrupted()


if __name__ == "__main__":
    sys.exit(main())
