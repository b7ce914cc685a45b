"""The broker's side of the commit helper process (see :mod:`._commit_helper` for why it exists).

:meth:`CommitHelper.submit` is synchronous and never blocks: the request goes straight into the socket
with one non-blocking ``sendmsg`` (header and batch as two buffers, no copy), and whatever the socket
cannot take yet is left to the helper's sender task. One reader task takes the replies and calls each
batch's callback on the Trio thread, so a group commit costs the event loop two system calls and one
wake-up of the reader, however busy it is, and the write and ``fdatasync`` themselves never wait for the
GIL.

If the helper dies, every outstanding and later commit fails with :class:`StoreFailedError` naming its
exit status: the queues stop, and the next open recovers what is on disk.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
from collections import deque
from collections.abc import Callable
from typing import Final

import trio

from ._commit_helper import OP_CLOSE, OP_OPEN, OP_WRITE, OP_WRITE_SYNC, REPLY, REQUEST
from ._errors import StoreFailedError

__all__ = ["CommitCallback", "CommitHelper"]

logger = logging.getLogger("corda_trio.store")

HELPER_PATH: Final = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_commit_helper.py")
#: ``done(error)``: ``None`` once the batch is written (and synced, if asked), else what went wrong.
CommitCallback = Callable[[BaseException | None], None]
#: How long a cancelled :meth:`CommitHelper.run` waits for the helper's last replies before killing it.
WIND_DOWN_SECONDS: Final = 5.0


class CommitHelper:
    """One commit helper process and its socket; :meth:`run` must be running (in the broker's nursery)."""

    def __init__(self, sock: socket.socket, process: trio.Process) -> None:
        self._sock = sock
        self._process = process
        self._callbacks: dict[int, CommitCallback] = {}
        self._next_token = 0
        self._next_handle = 0
        self._unsent: deque[memoryview] = deque()
        self._send_wanted = trio.Event()
        self._failure: StoreFailedError | None = None
        self._closing = False
        self._reply_buf = bytearray()  # a reply cut between two reads waits here for its rest
        #: called once, with the error, if the helper exits when it was not asked to (the broker's hook)
        self.on_failure: Callable[[StoreFailedError], None] | None = None

    @classmethod
    async def start(cls, *, inherit: tuple[int, ...] = ()) -> CommitHelper:
        """Start a helper process.

        Args:
            inherit: descriptors the helper keeps open for its lifetime besides its socket (the broker
                passes its lock file: the directory stays locked until the helper has exited too).
        """
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            parent.setblocking(False)
            process = await trio.lowlevel.open_process(
                [sys.executable, "-I", "-S", HELPER_PATH, str(child.fileno())],
                pass_fds=(child.fileno(), *inherit),
                stdin=subprocess.DEVNULL,
                # Its own process group: a terminal's Ctrl-C is for the node, which then closes the
                # broker in order (the helper also ignores SIGINT and SIGTERM once it runs).
                start_new_session=True,
            )
        except BaseException:
            parent.close()
            raise
        finally:
            child.close()
        return cls(parent, process)

    @property
    def pid(self) -> int:
        return self._process.pid

    # ------------------------------------------------------------------ requests (synchronous)

    def open(self, path: str) -> int:
        """Have the helper open ``path`` for appending; returns the handle to write to it with."""
        handle = self._next_handle
        self._next_handle += 1
        self._send(REQUEST.pack(OP_OPEN, handle, 0, len(encoded := os.path.abspath(path).encode())), encoded)
        return handle

    def close(self, handle: int) -> None:
        """Have the helper close ``handle`` (after the writes already sent to it)."""
        self._send(REQUEST.pack(OP_CLOSE, handle, 0, 0), b"")

    def submit(self, handle: int, data: bytes | bytearray, *, sync: bool, done: CommitCallback) -> None:
        """Append ``data`` to ``handle`` (then ``fdatasync`` it if ``sync``); ``done`` is called on the Trio
        thread, later, never from within this call. ``data`` must not change until then."""
        if self._failure is not None:
            trio.lowlevel.current_trio_token().run_sync_soon(done, self._failure)
            return
        token = self._next_token
        self._next_token = token + 1
        self._callbacks[token] = done
        self._send(REQUEST.pack(OP_WRITE_SYNC if sync else OP_WRITE, handle, token, len(data)), data)

    def _send(self, header: bytes, body: bytes | bytearray) -> None:
        if self._failure is not None:
            return
        if self._unsent:
            self._unsent.append(memoryview(header))
            if body:
                self._unsent.append(memoryview(body))
            return
        try:
            sent = self._sock.sendmsg([header, body] if body else [header])
        except OSError:  # full (BlockingIOError), or the helper is gone: the reader sees its end of file
            sent = 0
        if sent < len(header) + len(body):
            if sent < len(header):
                self._unsent.append(memoryview(header)[sent:])
                if body:
                    self._unsent.append(memoryview(body))
            else:
                self._unsent.append(memoryview(body)[sent - len(header) :])
            self._send_wanted.set()

    # ------------------------------------------------------------------ tasks

    @trio.lowlevel.enable_ki_protection  # replies settle commits: never half-dispatched
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Send what the socket could not take at once and dispatch replies, until the helper exits
        (after :meth:`aclose`, or on its own: then every outstanding commit fails)."""
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._send_loop)
                task_status.started()
                await self._read_loop()
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await self._wind_down()

    async def _wind_down(self) -> None:
        """After :meth:`run` stopped (the helper exited, or ``run`` was cancelled): settle every commit.

        Theory of operation: a cancelled ``run`` must not leave a waiter parked forever, nor report
        success for bytes that never reached the disk. The helper finishes every request it has received
        and answers each one before it reads the end of file, so shutting our side for writing and
        reading replies to the end tells exactly which commits are durable (success) and which are not
        (what was still unsent here, or never answered: :class:`StoreFailedError`). The wait is bounded
        (:data:`WIND_DOWN_SECONDS`), after which the helper is killed; it is always reaped.
        """
        if self._sock.fileno() >= 0:
            # Replies may wait in the socket even if the helper has exited already.
            self._unsent.clear()  # never reached the helper: those commits fail below
            try:
                self._sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            with trio.move_on_after(WIND_DOWN_SECONDS):
                try:
                    await self._read_replies()
                except (OSError, trio.ClosedResourceError):
                    pass
        if self._sock.fileno() >= 0:
            trio.lowlevel.notify_closing(self._sock)
            self._sock.close()
        if self._process.returncode is None:
            self._process.kill()
        status = await self._process.wait()
        if self._failure is None:
            self._failure = StoreFailedError(
                f"the store's commit helper process (pid {self._process.pid}) stopped (status {status})"
            )
        self._unsent.clear()
        callbacks, self._callbacks = self._callbacks, {}
        for done in callbacks.values():
            done(self._failure)

    @trio.lowlevel.enable_ki_protection  # store internals: a Ctrl-C lands at a checkpoint, never half-way
    async def _send_loop(self) -> None:
        unsent = self._unsent
        while True:
            await self._send_wanted.wait()
            self._send_wanted = trio.Event()
            while unsent:
                await trio.lowlevel.wait_writable(self._sock)
                try:
                    sent = self._sock.sendmsg(list(unsent)[:256])
                except BlockingIOError:
                    continue
                except OSError:
                    return  # the reader sees the end of file
                while sent:
                    first = unsent[0]
                    if sent >= len(first):
                        sent -= len(first)
                        unsent.popleft()
                    else:
                        unsent[0] = first[sent:]
                        sent = 0

    async def _read_loop(self) -> None:
        await self._read_replies()
        await self._helper_gone()

    async def _read_replies(self) -> None:
        """Dispatch replies until the helper's end of file."""
        buf = self._reply_buf
        size = REPLY.size
        while True:
            await trio.lowlevel.wait_readable(self._sock)
            try:
                data = self._sock.recv(65536)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:
                return
            buf += data
            whole = len(buf) - len(buf) % size
            replies = bytes(buf[:whole])
            del buf[:whole]
            callbacks = self._callbacks
            for token, error in REPLY.iter_unpack(replies):
                done = callbacks.pop(token)
                done(None if error == 0 else OSError(error, os.strerror(error)))

    async def _helper_gone(self) -> None:
        with trio.CancelScope(shield=True):
            status = await self._process.wait()
        if self._closing and not self._callbacks:
            self._failure = StoreFailedError("the store's commit helper process is closed")
            return
        if self._failure is None:
            self._failure = StoreFailedError(
                f"the store's commit helper process (pid {self._process.pid}) exited with status {status}"
            )
            logger.critical("%s; %d commits outstanding failed", self._failure, len(self._callbacks))
        # (else kill_unanswering killed it, and its caller reports why)
        if self.on_failure is not None:
            self.on_failure(self._failure)
        callbacks, self._callbacks = self._callbacks, {}
        for done in callbacks.values():
            done(self._failure)
        self._unsent.clear()

    def kill_unanswering(self, waited_seconds: float) -> StoreFailedError:
        """Kill a helper that has answered nothing for ``waited_seconds`` although commits wait for it
        (stopped with SIGSTOP, in a paused VM, or stuck in the kernel); returns the failure that says so.

        :meth:`run` then sees the helper exit and fails every commit it had not answered: none of them was
        acknowledged to its appender, and the next open recovers whatever of them reached the disk (at
        most a torn last record, which recovery cuts). Nothing is written or acknowledged after this.
        """
        if self._failure is None:
            self._failure = StoreFailedError(
                f"the store's commit helper process (pid {self._process.pid}) did not answer for "
                f"{waited_seconds:g} s (stopped, or stuck in the kernel): killed it; the "
                f"{len(self._callbacks)} commits it had not confirmed were not acknowledged"
            )
        if self._process.returncode is None:
            self._process.kill()
        return self._failure

    @trio.lowlevel.enable_ki_protection  # store internals: a Ctrl-C lands at a checkpoint, never half-way
    async def kill(self) -> None:
        """Kill the helper (if it is still running) and reap it."""
        if self._process.returncode is None:
            self._process.kill()
        with trio.CancelScope(shield=True):
            await self._process.wait()
        if self._sock.fileno() >= 0:
            trio.lowlevel.notify_closing(self._sock)
            self._sock.close()

    @trio.lowlevel.enable_ki_protection  # store internals: a Ctrl-C lands at a checkpoint, never half-way
    async def aclose(self) -> None:
        """Shut the socket for writing (the helper finishes what it has, sees end of file and exits) and
        wait for the helper to exit; :meth:`run` then returns.

        Call it once nothing is outstanding (every log closed): outstanding commits would fail.
        """
        self._closing = True
        try:
            self._sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # already gone
        with trio.CancelScope(shield=True):
            with trio.move_on_after(10) as scope:
                await self._process.wait()
            if scope.cancelled_caught:
                logger.error("commit helper %d did not exit: killing it", self._process.pid)
                self._process.kill()
                await self._process.wait()
