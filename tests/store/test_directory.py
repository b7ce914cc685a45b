"""The broker directory: queue names that cannot collide with the store's files, files and directories
the store did not write (left alone and reported), the directory lock, and read-only checking."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import trio

from corda_trio import store
from corda_trio.node._cli import main
from corda_trio.store._segment import list_segment_numbers, segment_path

QUEUE = "p2p.inbound.DLdir"
REPO = Path(__file__).resolve().parents[2]


def _read(path: str | Path) -> bytes:
    return Path(path).read_bytes()


async def _fill(root: Path, count: int = 5) -> list[bytes]:
    payloads = [b"m-%d" % i for i in range(count)]
    async with store.open_broker(root) as broker:
        queue = await broker.declare_queue(QUEUE)
        await queue.enqueue_many(payloads)
    return payloads


async def _payloads(root: Path) -> list[bytes]:
    async with store.open_broker(root) as broker:
        return [m.payload async for m in broker.get_queue(QUEUE).browse()]


@pytest.mark.parametrize("name", ["x.seg", "X.SEG", "00000000000000000001.seg", "q.seg.compact", "a.lock"])
def test_names_that_end_like_the_stores_own_files_are_rejected(name: str) -> None:
    with pytest.raises(store.InvalidQueueNameError, match="ends like a file of the store"):
        store.validate_queue_name(name)


async def test_unicode_digit_file_names_are_strays_never_segments(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    payloads = await _fill(tmp_path)
    qdir = tmp_path / QUEUE
    (segment,) = list_segment_numbers(str(qdir))
    healthy = _read(segment_path(str(qdir), segment))
    arabic = "\u0660" * 19 + "\u0661" + ".seg"  # Arabic-Indic digits: \d matches them, [0-9] does not
    fullwidth = "\uff10" * 19 + "\uff11" + ".seg"
    for stray in (arabic, fullwidth):
        (qdir / stray).write_bytes(b"garbage" * 10)
    assert list_segment_numbers(str(qdir)) == [segment]
    recovered = store.recover_queue(str(qdir), store.RecoveryMode.CHECK)
    assert set(recovered.report.stray_files) == {arabic, fullwidth}
    assert main(["store", "check", str(tmp_path), "--repair"]) == 0
    out = capsys.readouterr().out
    assert f"not written by the store, left alone: {qdir / arabic}" in out
    assert _read(segment_path(str(qdir), segment)) == healthy  # untouched
    assert _read(qdir / arabic) == b"garbage" * 10
    assert await _payloads(tmp_path) == payloads


async def test_stray_directories_are_reported_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    payloads = await _fill(tmp_path)
    qdir = tmp_path / QUEUE
    (qdir / "00000000000000000099.seg").mkdir()  # a directory named like a segment
    (qdir / "notes").mkdir()
    (tmp_path / "not a queue").mkdir()
    (tmp_path / "stray.txt").write_text("x")
    assert main(["store", "check", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "left alone" in out and "00000000000000000099.seg" in out and "notes" in out
    assert main(["store", "list", str(tmp_path)]) == 0
    assert await _payloads(tmp_path) == payloads
    assert (qdir / "00000000000000000099.seg").is_dir() and (tmp_path / "not a queue").is_dir()


def test_a_directory_named_like_a_queue_that_the_store_did_not_write_is_never_written_to(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    payloads = trio.run(_fill, tmp_path)
    photos = tmp_path / "photos"
    photos.mkdir()
    (photos / "cat.jpg").write_bytes(b"meow")
    (tmp_path / "empty").mkdir()  # what an interrupted declare_queue leaves: a queue with nothing in it

    async def declare() -> None:
        async with store.open_broker(tmp_path) as broker:
            assert broker.list_queues() == ["empty", QUEUE]
            with pytest.raises(store.QueueExistsError, match="was not written by the store"):
                await broker.declare_queue("photos")

    trio.run(declare)
    assert main(["store", "list", str(tmp_path)]) == 0
    listed = capsys.readouterr().out
    assert "photos" not in listed and QUEUE in listed
    assert main(["store", "check", str(tmp_path)]) == 0
    assert f"left alone: {photos}" in capsys.readouterr().out
    assert main(["store", "compact", str(tmp_path)]) == 0
    assert "photos" not in capsys.readouterr().out
    assert sorted(os.listdir(photos)) == ["cat.jpg"] and _read(photos / "cat.jpg") == b"meow"
    assert trio.run(_payloads, tmp_path) == payloads


async def test_deleting_broker_lock_does_not_let_a_second_opener_in(tmp_path: Path) -> None:
    config = store.BrokerConfig(lock_wait_seconds=0.2)
    async with store.open_broker(tmp_path) as broker:
        await broker.declare_queue(QUEUE)
        os.unlink(tmp_path / "broker.lock")
        with pytest.raises(store.BrokerLockedError, match="in use"):
            async with store.open_broker(tmp_path, config=config):
                pass
        assert main(["store", "check", str(tmp_path)]) == 1  # the queue is there: the lock refuses
    async with store.open_broker(tmp_path, config=config):
        assert (tmp_path / "broker.lock").exists()  # the marker is back


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run the check as another user")
def test_check_works_for_a_read_only_user() -> None:
    """``store check`` as a user who may read the store but not write to it (a forked child that drops
    to ``nobody``: the interpreter is already loaded, so nothing outside the store must be readable)."""
    import fcntl  # noqa: F401  (imported lazily by the lock; the child could not load it any more)

    root = Path(tempfile.mkdtemp(prefix="corda-trio-ro-"))  # outside pytest's private (0700) tmp
    try:
        os.chmod(root, 0o755)
        payloads = trio.run(_fill, root / "broker")
        before = {p: p.stat().st_mtime_ns for p in root.rglob("*")}
        out_path = root / "out"
        pid = os.fork()
        if pid == 0:  # the child: never returns into pytest
            status = 70
            try:
                with open(out_path, "w") as out, contextlib.redirect_stdout(out):
                    os.setgid(65534)
                    os.setuid(65534)
                    status = main(["store", "check", str(root / "broker")])
            finally:
                os._exit(status)
        _pid, status = os.waitpid(pid, 0)
        output = out_path.read_text()
        assert os.waitstatus_to_exitcode(status) == 0, output
        assert f"OK       {QUEUE}: {len(payloads)} messages" in output
        assert {p: p.stat().st_mtime_ns for p in root.rglob("*") if p != out_path} == before
    finally:
        shutil.rmtree(root)


def test_files_nobody_can_reach_are_released_a_step_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Freeing a big file at once stalls every fsync on the file system while the journal commits it:
    unreachable files are shrunk step by step, then closed; a deleted queue's tree goes the same way."""
    from corda_trio.store import _segment

    sizes: list[int] = []
    real_ftruncate = os.ftruncate

    def ftruncate(fd: int, size: int) -> None:
        sizes.append(size)
        real_ftruncate(fd, size)

    monkeypatch.setattr(_segment, "RELEASE_PAUSE_SECONDS", 0.0)
    monkeypatch.setattr(_segment.os, "ftruncate", ftruncate)
    step = _segment.RELEASE_STEP_BYTES
    big = tmp_path / "big"
    big.write_bytes(b"x" * (3 * step + 5))
    fd = os.open(big, os.O_RDWR)
    os.unlink(big)
    _segment.release_file(fd)
    assert sizes == [2 * step + 5, step + 5, 5]
    with pytest.raises(OSError):
        os.fstat(fd)  # closed
    sizes.clear()
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "a.seg").write_bytes(b"y" * (step + 1))
    (tree / "sub" / "b").write_bytes(b"z")
    (tree / "link").symlink_to(tmp_path / "elsewhere")
    _segment.remove_tree_gently(str(tree))
    assert not tree.exists() and sizes == [1]


async def test_deleting_a_big_queue_removes_its_directory(tmp_path: Path) -> None:
    config = store.BrokerConfig(segment_bytes=1024 * 1024)
    async with store.open_broker(tmp_path, config=config) as broker:
        queue = await broker.declare_queue(QUEUE)
        for _ in range(12):
            await queue.enqueue_many([b"p" * 100_000] * 3)
        assert len(list_segment_numbers(str(tmp_path / QUEUE))) > 2
        await broker.delete_queue(QUEUE)
        assert not await trio.Path(tmp_path / QUEUE).exists()
        assert [p.name for p in await trio.Path(tmp_path).iterdir() if p.name.startswith(".deleted")] == []
        again = await broker.declare_queue(QUEUE)
        assert again.statistics().depth == 0
