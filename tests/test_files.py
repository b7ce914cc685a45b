"""``corda_trio.files.read_small_file``: what an operator points the node at is read with a limit."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from corda_trio.files import MAX_OPERATOR_FILE_BYTES, read_small_file


def test_a_file_of_exactly_the_limit_is_read_whole(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 4096)
    assert read_small_file(path, 4096) == b"x" * 4096
    assert read_small_file(str(path)) == b"x" * 4096  # the default limit is far above


def test_one_byte_more_is_refused_with_efbig_and_says_the_limit(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 4097)
    with pytest.raises(OSError) as info:
        read_small_file(path, 4096)
    assert info.value.errno == errno.EFBIG
    assert info.value.strerror == "larger than 4 KiB"
    assert info.value.filename == str(path)


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_an_endless_file_is_refused_after_the_limit(device: str) -> None:
    if not os.path.exists(device):
        pytest.skip(f"no {device} here")
    with pytest.raises(OSError) as info:
        read_small_file(device)
    assert info.value.errno == errno.EFBIG
    assert info.value.strerror == "larger than 1 MiB"
    assert MAX_OPERATOR_FILE_BYTES == 1 << 20


def test_a_limit_that_is_no_round_unit_is_said_in_bytes(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 1001)
    with pytest.raises(OSError, match="larger than 1000 bytes"):
        read_small_file(path, 1000)


def test_missing_files_and_directories_raise_what_open_raises(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_small_file(tmp_path / "nope")
    with pytest.raises(IsADirectoryError):
        read_small_file(tmp_path)
