"""The ``corda-trio`` command line.

Each command group lives in its own module that exposes ``register(subparsers)``; this module only
collects them, so that the packages stay independent of each other and a broken optional part (Spark,
say) cannot stop the rest of the CLI from starting: groups are imported lazily, when chosen.

Exit codes: 0 success, 1 the operation failed (the message says why), 2 usage or configuration error,
130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import importlib
import logging
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import Any, Final, NoReturn, TypeVar

from corda_trio import files
from corda_trio.interrupts import INTERRUPTED_EXIT as INTERRUPTED_EXIT
from corda_trio.interrupts import note_terminated, reset_terminated, say_interrupted, signals_deferred

__all__ = ["CliError", "main"]


class CliError(Exception):
    """An error to show to the operator as one line, with an exit code (2 = usage / configuration)."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def path_text(text: str) -> str:
    """The argparse ``type`` of a file or directory argument kept as a string: an empty one is refused (it
    named the current directory: ``store check ""`` said ``: no such directory``, ``node start --config ""``
    read the working directory as the config file)."""
    if not text:
        raise argparse.ArgumentTypeError("an empty path names no file or directory")
    return text


def path_arg(text: str) -> Path:
    """The argparse ``type`` of a file or directory argument: :func:`path_text`, as a :class:`Path`."""
    return Path(path_text(text))


#: name -> (module that defines the group, one-line help).  The module exposes
#: ``register(parser: argparse.ArgumentParser) -> None`` which adds sub-commands and sets ``func``.
COMMAND_GROUPS: Final[dict[str, tuple[str, str]]] = {
    "demo": ("corda_trio.node._cli_demo", "run a small end-to-end demo on this machine"),
    "bench": ("corda_trio.node._cli_bench", "run load benchmarks and write records"),
    "report": (
        "corda_trio.node._cli_report",
        "turn benchmark records into a Spark latency/throughput report",
    ),
    "network": ("corda_trio.node._cli_network", "create and inspect networks (bootstrap)"),
    "networkmap": ("corda_trio.node._cli_networkmap", "run the network map service"),
    "store": ("corda_trio.node._cli_store", "inspect and repair durable queues"),
    "float": ("corda_trio.node._cli_float", "run a float (DMZ listener) and make its tunnel PKI"),
    "node": ("corda_trio.node._cli_node", "run a node; ask a running node about itself (RPC)"),
    "flow": ("corda_trio.node._cli_flow", "start, list, watch and kill flows on a running node (RPC)"),
    "bridge": ("corda_trio.node._cli_bridge", "run a node's bridges in their own process"),
}


class _Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line (argparse prints the whole usage first, which
    for some commands wraps over five lines): what is wrong, and where the options are listed. Its
    sub-command parsers are of this class too (``add_subparsers`` makes them with the parser's class)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} ('{self.prog} --help' lists the options)\n")


def _build_parser(chosen: str | None) -> argparse.ArgumentParser:
    from corda_trio import __version__

    parser = _Parser(prog="corda-trio", description="corda-trio node and tools")
    parser.add_argument("--version", action="version", version=f"corda-trio {__version__}")
    sub = parser.add_subparsers(dest="group", metavar="COMMAND")
    for name, (module_name, help_text) in COMMAND_GROUPS.items():
        group_parser = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:  # import only the group that runs: keeps start-up fast and failures local
            importlib.import_module(module_name).register(group_parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the process exit code (also used by the console script).

    Ctrl-C anywhere (also inside a Trio run, where it may arrive wrapped in an exception group together
    with the errors of the tasks it cancelled) prints one line, ``interrupted``, and returns 130. SIGTERM is
    turned into the same unwinding, so ``finally`` blocks and ``async with`` exits run exactly as for
    Ctrl-C (records measured so far are flushed, child processes are stopped), and then returns 0. (Before
    this module is loaded, :mod:`corda_trio.__main__`, the process's entry point, does the same.)
    """
    reset_terminated()

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        # Deliver SIGTERM like Ctrl-C: through the SIGINT handler in force (Trio's, while a Trio run is
        # active, raises KeyboardInterrupt only where that is safe), so there is one unwinding path. (Noted
        # where the entry point sees it too: one landing before the try below unwinds through it.)
        note_terminated()
        handler = signal.getsignal(signal.SIGINT)
        if callable(handler):
            handler(signal.SIGINT, frame)
        else:  # SIGINT ignored (a background job): unwind anyway
            raise KeyboardInterrupt

    previous = _install_sigterm(on_sigterm)
    ignored_sigint = (
        threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    )
    if ignored_sigint:
        # A background job of a script starts with SIGINT ignored. Trio then installs no KeyboardInterrupt
        # handler of its own, and a SIGTERM turned into a KeyboardInterrupt raised at any point (inside
        # Trio's run loop, say) would abandon the run half-way, with pages of tracebacks. So the command
        # takes SIGINT as any command does (it ends it like Ctrl-C).
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return _dispatch(argv)
    except BaseException as exc:
        if not _is_interrupt(exc):
            raise
        _stop_children()
        return say_interrupted()
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        if ignored_sigint:
            signal.signal(signal.SIGINT, signal.SIG_IGN)


def _install_sigterm(handler: Callable[[int, FrameType | None], None]) -> Any:
    """Install ``handler`` for SIGTERM when we are the main thread (returns the previous one, or None)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, handler)


#: After an interrupt, how long child processes get to end by themselves (they normally do: the commit
#: helper on end of file, a Spark JVM when its stdin closes), then after SIGTERM, before SIGKILL.
CHILD_GRACE_SECONDS: Final = 2.0


def _stop_children() -> None:
    """Leave no child process behind an interrupted command.

    Unwinding already closed what the command opened, which ends well-behaved children; one that started
    and was interrupted half-way (a Spark JVM during its start-up, say) may not notice. Each live child (by
    pid, from ``/proc``) gets :data:`CHILD_GRACE_SECONDS` to end, then SIGTERM, then SIGKILL.
    """
    children = _live_children()
    for signum in (None, signal.SIGTERM, signal.SIGKILL):
        if signum is not None:
            for pid in children:
                with contextlib.suppress(OSError):
                    os.kill(pid, signum)
        deadline = time.monotonic() + CHILD_GRACE_SECONDS
        while children and time.monotonic() < deadline:
            for pid in children:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)  # reap it if it ended (it is ours)
            children = [pid for pid in children if pid in _live_children()]
            if children:
                time.sleep(0.05)
        if not children:
            return


def _live_children() -> list[int]:
    """PIDs of this process's children that have not ended (Linux ``/proc``; elsewhere none are found)."""
    me = os.getpid()
    found = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me and fields[0] not in ("Z", "X"):
            found.append(int(entry))
    return found


def _is_interrupt(exc: BaseException) -> bool:
    """A KeyboardInterrupt, a group whose leaves include one (the rest are the cancelled tasks' errors), or
    an error raised while one unwound (its context): code that a Ctrl-C cut short may fail on its way out,
    and that failure is the interrupt's, not the user's problem. py4j does so: interrupted in a call into
    the Spark JVM, it tries to cancel the call and raises ``Py4JError`` if the connection is gone by then.
    """
    todo = [exc]
    seen: set[int] = set()
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, KeyboardInterrupt):
            return True
        if isinstance(current, BaseExceptionGroup):
            todo += current.exceptions
        todo += [e for e in (current.__cause__, current.__context__) if e is not None]
    return False


_E = TypeVar("_E", bound=BaseException)


_R = TypeVar("_R")


def run_trio(async_fn: Callable[..., Awaitable[_R]], *args: Any) -> _R:
    """``trio.run`` for a command: a Ctrl-C (or a SIGTERM, delivered the same way) reaches the main task at
    its next checkpoint and never lands half-way through synchronous code. Without this, Trio raises it
    wherever unprotected code runs, and Trio's own ``task_status.started()`` is such code: interrupted
    there it leaves ``nursery.start`` waiting forever (seen with ``float start``: SIGTERM right after its
    ready line, the process idle and deaf to every later signal)."""
    import trio  # (not at the top: commands that never run Trio start faster)

    from corda_trio import dns

    async def main() -> _R:
        dns.use_own_dns_threads()  # (a DNS server that never answers cannot take the store's threads)
        return await async_fn(*args)

    return trio.run(main, restrict_keyboard_interrupt_to_checkpoints=True)


def error_text(exc: BaseException) -> str:
    """``exc`` as one line for an operator: an ``OSError`` as the system says it and the file it concerns
    (``No space left on device: /x/y``, not ``[Errno 28] No space left on device: '/x/y'``); anything else
    as its message with white space folded (its class name if it has none)."""
    if isinstance(exc, OSError) and exc.strerror:
        return files.os_error_text(exc)
    return " ".join(str(exc).split()) or type(exc).__name__


def grouped_error(exc: BaseException, kind: type[_E] | tuple[type[_E], ...]) -> _E | None:
    """The first ``kind`` error in ``exc`` (itself, or a leaf of a group as Trio nurseries nest them), or
    None when there is none or when an interrupt is among the leaves (that one must unwind as it is)."""
    if _is_interrupt(exc):
        return None
    if isinstance(exc, kind):
        return exc
    if not isinstance(exc, BaseExceptionGroup):
        return None
    leaf: BaseException | None = exc.subgroup(kind)
    while isinstance(leaf, BaseExceptionGroup):  # subgroup keeps the nesting of the nurseries
        leaf = leaf.exceptions[0]
    return leaf  # type: ignore[return-value]


def shown(text: str) -> str:
    """``text`` as one line that is safe on a terminal: the bytes of a file name that is not UTF-8 (Python
    carries them as lone surrogates) shown as ``\\xNN``, the way ``ls -b`` shows them, instead of
    ``\\udcNN``; control and format characters (a line break, an escape sequence, a right-to-left override)
    as their escapes, as ``repr`` writes them. Text from a node (a flow id made of a client id, a flow's
    error from a peer) reached the operator's terminal as it came: colours, moved cursors, forged lines."""
    try:
        text = text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # a lone surrogate that no file name made
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return _UNPRINTABLE.sub(lambda m: repr(m.group())[1:-1], text)


#: C0 and C1 controls, DEL, and the format characters (bidirectional overrides, zero-width characters).
_UNPRINTABLE: Final = re.compile(
    "[\x00-\x1f\x7f-\x9f\u061c\u180e\u200b-\u200f\u202a-\u202e\u2060-\u206f\ufeff\ufff9-\ufffb]"
)


class _CommandLog(logging.Handler):
    """Stands in for :data:`logging.lastResort` (the handler of last resort, used only while nothing has
    configured logging, which is the case for every command but the long-running ones): a warning from the
    library is one line, ``corda-trio: warning: ...``; an error is held back, because a command that fails
    says why in its own one line (the store logs that a queue stopped, then the command's error names the
    cause again), and shown only if the command succeeds after all."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.held: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.ERROR:
            self.held.append(record)
        else:
            self.show(record)

    def show(self, record: logging.LogRecord) -> None:
        level = "warning" if record.levelno < logging.ERROR else "error"
        try:
            message = " ".join(record.getMessage().split())
        except Exception:  # a bad format string in a log call must not end the command
            message = str(record.msg)
        print(f"corda-trio: {level}: {shown(message)}", file=sys.stderr)


def _dispatch(argv: Sequence[str] | None) -> int:
    log = _CommandLog()
    last_resort, logging.lastResort = logging.lastResort, log
    try:
        code = _run_command(argv)
    finally:
        logging.lastResort = last_resort
    if code == 0:
        for record in log.held:
            log.show(record)
    return code


def _run_command(argv: Sequence[str] | None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    chosen = next((a for a in args_list if not a.startswith("-")), None)
    with signals_deferred():  # (the command's modules load: a signal is raised once they have)
        parser = _build_parser(chosen if chosen in COMMAND_GROUPS else None)
    args = parser.parse_args(args_list)
    func: Callable[[argparse.Namespace], int | None] | None = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(func(args) or 0)
    except CliError as exc:
        if _is_interrupt(exc):  # a failure the interrupt caused (a cut connection, say): unwind as one
            raise
        print(f"corda-trio: error: {shown(str(exc))}", file=sys.stderr)
        return exc.exit_code
    except BaseExceptionGroup as group:  # a CliError raised inside a Trio nursery arrives grouped
        leaf = grouped_error(group, CliError)
        if leaf is None:
            raise
        print(f"corda-trio: error: {shown(str(leaf))}", file=sys.stderr)
        return leaf.exit_code
    except BrokenPipeError:  # `corda-trio ... | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except OSError as exc:
        # A path given (an option, a key of a configuration file) with a name longer than the file system
        # takes: Python's own checks (Path.exists, Path.is_dir) raise this one where they return False for
        # a missing file, so every command that looks before it leaps met it as a traceback.
        if exc.errno != errno.ENAMETOOLONG:
            raise
        print(f"corda-trio: error: {shown(error_text(exc))}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
