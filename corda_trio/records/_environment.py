"""What a run measured on (goes into the meta file): CPU count, Python, OS, host, git commit."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import trio

__all__ = ["environment_metadata"]


def _git_commit(start: Path) -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(start), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5
        )
        if out.returncode != 0:
            return None
        commit = out.stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(start), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=5,
        )
        return commit + ("-dirty" if dirty.returncode == 0 and dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def environment_metadata() -> dict[str, Any]:
    """CPU count, Python, OS, host name and the git commit of this checkout (``None`` outside git)."""
    return {
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
        "python_implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "hostname": socket.gethostname(),
        "git_commit": _git_commit(Path(__file__).resolve().parent),
        "trio": trio.__version__,
    }
