"""Exceptions of :mod:`corda_trio.store`; every one derives from :class:`StoreError`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from corda_trio import files

if TYPE_CHECKING:
    from ._parts import MissingPart

__all__ = [
    "BrokerLockedError",
    "CorruptSegmentError",
    "InvalidQueueNameError",
    "MissingPartError",
    "NewerFormatError",
    "PartListError",
    "QueueExistsError",
    "QueueNotFoundError",
    "StoreClosedError",
    "StoreError",
    "StoreFailedError",
    "UnknownDeliveryError",
]


class StoreError(Exception):
    """Root of the store's exceptions."""


def write_failure_text(exc: BaseException) -> str:
    """Why a write failed, for an operator: an ``OSError`` as the system says it and the file it concerns
    (``No space left on device: /store/q/00000000000000000001.seg``), anything else as its ``repr``."""
    return files.os_error_text(exc) if isinstance(exc, OSError) else repr(exc)


class InvalidQueueNameError(StoreError, ValueError):
    """A queue name that cannot safely become a directory name (the message says which rule it breaks)."""


class QueueNotFoundError(StoreError, KeyError):
    """No queue of that name exists."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else "queue not found"


class QueueExistsError(StoreError):
    """A queue exists with other properties (durable vs non-durable) than requested."""


class UnknownDeliveryError(StoreError, KeyError):
    """``ack`` / ``release`` of a message id that this consumer does not hold (never delivered to it,
    already acked or already released). A bug in the caller, never a disk problem."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown delivery"


class StoreClosedError(StoreError):
    """The broker or queue was closed."""


class BrokerLockedError(StoreError):
    """Another process holds the broker directory's lock."""


class StoreFailedError(StoreError):
    """A write or fsync failed: the queue stopped accepting work (fsync errors cannot be retried safely).

    Restart the node: recovery rebuilds the queue from what is on disk. ``__cause__`` is the ``OSError``.
    """


class CorruptSegmentError(StoreError):
    """A segment holds a record (or header) that is not valid and that a crash cannot explain.

    Recovery never skips such a record: the queue cannot be opened until an operator runs
    ``corda-trio store check --repair`` (which quarantines the segment and reports what was lost).

    Attributes:
        path: the segment file.
        offset: byte offset of the bad record (or of the header, 0).
        reason: what is wrong there.
    """

    def __init__(self, path: str, offset: int, reason: str) -> None:
        super().__init__(f"corrupt segment {path} at offset {offset}: {reason}")
        self.path = path
        self.offset = offset
        self.reason = reason


class MissingPartError(StoreError):
    """Queues or keyed logs that the store created (its part list, ``parts.json``) are gone from the broker
    directory, or emptied: what they held would be silently lost, so the broker does not open.

    Restore them, or (to give up what they held) run ``corda-trio store check --repair``, which takes them
    off the list.

    Attributes:
        directory: the broker directory.
        parts: the missing parts (name, directory, what is wrong).
    """

    def __init__(self, directory: str, parts: Sequence[MissingPart]) -> None:
        listed = "; ".join(str(p) for p in parts)
        what = "a part it created is" if len(parts) == 1 else f"{len(parts)} parts it created are"
        super().__init__(f"store {directory}: {what} missing: {listed}")
        self.directory = directory
        self.parts = tuple(parts)


class PartListError(StoreError):
    """The store's part list (``parts.json``) cannot be read or is damaged, or is missing where the
    store's owner knows there is one; ``corda-trio store check --repair`` rebuilds it from the parts there.

    Attributes:
        path: the part list's file.
        reason: what is wrong with it.
    """

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class NewerFormatError(StoreError):
    """A file of the store claims a format version above the one this build writes: a newer build of
    corda-trio wrote it. This build neither reads nor changes such a store (not even ``store check
    --repair``, which would take the newer records for damage): run the newer build on it.

    Attributes:
        path: the file.
        what: which format (``"segment"``, ``"manifest"``, ``"part list"``).
        found: the version the file claims.
        supported: the newest version this build reads.
    """

    def __init__(self, path: str, what: str, found: int, supported: int) -> None:
        super().__init__(
            f"{path}: {what} format {found} was written by a newer build of corda-trio (this build reads "
            f"format {supported} and older); nothing was read or changed: run the newer build on this store"
        )
        self.path = path
        self.what = what
        self.found = found
        self.supported = supported
