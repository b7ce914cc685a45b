"""Damaging a file in place, the ways a crash, a bad disk or an operator's mistake leave one: shared by the
corruption harnesses (``tests/node/corruption.py``, ``tests/float/test_corruption.py``,
``tests/network/test_corruption.py``)."""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path
from typing import Final

__all__ = ["DAMAGES", "campaign_damages", "damage_file"]

#: Every kind :func:`damage_file` knows.
DAMAGES: Final = ("flip", "truncate", "zero4k", "append", "older", "delete", "empty", "directory")
#: The kinds a suite run tries on every file (CI's time is bounded): the others say what these say for most
#: files (a small file zeroed or emptied reads as garbage or as a truncation; deleted, as a missing file,
#: which every command's own tests cover). ``CORDA_TRIO_CORRUPTION=all`` tries all of them.
SUITE_DAMAGES: Final = ("flip", "truncate", "append", "older", "directory")


def campaign_damages() -> tuple[str, ...]:
    """The kinds of damage a corruption campaign of the suite tries on every file (see ``SUITE_DAMAGES``)."""
    return DAMAGES if os.environ.get("CORDA_TRIO_CORRUPTION") == "all" else SUITE_DAMAGES


def damage_file(path: Path, kind: str, rng: random.Random, older: Path | None) -> str:
    """Damage ``path`` in place the ``kind`` way (one of :data:`DAMAGES`); a short description of what was
    done. ``older`` is an earlier copy of the file, put back for ``older``."""
    size = path.stat().st_size
    if kind == "flip":
        if size == 0:
            return "empty file: nothing to flip"
        offset, bit = rng.randrange(size), rng.randrange(8)
        with open(path, "r+b") as f:
            f.seek(offset)
            byte = f.read(1)[0]
            f.seek(offset)
            f.write(bytes([byte ^ (1 << bit)]))
        return f"bit {bit} of byte {offset} flipped"
    if kind == "truncate":
        offset = rng.randrange(size) if size else 0
        os.truncate(path, offset)
        return f"truncated at {offset} of {size}"
    if kind == "zero4k":
        if size == 0:
            return "empty file: nothing to zero"
        start = rng.randrange(0, size, 4096)
        with open(path, "r+b") as f:
            f.seek(start)
            f.write(bytes(min(4096, size - start)))
        return f"bytes {start}..{min(start + 4096, size)} zeroed"
    if kind == "append":
        garbage = rng.randbytes(rng.choice((1, 7, 40, 100, 4096)))
        with open(path, "ab") as f:
            f.write(garbage)
        return f"{len(garbage)} random bytes appended"
    if kind == "older":
        if older is None or not older.exists():
            return "no older copy: left as it is"
        if older.read_bytes() == path.read_bytes():
            return "older copy identical"
        shutil.copyfile(older, path)
        return "the older copy put back"
    if kind == "delete":
        path.unlink()
        return "deleted"
    if kind == "empty":
        os.truncate(path, 0)
        return "emptied"
    if kind == "directory":
        path.unlink()
        path.mkdir()
        return "replaced by a directory"
    raise ValueError(kind)
