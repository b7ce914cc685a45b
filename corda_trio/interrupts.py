"""Ctrl-C and SIGTERM at a corda-trio process's edges: the one line a command ends with, and holding signals
back while modules load.

It imports nothing but ``signal`` and ``sys``, so that the entry point (:mod:`corda_trio.__main__`) can
install its SIGTERM handler before anything heavy loads, and it is the one module both that entry point and
the command line (:func:`corda_trio.node._cli.main`) take these from. (When run as ``python -m corda_trio``,
the entry point's own module is ``__main__``, not ``corda_trio.__main__``: state shared by the two handlers
lives here, in a module that is loaded once.) Whichever handler saw SIGTERM says so (:func:`note_terminated`),
so the last line is ``terminated`` even when a SIGTERM lands between one handler taking over from the other.
"""

from __future__ import annotations

import signal
import sys
from types import FrameType
from typing import Final

__all__ = ["INTERRUPTED_EXIT", "note_terminated", "reset_terminated", "say_interrupted", "signals_deferred"]

_terminated = False


def note_terminated() -> None:
    """A SIGTERM handler's first step: the process ends because of SIGTERM (:func:`say_interrupted`)."""
    global _terminated
    _terminated = True


def reset_terminated() -> None:
    """Forget an earlier SIGTERM (a command line run again in the same process, as tests do)."""
    global _terminated
    _terminated = False


#: Exit code after Ctrl-C (128 + SIGINT, as shells report it).
INTERRUPTED_EXIT: Final = 130


def say_interrupted(terminated: bool = False) -> int:
    """Print the one line of a command ended by SIGTERM (``terminated``, or a handler noted it) or Ctrl-C
    (``interrupted``) and return its exit code (0 after SIGTERM: a clean stop was asked for and done; 130
    after Ctrl-C)."""
    terminated = terminated or _terminated
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
