"""The broker directory: its lock, its queue directories, and what else may be in it (blocking calls).

Theory of operation
-------------------
*Lock.* One process at a time may own a broker directory. The lock is an ``flock`` on a descriptor of the
directory *itself*, opened when the broker opens and held (by the broker and by its commit helper, which
inherits it) until both are gone. Locking a file inside the directory would not do: deleting that file
lets a second opener create a new one and lock it. A directory cannot be deleted while it holds a store,
so its lock cannot be side-stepped that way. Offline readers (``store check``, ``store list``) take the
same lock *shared*, on a read-only descriptor: they work for a read-only user and still refuse while a
node runs. ``broker.lock`` is kept as an empty marker file that says "this directory is a store".

*Layout.* The root holds ``broker.lock``, one directory per queue (named exactly like the queue, see
:func:`~._segment.validate_queue_name`), and transiently ``.deleted-<name>-<n>`` while a queue is being
deleted (a rename first, so that the delete is atomic; leftovers of an interrupted delete are removed at
the next open). It also holds ``parts.json``, the list of the queues and keyed logs the store created, which
the open checks before it changes anything (:mod:`._parts`). Anything else was not written by the store: it
is left alone and reported.
"""

from __future__ import annotations

import errno
import os
import shutil
import time
from typing import Final

import attrs

from ._errors import BrokerLockedError, InvalidQueueNameError, QueueExistsError
from ._parts import PARTS_FILE, PartList, check_parts, is_part_list_leftover, write_part_list
from ._recovery import RecoveredLog, RecoveryMode, recover_queue
from ._segment import (
    DELETED_PREFIX,
    KEYED_DIR,
    QUARANTINE_DIR,
    fsync_dir,
    list_segment_numbers,
    stray_entries,
    validate_queue_name,
)

__all__ = [
    "KEYED_DIR",
    "LOCK_FILE",
    "RootListing",
    "create_queue_dir",
    "is_queue_dir",
    "list_keyed",
    "list_root",
    "lock_directory",
    "open_root",
    "retire_queue_dir",
    "store_kind",
]

LOCK_FILE: Final = "broker.lock"
_O_DIRECTORY: Final = getattr(os, "O_DIRECTORY", 0)
_O_CLOEXEC: Final = getattr(os, "O_CLOEXEC", 0)


@attrs.frozen(kw_only=True)
class RootListing:
    """What :func:`open_root` found in a broker directory."""

    #: the locked directory descriptor (the caller closes it, which releases the lock)
    lock_fd: int
    #: queue directories, sorted
    queues: tuple[str, ...]
    #: entries the store did not write (left alone), sorted
    strays: tuple[str, ...]
    #: the durable queues and keyed logs there (the part list now says the same)
    parts: PartList


def lock_directory(directory: str, *, exclusive: bool, wait_seconds: float = 0.0) -> int:
    """Open ``directory`` read-only and ``flock`` it (waiting up to ``wait_seconds``); returns the
    descriptor, which holds the lock until closed.

    Raises:
        BrokerLockedError: another process holds a conflicting lock.
        OSError: the directory cannot be opened.
    """
    import fcntl

    fd = os.open(directory, os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC)
    try:
        deadline = time.monotonic() + wait_seconds
        flags = (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB
        while True:
            try:
                fcntl.flock(fd, flags)
                return fd
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise
                if time.monotonic() >= deadline:
                    holders = "".join(f" ({holder})" for holder in _holders(directory))
                    raise BrokerLockedError(
                        f"broker directory {directory} is in use by another process{holders}"
                    ) from None
                time.sleep(0.01)
    except BaseException:
        os.close(fd)
        raise


#: ``/proc/PID/stat`` states worth naming when such a process holds a store (the rest: "running").
_PROC_STATES: Final = {"T": "stopped (SIGSTOP: SIGCONT or kill it)", "t": "stopped by a debugger",
                       "D": "waiting in the kernel (disk I/O)", "Z": "a zombie"}  # fmt: skip


def _holders(directory: str) -> list[str]:
    """The other processes that have ``directory`` open (Linux ``/proc``; best effort, else none), named
    by pid, state and command: the holder of a store lock may be a commit helper that outlived its node
    because it is frozen, and the operator needs its pid."""
    try:
        target = os.path.realpath(directory)
        pids = [int(e) for e in os.listdir("/proc") if e.isdigit() and int(e) != os.getpid()]
    except OSError:
        return []
    found = []
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
            if not any(os.readlink(f"/proc/{pid}/fd/{fd}") == target for fd in fds):
                continue
            with open(f"/proc/{pid}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0].decode("ascii", "replace")
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
        except (OSError, IndexError):
            continue  # gone meanwhile, or not ours to look at
        found.append(f"pid {pid}, {_PROC_STATES.get(state, 'running')}: {command[:120]}")
    return found


def open_root(directory: str, wait_seconds: float = 0.0, *, require_part_list: bool = False) -> RootListing:
    """Create (if needed) and lock the broker directory, check that every part it created is there, finish
    interrupted deletes, list its queues, and bring the part list up to date (it gets one if it had none).

    Args:
        require_part_list: refuse a directory without a part list (its owner knows it had one) instead of
            giving it one that lists what is there.

    Raises:
        MissingPartError: a recorded part is missing (nothing in the directory was changed).
        PartListError: the part list is damaged, or missing although required (nothing was changed).
        BrokerLockedError: another process holds the lock.
    """
    os.makedirs(directory, exist_ok=True)
    fd = lock_directory(directory, exclusive=True, wait_seconds=wait_seconds)
    try:
        recorded = check_parts(directory, require_part_list=require_part_list)
        marker = os.path.join(directory, LOCK_FILE)
        if not os.path.exists(marker):
            os.close(os.open(marker, os.O_WRONLY | os.O_CREAT | _O_CLOEXEC, 0o644))
            fsync_dir(directory)
        for entry in os.listdir(directory):
            full = os.path.join(directory, entry)
            if entry.startswith(DELETED_PREFIX) and os.path.isdir(full) and not os.path.islink(full):
                shutil.rmtree(full, ignore_errors=True)  # an interrupted delete_queue
            elif is_part_list_leftover(entry) and os.path.isfile(full) and not os.path.islink(full):
                os.unlink(full)  # an interrupted replacement of the part list
        queues, strays = list_root(directory)
        # What is there now is what the list must say: every recorded part is (checked above) but those
        # whose delete was interrupted; a part that is there unrecorded was created, and the crash came
        # before it was recorded (or the list is new).
        parts = PartList(queues=frozenset(queues), keyed=frozenset(list_keyed(directory)))
        if parts != recorded:
            write_part_list(directory, parts)
        return RootListing(lock_fd=fd, queues=queues, strays=strays, parts=parts)
    except BaseException:
        os.close(fd)
        raise


def list_root(directory: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(queue names, entries the store did not write) of a broker directory, both sorted; reads only.

    A queue directory is named like a queue and holds what the store writes there (segments, manifest),
    or nothing at all (a queue whose creation was interrupted). A directory named like a queue that holds
    only other files is not the store's: it is reported, and never written to.
    """
    queues: list[str] = []
    strays: list[str] = []
    for entry in sorted(os.listdir(directory)):
        full = os.path.join(directory, entry)
        if entry == LOCK_FILE or (entry in (QUARANTINE_DIR, KEYED_DIR) and os.path.isdir(full)):
            continue
        if (entry == PARTS_FILE or is_part_list_leftover(entry)) and os.path.isfile(full):
            continue
        if entry.startswith(DELETED_PREFIX) and os.path.isdir(full):
            continue  # an interrupted delete_queue, finished by the next open
        if is_queue_dir(full):
            queues.append(entry)
        else:
            strays.append(entry)
    return tuple(queues), tuple(strays)


def list_keyed(directory: str) -> tuple[str, ...]:
    """The keyed logs of a broker directory (``keyed/<name>/``, each laid out like a queue), sorted."""
    keyed = os.path.join(directory, KEYED_DIR)
    if os.path.islink(keyed) or not os.path.isdir(keyed):
        return ()
    return tuple(name for name in sorted(os.listdir(keyed)) if is_queue_dir(os.path.join(keyed, name)))


def is_queue_dir(path: str) -> bool:
    """Whether ``path`` is a queue directory the store wrote (see :func:`list_root`)."""
    if not _is_queue_name(os.path.basename(path)) or os.path.islink(path) or not os.path.isdir(path):
        return False
    entries = os.listdir(path)
    return not entries or len(stray_entries(path)) < len(entries)


def _is_queue_name(entry: str) -> bool:
    try:
        validate_queue_name(entry)
    except InvalidQueueNameError:
        return False
    return True


def create_queue_dir(root: str, path: str) -> RecoveredLog:
    """Create the directory of a new queue (durably) and recover it (its first segment is created).

    Raises:
        QueueExistsError: ``path`` exists but holds only files the store did not write.
    """
    try:
        os.mkdir(path)
    except FileExistsError:
        if not is_queue_dir(path):
            raise QueueExistsError(
                f"{path} exists and was not written by the store: move it away to create queue"
                f" {os.path.basename(path)}"
            ) from None
    else:
        fsync_dir(root)
    return recover_queue(path, RecoveryMode.OPEN)


def retire_queue_dir(root: str, path: str) -> str:
    """Take a queue's directory away (renamed, atomically and durably: the queue is gone); returns where it
    went, for :func:`remove_tree_gently` (an interrupted removal is finished at the next open)."""
    n = 0
    while os.path.exists(target := os.path.join(root, f"{DELETED_PREFIX}{os.path.basename(path)}-{n}")):
        n += 1
    os.rename(path, target)
    fsync_dir(root)
    return target


def store_kind(directory: str) -> str | None:
    """``"broker"`` if ``directory`` is a broker directory, ``"queue"`` if it is one queue's directory,
    ``None`` if it is neither (nothing the store wrote is in it). Never writes anything."""
    if os.path.isfile(os.path.join(directory, LOCK_FILE)) or os.path.isfile(
        os.path.join(directory, PARTS_FILE)
    ):
        return "broker"
    if list_segment_numbers(directory):
        return "queue"
    for entry in os.listdir(directory):
        full = os.path.join(directory, entry)
        if is_queue_dir(full) and list_segment_numbers(full):
            return "broker"
    return None
