"""Reading the small files an operator points corda-trio at, with a size limit; writing small files whole.

Configuration files, keys, certificates, passphrase files, network parameters and node-info files are read
whole. A path that names something endless or huge instead (``/dev/zero``, ``/dev/urandom``, a multi-GiB
log given by mistake) must not make the process read until the machine runs out of memory: every such read
goes through :func:`read_small_file`, which reads at most one byte more than its limit and then refuses the
file with an ``OSError`` (``EFBIG``) whose text says so. Callers already turn an ``OSError`` into their own
one-line error (``cannot read private key 'x': larger than 1 MiB``), so the refusal reaches the operator
the same way as a missing file does.

Only a regular file is read. A named pipe (FIFO) that nobody writes to would block the ``open`` itself for
ever, and a device (``/dev/zero``) or socket is never what an operator meant: the file is opened with
``O_NONBLOCK`` (so the open of a FIFO returns at once), checked with ``fstat``, and anything but a regular
file is refused with an ``OSError`` whose text names what it is (``not a regular file: a named pipe``); a
directory is refused as the system says it (``Is a directory``). A file that another reader opens itself
(the SQLite databases of the network map, the records Spark reads) is checked the same way first, by
:func:`check_regular_file`, so that the operator is told what the file is: SQLite itself says only
``disk I/O error`` of a named pipe or ``/dev/zero``.

:func:`write_file_atomically` writes a small file (a key, a certificate, a record of the node's) so that a
crash leaves either the old file or the new one, never a part: a temporary file in the same directory,
``fsync``, ``rename``, then ``fsync`` of the directory.

:func:`open_for_appending` opens a log file the same careful way: a named pipe that nobody reads would block
a plain ``open()`` for writing for ever; it is refused at once (``ENXIO``, ``a named pipe that nobody
reads``), while a pipe a log collector reads, a device such as ``/dev/null`` and a regular file are opened.

An ``OSError`` reaches the operator as the system says it and the file it concerns
(:func:`os_error_text`: ``No space left on device: /x/y``); ``EMFILE`` adds the limit it ran into (``Too
many open files (the limit, ulimit -n, is 64): /x/y``), and ``ENOSPC`` on a file system with bytes free but
no inode left says so (``No space left on device (no free inodes: all 60 are used, 199 MiB free): /x/y``),
which the system's text does not say.
A write or sync on a descriptor fails without a
file name (the disk is full); :func:`name_file` gives it the name of the file the descriptor is for.
"""

from __future__ import annotations

import errno
import os
import resource  # (at import: at EMFILE the import of its extension module itself would fail)
import stat
from pathlib import Path
from typing import Final

__all__ = [
    "MAX_OPERATOR_FILE_BYTES",
    "check_regular_file",
    "name_file",
    "open_files_limit",
    "open_for_appending",
    "os_error_text",
    "read_small_file",
    "temporary_prefix",
    "write_file_atomically",
]

#: The limit for configuration files, keys, certificates and passphrase files: real ones are a few KiB.
MAX_OPERATOR_FILE_BYTES: Final = 1024 * 1024


_O_NOCTTY_CLOEXEC: Final = os.O_NOCTTY | os.O_CLOEXEC


def read_small_file(path: str | os.PathLike[str], limit: int = MAX_OPERATOR_FILE_BYTES) -> bytes:
    """The bytes of ``path``, a regular file which may hold at most ``limit`` of them.

    Raises:
        OSError: the file cannot be opened or read; it is a directory (``EISDIR``) or not a regular file
            (``EINVAL``, ``strerror`` ``"not a regular file: a named pipe"``; nothing is read and the open
            does not wait for a writer); or it holds more than ``limit`` bytes (``errno.EFBIG``, ``strerror``
            ``"larger than <limit>"``; nothing beyond ``limit + 1`` bytes is read).
    """
    fd = _open_regular_file(path)
    try:
        chunks: list[bytes] = []
        left = limit + 1
        while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
            chunks.append(chunk)
            left -= len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > limit:
        raise OSError(errno.EFBIG, f"larger than {_size(limit)}", os.fspath(path))
    return data


def check_regular_file(path: str | os.PathLike[str], *, missing_ok: bool = False) -> None:
    """Check that ``path`` is a regular file this process may read, as :func:`read_small_file` would, for a
    file that something else opens (SQLite, Spark): opened without waiting, checked, closed, nothing read.

    Args:
        missing_ok: nothing at ``path`` is fine (a database that its opener creates).

    Raises:
        OSError: as :func:`read_small_file` raises it for a file it refuses unread (``FileNotFoundError``
            when there is nothing at ``path``, through a symbolic link too, unless ``missing_ok``).
    """
    try:
        os.close(_open_regular_file(path))
    except FileNotFoundError:
        if not missing_ok:
            raise


def _open_regular_file(path: str | os.PathLike[str]) -> int:
    """A descriptor of ``path`` open for reading (in non-blocking mode), which is a regular file; else
    ``OSError`` (``EISDIR``, or ``EINVAL`` naming what it is)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | _O_NOCTTY_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise OSError(errno.EISDIR, os.strerror(errno.EISDIR), os.fspath(path))
        if not stat.S_ISREG(mode):
            raise OSError(errno.EINVAL, f"not a regular file: {_kind(mode)}", os.fspath(path))
    except BaseException:
        os.close(fd)
        raise
    return fd


def _kind(mode: int) -> str:
    """What a file that is not a regular file or a directory is, for a message."""
    if stat.S_ISFIFO(mode):
        return "a named pipe"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "of an unknown kind"


def open_for_appending(path: str | os.PathLike[str], mode: int = 0o644) -> int:
    """A descriptor of ``path`` (created with file mode ``mode`` if missing) open for appending, in blocking
    mode; the caller owns it.

    Raises:
        OSError: it cannot be opened; ``errno.ENXIO`` (``strerror`` ``"a named pipe that nobody reads"``) for
            a FIFO without a reader, at once, where ``open()`` would wait for one.
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | _O_NOCTTY_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # (O_NONBLOCK: a FIFO with no reader; nothing else answers ENXIO)
            raise OSError(errno.ENXIO, "a named pipe that nobody reads", os.fspath(path)) from None
        raise
    os.set_blocking(fd, True)
    return fd


def write_file_atomically(path: str | os.PathLike[str], data: bytes, mode: int) -> None:
    """Replace ``path`` with ``data`` (file mode ``mode``): a crash leaves the old file or the new one."""
    path = Path(path)
    tmp = path.with_name(f"{temporary_prefix(path.name)}{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)  # the umask may have removed bits we wanted, never added any we did not
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def name_file(exc: BaseException, path: str | os.PathLike[str]) -> None:
    """Make ``exc`` name ``path`` if it is an ``OSError`` that names no file (a ``write`` or ``fdatasync``
    on a descriptor fails so: ``[Errno 28] No space left on device``)."""
    if isinstance(exc, OSError) and exc.filename is None:
        exc.filename = os.fspath(path)


def os_error_text(exc: OSError) -> str:
    """``exc`` as the system says it and the file it concerns: ``No space left on device: /x/y``, not
    ``[Errno 28] No space left on device: '/x/y'`` (its ``str`` when it has no system text)."""
    if not exc.strerror:
        return str(exc) or type(exc).__name__
    text = exc.strerror
    if exc.errno == errno.EMFILE and (limit := open_files_limit()) is not None:
        text = f"{text} (the limit, ulimit -n, is {limit})"
    elif exc.errno == errno.ENOSPC and exc.filename and (inodes := _no_free_inodes(exc.filename)):
        text = f"{text} ({inodes})"
    return f"{text}: {os.fsdecode(exc.filename)}" if exc.filename else text


def _no_free_inodes(path: str | bytes | os.PathLike[str]) -> str | None:
    """Why ``ENOSPC`` came when the file system of ``path`` has bytes free but no inode left (``df -i``):
    ``no free inodes: all 60 are used, 199 MiB free``; ``None`` when it is not so (or cannot be told)."""
    directory = os.fsdecode(path)
    while True:  # (the file that could not be created is not there: ask the nearest directory that is)
        try:
            st = os.statvfs(directory)
            break
        except OSError:
            parent = os.path.dirname(directory)
            if parent == directory:
                return None
            directory = parent
    if st.f_files == 0 or st.f_favail > 0 or st.f_bavail == 0:
        return None
    return f"no free inodes: all {st.f_files} are used, {st.f_bavail * st.f_frsize >> 20} MiB free"


def open_files_limit() -> int | None:
    """This process's soft limit on open file descriptors (``ulimit -n``), ``None`` when unlimited."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else soft


def temporary_prefix(name: str) -> str:
    """How the temporary files of :func:`write_file_atomically` for a file named ``name`` begin (the pid
    follows): a crash between their creation and the rename leaves one behind, for its owner to remove."""
    return f".{name}.tmp-"


def _size(n: int) -> str:
    """``n`` bytes for a message: ``1 MiB``, ``64 KiB``, or the plain count."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} bytes"
