"""Exceptions of :mod:`corda_trio.store`; every one derives from :class:`StoreError`."""

from __future__ import annotations

__all__ = [
    "BrokerLockedError",
    "CorruptSegmentError",
    "InvalidQueueNameError",
    "QueueExistsError",
    "QueueNotFoundError",
    "StoreClosedError",
    "StoreError",
    "StoreFailedError",
    "UnknownDeliveryError",
]


class StoreError(Exception):
    """Root of the store's exceptions."""


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
