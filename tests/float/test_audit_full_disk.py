"""The float's audit log on a real full disk (a 64 KiB tmpfs): the write that fails fails the log once, and
the file ends with the last whole line, not a fragment of the one the disk took only part of.

Needs root (``mount``); skipped with the reason otherwise."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from corda_trio.bridge import float as fl


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a small file system needs root")
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_fails_the_audit_log_once_and_leaves_whole_lines(small_tmpfs: Path) -> None:
    path = small_tmpfs / "audit.jsonl"
    failures: list[fl.AuditLogError] = []
    audit = fl.AuditLog(path, max_bytes=1 << 20, on_failure=failures.append)
    written = 0
    while not failures:
        audit.write(
            "connection", peer=f"10.0.0.{written % 250}:{written}", pad="x" * 997
        )  # no page divides it
        written += 1
    assert [str(f) for f in failures] == [f"cannot write the audit log {path}: No space left on device"]
    data = path.read_bytes()
    assert data.endswith(b"\n"), data[-80:]
    lines = [json.loads(line) for line in data.splitlines()]
    assert [e["peer"] for e in lines] == [f"10.0.0.{i % 250}:{i}" for i in range(written - 1)]
    audit.write("connection", peer="after")  # dropped: the log failed already
    assert path.read_bytes() == data and len(failures) == 1
