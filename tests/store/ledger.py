"""Reading the ledger a crash-test child writes (one ``os.write`` per line, then ``kill -9``)."""

from __future__ import annotations

from pathlib import Path


def whole_lines(path: Path) -> list[str]:
    """The ledger's lines, without a last one that the kill cut short.

    One ``write`` of a short line is not always whole after ``kill -9``: a write that straddles a page of the
    page cache is copied a page at a time, and SIGKILL can end it between the two (seen once in CI: an ``E``
    line that ended after the message id). Such a line is the last one and has no newline; it is dropped
    (the fact it reported happened; the checks treat it as they treat a fact that was not reported).
    """
    text = path.read_bytes().decode("ascii")
    lines = text.split("\n")
    return lines[:-1]  # (the part after the last newline: empty, or cut short)
