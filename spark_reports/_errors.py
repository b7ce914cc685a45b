"""Errors of the report pipeline (each is shown to the operator as one line)."""

from __future__ import annotations

__all__ = ["ReportEnvironmentError", "ReportError", "ReportInputError"]


class ReportError(Exception):
    """Root of the report errors."""


class ReportInputError(ReportError):
    """The input directory is missing, empty, or holds malformed records (the message names the file)."""


class ReportEnvironmentError(ReportError):
    """Spark cannot run here (no Java, bad master URL, not enough memory)."""
