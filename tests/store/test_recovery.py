"""Crash consistency of the log: torn tails at every byte, corruption, compaction interrupted at each step."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from corda_trio import store
from corda_trio.store._record import (
    ACK_RECORD_BYTES,
    SEAL_RECORD_BYTES,
    SEGMENT_HEADER_BYTES,
    append_enqueue,
    scan_records,
)
from corda_trio.store._segment import list_segment_numbers, segment_path

QUEUE = "p2p.inbound.DLtest"


# Plain blocking helpers: the tests manipulate files between broker runs, never while one is open.
def _read(path: str | Path) -> bytes:
    return Path(path).read_bytes()


def _write(path: str | Path, data: bytes) -> None:
    Path(path).write_bytes(data)


def _exists(path: str | Path) -> bool:
    return os.path.exists(path)


def _dir_size(path: str) -> int:
    return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))


async def _build(root: Path, config: store.BrokerConfig | None = None) -> list[tuple[int, bytes]]:
    """A queue whose last segment ends with several separate writes: enqueues (with headers) and acks."""
    async with store.open_broker(root, config=config) as broker:
        queue = await broker.declare_queue(QUEUE)
        for i in range(6):
            await queue.enqueue(b"payload-%d" % i * (i + 1), headers=b"h%d" % i if i % 2 else b"")
        async with queue.consumer(credit=2) as consumer:
            first = await consumer.receive()
            await consumer.ack(first.message_id)
            second = await consumer.receive()
        await queue.enqueue(b"last", headers=b"meta")
        async with queue.consumer(credit=10) as consumer:
            again = await consumer.receive()
            assert again.message_id == second.message_id
            await consumer.ack(again.message_id)
        return [(m.message_id, m.payload) async for m in queue.browse()]


def _records(path: str) -> list[tuple[int, int, str, int]]:
    """(start, end, kind, id) of every record of a segment file."""
    data = _read(path)
    result = scan_records(data, SEGMENT_HEADER_BYTES, 1, -1)
    assert result.stop is None
    out = []
    for mid, loc in zip(result.enqueue_ids, result.enqueue_locations, strict=True):
        off, length = loc & ((1 << 40) - 1), (loc >> 40) & 0xFFFFFFFF
        out.append((off, off + length, "enqueue", mid))
    for mid, off in zip(result.ack_ids, result.ack_offsets, strict=True):
        out.append((off, off + ACK_RECORD_BYTES, "ack", mid))
    return sorted(out)


def _expected_live(records: list[tuple[int, int, str, int]], cut: int) -> list[int]:
    present = [r for r in records if r[1] <= cut]
    acked = {mid for _s, _e, kind, mid in present if kind == "ack"}
    return [mid for _s, _e, kind, mid in present if kind == "enqueue" and mid not in acked]


async def test_truncation_at_every_byte_of_the_last_records_recovers_the_durable_prefix(
    tmp_path: Path,
) -> None:
    original = tmp_path / "orig"
    await _build(original)
    qdir = original / QUEUE
    (number,) = list_segment_numbers(str(qdir))
    path = segment_path(str(qdir), number)
    records = _records(path)
    data = _read(path)
    first_cut = records[-5][0]  # the last five records: enqueues, an ack, the final enqueue and ack
    payload_of = {}
    for _s, _e, kind, mid in records:
        if kind == "enqueue":
            payload_of[mid] = None
    work = tmp_path / "work"
    for cut in range(first_cut, len(data) + 1):
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(original, work)
        (work / QUEUE / os.path.basename(path)).write_bytes(data[:cut])
        recovered = store.recover_queue(str(work / QUEUE), store.RecoveryMode.CHECK)
        expected = _expected_live(records, cut)
        assert list(recovered.live) == expected, cut
        boundary = cut in {r[1] for r in records} or cut == SEGMENT_HEADER_BYTES
        assert (recovered.report.torn_tail is None) == boundary, cut
        if not boundary:
            torn = recovered.report.torn_tail
            assert torn is not None and torn.offset == max(e for _s, e, _k, _m in records if e <= cut)
            assert torn.dropped_bytes == cut - torn.offset
        # The broker truncates the tail, then serves exactly the prefix and keeps working.
        async with store.open_broker(work) as broker:
            queue = broker.get_queue(QUEUE)
            report = broker.recovery_reports[QUEUE]
            assert (report.torn_tail is None) == boundary
            browsed = [m async for m in queue.browse()]
            assert [m.message_id for m in browsed] == expected
            new_id = await queue.enqueue(b"after")
            assert new_id > max(mid for _s, _e, kind, mid in records if kind == "enqueue" and _e <= cut)
        async with store.open_broker(work) as broker:
            assert broker.recovery_reports[QUEUE].torn_tail is None
            assert [m.message_id async for m in broker.get_queue(QUEUE).browse()] == [*expected, new_id]


async def test_recovered_payloads_and_headers_are_exact(tmp_path: Path) -> None:
    live = await _build(tmp_path)
    async with store.open_broker(tmp_path) as broker:
        got = [(m.message_id, m.payload) async for m in broker.get_queue(QUEUE).browse()]
    assert got == live and len(live) == 5


@pytest.mark.parametrize("where", ["first", "middle", "last-but-one"])
async def test_corrupt_record_in_the_middle_is_an_error_naming_file_and_offset(
    tmp_path: Path, where: str
) -> None:
    await _build(tmp_path)
    qdir = tmp_path / QUEUE
    (number,) = list_segment_numbers(str(qdir))
    path = segment_path(str(qdir), number)
    records = _records(path)
    start, end, _kind, _mid = {
        "first": records[0],
        "middle": records[len(records) // 2],
        "last-but-one": records[-2],
    }[where]
    data = bytearray(_read(path))
    data[end - 1] ^= 0x40  # one bit in the record's last byte: checksum mismatch
    _write(path, bytes(data))
    with pytest.raises(store.CorruptSegmentError) as info:
        async with store.open_broker(tmp_path):
            pass
    assert info.value.path == path and info.value.offset == start
    assert f"corrupt segment {path} at offset {start}: checksum mismatch" in str(info.value)
    assert _read(path) == bytes(data)  # nothing was changed


async def test_a_bit_flip_in_the_last_record_is_corruption_in_the_active_and_in_a_sealed_segment(
    tmp_path: Path,
) -> None:
    config = store.BrokerConfig(segment_bytes=4096)
    async with store.open_broker(tmp_path, config=config) as broker:
        queue = await broker.declare_queue(QUEUE)
        for _ in range(12):
            await queue.enqueue(b"z" * 1000)
    qdir = str(tmp_path / QUEUE)
    numbers = list_segment_numbers(qdir)
    assert len(numbers) >= 3
    # The last record of the ACTIVE segment, whole but with one flipped bit: no crash leaves that.
    last = segment_path(qdir, numbers[-1])
    good = _read(last)
    data = bytearray(good)
    data[-1] ^= 1
    _write(last, bytes(data))
    with pytest.raises(store.CorruptSegmentError, match="checksum mismatch") as info:
        store.recover_queue(qdir, store.RecoveryMode.CHECK)
    assert info.value.path == last and info.value.offset == len(good) - 1040
    _write(last, good)
    # The same at the end of an earlier (sealed, fsynced) segment: its seal record.
    sealed = segment_path(qdir, numbers[0])
    data = bytearray(_read(sealed))
    data[-1] ^= 1
    _write(sealed, bytes(data))
    with pytest.raises(store.CorruptSegmentError, match="checksum mismatch") as info:
        store.recover_queue(qdir, store.RecoveryMode.CHECK)
    assert info.value.path == sealed and info.value.offset == len(data) - 64


async def test_zero_filled_or_partial_tail_is_torn_but_a_valid_record_after_a_bad_one_is_corrupt(
    tmp_path: Path,
) -> None:
    await _build(tmp_path)
    qdir = str(tmp_path / QUEUE)
    (number,) = list_segment_numbers(qdir)
    path = segment_path(qdir, number)
    good = _read(path)
    records = _records(path)
    last_start, last_end = [(start, end) for start, end, kind, _id in records if kind == "enqueue"][-1]
    before_last = good[:last_start]
    last = good[last_start:last_end]
    page = 4096
    pad = -len(good) % 512 or 512
    pad += 512 if pad < 16 else 0
    tails = {
        "zero pages": good + bytes(2 * page),
        # a multi-record write cut by a power loss: the first bytes landed, the rest reads back as zeros
        "partial record then zero pages": before_last + last[: len(last) // 2] + bytes(page),
        # sectors that never reached the disk read back as zeros, up to a sector boundary
        "partial bytes after zeros": good + bytes(pad) + b"\x01garbage" + bytes(100),
    }
    pristine = tmp_path / "pristine"
    shutil.copytree(qdir, pristine)
    for label, data in tails.items():
        shutil.rmtree(qdir)
        shutil.copytree(pristine, qdir)
        _write(path, data)
        expected_cut = len(before_last) if label.startswith("partial record") else len(good)
        recovered = store.recover_queue(qdir, store.RecoveryMode.OPEN)
        torn = recovered.report.torn_tail
        assert torn is not None and torn.offset == expected_cut, label
        assert torn.dropped_bytes == len(data) - expected_cut, label
        for state in recovered.segments:
            os.close(state.fd)
        assert _read(path)[:expected_cut] == data[:expected_cut], label  # truncated back
        if label.startswith("partial record"):
            # The cut record's id stays used: the segment is sealed and a new one starts above it.
            (cut_id,) = [mid for start, _end, _kind, mid in records if start == last_start]
            assert recovered.next_id == cut_id + 1
            assert len(recovered.segments) == 2 and recovered.segments[-1].base_id == recovered.next_id
            assert len(_read(path)) == expected_cut + SEAL_RECORD_BYTES
        else:
            assert len(_read(path)) == expected_cut
    shutil.rmtree(qdir)
    shutil.copytree(pristine, qdir)
    # A well-formed record after a bad one cannot come from a crash: corruption, naming the offset.
    damaged = bytearray(good)
    damaged[records[-2][0] + 20] ^= 0x01  # a bit flip in the record before the last one
    _write(path, bytes(damaged))
    with pytest.raises(store.CorruptSegmentError, match=f"offset {records[-2][0]}"):
        store.recover_queue(qdir, store.RecoveryMode.CHECK)


async def test_unknown_kind_with_a_valid_checksum_is_corrupt_even_at_the_end(tmp_path: Path) -> None:
    await _build(tmp_path)
    qdir = str(tmp_path / QUEUE)
    (number,) = list_segment_numbers(qdir)
    path = segment_path(qdir, number)
    good = _read(path)
    next_seq = scan_records(good, SEGMENT_HEADER_BYTES, 1, -1).next_seq
    record = bytearray()
    append_enqueue(record, 10_000, 0, b"", b"x", next_seq)
    record[8] = 9  # kind 9 ...
    import zlib

    # ... with a valid checksum
    record[4:8] = zlib.crc32(bytes(record[8:])).to_bytes(4, "little")
    _write(path, good + bytes(record))
    with pytest.raises(store.CorruptSegmentError, match="unknown record kind"):
        store.recover_queue(qdir, store.RecoveryMode.CHECK)


async def test_crash_while_creating_a_segment_and_compaction_leftovers(tmp_path: Path) -> None:
    live = await _build(tmp_path)
    qdir = str(tmp_path / QUEUE)
    (number,) = list_segment_numbers(qdir)
    # A crash right after creating the next segment, before its header was synced.
    _write(segment_path(qdir, number + 1), b"CTWAL")
    # A crash in the middle of a compaction: the temporary copy never got renamed.
    leftover = segment_path(qdir, number)[: -len(".seg")] + ".seg.compact"
    _write(leftover, b"partial copy")
    async with store.open_broker(tmp_path) as broker:
        report = broker.recovery_reports[QUEUE]
        assert report.removed_files == (leftover,)
        assert report.torn_tail is not None and report.torn_tail.offset == 0
        assert [(m.message_id, m.payload) async for m in broker.get_queue(QUEUE).browse()] == live
    assert list_segment_numbers(qdir) == [number] and not _exists(leftover)


async def test_corrupt_header_of_a_sealed_segment(tmp_path: Path) -> None:
    config = store.BrokerConfig(segment_bytes=4096)
    async with store.open_broker(tmp_path, config=config) as broker:
        queue = await broker.declare_queue(QUEUE)
        for _ in range(8):
            await queue.enqueue(b"z" * 1000)
    qdir = str(tmp_path / QUEUE)
    first = segment_path(qdir, list_segment_numbers(qdir)[0])
    data = bytearray(_read(first))
    data[0:8] = b"NOTAWAL!"
    _write(first, bytes(data))
    with pytest.raises(store.CorruptSegmentError, match="offset 0: segment header: bad segment magic"):
        store.recover_queue(qdir, store.RecoveryMode.CHECK)


async def _mostly_acked(root: Path) -> tuple[list[int], str]:
    """Three sealed segments; most of the first two acked (their acks are in later segments)."""
    config = store.BrokerConfig(segment_bytes=2048, compact_live_ratio=0.0)  # no background compaction
    async with store.open_broker(root, config=config) as broker:
        queue = await broker.declare_queue(QUEUE)
        for i in range(30):
            await queue.enqueue(b"m%02d" % i * 40)
        keep = set(range(0, 30, 7))
        async with queue.consumer(credit=100) as consumer:
            for _ in range(30):
                d = await consumer.receive()
                if d.message_id not in keep:
                    await consumer.ack(d.message_id)
        live = [m.message_id async for m in queue.browse()]
        await queue.enqueue(b"tail")
        live.append(live[-1] + 1 if False else (await _last_id(queue)))
    return live, str(root / QUEUE)


async def _last_id(queue: store.Queue) -> int:
    return [m.message_id async for m in queue.browse()][-1]


async def test_compaction_keeps_live_messages_and_needed_acks(tmp_path: Path) -> None:
    live, qdir = await _mostly_acked(tmp_path)
    before = _dir_size(qdir)
    config = store.BrokerConfig(segment_bytes=2048, compact_live_ratio=0.0)
    async with store.open_broker(tmp_path, config=config) as broker:
        queue = broker.get_queue(QUEUE)
        reclaimed = await queue.compact()
        assert reclaimed > 0
        assert [m.message_id async for m in queue.browse()] == live
        stats = queue.statistics()
        assert stats.compactions >= 1 and stats.depth == len(live)
    after = _dir_size(qdir)
    assert after < before
    async with store.open_broker(tmp_path, config=config) as broker:
        queue = broker.get_queue(QUEUE)
        assert [m.message_id async for m in queue.browse()] == live
        payloads = [m.payload async for m in queue.browse()]
        assert payloads[:-1] == [b"m%02d" % i * 40 for i in live[:-1]]


async def test_compaction_interrupted_at_every_step_never_loses_or_duplicates(tmp_path: Path) -> None:
    """Replay the compaction of each segment and stop it at each step (partial temp file, complete temp
    file, renamed or unlinked), after the earlier segments' compactions completed: recovery always yields
    the same live set."""
    live, qdir = await _mostly_acked(tmp_path / "base")
    compacted_root = tmp_path / "compacted"
    shutil.copytree(tmp_path / "base", compacted_root)
    config = store.BrokerConfig(segment_bytes=2048, compact_live_ratio=0.0)
    async with store.open_broker(compacted_root, config=config) as broker:
        await broker.get_queue(QUEUE).compact()
    cdir = str(compacted_root / QUEUE)
    changed = [
        n for n in list_segment_numbers(qdir)
        if not _exists(segment_path(cdir, n))
        or _read(segment_path(cdir, n)) != _read(segment_path(qdir, n))
    ]  # fmt: skip
    assert changed
    for n in changed:
        old_path = segment_path(qdir, n)
        new_bytes = _read(segment_path(cdir, n)) if _exists(segment_path(cdir, n)) else None
        states: list[tuple[str, bytes | None, bytes | None]] = [("temp partial", _read(old_path), None)]
        if new_bytes is not None:
            states = [
                ("temp partial", _read(old_path), new_bytes[: len(new_bytes) // 2]),
                ("temp complete", _read(old_path), new_bytes),
                ("renamed", new_bytes, None),
            ]
        else:
            states.append(("unlinked", None, None))
        for label, seg_bytes, tmp_bytes in states:
            work = tmp_path / "work"
            shutil.rmtree(work, ignore_errors=True)
            shutil.copytree(tmp_path / "base", work)
            wdir = str(work / QUEUE)
            for done in changed[: changed.index(n)]:  # compactions run one after the other
                if _exists(segment_path(cdir, done)):
                    _write(segment_path(wdir, done), _read(segment_path(cdir, done)))
                else:
                    os.unlink(segment_path(wdir, done))
            target = segment_path(wdir, n)
            if seg_bytes is None:
                os.unlink(target)
            else:
                _write(target, seg_bytes)
            if tmp_bytes is not None:
                _write(target[: -len(".seg")] + ".seg.compact", tmp_bytes)
            recovered = store.recover_queue(wdir, store.RecoveryMode.CHECK)
            assert list(recovered.live) == live, (n, label)


async def test_damaged_length_field_in_the_middle_of_the_last_segment_is_corrupt_not_torn(
    tmp_path: Path,
) -> None:
    await _build(tmp_path)
    qdir = str(tmp_path / QUEUE)
    (number,) = list_segment_numbers(qdir)
    path = segment_path(qdir, number)
    records = _records(path)
    start = records[2][0]
    data = bytearray(_read(path))
    data[start + 3] ^= 0x80  # the length now claims ~2 GiB: it "runs past the end", yet records follow
    _write(path, bytes(data))
    with pytest.raises(store.CorruptSegmentError, match=f"offset {start}: record length field does not"):
        store.recover_queue(qdir, store.RecoveryMode.CHECK)
