"""The process entry point: ``python -m corda_trio`` and the ``corda-trio`` console script.

A command's own SIGTERM / Ctrl-C handling (:func:`corda_trio.node._cli.main`) is in place only once its
modules are imported, which takes tens of milliseconds (argparse, logging, the package). A SIGTERM in that
window used to end the process with the default action (exit 143, not a word). So this module, which
imports nothing but ``signal`` and ``sys``, installs a SIGTERM handler first, then imports the command line
and runs it: a SIGTERM or Ctrl-C that arrives while it loads unwinds the import and ends the process the way
the command line promises, one line (``terminated``, exit 0; ``interrupted``, exit 130). What remains is
the interpreter's own start-up (before any code of ours runs), where the default action still applies.

While modules load, a signal is only noted (:class:`signals_deferred`) and raised once the import is done: a
``KeyboardInterrupt`` raised by a handler in the middle of an import can land in the import lock's weakref
callback, where Python prints "Exception ignored" and goes on (seen: SIGTERM 50 ms after the start, and the
node started and ran as if it had never come).
"""

from __future__ import annotations

import signal
import sys
from types import FrameType
from typing import Final

__all__ = ["INTERRUPTED_EXIT", "main", "say_interrupted", "signals_deferred"]

#: Exit code after Ctrl-C (128 + SIGINT, as shells report it).
INTERRUPTED_EXIT: Final = 130


def say_interrupted(terminated: bool) -> int:
    """Print the one line of a command ended by SIGTERM (``terminated``) or Ctrl-C (``interrupted``) and
    return its exit code (0 after SIGTERM: a clean stop was asked for and done; 130 after Ctrl-C)."""
    print("terminated" if terminated else "interrupted", file=sys.stderr)
    return 0 if terminated else INTERRUPTED_EXIT


class signals_deferred:
    """``with signals_deferred(): import ...``: SIGTERM and SIGINT that arrive inside the block are noted,
    not handled; leaving it restores their handlers and raises each noted signal again, so that its handler
    runs in ordinary code. A SIGINT that is ignored (a background job) stays ignored. Outside the main thread
    (where no signal handler runs) it does nothing."""

    def __enter__(self) -> None:
        self._pending: list[int] = []
        self._saved: dict[int, object] = {}
        for signum in (signal.SIGTERM, signal.SIGINT):
            current = signal.getsignal(signum)
            if current is not None and current is not signal.SIG_IGN:
                try:
                    self._saved[signum] = signal.signal(signum, self._note)
                except ValueError:  # not the main thread (the command line run by a worker): no signals
                    return

    def _note(self, signum: int, frame: FrameType | None) -> None:
        self._pending.append(signum)

    def __exit__(self, *exc_info: object) -> None:
        for signum, handler in self._saved.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]
        for signum in dict.fromkeys(self._pending):
            signal.raise_signal(signum)


def main() -> int:
    """Install the early SIGTERM handler, then load and run the command line (see the module docstring)."""
    terminated = False

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        nonlocal terminated
        terminated = True
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        with signals_deferred():
            from corda_trio.node._cli import main as cli_main

        # (it installs its own handler at once and restores this one when it returns)
        return cli_main()
    except KeyboardInterrupt:  # (while loading, before the command line took the signals over)
        return say_interrupted(terminated)


if __name__ == "__main__":
    sys.exit(main())
