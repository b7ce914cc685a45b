"""``corda_trio.files.read_small_file``: what an operator points the node at is read with a limit."""

from __future__ import annotations

import concurrent.futures
import errno
import os
from pathlib import Path

import pytest

from corda_trio.files import MAX_OPERATOR_FILE_BYTES, check_regular_file, open_for_appending, read_small_file


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
def test_an_endless_device_is_refused_unread(device: str, tmp_path: Path) -> None:
    """Devices were read up to the limit, then refused as too large; they are refused for what they are,
    also through a symlink."""
    if not os.path.exists(device):
        pytest.skip(f"no {device} here")
    (tmp_path / "link").symlink_to(device)
    for path in (device, tmp_path / "link"):
        with pytest.raises(OSError) as info:
            read_small_file(path)
        assert info.value.errno == errno.EINVAL
        assert info.value.strerror == "not a regular file: a character device"
        assert info.value.filename == str(path)
    assert MAX_OPERATOR_FILE_BYTES == 1 << 20


def test_a_named_pipe_nobody_writes_to_is_refused_without_waiting(tmp_path: Path) -> None:
    """``open()`` of a FIFO waits for a writer: a pipe in place of a file stopped the command for ever."""
    path = tmp_path / "pipe"
    os.mkfifo(path)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        reading = pool.submit(read_small_file, path)
        try:
            error = reading.exception(timeout=10)
        finally:
            if not reading.done():  # (it waits in open(): a writer that comes and goes lets it return)
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    assert isinstance(error, OSError), "read_small_file waited for a writer"
    assert (error.errno, error.strerror) == (errno.EINVAL, "not a regular file: a named pipe")
    assert path.is_fifo()


def test_a_huge_regular_file_is_refused_after_the_limit(tmp_path: Path) -> None:
    path = tmp_path / "huge"
    with path.open("wb") as f:
        f.truncate(200 << 20)  # (sparse)
    with pytest.raises(OSError, match="larger than 1 MiB"):
        read_small_file(path)


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


def test_a_file_another_reader_opens_is_checked_as_read_small_file_would_read_it(tmp_path: Path) -> None:
    """check_regular_file refuses what read_small_file refuses, in its words, without reading or waiting."""
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "zero").symlink_to("/dev/zero")
    (tmp_path / "file").write_bytes(b"x")
    for name, problem in (("pipe", "a named pipe"), ("zero", "a character device")):
        with pytest.raises(OSError) as info:
            check_regular_file(tmp_path / name, missing_ok=True)
        assert (info.value.errno, info.value.strerror) == (errno.EINVAL, f"not a regular file: {problem}")
    with pytest.raises(IsADirectoryError):
        check_regular_file(tmp_path, missing_ok=True)
    with pytest.raises(FileNotFoundError):
        check_regular_file(tmp_path / "nope")
    check_regular_file(tmp_path / "nope", missing_ok=True)
    check_regular_file(tmp_path / "file")


def test_appending_to_a_named_pipe_nobody_reads_is_refused_at_once(tmp_path: Path) -> None:
    """A log file that is a FIFO nobody reads: ``open(path, "a")`` waits for a reader for ever."""
    path = tmp_path / "pipe"
    os.mkfifo(path)
    with pytest.raises(OSError) as info:
        open_for_appending(path)
    assert (info.value.errno, info.value.strerror) == (errno.ENXIO, "a named pipe that nobody reads")
    assert info.value.filename == str(path)


def test_appending_to_a_named_pipe_a_collector_reads_reaches_it(tmp_path: Path) -> None:
    path = tmp_path / "pipe"
    os.mkfifo(path)
    reader = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        fd = open_for_appending(path)
        assert os.get_blocking(fd)
        with open(fd, "ab") as f:
            f.write(b"a line\n")
        assert os.read(reader, 100) == b"a line\n"
    finally:
        os.close(reader)


def test_appending_creates_a_missing_file_and_appends_to_one_there(tmp_path: Path) -> None:
    path = tmp_path / "log"
    for line in (b"one\n", b"two\n"):
        with open(open_for_appending(path, 0o600), "ab") as f:
            f.write(line)
    assert path.read_bytes() == b"one\ntwo\n"
    assert path.stat().st_mode & 0o777 == 0o600
