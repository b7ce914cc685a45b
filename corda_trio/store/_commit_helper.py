"""The commit helper process: appends group-commit batches to segment files and syncs them.

This file runs as a separate process (``python -I -S _commit_helper.py FD``), started by
:mod:`._committer`, and imports nothing but the standard library, so that it starts in a few
milliseconds. It exists because of the GIL: a worker *thread* that must take the GIL back after its
``write`` and ``fdatasync`` waits for a busy Trio loop to let go of it, which it does only between
scheduler rounds; measured here that added 0.3-1 ms to every group commit while the loop was busy, and the
loop is busy exactly when it matters (see ``bench/wal.py``). A process has a GIL of its own.

Protocol, over the stream socket ``FD`` (little endian):

* request ``<B op, I handle, Q token, I length>`` then ``length`` bytes:
  ``OPEN`` (payload: the segment's absolute path, UTF-8) opens it for appending under ``handle``;
  ``WRITE`` / ``WRITE_SYNC`` append the payload to ``handle`` (and ``fdatasync`` it);
  ``CLOSE`` closes ``handle``.
* reply ``<Q token, i errno>`` for each ``WRITE`` / ``WRITE_SYNC``, in request order: ``errno`` 0 means
  the bytes are written (and durable for ``WRITE_SYNC``).

Everything that arrived together is done together: the writes of each handle are appended with one
``writev`` (in request order) and followed by one ``fdatasync``, then every reply is sent. A handle whose
open, write or sync failed answers every later write with that error (after a failed ``fsync`` nothing
written later may be trusted either). The helper exits when the socket reaches end of file, i.e. when
its parent closed it or died; it ignores SIGINT and SIGTERM, which are the parent's to handle (the parent
then drains and closes the socket).
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import struct
import sys

OP_OPEN = 1
OP_WRITE = 2
OP_WRITE_SYNC = 3
OP_CLOSE = 4

REQUEST = struct.Struct("<BIQI")
REPLY = struct.Struct("<Qi")
#: at most this many buffers per ``writev`` (IOV_MAX is 1024 on Linux)
MAX_IOV = 512
RECV_BYTES = 1 << 20


def _append(fd: int, views: list[memoryview]) -> None:
    """Append ``views`` to ``fd`` in order, in as few ``writev`` calls as the kernel allows."""
    while views:
        chunk = views[:MAX_IOV]
        written = os.writev(fd, chunk)
        total = sum(len(v) for v in chunk)
        if written == total:
            del views[: len(chunk)]
            continue
        # A short write: skip what went out and go on with the rest.
        while written:
            if written >= len(views[0]):
                written -= len(views[0])
                del views[0]
            else:
                views[0] = views[0][written:]
                written = 0


def serve(sock: socket.socket) -> int:
    """Serve requests until end of file; returns the exit status."""
    fds: dict[int, int] = {}
    failed: dict[int, int] = {}  # handle -> errno of its first failure (sticky)
    buf = bytearray()
    while True:
        chunk = sock.recv(RECV_BYTES)
        if not chunk:
            return 0
        buf += chunk
        while True:  # take whatever else is already there: one round of writes and syncs for it all
            try:
                more = sock.recv(RECV_BYTES, socket.MSG_DONTWAIT)
            except BlockingIOError:
                break
            if not more:
                break  # end of file: serve what is complete, then the next recv says so again
            buf += more
        view = memoryview(buf)
        pos = 0
        writes: dict[int, list[tuple[int, memoryview, bool]]] = {}
        order: list[int] = []  # the token of each write, in request order
        results: dict[int, int] = {}  # token -> errno
        while len(buf) - pos >= REQUEST.size:
            op, handle, token, length = REQUEST.unpack_from(buf, pos)
            end = pos + REQUEST.size + length
            if end > len(buf):
                break
            body = view[pos + REQUEST.size : end]
            pos = end
            if op == OP_OPEN:
                try:
                    fds[handle] = os.open(bytes(body).decode(), os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
                except OSError as exc:
                    failed[handle] = exc.errno or errno.EIO
            elif op in (OP_WRITE, OP_WRITE_SYNC):
                writes.setdefault(handle, []).append((token, body, op == OP_WRITE_SYNC))
                order.append(token)
            elif op == OP_CLOSE:
                # Writes to this handle that arrived in the same round come first.
                _flush(fds, failed, writes.pop(handle, []), handle, results)
                fd = fds.pop(handle, None)
                failed.pop(handle, None)
                if fd is not None:
                    os.close(fd)
            else:
                print(f"commit helper: unknown request {op}", file=sys.stderr)
                return 2
        for handle, items in writes.items():
            _flush(fds, failed, items, handle, results)
        replies = b"".join([REPLY.pack(token, results[token]) for token in order])
        buf = buf[pos:]  # a new buffer: the bodies still view the old one until this round is done
        if replies:
            sock.sendall(replies)


def _flush(
    fds: dict[int, int],
    failed: dict[int, int],
    items: list[tuple[int, memoryview, bool]],
    handle: int,
    results: dict[int, int],
) -> None:
    """Append the bodies of ``items`` to ``handle`` with one ``writev``, then one ``fdatasync`` if any
    asked for it; the outcome of each goes to ``results``. A failure is also kept in ``failed``."""
    if items and handle not in failed:
        fd = fds.get(handle)
        if fd is None:
            failed[handle] = errno.EBADF
        else:
            try:
                _append(fd, [body for _token, body, _sync in items])
                if any(sync for _token, _body, sync in items):
                    os.fdatasync(fd)
            except OSError as exc:
                failed[handle] = exc.errno or errno.EIO
    status = failed.get(handle, 0)
    for token, _body, _sync in items:
        results[token] = status


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sock = socket.socket(fileno=int(argv[1]))
    sock.setblocking(True)
    try:
        return serve(sock)
    except (ConnectionResetError, BrokenPipeError):
        return 0  # the parent went away
    finally:
        sock.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
