"""Blocking file operations on segments and queue directories (run them in worker threads).

Every function here may block on the disk, so the async layer calls them through
``trio.to_thread.run_sync`` with the broker's :class:`trio.CapacityLimiter`. None of them touches the
in-memory index: they take plain values (paths, descriptors, buffers) and return plain values.

Crash safety rests on four POSIX facts used below:

* ``fdatasync`` after ``write`` makes appended bytes *and* the new file size durable.
* A new file (or a rename, or an unlink) is durable only after ``fsync`` of its directory.
* ``rename`` over an existing file atomically replaces it: after a crash a reader sees the old file or
  the new one, never a mix.
* A descriptor keeps reading the inode it was opened on even after the name points elsewhere, so a
  reader holding the pre-compaction descriptor keeps reading consistent (old) bytes.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import time
from typing import Final

from corda_trio import files

from ._errors import CorruptSegmentError, InvalidQueueNameError, NewerFormatError
from ._record import (
    FORMAT_VERSION,
    MANIFEST_MAGIC,
    MANIFEST_READ_LIMIT,
    SEGMENT_HEADER_BYTES,
    SEGMENT_MAGIC,
    encode_manifest,
    encode_segment_header,
    peek_format_version,
)

__all__ = [
    "COMPACT_SUFFIX",
    "DELETED_PREFIX",
    "KEYED_DIR",
    "MANIFEST_NAME",
    "MANIFEST_TMP",
    "MAX_QUEUE_NAME_LENGTH",
    "PARTS_FILE",
    "QUARANTINE_DIR",
    "SEGMENT_SUFFIX",
    "check_queue_format",
    "create_segment",
    "fsync_dir",
    "is_compaction_leftover",
    "list_segment_numbers",
    "pread_exact",
    "read_manifest",
    "release_file",
    "remove_tree_gently",
    "rotate_segment",
    "segment_path",
    "stray_entries",
    "validate_queue_name",
    "write_all",
    "write_manifest",
]

SEGMENT_SUFFIX: Final = ".seg"
COMPACT_SUFFIX: Final = ".seg.compact"
QUARANTINE_DIR: Final = "quarantine"
#: the queue's manifest (first and last segment number) and its temp file while it is replaced
MANIFEST_NAME: Final = "manifest"
MANIFEST_TMP: Final = "manifest.tmp"
#: A queue name becomes a directory name as is, so it must fit NAME_MAX (255) with room to spare.
MAX_QUEUE_NAME_LENGTH: Final = 200
_NAME_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\Z")
#: ASCII digits only: ``\d`` would also match other scripts' digits (a stray file named with them must
#: never be taken for a segment).
_SEGMENT_RE: Final = re.compile(r"([0-9]{20})\.seg\Z", re.ASCII)
_COMPACT_RE: Final = re.compile(r"[0-9]{20}\.seg\.compact\Z", re.ASCII)
#: Suffixes of the files the store writes: a queue name must not end like them, so that a queue's
#: directory can never be taken for one of the store's own files (or the other way round).
_RESERVED_SUFFIXES: Final = (SEGMENT_SUFFIX, COMPACT_SUFFIX, ".lock")
#: The broker directory's list of the queues and keyed logs the store created (see ``_parts.py``).
PARTS_FILE: Final = "parts.json"
#: The directory of the broker directory that holds the keyed logs (one directory each, like queues).
KEYED_DIR: Final = "keyed"
#: A queue's directory is renamed ``<this><name>-<n>`` when it is deleted, then removed.
DELETED_PREFIX: Final = ".deleted-"
#: Directory entries of a broker directory that are not queues.
RESERVED_NAMES: Final = frozenset({"broker.lock", QUARANTINE_DIR, KEYED_DIR, PARTS_FILE})


def validate_queue_name(name: str) -> str:
    """Check that ``name`` can be used verbatim as a directory name, and return it.

    A queue's directory is named exactly like the queue (``p2p.inbound.DLBz7a...``), so that operators see
    the same name everywhere. Allowed: 1 to 200 ASCII letters, digits, ``.``, ``_`` and ``-``, starting with
    a letter or digit, without ``..``. That rules out path separators, ``.`` / ``..``, hidden files, NUL and
    anything a shell or another OS would mangle.

    Raises:
        InvalidQueueNameError: the name breaks one of these rules (the message says which).
    """
    if not isinstance(name, str):
        raise InvalidQueueNameError(f"queue name must be a str, not {type(name).__name__}")
    if not name:
        raise InvalidQueueNameError("queue name is empty")
    if len(name) > MAX_QUEUE_NAME_LENGTH:
        raise InvalidQueueNameError(
            f"queue name is {len(name)} characters long, the maximum is {MAX_QUEUE_NAME_LENGTH}"
        )
    if "/" in name or "\\" in name or "\0" in name:
        raise InvalidQueueNameError(f"queue name {name!r} contains a path separator or NUL")
    if ".." in name:
        raise InvalidQueueNameError(f"queue name {name!r} contains '..'")
    if not _NAME_RE.match(name) or not name.isascii():
        raise InvalidQueueNameError(
            f"queue name {name!r} must start with a letter or digit and contain only ASCII letters, "
            "digits, '.', '_' and '-'"
        )
    if name in RESERVED_NAMES:
        raise InvalidQueueNameError(f"queue name {name!r} is reserved")
    if name.lower().endswith(_RESERVED_SUFFIXES):
        raise InvalidQueueNameError(
            f"queue name {name!r} ends like a file of the store's own ({', '.join(_RESERVED_SUFFIXES)})"
        )
    return name


def segment_path(queue_dir: str, number: int) -> str:
    """Path of segment ``number`` (20 decimal digits, so that names sort like numbers)."""
    return os.path.join(queue_dir, f"{number:020d}{SEGMENT_SUFFIX}")


def check_queue_format(queue_dir: str) -> None:
    """Refuse a queue (or keyed log) directory that a newer build wrote: its manifest or a segment claims a
    format version above :data:`FORMAT_VERSION`. Reads the first 12 bytes of each regular file, nothing
    else; what is not the store's (or is damaged) is left for recovery to judge.

    Raises:
        NewerFormatError: the first such file, in name order (nothing was changed).
    """
    paths = [(os.path.join(queue_dir, MANIFEST_NAME), MANIFEST_MAGIC, "manifest")]
    paths += [(segment_path(queue_dir, n), SEGMENT_MAGIC, "segment") for n in list_segment_numbers(queue_dir)]
    for path, magic, what in paths:
        if not os.path.isfile(path):  # (a regular file only: never open a pipe a stranger put there)
            continue
        with open(path, "rb", buffering=0) as f:
            version = peek_format_version(f.read(12), magic)
        if version is not None and version > FORMAT_VERSION:
            raise NewerFormatError(path, what, version, FORMAT_VERSION)


def list_segment_numbers(queue_dir: str) -> list[int]:
    """Segment numbers present in ``queue_dir`` (regular files named like segments), ascending."""
    numbers = []
    for entry in os.listdir(queue_dir):
        match = _SEGMENT_RE.match(entry)
        if match and os.path.isfile(os.path.join(queue_dir, entry)):
            numbers.append(int(match.group(1)))
    numbers.sort()
    return numbers


def is_compaction_leftover(queue_dir: str, entry: str) -> bool:
    """Whether ``entry`` of ``queue_dir`` is the temp file of an interrupted compaction."""
    return _COMPACT_RE.match(entry) is not None and os.path.isfile(os.path.join(queue_dir, entry))


def stray_entries(queue_dir: str) -> list[str]:
    """Entries of ``queue_dir`` the store did not write (left alone, and reported), sorted."""
    strays = []
    for entry in sorted(os.listdir(queue_dir)):
        full = os.path.join(queue_dir, entry)
        if _SEGMENT_RE.match(entry) or _COMPACT_RE.match(entry):
            if os.path.isfile(full):
                continue
        elif entry == QUARANTINE_DIR and os.path.isdir(full):
            continue
        elif entry in (MANIFEST_NAME, MANIFEST_TMP) and os.path.isfile(full):
            continue
        strays.append(entry)
    return strays


def fsync_dir(path: str) -> None:
    """Make creations, renames and unlinks inside directory ``path`` durable."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_datasync = getattr(os, "fdatasync", os.fsync)


def sync_file(fd: int) -> None:
    """``fdatasync`` (or ``fsync`` where there is none): appended bytes and the file size are durable."""
    _datasync(fd)


def write_all(fd: int, data: bytes | bytearray | memoryview, sync: bool) -> None:
    """Append ``data`` to ``fd`` (opened with ``O_APPEND``), then ``fdatasync`` it when ``sync``.

    Raises:
        OSError: the write or the sync failed. The caller must treat the file as failed: after a failed
            fsync the kernel may have dropped the dirty pages, so retrying could report success for data
            that is not on disk.
    """
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]
    if sync:
        _datasync(fd)


def pread_exact(fd: int, offset: int, length: int) -> bytes:
    """Read exactly ``length`` bytes at ``offset``.

    Raises:
        OSError: the read failed, or the file ended early (``EIO``-like: a record the index promised is
            missing, which means the file changed under us).
    """
    data = os.pread(fd, length, offset)
    if len(data) == length:
        return data
    parts = [data]
    got = len(data)
    while got < length:
        chunk = os.pread(fd, length - got, offset + got)
        if not chunk:
            raise OSError(f"short read: wanted {length} bytes at offset {offset}, file ended after {got}")
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


def create_segment(queue_dir: str, number: int, base_id: int, first_seq: int = 0, flags: int = 0) -> int:
    """Create segment ``number`` with its header, durably, and return a descriptor open for appends.

    The header is written and synced, then the directory is synced, before any record goes in: a crash
    leaves either no file, or a file whose header is complete, or (if the crash hits between creation and
    the header write) a short file that recovery recognises as a torn, empty last segment.
    """
    path = segment_path(queue_dir, number)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_APPEND | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        write_all(fd, encode_segment_header(number, base_id, first_seq, flags), sync=True)
        fsync_dir(queue_dir)
    except OSError as exc:
        os.close(fd)
        files.name_file(exc, path)  # (a write or sync on the descriptor: a full disk, say)
        raise
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_segment(path: str) -> int:
    """Open an existing segment for appends and positional reads."""
    return os.open(path, os.O_RDWR | os.O_APPEND | getattr(os, "O_CLOEXEC", 0))


#: Freeing a large file's blocks in one go makes the file system's next journal commit, which every
#: ``fsync`` waits for, take as long as the freeing: on ext4 with online discard, 40-70 ms for a 64 MiB
#: segment, measured on this project's build machine (every queue's group commits stall meanwhile). Files
#: nobody can reach any more are therefore shrunk a step at a time before they go (then: under 1 ms).
RELEASE_STEP_BYTES: Final = 2 * 1024 * 1024
RELEASE_PAUSE_SECONDS: Final = 0.02


def release_file(fd: int) -> None:
    """Close ``fd``, the last descriptor of a file nobody can reach any more (unlinked, or replaced by a
    rename), after shrinking it by :data:`RELEASE_STEP_BYTES` every :data:`RELEASE_PAUSE_SECONDS`
    (blocking: about a third of a second per 32 MiB; on a worker thread)."""
    try:
        size = os.fstat(fd).st_size
        while size > RELEASE_STEP_BYTES:
            size -= RELEASE_STEP_BYTES
            os.ftruncate(fd, size)
            time.sleep(RELEASE_PAUSE_SECONDS)
    except OSError:
        pass  # (a descriptor not open for writing: the file is freed at once when it closes)
    finally:
        close_quietly(fd)


def remove_tree_gently(path: str) -> None:
    """Delete the directory ``path``, which nobody can reach any more (renamed away), with each of its
    files released as by :func:`release_file` (blocking)."""
    with os.scandir(path) as entries:
        for entry in list(entries):
            if entry.is_file(follow_symlinks=False):
                try:
                    fd = os.open(entry.path, os.O_WRONLY | getattr(os, "O_CLOEXEC", 0))
                except OSError:
                    os.unlink(entry.path)
                    continue
                os.unlink(entry.path)
                release_file(fd)
            elif entry.is_dir(follow_symlinks=False):
                remove_tree_gently(entry.path)
            else:
                os.unlink(entry.path)
    try:
        os.rmdir(path)
    except OSError:
        shutil.rmtree(path)  # something appeared meanwhile (never by the store)


def close_quietly(fd: int) -> None:
    """Close ``fd`` ignoring errors (used on cleanup paths that already report a failure)."""
    with contextlib.suppress(OSError):
        os.close(fd)


def is_header_only(size: int) -> bool:
    """True when a segment of ``size`` bytes holds no record."""
    return size <= SEGMENT_HEADER_BYTES


def read_manifest(queue_dir: str) -> bytes | None:
    """The bytes of the queue's manifest (at most ``MANIFEST_READ_LIMIT + 1``), or ``None`` if it has none.

    Raises:
        CorruptSegmentError: the manifest's name is taken by something that is not a file (a directory):
            the store did not write it and cannot tell what the queue held, so it refuses to guess.
    """
    path = os.path.join(queue_dir, MANIFEST_NAME)
    try:
        with open(path, "rb") as f:
            return f.read(MANIFEST_READ_LIMIT + 1)
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        raise CorruptSegmentError(
            path, 0, "the manifest is a directory, not the store's file: move it out of the queue directory"
        ) from None


def write_manifest(dir_fd: int, first: int, last: int) -> None:
    """Durably replace the manifest of the queue directory ``dir_fd`` (temp file, ``fdatasync``,
    ``rename``, directory ``fsync``): after a crash it is the old one or the new one."""
    fd = os.open(
        MANIFEST_TMP,
        os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0),
        0o644,
        dir_fd=dir_fd,
    )
    try:
        write_all(fd, encode_manifest(first, last), sync=True)
    finally:
        os.close(fd)
    os.replace(MANIFEST_TMP, MANIFEST_NAME, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    os.fsync(dir_fd)


def open_dir(path: str) -> int:
    """A descriptor of the directory ``path`` (for ``dir_fd=`` operations and ``fsync``)."""
    return os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))


def write_manifest_at(queue_dir: str, first: int, last: int) -> None:
    """:func:`write_manifest` for a directory given by path."""
    fd = open_dir(queue_dir)
    try:
        write_manifest(fd, first, last)
    finally:
        os.close(fd)


def rotate_segment(
    queue_dir: str, old_fd: int, seal: bytes, number: int, base_id: int, first_seq: int, first: int
) -> int:
    """Seal the tail segment (append ``seal`` to ``old_fd``, ``fdatasync``), create segment ``number``
    and replace the manifest to list segments ``first`` to ``number``; returns the new descriptor.

    The order is what recovery relies on: a segment is sealed before the next one exists, and a new
    segment holds no record before the manifest lists it.
    """
    try:
        write_all(old_fd, seal, sync=True)
    except OSError as exc:
        files.name_file(exc, segment_path(queue_dir, number - 1))
        raise
    fd = create_segment(queue_dir, number, base_id, first_seq)
    try:
        write_manifest_at(queue_dir, first, number)
    except BaseException:
        os.close(fd)
        raise
    return fd
