"""The pure record codec: golden vectors from protocol_spec/store-format.md, round trips, the scanner."""

from __future__ import annotations

import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corda_trio.store import _record as rec
from corda_trio.store import _record_v1 as v1

# protocol_spec/store-format.md §3 "Golden vectors"
GOLDEN_HEADER = (
    "43545741 4c534547 02000000 30000000 01000000 00000000 00000000 00000000 00000000 00000000"
    " 00000000 7c894935"
)
GOLDEN_ENQUEUE = (
    "2e000000 4795198e 01000000 03000000 01000000 07000000 00000000 0068e5cf 8b010000 d1ffffff 68 68656c6c6f"
)
GOLDEN_ACK = "28000000 6dad617d 02000000 04000000 00000000 07000000 00000000 00000000 00000000 d7ffffff"
GOLDEN_SEAL = (
    "40000000 b0916f4e 03000000 05000000 00000000 00000000 00000000 00000000 00000000 bfffffff"
    " 05000000 00000000 02000000 00000000 08000000 00000000"
)
GOLDEN_MANIFEST = "43545741 4c4d414e 02000000 00000000 01000000 00000000 02000000 00000000 00000000 02d7aaf8"
# format version 1 (read for migration only): protocol_spec/store-format.md §8
V1_HEADER = "43545741 4c534547 01000000 28000000 01000000 00000000 00000000 00000000 cb40304a 00000000"
V1_ENQUEUE = "26000000 2df1c954 01000000 07000000 00000000 0068e5cf 8b010000 01000000 68 68656c6c6f"
V1_ACK = "20000000 bca0be9b 02000000 07000000 00000000 00000000 00000000 00000000"


def _hex(text: str) -> bytes:
    return bytes.fromhex(text.replace(" ", ""))


def _segment(*records: bytes, first_seq: int = 0) -> bytearray:
    return bytearray(rec.encode_segment_header(1, 0, first_seq) + b"".join(records))


@given(meta=st.binary(max_size=16), payload=st.binary(max_size=64), data=st.data())
def test_the_checksum_covers_every_byte_after_it(meta: bytes, payload: bytes, data: st.DataObject) -> None:
    """The record's crc field is CRC-32 (zlib) of bytes [8, length), as the spec says, and a flipped bit
    anywhere in the record is caught when the record is read back."""
    buf = bytearray()
    length = rec.append_enqueue(buf, 9, 1_700_000_000_000, meta, payload, 4)
    record = bytes(buf)
    assert length == len(record)
    assert int.from_bytes(record[4:8], "little") == zlib.crc32(record[8:])
    assert rec.decode_enqueue_body(record) == (9, 1_700_000_000_000, meta, payload)
    position = data.draw(st.integers(0, len(record) - 1))
    bit = data.draw(st.integers(0, 7))
    damaged = bytearray(record)
    damaged[position] ^= 1 << bit
    with pytest.raises(ValueError):
        rec.decode_enqueue_body(bytes(damaged))


def test_golden_vectors() -> None:
    header = _hex(GOLDEN_HEADER)
    assert rec.encode_segment_header(1, 0, 0) == header
    assert rec.decode_segment_header(header) == rec.SegmentHeader(1, 0, 0, 0)
    buf = bytearray()
    assert rec.append_enqueue(buf, 7, 1_700_000_000_000, b"h", b"hello", 3) == 46
    assert bytes(buf) == _hex(GOLDEN_ENQUEUE)
    assert rec.decode_enqueue_body(bytes(buf)) == (7, 1_700_000_000_000, b"h", b"hello")
    ack = bytearray()
    rec.append_ack(ack, 7, 4)
    assert bytes(ack) == _hex(GOLDEN_ACK)
    seal = bytearray()
    rec.append_seal(seal, rec.Seal(next_seq=5, records=2, next_id=8))
    assert bytes(seal) == _hex(GOLDEN_SEAL)
    assert rec.encode_manifest(1, 2) == _hex(GOLDEN_MANIFEST)
    assert rec.decode_manifest(_hex(GOLDEN_MANIFEST)) == (1, 2)
    segment = rec.encode_segment_header(1, 0, 3) + bytes(buf) + bytes(ack) + bytes(seal)
    result = rec.scan_records(segment, rec.SEGMENT_HEADER_BYTES, 1, -1, 3)
    assert result.stop is None and list(result.enqueue_ids) == [7] and list(result.ack_ids) == [7]
    assert result.seal == rec.Seal(5, 2, 8) and result.records == 2 and result.next_seq == 5


@pytest.mark.parametrize("golden", [GOLDEN_ENQUEUE, GOLDEN_ACK, GOLDEN_SEAL])
def test_checksum_and_length_check_are_what_the_spec_says(golden: str) -> None:
    """The spec's definitions, computed here independently of the codec."""
    data = _hex(golden)
    length, crc, check = int.from_bytes(data[:4], "little"), data[4:8], data[36:40]
    assert length == len(data)
    assert zlib.crc32(data[8:]).to_bytes(4, "little") == crc  # bytes [8, length)
    assert (~length & 0xFFFFFFFF).to_bytes(4, "little") == check
    header = _hex(GOLDEN_HEADER)
    assert zlib.crc32(header[:44]).to_bytes(4, "little") == header[44:]


def test_format_1_golden_vectors_still_read() -> None:
    assert v1.decode_segment_header(_hex(V1_HEADER)) == (1, 0)
    assert v1.decode_enqueue_body(_hex(V1_ENQUEUE)) == (7, 1_700_000_000_000, b"h", b"hello")
    segment = _hex(V1_HEADER) + _hex(V1_ENQUEUE) + _hex(V1_ACK)
    result = v1.scan_records(segment, v1.SEGMENT_HEADER_BYTES, 1, -1)
    assert result.stop is None and list(result.enqueue_ids) == [7] and list(result.ack_ids) == [7]
    assert rec.peek_format_version(_hex(V1_HEADER)) == 1 and rec.peek_format_version(_hex(GOLDEN_HEADER)) == 2
    with pytest.raises(ValueError, match="version 1"):
        rec.decode_segment_header(_hex(V1_HEADER) + bytes(8))


@given(
    prefix=st.binary(max_size=300),
    mid=st.integers(0, 2**64 - 1),
    ts=st.integers(0, 2**40),
    meta=st.binary(max_size=40),
    payload=st.binary(max_size=300),
)
def test_append_enqueue_located_writes_the_same_bytes_and_returns_the_location(
    prefix: bytes, mid: int, ts: int, meta: bytes, payload: bytes
) -> None:
    plain = bytearray(prefix)
    length = rec.append_enqueue(plain, mid, ts, meta, payload, mid)
    located = bytearray(prefix)
    loc = rec.append_enqueue_located(located, mid, ts, meta, payload, mid)
    assert located == plain
    assert rec.unpack_location(loc) == (0, len(prefix), length, len(meta), ts)


def test_append_enqueue_located_rejects_oversized_records_untouched() -> None:
    class Huge(bytes):
        def __len__(self) -> int:
            return rec.MAX_RECORD_BYTES

    buf = bytearray(b"kept")
    with pytest.raises(ValueError, match="exceeds the maximum"):
        rec.append_enqueue_located(buf, 1, 0, b"", Huge(), 0)
    assert buf == b"kept"


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda h: h[:47], "48"),
        (lambda h: b"X" + h[1:], "magic"),
        (lambda h: h[:20] + b"\x01" + h[21:], "checksum"),
        (lambda h: h[:33] + b"\x01" + h[34:], "checksum"),
    ],
)
def test_bad_segment_headers(mutate: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        rec.decode_segment_header(mutate(rec.encode_segment_header(3, 9, 11)))  # type: ignore[operator]


@pytest.mark.parametrize(
    "bad", [b"", b"x" * 40, rec.encode_manifest(2, 1), rec.encode_manifest(1, 2)[:-1] + b"!"]
)
def test_bad_manifests(bad: bytes) -> None:
    with pytest.raises(ValueError, match="manifest"):
        rec.decode_manifest(bad)


def test_decode_enqueue_body_rejects_damage() -> None:
    buf = bytearray()
    rec.append_enqueue(buf, 1, 2, b"", b"payload")
    buf[-1] ^= 1
    with pytest.raises(ValueError, match="checksum mismatch"):
        rec.decode_enqueue_body(bytes(buf))
    with pytest.raises(ValueError, match="shorter"):
        rec.decode_enqueue_body(b"\x00" * 10)


def test_location_packing_round_trips_at_the_limits() -> None:
    fields = (2**32 - 1, 2**40 - 1, 2**32 - 1, 2**32 - 1, 2**47)
    assert rec.unpack_location(rec.pack_location(*fields)) == fields
    assert rec.unpack_location(rec.pack_location(1, 48, 40, 0, 0)) == (1, 48, 40, 0, 0)


records = st.lists(
    st.one_of(
        st.tuples(st.just("enqueue"), st.binary(max_size=64), st.binary(max_size=600)),
        st.tuples(st.just("ack"), st.integers(0, 2**64 - 1), st.just(b"")),
    ),
    max_size=30,
)


@given(records, st.integers(0, 2**40), st.integers(0, 2**64 - 100), st.booleans())
def test_scan_returns_exactly_what_was_appended(
    items: list[tuple[str, object, bytes]], ts: int, first_seq: int, sealed: bool
) -> None:
    data = bytearray(rec.encode_segment_header(5, 0, first_seq))
    enqueued, acked, next_id = [], [], 0
    seq = first_seq
    for kind, a, b in items:
        if kind == "enqueue":
            offset = len(data)
            length = rec.append_enqueue(data, next_id, ts, a, b, seq)  # type: ignore[arg-type]
            enqueued.append((next_id, offset, length, len(a), a, b))  # type: ignore[arg-type]
            next_id += 1
        else:
            rec.append_ack(data, a, seq)  # type: ignore[arg-type]
            acked.append(a)
        seq += 1
    if sealed:
        rec.append_seal(data, rec.Seal(seq, len(items), next_id))
    result = rec.scan_records(data, rec.SEGMENT_HEADER_BYTES, 5, -1, first_seq)
    assert result.stop is None and result.end == len(data)
    assert result.records == len(items) and result.next_seq == seq
    assert result.seal == (rec.Seal(seq, len(items), next_id) if sealed else None)
    assert list(result.ack_ids) == acked
    assert list(result.enqueue_ids) == [e[0] for e in enqueued]
    for (mid, offset, length, meta_len, meta, payload), loc in zip(
        enqueued, result.enqueue_locations, strict=True
    ):
        assert rec.unpack_location(loc) == (5, offset, length, meta_len, ts)
        assert rec.decode_enqueue_body(bytes(data[offset : offset + length])) == (mid, ts, meta, payload)


@given(records, st.data())
def test_any_cut_of_the_last_record_is_a_torn_tail(
    items: list[tuple[str, object, bytes]], data: st.DataObject
) -> None:
    buf = _segment()
    for i, (kind, a, b) in enumerate(items):
        if kind == "enqueue":
            rec.append_enqueue(buf, i, 0, a, b, i)  # type: ignore[arg-type]
        else:
            rec.append_ack(buf, i, i)
    good = len(buf)
    rec.append_enqueue(buf, 10_000, 0, b"m", b"last record", len(items))
    cut = data.draw(st.integers(good + 1, len(buf) - 1))
    prefix = bytes(buf[:cut])
    result = rec.scan_records(prefix, rec.SEGMENT_HEADER_BYTES, 1, -1)
    assert result.stop is not None and result.end == good
    assert rec.classify_stop(prefix, result, is_active_segment=True) is rec.Verdict.TORN_TAIL
    assert rec.classify_stop(prefix, result, is_active_segment=False) is rec.Verdict.CORRUPT


@given(records, st.data())
def test_a_bit_flip_anywhere_in_a_whole_last_record_is_corruption_not_a_torn_tail(
    items: list[tuple[str, object, bytes]], data: st.DataObject
) -> None:
    """The last record is all there: no crash explains a flipped bit in it (its length field
    included: the length check catches a length that now runs past the end)."""
    buf = _segment()
    for i, (kind, a, b) in enumerate(items):
        if kind == "enqueue":
            rec.append_enqueue(buf, i, 0, a, b, i)  # type: ignore[arg-type]
        else:
            rec.append_ack(buf, i, i)
    good = len(buf)
    last = data.draw(st.sampled_from(["enqueue", "ack"]))
    if last == "enqueue":
        rec.append_enqueue(buf, 10_000, 0, b"m", data.draw(st.binary(min_size=1, max_size=200)), len(items))
    else:
        rec.append_ack(buf, 10_000, len(items))
    position = data.draw(st.integers(good, len(buf) - 1))
    buf[position] ^= 1 << data.draw(st.integers(0, 7))
    result = rec.scan_records(bytes(buf), rec.SEGMENT_HEADER_BYTES, 1, -1)
    assert result.stop is not None and result.end == good
    assert rec.classify_stop(bytes(buf), result, is_active_segment=True) is rec.Verdict.CORRUPT


@given(st.integers(1, 5), st.integers(0, 3000), st.data())
def test_zero_filled_blocks_in_the_last_write_are_a_torn_tail(
    records: int, size: int, data: st.DataObject
) -> None:
    """A power loss: the file size covers the last write, some of its sectors read back as zeros."""
    buf = _segment()
    rec.append_enqueue(buf, 0, 0, b"", b"synced", 0)
    good = len(buf)
    for i in range(1, records + 1):
        rec.append_enqueue(buf, i, 0, b"", bytes(range(256)) * (1 + size // 256), i)
    blocks = range(good // rec.ZERO_BLOCK, (len(buf) - 1) // rec.ZERO_BLOCK + 1)
    lost = data.draw(st.sampled_from(list(blocks)))
    start, end = max(good, lost * rec.ZERO_BLOCK), min(len(buf), (lost + 1) * rec.ZERO_BLOCK)
    if end - start < 16:
        return  # a sliver that short is not told from data (the spec's minimum zero run)
    buf[start:end] = bytes(end - start)
    if end < len(buf) and end % rec.ZERO_BLOCK == 0:
        buf[end] |= 1  # (the run must end at the sector boundary, as a real lost sector does)
    result = rec.scan_records(bytes(buf), rec.SEGMENT_HEADER_BYTES, 1, -1)
    assert result.stop is not None
    verdict = rec.classify_stop(bytes(buf), result, is_active_segment=True)
    # a valid record after the zeros is corruption (an append leaves a prefix): the rule is conservative
    after = rec.find_records(bytes(buf), result.end + 1)
    assert verdict is (rec.Verdict.CORRUPT if after else rec.Verdict.TORN_TAIL)
    assert result.end >= good


def test_sequence_numbers_must_run_on_and_a_seal_must_match_and_end_the_segment() -> None:
    buf = _segment(first_seq=10)
    rec.append_enqueue(buf, 1, 0, b"", b"a", 10)
    second = len(buf)
    rec.append_enqueue(buf, 2, 0, b"", b"b", 12)  # 11 is missing
    result = rec.scan_records(bytes(buf), rec.SEGMENT_HEADER_BYTES, 1, -1, 10)
    assert result.stop is rec.StopReason.BAD_SEQUENCE and result.end == second
    # a compacted segment may skip numbers, never go back
    assert rec.scan_records(bytes(buf), rec.SEGMENT_HEADER_BYTES, 1, -1, 10, contiguous=False).stop is None
    sealed = _segment(first_seq=10)
    rec.append_enqueue(sealed, 1, 0, b"", b"a", 10)
    seal_at = len(sealed)
    rec.append_seal(sealed, rec.Seal(11, 2, 2))  # says two records, holds one
    result = rec.scan_records(bytes(sealed), rec.SEGMENT_HEADER_BYTES, 1, -1, 10)
    assert result.stop is rec.StopReason.BAD_SEAL and result.end == seal_at
    good = _segment(first_seq=10)
    rec.append_enqueue(good, 1, 0, b"", b"a", 10)
    rec.append_seal(good, rec.Seal(11, 1, 2))
    end = len(good)
    rec.append_ack(good, 1, 11)
    result = rec.scan_records(bytes(good), rec.SEGMENT_HEADER_BYTES, 1, -1, 10)
    assert result.stop is rec.StopReason.AFTER_SEAL and result.end == end
    assert rec.classify_stop(bytes(good), result, is_active_segment=True) is rec.Verdict.CORRUPT


@given(st.binary(max_size=400))
def test_random_bytes_never_crash_the_scanner(junk: bytes) -> None:
    data = rec.encode_segment_header(1, 0) + junk
    result = rec.scan_records(data, rec.SEGMENT_HEADER_BYTES, 1, -1)
    assert result.end <= len(data)
    if result.stop is not None:
        assert rec.classify_stop(data, result, is_active_segment=True) in tuple(rec.Verdict)


def test_ids_must_increase_and_unknown_kinds_are_errors() -> None:
    buf = _segment()
    rec.append_enqueue(buf, 5, 0, b"", b"a", 0)
    first = len(buf)
    rec.append_enqueue(buf, 5, 0, b"", b"b", 1)
    result = rec.scan_records(buf, rec.SEGMENT_HEADER_BYTES, 1, -1)
    assert result.stop is rec.StopReason.ID_NOT_INCREASING and result.end == first
    assert rec.classify_stop(buf, result, is_active_segment=True) is rec.Verdict.CORRUPT
    # ids continue across segments: the previous segment's last id is passed in
    assert (
        rec.scan_records(buf[:first], rec.SEGMENT_HEADER_BYTES, 2, 5).stop is rec.StopReason.ID_NOT_INCREASING
    )


def test_oversized_record_is_refused_before_encoding() -> None:
    class Huge(bytes):
        def __len__(self) -> int:
            return rec.MAX_RECORD_BYTES

    with pytest.raises(ValueError, match="exceeds the maximum"):
        rec.append_enqueue(bytearray(), 1, 0, b"", Huge())


def test_public_surface() -> None:
    """``store.__all__`` lists every public name once, each defined in the package, and nothing more."""
    import types

    from corda_trio import store

    exported = store.__all__
    assert len(exported) == len(set(exported))
    missing = [name for name in exported if not hasattr(store, name)]
    assert missing == []
    public = {
        n for n, v in vars(store).items() if not n.startswith("_") and not isinstance(v, types.ModuleType)
    } - {"annotations"}
    assert public == set(exported), sorted(public ^ set(exported))
