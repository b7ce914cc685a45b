"""The store's part list (``parts.json``): which queues and keyed logs the store has created (blocking calls).

Theory of operation
-------------------
Inside one queue, the manifest makes a deleted segment visible (``protocol_spec/store-format.md``
§2a). Nothing inside a queue can tell that the whole queue is gone: a queue's directory deleted (an
outbound queue with unsent messages, a dedup generation) or emptied, or the keyed log of the flow
checkpoints deleted, would look to the open like a queue never created, or one to create again, empty.
So the broker directory also
holds ``parts.json``, the names of the durable queues and keyed logs the store created, replaced whole
(temporary file, fsync, rename, fsync of the directory) only when that set changes: a queue declared for the
first time, a queue deleted. Enqueues, acks and puts never touch it.

*Open.* Before anything in the directory is changed, every recorded part must be there: its directory,
holding its manifest or segments that recovery can judge (:func:`_why_missing`). A part that is not is
reported (:class:`~._errors.MissingPartError`) and the broker does not open. Recording follows the data and
leaves the data first, so every crash leaves a list the check accepts:

* *creation*: the queue's directory, first segment and manifest are durable before its name is recorded. A
  crash in between leaves a part that is not recorded yet; the open records every part it finds (it can
  only have come from such a creation, from a copy the operator put there, or from a store written before
  this list existed: a directory without ``parts.json`` gets one listing what is there).
* *deletion*: the queue's directory is first renamed to ``.deleted-<name>-<n>`` (the commit point of the
  delete), then its name leaves the list, then the directory is removed. A recorded part that is missing
  while such a directory is there was being deleted: it leaves the list at the next open.

A part that was never created (the keyed log of a node that never ran a flow, the outbound queue of a peer
never sent to) is not in the list, so its absence is no damage.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import Final

import attrs

from corda_trio import files

from ._errors import MissingPartError, NewerFormatError, PartListError
from ._record import SEGMENT_HEADER_BYTES, peek_format_version
from ._segment import (
    DELETED_PREFIX,
    KEYED_DIR,
    MANIFEST_NAME,
    PARTS_FILE,
    check_queue_format,
    list_segment_numbers,
    segment_path,
    validate_queue_name,
)

__all__ = [
    "PARTS_FILE",
    "MissingPart",
    "PartList",
    "check_store_format",
    "find_missing_parts",
    "is_part_list_leftover",
    "read_part_list",
    "write_part_list",
]

#: The format this version writes (and the only one it reads; a newer one is refused as such).
PARTS_FORMAT: Final = 1
#: Far above any real list (a name is at most 200 bytes; a node has one queue per peer).
_MAX_PARTS_FILE_BYTES: Final = 64 * 1024 * 1024
_KEYED_PREFIX: Final = f"{KEYED_DIR}/"


@attrs.frozen(kw_only=True)
class PartList:
    """The durable queues and keyed logs of a store (names as given to ``declare_queue`` and
    ``open_keyed_log``)."""

    queues: frozenset[str] = frozenset()
    keyed: frozenset[str] = frozenset()

    def names(self) -> list[str]:
        """Every part as the operator commands name it: queues by name, keyed logs as ``keyed/<name>``."""
        return sorted(self.queues) + [f"{_KEYED_PREFIX}{name}" for name in sorted(self.keyed)]

    def without(self, names: Iterable[str]) -> PartList:
        """This list without the parts named (as :meth:`names` names them)."""
        gone = set(names)
        return PartList(
            queues=frozenset(q for q in self.queues if q not in gone),
            keyed=frozenset(k for k in self.keyed if f"{_KEYED_PREFIX}{k}" not in gone),
        )


@attrs.frozen(kw_only=True)
class MissingPart:
    """A recorded part that is not (or no longer) in the broker directory."""

    #: as :meth:`PartList.names` names it
    name: str
    #: its directory
    path: str
    #: what is wrong: ``"its directory is gone"``, ``"its directory is empty"``, ...
    reason: str

    def __str__(self) -> str:
        kind = "keyed log" if self.name.startswith(_KEYED_PREFIX) else "queue"
        return f"{kind} {self.name.removeprefix(_KEYED_PREFIX)} ({self.path}: {self.reason})"


def read_part_list(root: str) -> PartList | None:
    """The part list of broker directory ``root``, or ``None`` if it has none.

    Raises:
        PartListError: the file cannot be read or is not a part list this version writes.
    """
    path = os.path.join(root, PARTS_FILE)
    try:
        data = files.read_small_file(path, _MAX_PARTS_FILE_BYTES)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise PartListError(path, f"cannot be read: {exc.strerror or exc}") from None
    try:
        doc = json.loads(data)
        found = doc.get("format") if isinstance(doc, dict) else None
        if type(found) is int and found > PARTS_FORMAT:  # (not a bool: True == 1)
            raise NewerFormatError(path, "part list", found, PARTS_FORMAT)
        if type(found) is not int or found != PARTS_FORMAT:
            raise ValueError(f"not a part list of format {PARTS_FORMAT}")
        queues, keyed = doc["queues"], doc["keyed"]
        if not isinstance(queues, list) or not isinstance(keyed, list):
            raise ValueError("'queues' and 'keyed' must be lists")
        for name in [*queues, *keyed]:
            validate_queue_name(name)
    except RecursionError:
        raise PartListError(path, "not the part list the store writes: nested too deeply to read") from None
    except (ValueError, KeyError, TypeError) as exc:  # (InvalidQueueNameError is a ValueError)
        reason = f"missing key {exc}" if isinstance(exc, KeyError) else str(exc)
        raise PartListError(path, f"not the part list the store writes: {reason}") from None
    return PartList(queues=frozenset(queues), keyed=frozenset(keyed))


def write_part_list(root: str, parts: PartList) -> None:
    """Replace the part list of ``root`` with ``parts`` (durably: a crash leaves the old list or this one)."""
    doc = {"format": PARTS_FORMAT, "queues": sorted(parts.queues), "keyed": sorted(parts.keyed)}
    files.write_file_atomically(
        os.path.join(root, PARTS_FILE), (json.dumps(doc, indent=1) + "\n").encode(), 0o644
    )


def is_part_list_leftover(entry: str) -> bool:
    """Whether ``entry`` of a broker directory is the temporary file of a replacement of the part list that
    a crash interrupted (removed at the next open)."""
    return entry.startswith(files.temporary_prefix(PARTS_FILE))


def check_parts(root: str, *, require_part_list: bool = False) -> PartList | None:
    """Check that broker directory ``root`` still has every part its part list names (reads only); returns
    the list (``None``: there is none, and none is required). The open does it under the directory's lock
    before it changes anything; a node's start does it first of all, before it writes anything anywhere.

    Raises:
        NewerFormatError: a newer build wrote the part list or a part (:func:`check_store_format`).
        MissingPartError: a recorded part is gone or emptied.
        PartListError: the part list is damaged, or missing although ``require_part_list``.
    """
    check_store_format(root)
    recorded = read_part_list(root)
    if recorded is None and require_part_list:
        raise PartListError(
            os.path.join(root, PARTS_FILE),
            "missing: the list of the queues and keyed logs the store created is gone, so what else is gone "
            "cannot be told",
        )
    if recorded is not None and (missing := find_missing_parts(root, recorded)):
        raise MissingPartError(root, missing)
    return recorded


def check_store_format(root: str) -> None:
    """Refuse a broker directory that a newer build wrote: its part list, or the manifest or a segment of
    any queue or keyed log, claims a format above this build's (reads only; see ``check_queue_format``).

    Raises:
        NewerFormatError: the first such file (nothing was changed).
    """
    try:
        read_part_list(root)  # (raises NewerFormatError for a list of a newer format)
    except PartListError:
        pass  # (damage, not a newer format: check_parts reports it)
    keyed = os.path.join(root, KEYED_DIR)
    for parent in (root, keyed):
        if os.path.islink(parent) or not os.path.isdir(parent):
            continue
        for entry in sorted(os.listdir(parent)):
            path = os.path.join(parent, entry)
            if parent == root and entry == KEYED_DIR:
                continue
            if not os.path.islink(path) and os.path.isdir(path):
                check_queue_format(path)


def find_missing_parts(root: str, parts: PartList) -> list[MissingPart]:
    """The parts of ``parts`` that broker directory ``root`` lacks, by name (reads only).

    A part is there when its directory is (a directory, not a symbolic link) and holds its manifest, or
    segments that recovery can judge (:func:`_why_missing`). A missing queue whose delete was interrupted
    (its ``.deleted-<name>-<n>`` directory is there) is not missing.
    """
    deleting = set()
    with os.scandir(root) as entries:
        for entry in entries:
            if entry.name.startswith(DELETED_PREFIX) and entry.is_dir(follow_symlinks=False):
                deleting.add(entry.name[len(DELETED_PREFIX) :].rpartition("-")[0])
    missing = []
    for name in parts.names():
        path = os.path.join(root, name)
        reason = _why_missing(path)
        if reason is not None and not (reason == "its directory is gone" and name in deleting):
            missing.append(MissingPart(name=name, path=path, reason=reason))
    return missing


def _why_missing(path: str) -> str | None:
    """What is missing of the recorded part at ``path``, or ``None`` when what is there is for recovery to
    judge: a manifest (whatever it holds: recovery refuses a damaged one, and a repair salvages the queue
    around it), segments in format version 1 (no manifest), or several segments or one holding records
    (refused by recovery as "manifest missing", salvaged by a repair). What recovery would take for a queue
    whose creation a crash cut short (no manifest, and no segment or one without a record) is a part the
    store created but no longer has: it was recorded only once its manifest was durable."""
    if os.path.islink(path):
        return "is a symbolic link (the store never follows one)"
    try:
        entries = os.listdir(path)
    except FileNotFoundError:
        return "its directory is gone"
    except NotADirectoryError:
        return "is not a directory"
    except OSError as exc:
        return f"cannot be read: {exc.strerror or exc}"
    if MANIFEST_NAME in entries:
        return None
    numbers = list_segment_numbers(path)
    if not numbers:
        return "its directory is empty" if not entries else "its manifest and segments are gone"
    first = segment_path(path, numbers[0])
    with open(first, "rb", buffering=0) as f:
        if peek_format_version(f.read(12)) == 1:
            return None  # written in format version 1, which had no manifest: recovery migrates it
    if len(numbers) > 1 or os.path.getsize(first) > SEGMENT_HEADER_BYTES:
        return None
    return "its manifest is gone, and every segment but an empty one"
