"""Fault injection on a closed store: a flipped bit in every record (seals included) of every segment,
truncation at every record boundary, deleted segments, zero pages and partial writes after the last
record, crashes between the steps of a rotation. Each case either opens with nothing acknowledged lost
or refuses to open naming the file and the offset; ``store repair`` then drops the damage only when
asked, reporting what was lost, and ids are never handed out again. Never a silent loss.

What a crash can leave, and so what opens (protocol_spec/store-format.md §6): only the *active* (last)
segment can end in a torn write, only in a shape a crash leaves (a record cut short by the end of the
file, or damage where sectors read back as zeros). A truncation of the active segment exactly at a record
boundary is what a crash before that write's ``fdatasync`` leaves too, so it opens (the format cannot
know that those records had been acknowledged); a sealed segment must be whole.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from corda_trio import store
from corda_trio.store import _record_v1 as v1
from corda_trio.store._record import (
    SEAL_RECORD_BYTES,
    SEGMENT_HEADER_BYTES,
    Seal,
    append_seal,
    decode_segment_header,
    scan_records,
)
from corda_trio.store._segment import MANIFEST_NAME, list_segment_numbers, segment_path

QUEUE = "faults"
CONFIG = store.BrokerConfig(segment_bytes=2048, compact_live_ratio=0.0)  # several segments, no compaction


def _records(path: str) -> tuple[list[int], int]:
    """Start offsets of every record of a segment file (its seal included), and the seal's offset."""
    data = Path(path).read_bytes()
    header = decode_segment_header(data)
    result = scan_records(
        data, SEGMENT_HEADER_BYTES, header.number, -1, header.first_seq, not header.compacted
    )
    assert result.stop is None
    starts = [loc & ((1 << 40) - 1) for loc in result.enqueue_locations]
    seal = [result.seal_offset] if result.seal is not None else []
    return sorted([*starts, *result.ack_offsets, *seal]), result.seal_offset


async def _build(root: Path) -> dict[int, bytes]:
    async with store.open_broker(root, config=CONFIG) as broker:
        queue = await broker.declare_queue(QUEUE)
        for i in range(30):
            await queue.enqueue(b"payload-%d-" % i + b"x" * (i * 7))
        async with queue.consumer(credit=30) as consumer:
            for _ in range(10):
                await consumer.ack((await consumer.receive()).message_id)
        return {m.message_id: m.payload async for m in queue.browse()}


def _read(path: str | Path) -> bytes:
    return Path(path).read_bytes()


def _write(path: str | Path, data: bytes) -> None:
    Path(path).write_bytes(data)


def _recover(qdir: str | Path) -> dict[int, int] | store.CorruptSegmentError:
    try:
        recovered = store.recover_queue(str(qdir), store.RecoveryMode.CHECK)
    except store.CorruptSegmentError as exc:
        return exc
    return recovered.live


def _fresh_copy(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(tmp_path / "base", work)
    return work


async def test_a_bit_flip_in_any_record_of_any_segment_is_refused_with_file_and_offset(
    tmp_path: Path,
) -> None:
    await _build(tmp_path / "base")
    qdir_base = tmp_path / "base" / QUEUE
    numbers = list_segment_numbers(str(qdir_base))
    assert len(numbers) >= 3
    cases = 0
    for number in numbers:
        starts, _seal = _records(segment_path(str(qdir_base), number))
        size = len(_read(segment_path(str(qdir_base), number)))
        for start in starts:
            # length, crc, kind, sequence, id, length check, first body byte (or the next record)
            for where in (0, 5, 8, 13, 21, 37, 41):
                if start + where >= size:
                    continue
                work = _fresh_copy(tmp_path)
                path = segment_path(str(work / QUEUE), number)
                position = start + where
                data = bytearray(_read(path))
                data[position] ^= 0x10
                _write(path, bytes(data))
                outcome = _recover(work / QUEUE)
                cases += 1
                assert isinstance(outcome, store.CorruptSegmentError), (
                    f"segment {number} at {position}: silent"
                )
                assert outcome.path == path and outcome.offset <= position, (number, start, where)
                assert f"{path} at offset {outcome.offset}" in str(outcome)
    assert cases > 150


async def test_truncation_at_every_record_boundary(tmp_path: Path) -> None:
    """A sealed segment cut anywhere is refused (the offset is where its seal should have been); the
    active one cut at a record boundary opens with that prefix (what a crash before the write's sync
    leaves), cut inside a record it opens with a torn tail."""
    await _build(tmp_path / "base")
    qdir_base = tmp_path / "base" / QUEUE
    base_live = store.recover_queue(str(qdir_base), store.RecoveryMode.CHECK).live
    numbers = list_segment_numbers(str(qdir_base))
    for number in numbers:
        path_base = segment_path(str(qdir_base), number)
        starts, seal = _records(path_base)
        for cut in [SEGMENT_HEADER_BYTES, *starts[1:], *(s + 7 for s in starts)]:
            work = _fresh_copy(tmp_path)
            path = segment_path(str(work / QUEUE), number)
            _write(path, _read(path)[:cut])
            outcome = _recover(work / QUEUE)
            if number != numbers[-1]:
                assert isinstance(outcome, store.CorruptSegmentError), (
                    f"segment {number} cut at {cut}: silent"
                )
                assert outcome.path == path and outcome.offset <= cut
                assert seal > 0
            else:
                assert not isinstance(outcome, store.CorruptSegmentError), outcome
                # what a crash before the cut-off writes' sync leaves: their enqueues gone, their acks
                # undone; everything the sealed segments hold is there
                earlier = {m for m, loc in base_live.items() if store.unpack_location(loc)[0] != number}
                assert earlier <= outcome.keys() <= set(range(30)), cut
                data = _read(path_base)[:cut]
                header = decode_segment_header(data)
                result = scan_records(data, SEGMENT_HEADER_BYTES, number, -1, header.first_seq)
                assert result.stop is None or result.end == max(s for s in starts if s <= cut)


@pytest.mark.parametrize("which", ["first", "middle", "last"])
async def test_a_deleted_segment_is_refused_naming_it_and_repair_reports_it(
    tmp_path: Path, which: str, capsys: pytest.CaptureFixture[str]
) -> None:
    live = await _build(tmp_path)
    qdir = tmp_path / QUEUE
    numbers = list_segment_numbers(str(qdir))
    victim_number = {"first": numbers[0], "middle": numbers[1], "last": numbers[-1]}[which]
    victim = segment_path(str(qdir), victim_number)
    locations = store.recover_queue(str(qdir), store.RecoveryMode.CHECK).live
    elsewhere = {mid for mid, loc in locations.items() if store.unpack_location(loc)[0] != victim_number}
    os.unlink(victim)
    with pytest.raises(store.CorruptSegmentError, match="segment file missing") as info:
        async with store.open_broker(tmp_path, config=CONFIG):
            pass
    assert info.value.path == victim and info.value.offset == 0
    from corda_trio.node._cli import main

    assert main(["store", "check", str(tmp_path), "--repair"]) == 0
    out = capsys.readouterr().out
    assert f"{victim} at offset 0: segment file missing" in out
    every = {i: b"payload-%d-" % i + b"x" * (i * 7) for i in range(30)}
    async with store.open_broker(tmp_path, config=CONFIG) as broker:
        queue = broker.get_queue(QUEUE)
        survivors = {m.message_id: m.payload async for m in queue.browse()}
        # every live message of the other segments is there; acks the lost segment held are lost too,
        # so messages they removed may come back (reported: "delivered again"), never unknown ones
        assert elsewhere <= survivors.keys() and survivors.items() <= every.items()
        assert elsewhere == live.keys() - {m for m, loc in locations.items() if m not in elsewhere}
        new_id = await queue.enqueue(b"after the repair")
        assert new_id > max(live)  # ids are never reused
    async with store.open_broker(tmp_path, config=CONFIG) as broker:
        assert new_id in {m.message_id async for m in broker.get_queue(QUEUE).browse()}


async def test_repair_of_a_truncated_sealed_segment_reports_the_missing_records(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    live = await _build(tmp_path)
    qdir = tmp_path / QUEUE
    numbers = list_segment_numbers(str(qdir))
    path = segment_path(str(qdir), numbers[0])
    starts, _seal = _records(path)
    cut = starts[-3]  # two records and the seal are gone
    _write(path, _read(path)[:cut])
    with pytest.raises(store.CorruptSegmentError, match="without its seal record") as info:
        store.recover_queue(str(qdir), store.RecoveryMode.CHECK)
    assert info.value.path == path and info.value.offset == cut
    recovered = store.recover_queue(str(qdir), store.RecoveryMode.REPAIR)
    for state in recovered.segments:
        os.close(state.fd)
    (cut_report, gap) = recovered.report.repairs
    assert cut_report.path == path and cut_report.offset == cut
    assert gap.lost.missing_records == 2 and "sequence numbers" in gap.reason
    assert set(recovered.live) <= set(live) and len(recovered.live) >= len(live) - 2
    assert recovered.next_id > max(live)
    assert store.recover_queue(str(qdir), store.RecoveryMode.CHECK).report.repairs == ()


async def test_zero_pages_and_partial_writes_after_the_last_record_open_with_nothing_lost(
    tmp_path: Path,
) -> None:
    live = await _build(tmp_path)
    qdir = tmp_path / QUEUE
    last = segment_path(str(qdir), list_segment_numbers(str(qdir))[-1])
    good = _read(last)
    for tail in (bytes(4096), bytes(3 * 4096), b"\x7f\x00\x00\x00partial" + bytes(4000), b"\x01" * 17):
        _write(last, good + tail)
        async with store.open_broker(tmp_path, config=CONFIG) as broker:
            report = broker.recovery_reports[QUEUE]
            assert report.torn_tail is not None and report.torn_tail.offset == len(good)
            assert {m.message_id: m.payload async for m in broker.get_queue(QUEUE).browse()} == live


@pytest.mark.parametrize("damage", ["segment header", "unreadable segment", "manifest"])
async def test_a_damaged_middle_segment_or_manifest_refuses_to_open_naming_it(
    tmp_path: Path, damage: str
) -> None:
    await _build(tmp_path)
    qdir = tmp_path / QUEUE
    middle = segment_path(str(qdir), list_segment_numbers(str(qdir))[1])
    target = str(qdir / MANIFEST_NAME) if damage == "manifest" else middle
    data = bytearray(_read(target))
    if damage == "unreadable segment":
        data[SEGMENT_HEADER_BYTES:] = os.urandom(len(data) - SEGMENT_HEADER_BYTES)
    else:
        data[17] ^= 0x01
    _write(target, bytes(data))
    with pytest.raises(store.CorruptSegmentError) as info:
        async with store.open_broker(tmp_path, config=CONFIG):
            pass
    assert info.value.path == target


async def test_crashes_between_the_steps_of_a_rotation_open_with_nothing_lost(tmp_path: Path) -> None:
    """Seal, create the next segment, list it in the manifest: a crash after any step opens."""
    live = await _build(tmp_path / "base")
    base = tmp_path / "base" / QUEUE
    numbers = list_segment_numbers(str(base))
    last = numbers[-1]
    # 1. The last segment was sealed, the next one never created: it is created at the open.
    good = _read(segment_path(str(base), last))
    header = decode_segment_header(good)
    result = scan_records(good, SEGMENT_HEADER_BYTES, last, -1, header.first_seq)
    seal = bytearray()
    append_seal(seal, Seal(result.next_seq, result.records, max(live) + 1))
    sealed_then = good + bytes(seal)
    work = _fresh_copy(tmp_path)
    _write(segment_path(str(work / QUEUE), last), sealed_then)
    async with store.open_broker(work, config=CONFIG) as broker:
        queue = broker.get_queue(QUEUE)
        assert {m.message_id: m.payload async for m in queue.browse()} == live
        await queue.enqueue(b"more")
    assert list_segment_numbers(str(work / QUEUE))[-1] == last + 1
    # 1b. ... and the next one created, its header cut short: removed, created again, still consecutive.
    work = _fresh_copy(tmp_path)
    _write(segment_path(str(work / QUEUE), last), sealed_then)
    _write(segment_path(str(work / QUEUE), last + 1), b"CTWALSEG\x02\x00")
    for _ in range(2):  # (the second open finds what the first one left)
        async with store.open_broker(work, config=CONFIG) as broker:
            queue = broker.get_queue(QUEUE)
            assert {m.message_id: m.payload async for m in queue.browse()} == live
    assert list_segment_numbers(str(work / QUEUE)) == [*numbers, last + 1]
    # 2. The next one was created (header only), the manifest not replaced yet: adopted.
    work = _fresh_copy(tmp_path)
    _write(segment_path(str(work / QUEUE), last), sealed_then)
    from corda_trio.store._record import encode_segment_header

    first_seq = result.next_seq
    _write(
        segment_path(str(work / QUEUE), last + 1), encode_segment_header(last + 1, max(live) + 1, first_seq)
    )
    async with store.open_broker(work, config=CONFIG) as broker:
        assert {m.message_id: m.payload async for m in broker.get_queue(QUEUE).browse()} == live
    assert (
        store.recover_queue(str(work / QUEUE), store.RecoveryMode.CHECK).report.segments == len(numbers) + 1
    )
    # 3. A segment the manifest does not list that holds records cannot come from a crash.
    work = _fresh_copy(tmp_path)
    _write(segment_path(str(work / QUEUE), last + 1), _read(segment_path(str(base), last)))
    assert isinstance(_recover(work / QUEUE), store.CorruptSegmentError)


def _v1_store(root: Path, records: list[tuple[str, int, bytes]], segment_ids: list[int]) -> str:
    """A queue written in format 1 (as the previous version of the store wrote it): one segment per
    entry of ``segment_ids`` (its base id), records spread over them in order."""
    os.makedirs(root / QUEUE)
    (root / "broker.lock").write_bytes(b"")
    per = -(-len(records) // len(segment_ids))
    for n, base_id in enumerate(segment_ids, start=1):
        buf = bytearray(v1.encode_segment_header(n, base_id))
        for kind, mid, payload in records[(n - 1) * per : n * per]:
            if kind == "enqueue":
                v1.append_enqueue(buf, mid, 1_700_000_000_000 + mid, b"h%d" % mid, payload)
            else:
                v1.append_ack(buf, mid)
        _write(segment_path(str(root / QUEUE), n), bytes(buf))
    return str(root / QUEUE)


async def test_a_format_1_store_still_opens_and_is_migrated(tmp_path: Path) -> None:
    records: list[tuple[str, int, bytes]] = [("enqueue", i, b"m%d" % i * 20) for i in range(12)]
    records += [("ack", i, b"") for i in (0, 3, 4)]
    qdir = _v1_store(tmp_path, records, [0, 4, 8])
    before = {n: _read(segment_path(qdir, n)) for n in list_segment_numbers(qdir)}
    checked = store.recover_queue(qdir, store.RecoveryMode.CHECK)  # check leaves it as it is
    assert checked.report.found_format == 1 and len(checked.live) == 9
    assert {n: _read(segment_path(qdir, n)) for n in list_segment_numbers(qdir)} == before
    expected = [(i, b"m%d" % i * 20, b"h%d" % i) for i in range(12) if i not in (0, 3, 4)]
    async with store.open_broker(tmp_path) as broker:
        assert broker.recovery_reports[QUEUE].found_format == 1
        queue = broker.get_queue(QUEUE)
        assert [(m.message_id, m.payload, m.headers) async for m in queue.browse()] == expected
        assert await queue.enqueue(b"new") == 12
    assert not [n for n in list_segment_numbers(qdir) if n <= 3]  # the format-1 segments are gone
    async with store.open_broker(tmp_path) as broker:
        report = broker.recovery_reports[QUEUE]
        assert report.found_format == 2 and report.torn_tail is None
        got = [(m.message_id, m.payload, m.headers) async for m in broker.get_queue(QUEUE).browse()]
        assert got == [*expected, (12, b"new", b"")]


async def test_a_format_1_store_with_a_torn_tail_or_a_migration_cut_short(tmp_path: Path) -> None:
    records: list[tuple[str, int, bytes]] = [("enqueue", i, b"v%d" % i) for i in range(6)]
    qdir = _v1_store(tmp_path, records, [0, 3])
    last = segment_path(qdir, 2)
    _write(last, _read(last) + b"\x30\x00\x00\x00cut sho")  # a format-1 torn tail: cut, id not kept
    # A migration cut short: its new segment was written, the manifest never was.
    from corda_trio.store._record import SEGMENT_ORIGIN, encode_segment_header

    _write(segment_path(qdir, 3), encode_segment_header(3, 6, 0, SEGMENT_ORIGIN) + b"partial")
    async with store.open_broker(tmp_path) as broker:
        report = broker.recovery_reports[QUEUE]
        assert report.found_format == 1 and report.torn_tail is not None
        assert segment_path(qdir, 3) in report.removed_files
        assert [m.message_id async for m in broker.get_queue(QUEUE).browse()] == list(range(6))
    assert store.recover_queue(qdir, store.RecoveryMode.CHECK).report.found_format == 2


async def test_a_rebuild_cut_before_its_manifest_switch_is_removed(tmp_path: Path) -> None:
    live = await _build(tmp_path)
    qdir = tmp_path / QUEUE
    numbers = list_segment_numbers(str(qdir))
    from corda_trio.store._record import SEGMENT_ORIGIN, append_enqueue, encode_segment_header

    orphan = bytearray(encode_segment_header(numbers[-1] + 1, 999, 0, SEGMENT_ORIGIN))
    append_enqueue(orphan, 5, 0, b"", b"copied", 0)
    _write(segment_path(str(qdir), numbers[-1] + 1), bytes(orphan))
    async with store.open_broker(tmp_path, config=CONFIG) as broker:
        assert segment_path(str(qdir), numbers[-1] + 1) in broker.recovery_reports[QUEUE].removed_files
        assert {m.message_id: m.payload async for m in broker.get_queue(QUEUE).browse()} == live
    assert SEAL_RECORD_BYTES == 64
