"""The float's audit log: one JSON object per line, rotated by size; per-peer latency summaries.

Theory of operation
-------------------
The audit log is the only thing a float writes to disk. Each connection event is one line: ``ts`` (UTC,
ISO 8601 with milliseconds), ``event`` and the event's fields (peer address, legal name, TLS outcome, link
attached, refused or detached, close with its condition, control link up/down, activation). Lines are written
and flushed one at a time, so a crash loses at most the line being written; a line is a few hundred bytes, so
writing it on the event loop costs less than handing it to a thread. A line the disk took only part of
(it filled up during the write) is cut off again, so the file always ends with a whole line.

A line that cannot be written (the disk is full, the file's device is gone) makes the log *failed*: the
float does not run without its audit trail. :attr:`AuditLog.failure` then holds an :class:`AuditLogError`
naming the file and the reason, ``on_failure`` is called once with it (the float stops on it: see
``Float.run``; without ``on_failure`` the write raises it), and later lines are dropped.

Rotation: before a line would take the file past ``max_bytes``, ``audit.jsonl`` becomes ``audit.jsonl.1``
(``.1`` becomes ``.2`` and so on, the oldest beyond ``backups`` is deleted) and a new file is started.
A named pipe a log collector reads, or a device, at ``path`` is written and never rotated; a named pipe
that nobody reads is refused when the log is opened (``files.open_for_appending``), not waited on.

:class:`LatencySummary` collects, per peer legal name, the time from a peer's delivery arriving at the float
to the inside's outcome for it; :meth:`AuditLog.write_latency` writes one ``latency`` line per peer (count,
p50, p99, max in milliseconds) and starts over. The float calls it once a minute, and once more when it stops
(for the minute so far).
"""

from __future__ import annotations

import bisect
import datetime as dt
import json
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, Final

import attrs

from corda_trio.files import open_for_appending

__all__ = [
    "DEFAULT_AUDIT_BACKUPS",
    "DEFAULT_AUDIT_MAX_BYTES",
    "LATENCY_BUCKETS",
    "AuditLog",
    "AuditLogError",
    "LatencySummary",
]

#: 10 MiB per file and 5 old files: a week of a busy float's connection events fits.
DEFAULT_AUDIT_MAX_BYTES: Final = 10 * 1024 * 1024
DEFAULT_AUDIT_BACKUPS: Final = 5


def _ends_with_newline(path: Path) -> bool:
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"


def _utc_now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class AuditLogError(Exception):
    """The audit log cannot be written (the message names the file and why)."""


@attrs.define(eq=False)
class AuditLog:
    """JSON lines at ``path`` (``None``: the events go only to ``echo``), rotated at ``max_bytes``."""

    path: Path | None
    max_bytes: int = DEFAULT_AUDIT_MAX_BYTES
    backups: int = DEFAULT_AUDIT_BACKUPS
    #: Also called with every line written (the CLI prints the important ones).
    echo: Callable[[dict[str, Any]], None] | None = None
    clock: Callable[[], str] = _utc_now
    #: Called once, with the error, when a line cannot be written (it may be called from any thread that
    #: wrote the line); without it, that write raises the error.
    on_failure: Callable[[AuditLogError], None] | None = None
    #: Set once a line could not be written; from then on lines are dropped.
    failure: AuditLogError | None = None
    _file: IO[bytes] | None = None
    _size: int = 0
    _rotates: bool = True

    def __attrs_post_init__(self) -> None:
        if self.max_bytes < 256:
            raise ValueError(f"max_bytes must be at least 256, got {self.max_bytes}")
        if self.path is not None:
            self._open()

    def _open(self) -> None:
        assert self.path is not None
        # (not open(): a named pipe nobody reads would stop the float in it for ever, before it is up)
        fd = open_for_appending(self.path)
        self._file = open(fd, "ab")  # kept open; closed by close()
        st = os.fstat(fd)
        # A pipe a log collector reads, or a device, is not rotated (renaming it would not rotate it).
        self._rotates = stat.S_ISREG(st.st_mode)
        self._size = st.st_size if self._rotates else 0
        if self._rotates and self._size and not _ends_with_newline(self.path):
            # (a line a crash or a damaged disk left torn is ended as it is: the new lines start whole)
            self._file.write(b"\n")
            self._file.flush()
            self._size += 1

    def _rotate(self) -> None:
        assert self.path is not None and self._file is not None
        self._file.close()
        for i in range(self.backups, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{i}")
            if i == self.backups:
                older.unlink(missing_ok=True)
            else:
                newer = self.path.with_name(f"{self.path.name}.{i + 1}")
                if older.exists():
                    os.replace(older, newer)
        if self.backups > 0:
            os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))
        else:
            self.path.unlink(missing_ok=True)
        self._open()

    def write(self, event: str, **fields: Any) -> None:
        """Append one line ``{"ts", "event", **fields}``."""
        record = {"ts": self.clock(), "event": event, **fields}
        if self.echo is not None:
            self.echo(record)
        if self._file is None or self.failure is not None:
            return
        line = (json.dumps(record, separators=(",", ":"), default=str) + "\n").encode()
        try:
            if self._rotates and self._size and self._size + len(line) > self.max_bytes:
                self._rotate()
            assert self._file is not None
            self._file.write(line)
            self._file.flush()
        except OSError as exc:
            self.failure = AuditLogError(f"cannot write the audit log {self.path}: {exc.strerror or exc}")
            self.close()
            self._cut_partial_line()
            if self.on_failure is None:
                raise self.failure from None
            self.on_failure(self.failure)
            return
        self._size += len(line)

    def _cut_partial_line(self) -> None:
        """After a failed write (the file is closed): truncate the file back to its last whole line, so
        that a reader of the JSON lines finds no fragment at its end. Best effort: a file that is gone
        (a rotation failed half-way) is left as it is."""
        assert self.path is not None
        try:
            if os.stat(self.path).st_size > self._size:
                os.truncate(self.path, self._size)
        except OSError:
            pass

    def write_latency(self, summary: LatencySummary) -> None:
        """One ``latency`` line per peer seen since the last call; then ``summary`` starts over."""
        for peer, figures in summary.drain().items():
            self.write("latency", legal_name=peer, **figures)

    def close(self) -> None:
        """Close the file (what it could not flush is lost: the failure was reported already)."""
        if self._file is not None:
            file, self._file = self._file, None
            try:
                file.close()
            except OSError:
                pass


#: Upper bounds (seconds) of :attr:`LatencySummary.buckets`: a delivery stored by the inside takes about a
#: millisecond on one host, one waiting for an inside's fsync or credit far longer.
LATENCY_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


@attrs.define(eq=False)
class LatencySummary:
    """Forwarding latencies (seconds) per peer legal name, summarised and reset by :meth:`drain`; and, never
    reset, their count, sum and histogram over all peers (:data:`LATENCY_BUCKETS`, for a metrics scrape)."""

    _samples: dict[str, list[float]] = attrs.field(factory=dict)
    count: int = 0
    sum_seconds: float = 0.0
    #: samples at most each bound of :data:`LATENCY_BUCKETS` (not cumulative: one bucket per sample)
    buckets: list[int] = attrs.field(factory=lambda: [0] * (len(LATENCY_BUCKETS) + 1))

    def add(self, peer: str, seconds: float) -> None:
        self._samples.setdefault(peer, []).append(seconds)
        self.count += 1
        self.sum_seconds += seconds
        self.buckets[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1

    def drain(self) -> dict[str, dict[str, float | int]]:
        out: dict[str, dict[str, float | int]] = {}
        for peer, samples in self._samples.items():
            ordered = sorted(samples)
            n = len(ordered)

            def pick(q: float, ordered: list[float] = ordered, n: int = n) -> float:
                return round(ordered[min(n - 1, max(0, int(q * n + 0.999999) - 1))] * 1000, 3)

            out[peer] = {"count": n, "p50_ms": pick(0.5), "p99_ms": pick(0.99), "max_ms": pick(1.0)}
        self._samples = {}
        return out
