"""The node's log file when it cannot be written: one line on stderr, not a traceback per record."""

from __future__ import annotations

import contextlib
import errno
import io
import logging
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from corda_trio.node import _node


class _FullDisk(io.StringIO):
    """A stream whose writes fail as on a full disk, until ``full`` is cleared."""

    full = True

    def write(self, text: str) -> int:
        if self.full:
            raise OSError(errno.ENOSPC, "No space left on device")
        return super().write(text)


@contextlib.contextmanager
def _logging_to(path: Path, name: str) -> Iterator[tuple[logging.Logger, logging.Handler]]:
    """A logger of its own that writes only to the node's log file handler at ``path``."""
    handler = _node._LogFile(path, maxBytes=1 << 20, backupCount=1)
    logger = logging.getLogger(name)
    logger.propagate = False
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        yield logger, handler
    finally:
        logger.removeHandler(handler)
        handler.close()


def _records(logger: logging.Logger, n: int) -> None:
    for i in range(n):
        logger.info("record %d", i)


def test_a_log_file_that_cannot_be_written_is_one_line_then_one_when_it_can(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with _logging_to(tmp_path / "node.log", "test.log_file") as (logger, handler):
        handler.stream.close()  # type: ignore[attr-defined]
        full = _FullDisk()
        handler.stream = full  # type: ignore[attr-defined]
        _records(logger, 50)
        err = capsys.readouterr().err
        assert err == (
            f"corda-trio node: warning: cannot write the log file {tmp_path / 'node.log'}: No space left on "
            "device; log records are dropped until it can be written again\n"
        )
        full.full = False
        _records(logger, 3)
        again = f"corda-trio node: the log file {tmp_path / 'node.log'} is written again\n"
        assert capsys.readouterr().err == again
        assert full.getvalue().count("record") == 3
        full.full = True
        _records(logger, 5)
        assert capsys.readouterr().err.count("cannot write the log file") == 1  # told again, once


def test_a_record_that_cannot_be_formatted_still_reports_its_bug(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with _logging_to(tmp_path / "node.log", "test.log_file.bug") as (logger, _handler):
        logger.warning("%d", "not a number")  # logging's own report of a broken call, as before
        assert "--- Logging error ---" in capsys.readouterr().err


def test_text_log_lines_cannot_be_forged_by_what_a_client_chose(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A client id, address or legal name logged by the node may hold a newline (or a terminal escape): in
    the text format it is escaped, so every record stays one line of the file and of stderr; a traceback
    (the node's own text) keeps its lines."""
    config = types.SimpleNamespace(  # what configure_logging reads of a NodeConfig
        log_path=tmp_path / "logs" / "node.log", log_level="info", log_format=_node.LogFormat.TEXT
    )
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        path = _node.configure_logging(config)  # type: ignore[arg-type]
        forged = "order-1\n2026-01-01 00:00:00,000 INFO corda_trio.rpc: admin logged in\x1b[2J\u2028"
        logging.getLogger("corda_trio.test").warning("flow started for client id %s", forged)
        try:
            raise ValueError("boom")
        except ValueError:
            logging.getLogger("corda_trio.test").exception("failed\r\n")
        for handler in root.handlers:
            handler.flush()
    finally:
        for handler in root.handlers:
            handler.close()
        root.handlers[:], root.level = saved
    lines = path.read_text().splitlines()
    assert lines[0].endswith(
        "WARNING corda_trio.test: flow started for client id order-1\\x0a2026-01-01 00:00:00,000 INFO "
        "corda_trio.rpc: admin logged in\\x1b[2J\\u2028"
    )
    assert lines[1].endswith("ERROR corda_trio.test: failed\\x0d\\x0a")
    assert lines[2] == "Traceback (most recent call last):" and lines[-1] == "ValueError: boom"
    (err,) = capsys.readouterr().err.splitlines()[:1]
    assert err.startswith("corda-trio node: WARNING corda_trio.test: flow started") and "\\x0a2026" in err
