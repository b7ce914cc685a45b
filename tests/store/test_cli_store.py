"""``corda-trio store check / list / compact``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from corda_trio import store
from corda_trio.node._cli import main
from corda_trio.store._segment import list_segment_numbers, segment_path

QUEUE = "p2p.inbound.DLcli"


def _corrupt_middle(root: Path) -> tuple[str, int]:
    qdir = str(root / QUEUE)
    path = segment_path(qdir, list_segment_numbers(qdir)[0])
    data = bytearray(Path(path).read_bytes())
    offset = 48 + 3 * (40 + 5)  # the fourth record (payloads are 5 bytes)
    data[offset + 42] ^= 0xFF  # a payload byte
    Path(path).write_bytes(bytes(data))
    return path, offset


def _append(path: str, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


async def _fill(root: Path) -> None:
    async with store.open_broker(root) as broker:
        queue = await broker.declare_queue(QUEUE)
        for i in range(8):
            await queue.enqueue(b"msg-%d" % i)
        await broker.declare_queue("internal.peers.DLother")


async def test_check_repair_and_list(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    await _fill(tmp_path)
    assert main(["store", "check", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"OK       {QUEUE}: 8 messages" in out and "internal.peers.DLother: 0 messages" in out

    path, offset = _corrupt_middle(tmp_path)
    assert main(["store", "check", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert f"CORRUPT  {QUEUE}: {path} at offset {offset}: checksum mismatch" in out
    with pytest.raises(store.CorruptSegmentError):
        async with store.open_broker(tmp_path):
            pass

    assert main(["store", "check", str(tmp_path), "--repair"]) == 0
    out = capsys.readouterr().out
    assert "REPAIRED" in out and "LOST messages (enqueues): 4, 5, 6, 7" in out
    assert "the damaged record's header claims message id 3" in out  # the damaged one is reported too
    assert f"dropped {5 * (40 + 5)} bytes from offset {offset}" in out
    quarantined = os.listdir(tmp_path / QUEUE / store.QUARANTINE_DIR)
    assert quarantined == [os.path.basename(path) + ".corrupt-0"]
    assert main(["store", "check", str(tmp_path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["corrupt"] == 0
    assert {q["queue"] for q in report["queues"]} == {QUEUE, "internal.peers.DLother"}

    async with store.open_broker(tmp_path) as broker:
        queue = broker.get_queue(QUEUE)
        assert [m.payload async for m in queue.browse()] == [b"msg-0", b"msg-1", b"msg-2"]
        assert await queue.enqueue(b"new") == 8  # the lost ids 3-7 are never handed out again

    assert main(["store", "list", str(tmp_path), "--prefix", "p2p."]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{QUEUE}: 4 messages") and "DLother" not in out


async def test_check_a_single_queue_directory_reports_a_torn_tail(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    await _fill(tmp_path)
    qdir = tmp_path / QUEUE
    path = segment_path(str(qdir), list_segment_numbers(str(qdir))[0])
    _append(path, b"\x50\x00\x00\x00partial")
    assert main(["store", "check", str(qdir)]) == 0
    out = capsys.readouterr().out
    assert "torn tail will be truncated on the next open" in out and "11 bytes" in out
    assert main(["store", "check", str(qdir), "--repair"]) == 0
    assert "torn tail truncated" in capsys.readouterr().out
    assert main(["store", "check", str(qdir)]) == 0
    assert "torn tail" not in capsys.readouterr().out


async def test_every_store_command_refuses_a_held_store_with_one_line_naming_the_pid(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """store list / check / compact on a store another process holds (a real process taking the node's
    lock) give the same line, naming that pid and saying to stop it; before, compact named the pid and
    list / check said only 'is in use by a running node: stop it first'."""
    await _fill(tmp_path)
    holder = await trio.lowlevel.open_process(
        [sys.executable, "-c", "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); "
         "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); sys.stdin.read()", str(tmp_path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert holder.stdout is not None
        said = b""
        while not said.endswith(b"\n"):
            said += await holder.stdout.receive_some(16)
        assert said == b"held\n"
        lines = []
        for command in (["list"], ["check"], ["compact"]):
            code = await trio.to_thread.run_sync(main, ["store", *command, str(tmp_path)])
            assert code == 1, command
            err = capsys.readouterr().err.strip()
            assert err.count("\n") == 0 and "Traceback" not in err, err
            lines.append(err)
    finally:
        holder.kill()
        await holder.wait()
    assert lines[0] == lines[1] == lines[2], lines
    assert f"is in use by another process (pid {holder.pid}, " in lines[0], lines[0]
    assert lines[0].endswith(": stop it first"), lines[0]


async def test_compact_and_refusal_while_the_broker_is_open(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async with store.open_broker(tmp_path) as broker:
        queue = await broker.declare_queue(QUEUE)
        await queue.enqueue_many([b"x" * 100] * 10)
        async with queue.consumer() as consumer:
            for _ in range(9):
                await consumer.ack((await consumer.receive()).message_id)
        assert main(["store", "check", str(tmp_path)]) == 1
        assert "is in use by another process" in capsys.readouterr().err
    assert await trio.to_thread.run_sync(main, ["store", "compact", str(tmp_path)]) == 0  # runs its own trio
    assert f"{QUEUE}: " in capsys.readouterr().out
    assert main(["store", "list", str(tmp_path), "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["messages"] == 1 and row["disk_bytes"] < 400


def test_bad_arguments(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["store", "check", str(tmp_path / "missing")]) == 2
    assert "no such directory" in capsys.readouterr().err
    (tmp_path / "notes.txt").write_text("not a store")
    assert main(["store", "check", str(tmp_path)]) == 1
    assert "not a store directory" in capsys.readouterr().err
    assert main(["store", "compact", str(tmp_path)]) == 1
    assert "not a broker directory" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["notes.txt"]  # nothing written to the wrong directory
    assert main(["store", "list", str(tmp_path / "notes.txt")]) == 2
    assert "notes.txt: not a directory (a file)" in capsys.readouterr().err


async def test_queue_option_that_names_another_queue_than_the_queue_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`store check QUEUE_DIR --queue OTHER` checked QUEUE_DIR and said OK, as if OTHER had been checked."""
    await _fill(tmp_path)
    assert main(["store", "check", str(tmp_path / QUEUE), "--queue", "internal.peers.DLother"]) == 2
    err = capsys.readouterr().err
    assert f"is the directory of queue {QUEUE!r}, not of 'internal.peers.DLother'" in err
    assert "\n" not in err.strip()
    assert main(["store", "check", str(tmp_path / QUEUE), "--queue", QUEUE]) == 0


async def test_a_directory_in_place_of_the_manifest_is_one_line_never_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`store list` and `store compact` printed an IsADirectoryError traceback, `store check` a raw errno."""
    await _fill(tmp_path)
    manifest = tmp_path / QUEUE / "manifest"
    manifest.unlink()
    manifest.mkdir()
    for command in (["check"], ["list"], ["compact"], ["check", "--repair"]):
        args = ["store", *command, str(tmp_path)]
        assert await trio.to_thread.run_sync(main, args) == 1
        captured = capsys.readouterr()
        text = captured.out + captured.err
        assert f"{manifest} at offset 0: the manifest is a directory" in text, text
        assert "Traceback" not in text
    assert main(["store", "list", str(tmp_path), "--prefix", "internal."]) == 0  # the other queue is fine
    assert "internal.peers.DLother: 0 messages" in capsys.readouterr().out
    with pytest.raises(store.CorruptSegmentError, match="the manifest is a directory"):
        async with store.open_broker(tmp_path):
            pass
    assert manifest.is_dir()  # nothing destroyed


async def test_compact_that_cannot_write_its_new_segment_is_one_line_and_loses_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A directory named like the queue's next segment (`store check` leaves it alone, as not the store's):
    compaction's new segment cannot be created, the queue stops, and `store compact` printed the
    StoreFailedError's traceback."""
    await _fill(tmp_path)
    await _ack_first(tmp_path, 4)  # (so that compacting seals the current segment: it reclaims more)
    qdir = str(tmp_path / QUEUE)
    os.mkdir(segment_path(qdir, list_segment_numbers(qdir)[-1] + 1))
    # as its own process (where nothing configured logging, unlike under pytest): exactly one line, the
    # store's log line that the queue stopped is not printed as well
    command = [sys.executable, "-m", "corda_trio", "store", "compact", str(tmp_path), "--queue", QUEUE]
    done = await trio.run_process(command, capture_stdout=True, capture_stderr=True, check=False)
    assert done.returncode == 1
    (line,) = done.stderr.decode().splitlines()
    assert line.startswith("corda-trio: error: cannot compact: ") and "File exists" in line
    assert await trio.to_thread.run_sync(main, ["store", "compact", str(tmp_path), "--queue", QUEUE]) == 1
    err = capsys.readouterr().err
    assert err.splitlines()[-1].startswith("corda-trio: error: cannot compact: ") and "File exists" in err
    assert "Traceback" not in err
    assert main(["store", "list", str(tmp_path), "--json", "--prefix", QUEUE]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["messages"] == 4


async def _ack_first(root: Path, count: int) -> None:
    async with store.open_broker(root) as broker, broker.get_queue(QUEUE).consumer() as consumer:
        for _ in range(count):
            await consumer.ack((await consumer.receive()).message_id)


def _queue_bytes(root: Path) -> dict[str, int]:
    qdir = root / QUEUE
    return {p.name: p.stat().st_size for p in qdir.iterdir()}


async def test_compact_never_grows_a_queue_and_says_when_it_reclaims_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`store compact` sealed the current segment whatever it held: a queue of live messages only (a node's
    dedup queue after a demo run) grew by the seal and the next segment's header (5625 -> 5737 bytes,
    reclaimed 0). Now it is left alone, byte for byte, and the line says so; one with acked messages is
    still compacted, and comes out smaller."""
    await _fill(tmp_path)
    files = _queue_bytes(tmp_path)
    before = sum(files.values()) - files["manifest"]
    for _ in range(2):
        assert await trio.to_thread.run_sync(main, ["store", "compact", str(tmp_path), "--queue", QUEUE]) == 0
        assert capsys.readouterr().out == f"{QUEUE}: {before} bytes, nothing to reclaim (left as it is)\n"
        assert _queue_bytes(tmp_path) == files
    # one acked message (45 bytes) and its ack (40) take less than sealing adds (64 + 48): left alone too
    await _ack_first(tmp_path, 1)
    files = _queue_bytes(tmp_path)
    before = sum(files.values()) - files["manifest"]
    assert await trio.to_thread.run_sync(main, ["store", "compact", str(tmp_path), "--queue", QUEUE]) == 0
    assert capsys.readouterr().out == f"{QUEUE}: {before} bytes, nothing to reclaim (left as it is)\n"
    assert _queue_bytes(tmp_path) == files
    await _ack_first(tmp_path, 3)  # four acked: 4 * 45 + 4 * 40 bytes to reclaim, more than sealing adds
    before = sum(_queue_bytes(tmp_path).values()) - files["manifest"]
    assert await trio.to_thread.run_sync(main, ["store", "compact", str(tmp_path), "--queue", QUEUE]) == 0
    line = capsys.readouterr().out
    after = sum(_queue_bytes(tmp_path).values()) - files["manifest"]
    assert before - after == 4 * 45 + 4 * 40 - 64 - 48  # less the seal and the next segment's header
    assert line == f"{QUEUE}: {before} -> {after} bytes (reclaimed {before - after})\n"
    async with store.open_broker(tmp_path) as broker:
        assert [m.payload async for m in broker.get_queue(QUEUE).browse()] == [
            b"msg-%d" % i for i in range(4, 8)
        ]


async def test_an_endless_file_in_place_of_the_manifest_is_refused_then_repaired(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A manifest name pointing at /dev/zero: `store check` read it to the end (the OOM killer took the
    process at 24 GiB). Now its first 4 KiB tell that it is not a manifest, and a repair rebuilds it with
    every message kept."""
    await _fill(tmp_path)
    manifest = tmp_path / QUEUE / "manifest"
    manifest.unlink()
    manifest.symlink_to("/dev/zero")
    assert await trio.to_thread.run_sync(main, ["store", "check", str(tmp_path)]) == 1
    text = capsys.readouterr().out
    assert f"{manifest} at offset 0: manifest: manifest is larger than 4096 bytes, expected 40" in text, text
    with pytest.raises(store.CorruptSegmentError, match="manifest is larger than 4096 bytes"):
        async with store.open_broker(tmp_path):
            pass
    assert await trio.to_thread.run_sync(main, ["store", "check", "--repair", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "REPAIRED" in out
    assert "left alone" not in out  # (the symlink was replaced by the rebuilt manifest: not left alone)
    assert manifest.is_file() and not manifest.is_symlink()
    assert main(["store", "list", str(tmp_path), "--json"]) == 0
    rows = {row["queue"]: row for row in json.loads(capsys.readouterr().out)}
    assert rows[QUEUE]["messages"] == 8  # all of them


def _overcommit_always() -> bool:
    try:
        return Path("/proc/sys/vm/overcommit_memory").read_text().strip() == "1"
    except OSError:
        return False


@pytest.mark.skipif(_overcommit_always(), reason="unconditional overcommit: the read would be attempted")
async def test_a_segment_too_large_to_scan_in_memory_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A segment extended (sparse) to a terabyte: recovery reads a segment whole, and `store check` / `list`
    / `compact` died with a MemoryError traceback. Now: one line naming the file and its size."""
    await _fill(tmp_path)
    (segment,) = sorted((tmp_path / QUEUE).glob("*.seg"))
    os.truncate(segment, 1 << 40)
    for command, code in ((["check"], 1), (["check", "--repair"], 1), (["compact"], 1), (["list"], 1)):
        assert await trio.to_thread.run_sync(main, ["store", *command, str(tmp_path)]) == code
        captured = capsys.readouterr()
        text = captured.out + captured.err
        assert f"{segment}: 1,099,511,627,776 bytes, more than this process can hold in memory" in text, text
        assert "Traceback" not in text and "MemoryError" not in text
    with pytest.raises(OSError, match="more than this process can hold in memory to scan"):
        async with store.open_broker(tmp_path):
            pass
    assert segment.stat().st_size == 1 << 40  # nothing cut, nothing moved


async def test_a_corrupt_keyed_log_is_found_and_repaired_like_a_queue(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The flow checkpoints (a keyed log under keyed/) were not looked at: `store check` said OK for a
    store whose node then refused to start on a corrupt checkpoint record, pointing at `store check`."""
    await _fill(tmp_path)
    async with store.open_broker(tmp_path) as broker:
        log = await broker.open_keyed_log("flows.checkpoints")
        for i in range(6):
            await log.put(b"flow-%d" % i, b"state-%d" % i)
    kdir = tmp_path / store.KEYED_DIR / "flows.checkpoints"
    (segment,) = sorted(kdir.glob("*.seg"))
    data = bytearray(segment.read_bytes())
    data[-5] ^= 0xFF  # inside the last record: its checksum no longer matches
    segment.write_bytes(bytes(data))
    assert await trio.to_thread.run_sync(main, ["store", "check", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert f"CORRUPT  keyed/flows.checkpoints: {segment} at offset" in out, out
    assert f"OK       {QUEUE}: 8 messages" in out  # the queues are checked as before
    assert main(["store", "list", str(tmp_path)]) == 1
    assert "keyed/flows.checkpoints: corrupt segment" in capsys.readouterr().out
    args = ["store", "check", "--repair", "--queue", "keyed/flows.checkpoints", str(tmp_path)]
    assert await trio.to_thread.run_sync(main, args) == 0
    out = capsys.readouterr().out
    assert "REPAIRED keyed/flows.checkpoints: 5 live records" in out, out
    assert "the damaged record's header claims message id 5 (LOST if it was one)" in out  # the last put
    async with store.open_broker(tmp_path) as broker:
        log = await broker.open_keyed_log("flows.checkpoints")
        assert sorted(log.items()) == [(b"flow-%d" % i, b"state-%d" % i) for i in range(5)]


async def test_compact_takes_a_keyed_log_with_no_live_records(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A stopped node whose flows had all ended (its checkpoint log empty) made `store compact` fail after
    compacting the queues: 'no queue named 'keyed/flows.checkpoints'', exit 1, though `store list` listed
    it; the empty log was taken for none (its length is 0) and looked up among the queues."""
    await _fill(tmp_path)
    async with store.open_broker(tmp_path) as broker:
        log = await broker.open_keyed_log("flows.checkpoints")
        await log.put(b"flow-1", b"state")
        await log.delete(b"flow-1")
        assert len(log) == 0
    for args in ([], ["--queue", "keyed/flows.checkpoints"]):
        code = await trio.to_thread.run_sync(main, ["store", "compact", str(tmp_path), *args])
        captured = capsys.readouterr()
        assert code == 0, captured.err
        assert captured.err == ""
        assert "keyed/flows.checkpoints: " in captured.out, captured.out


async def test_a_warning_of_the_store_is_one_line_of_the_command(tmp_path: Path) -> None:
    """The store warns about a directory entry it did not write; a command run as its own process shows
    that as one ``corda-trio: warning:`` line (the file name as ``ls -b`` shows it) and succeeds."""
    await _fill(tmp_path)
    os.mkdir(os.fsencode(tmp_path) + b"/stray\xff")
    command = [sys.executable, "-m", "corda_trio", "store", "compact", str(tmp_path), "--queue", QUEUE]
    done = await trio.run_process(command, capture_stdout=True, capture_stderr=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stderr.decode().splitlines() == [
        f"corda-trio: warning: broker directory {tmp_path}: ignoring stray\\xff (not written by the store)"
    ]


async def test_repair_of_a_queue_whose_only_segment_is_deleted_reports_the_loss(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by the corruption harness (tests/node/corruption.py, a node's dead letters): the one segment of a
    queue deleted, ``store check`` named it, but ``--repair`` said ``OK ... 0 messages``: the eight
    messages were gone without a word (the salvage looked only for segments between the first and the last
    one present, and none was). Now the missing segment is reported with the ids it may have held, and no
    id is handed out again."""
    await _fill(tmp_path)
    qdir = str(tmp_path / QUEUE)
    (only,) = list_segment_numbers(qdir)
    victim = segment_path(qdir, only)
    os.unlink(victim)
    assert main(["store", "check", str(tmp_path)]) == 1
    assert f"{victim} at offset 0: segment file missing" in capsys.readouterr().out
    assert main(["store", "check", str(tmp_path), "--repair"]) == 0
    out = capsys.readouterr().out
    assert f"REPAIRED {QUEUE}: 0 messages" in out, out
    assert f"{victim} at offset 0: segment file missing" in out and "their message ids lie in 0.." in out, out
    async with store.open_broker(tmp_path) as broker:
        assert await broker.get_queue(QUEUE).enqueue(b"new") > 7  # ids 0-7 are never handed out again


def _contents(root: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


async def test_compact_covers_the_keyed_logs_and_refuses_a_damaged_one_before_compacting_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by the corruption harness (tests/node/corruption.py): with the flow checkpoints' manifest
    damaged (one bit), ``store compact`` compacted the queues and said nothing, exit 0, for a store the
    node then refused to open: it never opened the keyed logs (nor compacted them). Now they are opened
    first: a damaged one stops it, naming the file, before anything is compacted; a sound one is compacted."""
    await _fill(tmp_path)
    await _ack_first(tmp_path, 6)
    async with store.open_broker(tmp_path) as broker:
        log = await broker.open_keyed_log("flows.checkpoints")
        for i in range(20):
            await log.put(b"flow", b"state-%d" % i)  # each put supersedes the one before
    manifest = tmp_path / store.KEYED_DIR / "flows.checkpoints" / "manifest"
    data = bytearray(manifest.read_bytes())
    data[35] ^= 0x80
    manifest.write_bytes(bytes(data))
    before = _contents(tmp_path)
    assert await trio.to_thread.run_sync(main, ["store", "compact", str(tmp_path)]) == 1
    out, err = capsys.readouterr()
    assert out == "", out
    assert f"corrupt segment {manifest} at offset 0: manifest: manifest checksum mismatch" in err, err
    assert _contents(tmp_path) == before
    data[35] ^= 0x80
    manifest.write_bytes(bytes(data))
    assert await trio.to_thread.run_sync(main, ["store", "compact", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    (keyed_line,) = [line for line in out.splitlines() if line.startswith("keyed/flows.checkpoints: ")]
    assert "(reclaimed " in keyed_line, out
    async with store.open_broker(tmp_path) as broker:
        assert (await broker.open_keyed_log("flows.checkpoints")).items() == [(b"flow", b"state-19")]


async def test_repair_of_a_listed_segment_emptied_reports_the_loss(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by the corruption harness (a node's dedup generation, its one segment emptied): ``store check``
    called it corrupt, ``--repair`` took the empty file for a segment a crash had just created and said
    ``OK ... 0 messages``, the eight messages gone without a word. The manifest lists only segments whose
    header was synced, so it is damage: reported, with the ids its records may have held."""
    await _fill(tmp_path)
    qdir = str(tmp_path / QUEUE)
    (only,) = list_segment_numbers(qdir)
    victim = segment_path(qdir, only)
    os.truncate(victim, 0)
    assert main(["store", "check", str(tmp_path)]) == 1
    capsys.readouterr()
    assert main(["store", "check", str(tmp_path), "--repair"]) == 0
    out = capsys.readouterr().out
    assert f"REPAIRED {QUEUE}: 0 messages" in out, out
    assert f"{victim} at offset 0: segment header: segment header is 0 bytes" in out, out
    async with store.open_broker(tmp_path) as broker:
        assert await broker.get_queue(QUEUE).enqueue(b"new") > 7
