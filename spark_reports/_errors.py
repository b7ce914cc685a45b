"""Errors of the report pipeline (each is shown to the operator as one line)."""

from __future__ import annotations

__all__ = [
    "BadRecordsError",
    "ReportEnvironmentError",
    "ReportError",
    "ReportInputError",
    "ReportOutputError",
]

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._validate import BadRecord


class ReportError(Exception):
    """Root of the report errors."""


class ReportInputError(ReportError):
    """The input directory is missing, empty, or holds malformed records (the message names the file)."""


class ReportEnvironmentError(ReportError):
    """Spark cannot run here (no Java, bad master URL, not enough memory)."""


class ReportOutputError(ReportError):
    """The report or its tables cannot be written (the disk is full or read-only): the message says where."""


class BadRecordsError(ReportInputError):
    """Records that break the schema; :attr:`lines` holds ``FILE:LINE: problem`` for the first few.

    Attributes:
        listed: the first bad records, by file and line.
        total: how many records are bad in all.
    """

    def __init__(self, listed: tuple[BadRecord, ...], total: int) -> None:
        more = total - len(listed)
        super().__init__(
            f"{total:,} bad record(s) in the input"
            + (f" (the first {len(listed)} are listed)" if more > 0 else "")
            + "; fix them, or pass --skip-bad to leave them out of the report"
        )
        self.listed = listed
        self.total = total

    @property
    def lines(self) -> list[str]:
        """One ``FILE:LINE: what is wrong`` per listed record, then ``... and N more`` if some are not."""
        out = [b.format() for b in self.listed]
        if self.total > len(self.listed):
            out.append(f"... and {self.total - len(self.listed):,} more bad record(s)")
        return out
