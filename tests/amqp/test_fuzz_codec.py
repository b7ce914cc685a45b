"""Fuzzing invariant (h11 ``fuzz/afl-server.py`` style): malformed bytes raise only ``DecodeError``.

Random bytes and mutations of valid encodings go through every decoder: each either decodes or raises
:class:`~corda_trio.amqp.DecodeError` (with an offset inside the input); never another exception, and never
a large allocation (declared sizes are checked against the buffer before anything is allocated).
"""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from corda_trio import amqp

ROOT = Path(__file__).resolve().parents[2]
VECTORS = json.loads((ROOT / "protocol_spec" / "vectors" / "amqp-codec.json").read_text(encoding="utf-8"))
VALID = [bytes.fromhex(v["hex"]) for kind in ("values", "frames", "messages") for v in VECTORS[kind]]
VALID = [v for v in VALID if v]


def check_value(data: bytes) -> None:
    try:
        _, end = amqp.decode_value(data)
    except amqp.DecodeError as exc:
        assert 0 <= exc.offset <= len(data)
        assert exc.condition.startswith("amqp:")
    else:
        assert 0 < end <= len(data)


def check_message(data: bytes) -> None:
    try:
        amqp.Message.decode(data)
    except amqp.DecodeError as exc:
        assert 0 <= exc.offset <= len(data)


def check_frames(data: bytes, chunk: int) -> None:
    buf = amqp.FrameBuffer(max_frame_size=1 << 16)
    try:
        for i in range(0, len(data), chunk):
            buf.feed(data[i : i + chunk])
            while buf.next_frame() is not None:
                pass
    except amqp.DecodeError:
        pass
    try:
        amqp.decode_frame(data)
    except amqp.DecodeError:
        pass


@given(st.binary(max_size=512))
@example(b"\xf0\xff\xff\xff\xff\xff\xff\xff\xff\x40")
@example(b"\xd1\x00\x00\x00\x08\x00\x00\x00\x02\xc0\x01\x00\x40")
def test_random_bytes_raise_only_decode_error(data: bytes) -> None:
    check_value(data)
    check_message(data)
    check_frames(data, 7)


mutations = st.lists(
    st.tuples(
        st.sampled_from(["flip", "insert", "delete", "truncate"]), st.integers(0, 2**16), st.integers(0, 255)
    ),
    min_size=1,
    max_size=4,
)


def mutate(data: bytes, ops: list[tuple[str, int, int]]) -> bytes:
    buf = bytearray(data)
    for op, where, byte in ops:
        i = where % (len(buf) + 1)
        if op == "flip" and i < len(buf):
            buf[i] ^= byte or 0xFF
        elif op == "insert":
            buf[i:i] = bytes((byte,))
        elif op == "delete" and i < len(buf):
            del buf[i]
        elif op == "truncate":
            del buf[i:]
    return bytes(buf)


@given(st.sampled_from(VALID), mutations, st.integers(1, 64))
def test_mutated_valid_encodings_raise_only_decode_error(data: bytes, ops: Any, chunk: int) -> None:
    bad = mutate(data, ops)
    check_value(bad)
    check_message(bad)
    check_frames(bad, chunk)


def test_huge_declared_sizes_allocate_nothing() -> None:
    cases = [
        b"\xb0\xff\xff\xff\xff" + b"x" * 64,  # 4 GiB binary
        b"\xb1\xff\xff\xff\xff" + b"x" * 64,  # 4 GiB string
        b"\xd0\xff\xff\xff\xff\xff\xff\xff\xff" + b"\x40" * 64,  # 4G-element list
        b"\xd1\xff\xff\xff\xff\xff\xff\xff\xfe" + b"\x40" * 64,  # map
        b"\xf0\xff\xff\xff\xff\xff\xff\xff\xff\x40",  # 4G nulls (zero-width elements)
        b"\xf0\x00\x00\x00\x05\xff\xff\xff\xff\x40",
        b"\xf0\x00\x00\x00\x05\x00\x0f\xff\xff\x45",  # 1M empty lists
    ]
    tracemalloc.start()
    try:
        for data in cases:
            check_value(data)
            check_message(b"\x00\x53\x77" + data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, peak
    buf = amqp.FrameBuffer()  # even with the default (4 GiB) max-frame-size, nothing is reserved up front
    buf.feed(b"\xff\xff\xff\xf0\x02\x00\x00\x00")
    assert buf.next_frame() is None
    assert buf.buffered_bytes == 8


@pytest.mark.slow
@settings(max_examples=3000)
@given(st.lists(st.sampled_from(VALID), min_size=1, max_size=4), mutations, st.integers(1, 300))
def test_deep_fuzz_of_concatenated_mutated_streams(parts: list[bytes], ops: Any, chunk: int) -> None:
    """A longer run of the invariant (marked slow) over streams of several mutated encodings."""
    bad = mutate(b"".join(parts), ops)
    check_value(bad)
    check_message(bad)
    check_frames(bad, chunk)
