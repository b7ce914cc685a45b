"""The pure record codec: golden vectors from protocol_spec/store-format.md, round trips, the scanner."""

from __future__ import annotations

import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corda_trio.store import _record as rec

# protocol_spec/store-format.md §3 "Golden vectors"
GOLDEN_HEADER = "43545741 4c534547 01000000 28000000 01000000 00000000 00000000 00000000 cb40304a 00000000"
GOLDEN_ENQUEUE = "26000000 2df1c954 01000000 07000000 00000000 0068e5cf 8b010000 01000000 68 68656c6c6f"
GOLDEN_ACK = "20000000 bca0be9b 02000000 07000000 00000000 00000000 00000000 00000000"


def _hex(text: str) -> bytes:
    return bytes.fromhex(text.replace(" ", ""))


def test_crc_is_the_standard_crc32() -> None:
    assert zlib.crc32(b"123456789") == 0xCBF43926


def test_golden_vectors() -> None:
    assert rec.encode_segment_header(1, 0) == _hex(GOLDEN_HEADER)
    assert rec.decode_segment_header(_hex(GOLDEN_HEADER)) == (1, 0)
    buf = bytearray()
    assert rec.append_enqueue(buf, 7, 1_700_000_000_000, b"h", b"hello") == 38
    assert bytes(buf) == _hex(GOLDEN_ENQUEUE)
    assert rec.decode_enqueue_body(bytes(buf)) == (7, 1_700_000_000_000, b"h", b"hello")
    ack = bytearray()
    rec.append_ack(ack, 7)
    assert bytes(ack) == _hex(GOLDEN_ACK)
    segment = _hex(GOLDEN_HEADER) + bytes(buf) + bytes(ack)
    result = rec.scan_records(segment, rec.SEGMENT_HEADER_BYTES, 1, -1)
    assert result.stop is None and list(result.enqueue_ids) == [7] and list(result.ack_ids) == [7]


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
    length = rec.append_enqueue(plain, mid, ts, meta, payload)
    located = bytearray(prefix)
    loc = rec.append_enqueue_located(located, mid, ts, meta, payload)
    assert located == plain
    assert rec.unpack_location(loc) == (0, len(prefix), length, len(meta), ts)


def test_append_enqueue_located_rejects_oversized_records_untouched() -> None:
    class Huge(bytes):
        def __len__(self) -> int:
            return rec.MAX_RECORD_BYTES

    buf = bytearray(b"kept")
    with pytest.raises(ValueError, match="exceeds the maximum"):
        rec.append_enqueue_located(buf, 1, 0, b"", Huge())
    assert buf == b"kept"


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda h: h[:39], "40"),
        (lambda h: b"X" + h[1:], "magic"),
        (lambda h: h[:20] + b"\x01" + h[21:], "checksum"),
    ],
)
def test_bad_segment_headers(mutate: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        rec.decode_segment_header(mutate(rec.encode_segment_header(3, 9)))  # type: ignore[operator]


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
    assert rec.unpack_location(rec.pack_location(1, 40, 32, 0, 0)) == (1, 40, 32, 0, 0)


records = st.lists(
    st.one_of(
        st.tuples(st.just("enqueue"), st.binary(max_size=64), st.binary(max_size=600)),
        st.tuples(st.just("ack"), st.integers(0, 2**64 - 1), st.just(b"")),
    ),
    max_size=30,
)


@given(records, st.integers(0, 2**40))
def test_scan_returns_exactly_what_was_appended(items: list[tuple[str, object, bytes]], ts: int) -> None:
    data = bytearray(rec.encode_segment_header(5, 0))
    enqueued, acked, next_id = [], [], 0
    for kind, a, b in items:
        if kind == "enqueue":
            offset = len(data)
            length = rec.append_enqueue(data, next_id, ts, a, b)  # type: ignore[arg-type]
            enqueued.append((next_id, offset, length, len(a), a, b))  # type: ignore[arg-type]
            next_id += 1
        else:
            rec.append_ack(data, a)  # type: ignore[arg-type]
            acked.append(a)
    result = rec.scan_records(data, rec.SEGMENT_HEADER_BYTES, 5, -1)
    assert result.stop is None and result.end == len(data)
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
    buf = bytearray(rec.encode_segment_header(1, 0))
    for i, (kind, a, b) in enumerate(items):
        if kind == "enqueue":
            rec.append_enqueue(buf, i, 0, a, b)  # type: ignore[arg-type]
        else:
            rec.append_ack(buf, i)
    good = len(buf)
    rec.append_enqueue(buf, 10_000, 0, b"m", b"last record")
    cut = data.draw(st.integers(good + 1, len(buf) - 1))
    prefix = bytes(buf[:cut])
    result = rec.scan_records(prefix, rec.SEGMENT_HEADER_BYTES, 1, -1)
    assert result.stop is not None and result.end == good
    assert rec.classify_stop(prefix, result, is_last_segment=True) is rec.Verdict.TORN_TAIL
    assert rec.classify_stop(prefix, result, is_last_segment=False) is rec.Verdict.CORRUPT


@given(st.binary(max_size=400))
def test_random_bytes_never_crash_the_scanner(junk: bytes) -> None:
    data = rec.encode_segment_header(1, 0) + junk
    result = rec.scan_records(data, rec.SEGMENT_HEADER_BYTES, 1, -1)
    assert result.end <= len(data)
    if result.stop is not None:
        assert rec.classify_stop(data, result, is_last_segment=True) in tuple(rec.Verdict)


def test_ids_must_increase_and_unknown_kinds_are_errors() -> None:
    buf = bytearray(rec.encode_segment_header(1, 0))
    rec.append_enqueue(buf, 5, 0, b"", b"a")
    first = len(buf)
    rec.append_enqueue(buf, 5, 0, b"", b"b")
    result = rec.scan_records(buf, rec.SEGMENT_HEADER_BYTES, 1, -1)
    assert result.stop is rec.StopReason.ID_NOT_INCREASING and result.end == first
    assert rec.classify_stop(buf, result, is_last_segment=True) is rec.Verdict.CORRUPT
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
    from corda_trio import store

    for name in store.__all__:
        assert getattr(store, name) is not None, name
    assert sorted(store.__all__) == sorted(set(store.__all__))
