"""AMQP codec micro-benchmark: corda_trio vs azure-servicebus's pure-Python ``_pyamqp`` vs Qpid Proton-C.

Run ``python -m bench.codec`` (``--quick`` for a short run, ``--json`` for one JSON record per line; the
table run ends with one JSON summary line). Other code calls :func:`run_codec_benchmark`, which returns the
results as records (plain dicts, schema below).

What is measured, for each library, in one process and one run (the libraries alternate within every
repeat, so a busy machine slows them alike):

``encode``
    from plain Python data (the body bytes, the seven Corda headers, the message id and address, the
    delivery id and tag) to the bytes of one whole transfer frame: build the library's message object with
    a durable header, properties (message-id, to), application-properties with seven Corda P2P headers
    (``platform-topic``, ``platform-version`` as an AMQP int, ``corda-vendor``, ``release-version``,
    ``_AMQ_DUPL_ID``, ``sender-uuid``, ``send-seq-no`` as a long: Corda 4's ``P2PMessagingHeaders``) and one
    Data body section, encode it, build the transfer performative (handle,
    delivery-id, delivery-tag, message-format, settled=false), and produce header + performative + payload.
    Every message gets a fresh delivery-id, message-id (also the ``_AMQ_DUPL_ID`` value) and sequence
    number, as a real sender's do.
``decode``
    from the bytes of that whole frame to decoded objects: the 8-byte frame header, the transfer
    performative's fields, and the message with **every section decoded** (header, properties,
    application-properties, and the body as ``bytes``). Each library decodes frames it encoded itself,
    cycling through a pool of distinct frames (up to 8192, at most ~32 MiB; ids differ), so that no
    decoder is timed on one frame seen over and over (corda_trio memoises recurring small map entries
    and headers, which real traffic has, but not one-off ids). Before timing, corda_trio checks that it
    decodes the other two libraries' first frames to the same message.

* ``corda_trio``: ``amqp.encode_frame(Transfer, channel, Message(...).encode())`` /
  ``amqp.decode_frame(frame)`` + ``amqp.Message.decode(frame.payload)``.
* ``pyamqp``: what ``azure.servicebus._pyamqp``'s own transport and link do: ``encode_payload`` +
  ``encode_frame(TransferFrame)`` + the channel bytes / ``struct`` header, ``decode_frame`` and
  ``decode_payload``.
* ``proton``: ``proton.Message`` (``inferred`` Data body) ``encode()``; the performative via ``proton.Data``
  (the Python binding has no frame encoder: the same codec Proton-C's engine uses); decode with
  ``Data.decode`` + ``Message.decode``.

Two message shapes (``--shapes``): ``p2p``, the seven application properties above (Corda 4's P2P traffic),
and ``basic``, the benchmark's earlier corpus: the same message with only the first five of them
(``platform-topic``, ``platform-version``, ``corda-vendor``, ``release-version``, ``_AMQ_DUPL_ID``).
Body sizes: 16 B, 1 KiB (the target case) and 64 KiB. The measurement runs in ``repeats`` rounds; a round
times one batch of about ``batch_seconds`` of every library, first all encodes, then all decodes, in an
order that flips from round to round, so the batches compared with each other run within a second or so.
A library's ops/s is the best of its batches (the median is reported too). A *ratio* is taken per round,
corda_trio's batch over the faster anchor's batch of that same round, and the reported ratio is the median
of those per-round ratios (with their range, and the ratio of the bests for comparison): on a shared
machine whose speed drifts within minutes, a slowdown that lasts a round slows both sides of that round's
ratio, where it skews a ratio of two bests taken at different times. Target: corda_trio at least 3x
(encode) and 2.5x (decode) the faster of the other two on the 1 KiB message of both shapes
(``meets_target``); the last line (JSON) carries every ratio (``ratios``, ``ratio_ranges``) and, for every
shape and body size, whether both ratios reach the target there (``meets_target_by_case``).

Record schema (one dict per shape x library x operation x body size, then one ``"summary"`` record per
shape and body size)::

    {"benchmark": "codec", "shape": "p2p" | "basic", "library": "corda_trio" | "pyamqp" | "proton",
     "operation": "encode" | "decode", "body_bytes": 1024, "frame_bytes": 1186, "ops_per_second": 123456.0,
     "median_ops_per_second": ..., "us_per_op": 8.1, "repeats": 7, "machine": "...", "python": "3.11.7"}
    {"benchmark": "codec", "shape": "p2p", "library": "summary", "body_bytes": 1024, "encode_ratio": 2.3,
     "encode_ratio_range": [2.1, 2.5], "encode_ratio_of_bests": 2.3, "encode_anchor": "proton",
     "decode_ratio": 2.1, ..., "target": "...", "meets_target": true, ...}

``encode_ratio`` / ``decode_ratio`` = the median over the rounds of corda_trio's ops/s over the faster of
``pyamqp`` and ``proton`` in that round; ``*_anchor`` the library that was the faster one in most rounds.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import platform
import statistics
import struct
import sys
import time
from collections.abc import Callable
from typing import Any, Final

from corda_trio import amqp

__all__ = ["BODY_SIZES", "LIBRARIES", "SHAPES", "run_codec_benchmark"]

BODY_SIZES: Final = (16, 1024, 65536)
#: Message shapes: how many of :func:`corda_headers`' application properties the message carries.
SHAPES: Final = {"p2p": 7, "basic": 5}  # see corda_headers
LIBRARIES: Final = ("corda_trio", "pyamqp", "proton")
TARGET_ENCODE_RATIO: Final = 3.0
TARGET_DECODE_RATIO: Final = 2.5
POOL_FRAMES: Final = 8192
POOL_BYTES: Final = 32 << 20
HANDLE, CHANNEL, DELIVERY_ID = 0, 1, 4711
DELIVERY_TAG: Final = (4711).to_bytes(8, "big")
MESSAGE_ID: Final = "N-5f2c1e9a77d04b2c-3-1"
ADDRESS: Final = "p2p.inbound.DL8eWT8pPPKVq1LqiZE33L5pHNWNQfzdXFmrDnT7pHCrzK"
_HEADER: Final = struct.Struct(">IBBH")


SENDER_UUID: Final = "3f0b9c4e-8a51-4d8e-9c4a-6a1d2f7b5e10"


def corda_headers(message_id: str = MESSAGE_ID, seq: int = 0, shape: str = "p2p") -> dict[str, Any]:
    """The Corda 4 P2P application properties (``P2PMessagingHeaders``) of ``shape``, as plain values."""
    headers = {
        "platform-topic": "platform.session",
        "platform-version": 13,  # written as AMQP int by every library
        "corda-vendor": "Corda Open Source",
        "release-version": "4.12",
        "_AMQ_DUPL_ID": message_id,
    }
    if shape == "p2p":  # (built in place: this runs inside every timed encode, for every library)
        headers["sender-uuid"] = SENDER_UUID
        headers["send-seq-no"] = 1_000_000 + seq  # a long
    return headers


def _ids() -> Callable[[], tuple[int, str, int]]:
    """A fresh (delivery id, message id, seq) per message, as a real sender has: no codec sees a repeat."""
    counter = itertools.count()

    def next_ids() -> tuple[int, str, int]:
        n = next(counter)
        return DELIVERY_ID + n, f"{MESSAGE_ID}-{n}", n

    return next_ids


# --- the three libraries -------------------------------------------------------------------------------


def _ours(body: bytes, shape: str) -> tuple[Callable[[], bytes], Callable[[bytes], Any]]:
    next_ids = _ids()
    Int, Message, Header, Properties = amqp.Int, amqp.Message, amqp.Header, amqp.Properties
    Transfer, encode_frame, decode_frame = amqp.Transfer, amqp.encode_frame, amqp.decode_frame

    def encode() -> bytes:
        delivery_id, message_id, seq = next_ids()
        app = corda_headers(message_id, seq, shape)
        app["platform-version"] = Int(app["platform-version"])
        message = Message(
            header=Header(durable=True),
            properties=Properties(message_id=message_id, to=ADDRESS),
            application_properties=app,
            body=body,
        )
        transfer = Transfer(handle=HANDLE, delivery_id=delivery_id, delivery_tag=DELIVERY_TAG,
                            message_format=0, settled=False)  # fmt: skip
        return encode_frame(transfer, CHANNEL, message.encode())

    def decode(frame: bytes) -> Any:
        f = decode_frame(frame)
        return f.channel, f.performative, f.message()

    return encode, decode


def _pyamqp(body: bytes, shape: str) -> tuple[Callable[[], bytes], Callable[[bytes], Any]]:
    from azure.servicebus._pyamqp import _decode as pyd
    from azure.servicebus._pyamqp import _encode as pye
    from azure.servicebus._pyamqp import message as pym
    from azure.servicebus._pyamqp import performatives as pyp
    from azure.servicebus._pyamqp.types import AMQPTypes

    next_ids = _ids()
    channel = struct.pack(">H", CHANNEL)

    def encode() -> bytes:
        delivery_id, message_id, seq = next_ids()
        app = corda_headers(message_id, seq, shape)
        app["platform-version"] = {pye.TYPE: AMQPTypes.int, pye.VALUE: app["platform-version"]}
        message = pym.Message(
            header=pym.Header(durable=True),
            properties=pym.Properties(message_id=message_id, to=ADDRESS),
            application_properties=app,
            data=[body],
        )
        payload = pye.encode_payload(bytearray(), message)
        transfer = pyp.TransferFrame(handle=HANDLE, delivery_id=delivery_id, delivery_tag=DELIVERY_TAG,
                                     message_format=0, settled=False, payload=payload)  # fmt: skip
        header, performative = pye.encode_frame(transfer)
        return bytes(header + channel + performative)

    def decode(frame: bytes) -> Any:
        _size, doff, _ftype, ch = _HEADER.unpack_from(frame)
        _code, fields = pyd.decode_frame(memoryview(frame)[doff * 4 :])
        message = pyd.decode_payload(fields[-1])
        return ch, fields, message

    return encode, decode


def _proton(body: bytes, shape: str) -> tuple[Callable[[], bytes], Callable[[bytes], Any]]:
    import proton
    from proton import Data, Described, int32, ulong

    next_ids = _ids()
    descriptor = ulong(0x14)
    uint = proton.uint

    def encode() -> bytes:
        delivery_id, message_id, seq = next_ids()
        app = corda_headers(message_id, seq, shape)
        app["platform-version"] = int32(app["platform-version"])
        message = proton.Message(inferred=True, durable=True, id=message_id, address=ADDRESS, properties=app,
                                 body=body)  # fmt: skip
        payload = message.encode()
        data = Data()
        data.put_object(
            Described(descriptor, [uint(HANDLE), uint(delivery_id), DELIVERY_TAG, uint(0), False])
        )
        performative = data.encode()
        return _HEADER.pack(8 + len(performative) + len(payload), 2, 0, CHANNEL) + performative + payload

    def decode(frame: bytes) -> Any:
        _size, doff, _ftype, ch = _HEADER.unpack_from(frame)
        data = Data()
        used = data.decode(frame[doff * 4 :])
        data.rewind()
        data.next()
        transfer = data.get_object()
        message = proton.Message()
        message.decode(frame[doff * 4 + used :])
        return ch, transfer, message

    return encode, decode


_FACTORIES: Final = {"corda_trio": _ours, "pyamqp": _pyamqp, "proton": _proton}


def _check_equivalent(frames: dict[str, bytes], body: bytes, shape: str) -> None:
    """corda_trio decodes every library's first frame to the same transfer and message (a sanity check)."""
    message_id = f"{MESSAGE_ID}-0"
    expected_app = corda_headers(message_id, 0, shape)
    for library, frame in frames.items():
        f = amqp.decode_frame(frame)
        m = amqp.Message.decode(f.payload)
        t = f.performative
        problems = []
        if (f.channel, t.handle, t.delivery_id, t.delivery_tag, t.settled) != (
            CHANNEL, HANDLE, DELIVERY_ID, DELIVERY_TAG, False):  # fmt: skip
            problems.append(f"transfer {t}")
        if m.header is None or not m.header.durable:
            problems.append(f"header {m.header}")
        if m.properties is None or (m.properties.message_id, m.properties.to) != (message_id, ADDRESS):
            problems.append(f"properties {m.properties}")
        app = m.application_properties or {}
        if app != expected_app or type(app["platform-version"]) is not amqp.Int:
            problems.append(f"application-properties {app}")
        if m.body != body:
            problems.append("body")
        if problems:
            raise AssertionError(f"{library}'s frame differs: {'; '.join(problems)}")


def _pool_size(frame_bytes: int, pool_frames: int) -> int:
    """How many distinct frames the decoders cycle through: up to ``pool_frames``, at most ~32 MiB each."""
    return max(1, min(pool_frames, POOL_BYTES // frame_bytes))


def _time(fn: Callable[[], Any], number: int) -> float:
    gc_was = gc.isenabled()
    gc.disable()
    try:
        start = time.perf_counter()
        for _ in range(number):
            fn()
        return time.perf_counter() - start
    finally:
        if gc_was:
            gc.enable()


def _calibrate(fn: Callable[[], Any], batch_seconds: float) -> int:
    number = 1
    while True:
        elapsed = _time(fn, number)
        if elapsed >= batch_seconds / 4:
            return max(1, int(number * batch_seconds / elapsed))
        number *= 4


def run_codec_benchmark(
    *,
    body_sizes: tuple[int, ...] = BODY_SIZES,
    libraries: tuple[str, ...] = LIBRARIES,
    shapes: tuple[str, ...] = tuple(SHAPES),
    repeats: int = 9,
    batch_seconds: float = 0.15,
    pool_frames: int = POOL_FRAMES,
) -> list[dict[str, Any]]:
    """Run the benchmark; return one record per shape x library x operation x body size, then summaries.

    Args:
        body_sizes: Data body sizes in bytes.
        libraries: which of :data:`LIBRARIES` to measure (the summary needs ``corda_trio`` and another).
        shapes: which of :data:`SHAPES` to measure.
        repeats: rounds, each one timed batch of every library and operation (see the module docstring).
        batch_seconds: approximate length of one batch.
        pool_frames: how many distinct frames each decoder cycles through (capped at ~32 MiB).
    """
    machine = f"{platform.machine()} {os.cpu_count()} cpu, {platform.system()} {platform.release()}"
    records: list[dict[str, Any]] = []
    for shape in shapes:
        for size in body_sizes:
            records += _measure(shape, size, libraries, repeats, batch_seconds, pool_frames, machine)
    return records


def _measure(
    shape: str, size: int, libraries: tuple[str, ...], repeats: int, batch_seconds: float, pool_frames: int,
    machine: str,
) -> list[dict[str, Any]]:  # fmt: skip
    """The records of one shape and body size (every library, both operations, then the summary)."""
    records: list[dict[str, Any]] = []
    body = bytes(range(256)) * (size // 256) + bytes(range(size % 256))
    funcs = {lib: _FACTORIES[lib](body, shape) for lib in libraries}
    frames = {lib: enc() for lib, (enc, _dec) in funcs.items()}
    _check_equivalent(frames, body, shape)
    jobs: dict[tuple[str, str], Callable[[], Any]] = {}
    for lib, (enc, dec) in funcs.items():
        # decode cycles through distinct frames (ids differ), as a receiver sees them
        pool = [frames[lib]] + [enc() for _ in range(_pool_size(len(frames[lib]), pool_frames) - 1)]
        jobs[(lib, "encode")] = enc
        jobs[(lib, "decode")] = lambda dec=dec, frames=itertools.cycle(pool): dec(next(frames))
    numbers = {key: _calibrate(fn, batch_seconds) for key, fn in jobs.items()}
    rates: dict[tuple[str, str], list[float]] = {key: [] for key in jobs}
    for round_ in range(repeats):
        # One round times one batch of every library, operation by operation, so the batches compared with
        # each other run seconds apart at most; the order flips every round (no library always goes first).
        order = libraries if round_ % 2 == 0 else libraries[::-1]
        for op in ("encode", "decode"):
            for lib in order:
                key = (lib, op)
                rates[key].append(numbers[key] / _time(jobs[key], numbers[key]))
    common = {"benchmark": "codec", "shape": shape, "body_bytes": size, "machine": machine,
              "python": platform.python_version()}  # fmt: skip
    for (lib, op), values in rates.items():
        best = max(values)
        records.append({
            **common, "library": lib, "operation": op, "frame_bytes": len(frames[lib]),
            "ops_per_second": round(best, 1), "median_ops_per_second": round(statistics.median(values), 1),
            "us_per_op": round(1e6 / best, 3), "repeats": repeats,
        })  # fmt: skip
    others = [lib for lib in libraries if lib != "corda_trio"]
    if "corda_trio" in libraries and others:
        summary: dict[str, Any] = {**common, "library": "summary"}
        for op in ("encode", "decode"):
            ours = rates[("corda_trio", op)]
            # per round: ours over the faster anchor *in that round*; the ratio is their median
            anchors = [max(rates[(lib, op)][i] for lib in others) for i in range(repeats)]
            per_round = sorted(o / a for o, a in zip(ours, anchors, strict=True))
            fastest = [max(others, key=lambda lib, i=i, op=op: rates[(lib, op)][i]) for i in range(repeats)]
            summary[f"{op}_ratio"] = round(statistics.median(per_round), 3)
            summary[f"{op}_ratio_range"] = [round(per_round[0], 3), round(per_round[-1], 3)]
            best_anchor = max(max(rates[(lib, op)]) for lib in others)
            summary[f"{op}_ratio_of_bests"] = round(max(ours) / best_anchor, 3)
            summary[f"{op}_anchor"] = max(others, key=fastest.count)
        summary["target"] = (
            f"corda_trio >= {TARGET_ENCODE_RATIO}x (encode) and >= {TARGET_DECODE_RATIO}x (decode) "
            "the faster anchor (1 KiB)"
        )
        encode_ok = summary["encode_ratio"] >= TARGET_ENCODE_RATIO
        summary["meets_target"] = encode_ok and summary["decode_ratio"] >= TARGET_DECODE_RATIO
        records.append(summary)
    return records


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.codec", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="short run (3 repeats of 0.05 s)")
    parser.add_argument("--json", action="store_true", help="print one JSON record per line")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--sizes", default=",".join(map(str, BODY_SIZES)), help="body sizes, comma-separated")
    parser.add_argument("--shapes", default=",".join(SHAPES), help=f"message shapes ({', '.join(SHAPES)})")
    args = parser.parse_args(argv)
    repeats = args.repeats or (3 if args.quick else 9)
    shapes = tuple(args.shapes.split(","))
    unknown = set(shapes) - set(SHAPES)
    if unknown:
        parser.error(f"unknown shape(s) {', '.join(sorted(unknown))}; choose from {', '.join(SHAPES)}")
    records = run_codec_benchmark(
        body_sizes=tuple(int(s) for s in args.sizes.split(",")),
        shapes=shapes,
        repeats=repeats,
        batch_seconds=0.05 if args.quick else 0.15,
    )
    if args.json:
        for r in records:
            print(json.dumps(r))
        return 0
    print(
        f"{'shape':<6} {'body':>7} {'operation':<9} "
        + "".join(f"{lib:>14}" for lib in LIBRARIES)
        + "   ratio (ours / faster anchor: median of rounds [range])"
    )
    by_key = {
        (r["shape"], r["body_bytes"], r["operation"], r["library"]): r
        for r in records
        if r["library"] != "summary"
    }
    summaries = {(r["shape"], r["body_bytes"]): r for r in records if r["library"] == "summary"}
    final: dict[str, Any] = {"benchmark": "codec", "unit": "ops_per_second", "results": {}, "ratios": {}}
    for shape in shapes:
        for size in sorted({r["body_bytes"] for r in records}):
            s = summaries.get((shape, size))
            if s:
                ratios = {"encode": s["encode_ratio"], "decode": s["decode_ratio"]}
                final["ratios"][f"{shape}_{size}"] = ratios
                final.setdefault("ratio_ranges", {})[f"{shape}_{size}"] = {
                    op: s[f"{op}_ratio_range"] for op in ("encode", "decode")
                }
                final.setdefault("meets_target_by_case", {})[f"{shape}_{size}"] = s["meets_target"]
            for op in ("encode", "decode"):
                cells = []
                for lib in LIBRARIES:
                    r = by_key.get((shape, size, op, lib))
                    cells.append(f"{r['ops_per_second']:>14,.0f}" if r else f"{'-':>14}")
                    if r:
                        final["results"].setdefault(lib, {})[f"{op}_{shape}_{size}"] = r["ops_per_second"]
                ratio = ""
                if s:
                    low, high = s[f"{op}_ratio_range"]
                    ratio = f"   {s[f'{op}_ratio']:.2f}x vs {s[f'{op}_anchor']} [{low:.2f}-{high:.2f}]"
                print(f"{shape:<6} {size:>7} {op:<9} " + "".join(cells) + ratio)
    targets = [summaries[(shape, 1024)] for shape in shapes if (shape, 1024) in summaries]
    if targets:
        if (shapes[0], 1024) in summaries:  # the first shape's 1 KiB ratios, as earlier runs printed them
            first = summaries[(shapes[0], 1024)]
            final["ratios_1k"] = {"encode": first["encode_ratio"], "decode": first["decode_ratio"]}
        final["meets_target"] = all(s["meets_target"] for s in targets)
        print(f"1 KiB target ({targets[0]['target']}, shapes {', '.join(shapes)}): "
              f"{'MET' if final['meets_target'] else 'MISSED'}")  # fmt: skip
    final["load_average"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(final))
    return 0


if __name__ == "__main__":
    sys.exit(main())
