"""Write-ahead-log benchmark: group commit against a raw fsync loop, 1 KiB durable throughput, recovery.

Run ``python -m bench.wal`` (``--quick`` for a short run, ``--json`` for one JSON record per line). Other
code calls :func:`run_wal_benchmark`, which returns the results as records (plain dicts).

What is measured, in one run:

``raw-loop``, ``raw-loop-encoded``, ``raw-loop-per-record``
    (a) a plain Python loop that appends 256-byte records to a file and calls ``fdatasync`` once per
    batch of N records. ``raw-loop`` writes N pre-built random 256-byte blobs joined into one ``os.write``:
    the ceiling for this disk at N records per fsync, with no per-record work at all.
    ``raw-loop-encoded`` is the like-for-like loop: every record is encoded in the store's format
    (``protocol_spec/store-format.md``: 40-byte header with sequence, id, timestamp, CRC-32 and length
    check, 216-byte payload) by the same codec function the queue uses, into one buffer written with one
    ``os.write`` per batch.
    ``raw-loop-per-record`` calls ``os.write`` once per pre-built record.
``queue-256``
    (b) our durable queue with 64 concurrent producers enqueuing 256-byte records (216-byte payload +
    40-byte header), fsync ``always``. Its mean records per fsync is the N given to (a), so the two run
    at the same records per fsync. ``ratio_to_raw_encoded`` is (b) / ``raw-loop-encoded``: same records
    per fsync, same bytes on disk, same encoding and checksum work, so the ratio measures exactly what the
    queue adds (tasks, wake-ups, hand-offs to the commit helper, index); the target is >= 0.5.
    ``ratio_to_raw`` is (b) / ``raw-loop`` and ``ratio_to_raw_per_record`` (b) / ``raw-loop-per-record``.
    (b) also reports its CPU time per record: the broker's process (all threads), its event-loop thread
    alone, and its commit helper process.

    ``serial_bound`` is what a queue that commits one batch at a time could reach at most: every batch
    then holds all 64 producers and the next one can only start after they were woken, so one group
    commit costs the event loop's work for 64 records *plus* one write + fsync, and the ratio is at most
    ``fsync_seconds / (fsync_seconds + per_fsync * event_loop_seconds_per_record)`` (computed from the
    measured values). The queue beats it by splitting the producers into two cohorts whose event-loop
    work overlaps the other cohort's fsync (see ``corda_trio/store/_wal.py``).
``queue-1k``
    the same with 1 KiB payloads. Target: >= 50,000 durable enqueues per second.
``queue-1k-threads``
    the reference for ``queue-1k``, in the same run: the same queue with ``commit_process=False``
    (writes and syncs on worker threads, batches taken whole, one in flight: the store's design before the
    commit helper process). ``ratio_to_threads`` on ``queue-1k`` compares the two.
``sweep`` (``--sweep``, not part of the default run)
    1 KiB durable enqueues with 1, 4, 16 and 64 producers, with the commit helper process and on
    worker threads, alternating: where the two designs differ as the load grows.
``recovery-1m``
    a queue holding 1,000,000 messages of 1 KiB is closed and opened again: ``seconds`` until the broker
    is ready (every segment scanned and checksummed, the index rebuilt), plus the time to the first
    delivery. Target: <= 5 s. (The fill uses ``fsync="none"``: durability of the fill is not measured.)

The machine is shared and its fsync latency varies a lot from second to second, so (a) runs interleaved
with (b): each (b) run is cut into 8 slices and the three loops of (a) run a slice's worth of records
(at the records per fsync (b) showed so far) after each slice, each side timed only while it runs.
That is repeated ``repeats`` times; the records report each run plus the medians.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any, Final

import trio

from corda_trio import store

__all__ = ["raw_encoded_loop", "raw_fsync_loop", "run_producer_sweep", "run_wal_benchmark"]

RECORD_BYTES: Final = 256
HEADER_BYTES: Final = 40  # record header of store format version 2 (protocol_spec/store-format.md §3)
PRODUCERS: Final = 64
#: (a) runs between the slices of each (b) run (see :func:`_queue_run`).
SLICES: Final = 8


def _batch_sizes(total: int, per_fsync: int) -> list[int]:
    """``total`` records in batches of ``per_fsync`` (the last one smaller if it does not divide)."""
    full, rest = divmod(max(1, total), per_fsync)
    return [per_fsync] * full + ([rest] if rest else [])


def raw_fsync_loop(
    directory: str, *, record_bytes: int, per_fsync: int, total: int, write_per_record: bool = False
) -> dict[str, Any]:
    """(a): append ``total`` records of ``record_bytes`` with one ``fdatasync`` per ``per_fsync`` records.

    With ``write_per_record`` each record is one ``os.write`` (the loop appends records one by one);
    otherwise each batch is joined and written with a single ``os.write`` (the cheapest possible loop).
    """
    records = [os.urandom(record_bytes) for _ in range(per_fsync)]
    sizes = _batch_sizes(total, per_fsync)
    path = os.path.join(directory, "raw.log")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    write = os.write
    try:
        start = time.perf_counter()
        for size in sizes:
            if write_per_record:
                for record in records[:size]:
                    write(fd, record)
            else:
                write(fd, b"".join(records[:size]))
            os.fdatasync(fd)
        elapsed = time.perf_counter() - start
    finally:
        os.close(fd)
        os.unlink(path)
    count, batches = sum(sizes), len(sizes)
    return {
        "variant": "raw-loop-per-record" if write_per_record else "raw-loop",
        "record_bytes": record_bytes, "records": count, "seconds": elapsed,
        "records_per_second": count / elapsed, "records_per_fsync": float(per_fsync), "fsyncs": batches,
        "fsync_seconds": elapsed / batches,
    }  # fmt: skip


def raw_encoded_loop(directory: str, *, record_bytes: int, per_fsync: int, total: int) -> dict[str, Any]:
    """(a), like for like: encode ``total`` records in the store's format (header, id, timestamp, CRC-32;
    ``record_bytes`` in all) into one buffer per batch, ``os.write`` it, ``fdatasync``, ``per_fsync``
    records per batch."""
    payload = os.urandom(record_bytes - HEADER_BYTES)
    path = os.path.join(directory, "raw-encoded.log")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    write = os.write
    sync = os.fdatasync
    clock = time.time_ns
    sizes = _batch_sizes(total, per_fsync)
    try:
        message_id = 0
        start = time.perf_counter()
        cpu_start = time.process_time()
        for size in sizes:
            buf = bytearray()
            for _ in range(size):
                store.append_enqueue(buf, message_id, clock() // 1_000_000, b"", payload)
                message_id += 1
            write(fd, buf)
            sync(fd)
        elapsed = time.perf_counter() - start
        cpu = time.process_time() - cpu_start
    finally:
        os.close(fd)
        os.unlink(path)
    count, batches = sum(sizes), len(sizes)
    return {
        "variant": "raw-loop-encoded", "record_bytes": record_bytes, "records": count, "seconds": elapsed,
        "records_per_second": count / elapsed, "records_per_fsync": float(per_fsync), "fsyncs": batches,
        "fsync_seconds": elapsed / batches, "cpu_microseconds_per_record": cpu / count * 1e6,
    }  # fmt: skip


async def _queue_run(
    directory: str,
    *,
    payload_bytes: int,
    producers: int,
    total: int,
    slices: int = 1,
    between: Callable[[float], None] | None = None,
    commit_process: bool = True,
) -> dict[str, Any]:
    """(b): ``producers`` tasks enqueue ``total`` messages of ``payload_bytes`` into one durable queue.

    The run is cut into ``slices``; after each one (every enqueue of it durable, the queue idle)
    ``between(records_per_fsync_so_far)`` runs synchronously, outside the timed part. That is how (a) runs
    interleaved with (b), a slice at a time, so that both see the same fsync latency: on a shared
    machine it changes by a factor of ten within seconds.
    """
    root = os.path.join(directory, "broker")
    shutil.rmtree(root, ignore_errors=True)
    payload = os.urandom(payload_bytes)
    per_producer = total // producers // slices
    elapsed = cpu = loop_cpu = 0.0
    async with store.open_broker(root, config=store.BrokerConfig(commit_process=commit_process)) as broker:
        queue = await broker.declare_queue("bench.wal")

        async def produce() -> None:
            enqueue = queue.enqueue
            for _ in range(per_producer):
                await enqueue(payload)

        # (the helper idles while ``between`` runs: its CPU over the whole run is that of the slices)
        helper_pid = broker._helper.pid if broker._helper is not None else None
        helper_cpu_start = _process_cpu(helper_pid) if helper_pid is not None else None
        for _ in range(slices):
            start = time.perf_counter()
            cpu_start = time.process_time()
            loop_cpu_start = time.thread_time()
            async with trio.open_nursery() as nursery:
                for _ in range(producers):
                    nursery.start_soon(produce)
            elapsed += time.perf_counter() - start
            cpu += time.process_time() - cpu_start
            loop_cpu += time.thread_time() - loop_cpu_start
            if between is not None:
                between(queue.statistics().records_per_fsync)
        stats = queue.statistics()
        helper_cpu_end = _process_cpu(helper_pid) if helper_pid is not None else None
    helper_cpu = None
    if helper_cpu_start is not None and helper_cpu_end is not None:
        helper_cpu = helper_cpu_end - helper_cpu_start
    shutil.rmtree(root, ignore_errors=True)
    count = per_producer * producers * slices
    return {
        "variant": f"queue-{'1k' if payload_bytes == 1024 else payload_bytes + HEADER_BYTES}"
        + ("" if commit_process else "-threads"),
        "record_bytes": payload_bytes + HEADER_BYTES, "payload_bytes": payload_bytes, "producers": producers,
        "records": count, "seconds": elapsed, "records_per_second": count / elapsed,
        "records_per_fsync": stats.records_per_fsync, "fsyncs": stats.fsyncs, "slices": slices,
        "cpu_microseconds_per_record": cpu / count * 1e6,
        "loop_cpu_microseconds_per_record": loop_cpu / count * 1e6,
        "helper_cpu_microseconds_per_record": None if helper_cpu is None else helper_cpu / count * 1e6,
    }  # fmt: skip


def _process_cpu(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` so far (Linux ``/proc``; ``None`` elsewhere)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _combine(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One record for the slices of a raw loop run between the slices of a queue run."""
    records = sum(p["records"] for p in parts)
    seconds = sum(p["seconds"] for p in parts)
    fsyncs = sum(p["fsyncs"] for p in parts)
    out = dict(parts[-1], records=records, seconds=seconds, fsyncs=fsyncs, slices=len(parts))
    out["records_per_second"] = records / seconds
    out["records_per_fsync"] = records / fsyncs
    out["fsync_seconds"] = seconds / fsyncs
    if "cpu_microseconds_per_record" in out:
        cpu = sum(p["cpu_microseconds_per_record"] * p["records"] for p in parts)
        out["cpu_microseconds_per_record"] = cpu / records
    return out


async def _recovery_run(directory: str, *, messages: int, payload_bytes: int) -> dict[str, Any]:
    root = os.path.join(directory, "recovery")
    shutil.rmtree(root, ignore_errors=True)
    payload = os.urandom(payload_bytes)
    fill_start = time.perf_counter()
    async with store.open_broker(root) as broker:
        queue = await broker.declare_queue("bench.recovery", fsync="none")
        chunk = 2000
        for start in range(0, messages, chunk):
            await queue.enqueue_many([payload] * min(chunk, messages - start))
        disk = queue.statistics().disk_bytes
    fill_seconds = time.perf_counter() - fill_start
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    async with store.open_broker(root) as broker:
        ready = time.perf_counter() - start
        queue = broker.get_queue("bench.recovery")
        depth = queue.statistics().depth
        async with queue.consumer(credit=1) as consumer:
            first = await consumer.receive()
        first_delivery = time.perf_counter() - start
        report = broker.recovery_reports["bench.recovery"]
    rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    shutil.rmtree(root, ignore_errors=True)
    assert depth == messages and first.payload == payload
    return {
        "variant": "recovery-1m" if messages == 1_000_000 else f"recovery-{messages}",
        "messages": messages, "payload_bytes": payload_bytes, "disk_bytes": disk, "segments": report.segments,
        "seconds": ready, "scan_seconds": report.duration_seconds, "first_delivery_seconds": first_delivery,
        "fill_seconds": fill_seconds, "max_rss_growth_bytes": max(0, rss_after - rss_before) * 1024,
    }  # fmt: skip


def run_wal_benchmark(
    *,
    directory: str | None = None,
    total: int = 64_000,
    repeats: int = 3,
    recovery_messages: int = 1_000_000,
) -> list[dict[str, Any]]:
    """Run the whole benchmark and return one record (a dict) per measurement, then summary records.

    Args:
        directory: where to put the files (default: a temporary directory on the same disk as /tmp).
        total: enqueues per throughput run.
        repeats: how many times (a) and (b) alternate.
        recovery_messages: size of the recovery test (0 skips it).

    Every record has ``benchmark="wal"``, ``variant``, ``run``; summaries have ``run="median"`` and carry
    ``target`` and ``meets_target``.
    """
    base = tempfile.mkdtemp(prefix="wal-bench-", dir=directory)
    records: list[dict[str, Any]] = []
    try:
        slice_total = total // SLICES
        for run in range(repeats):
            parts: dict[str, list[dict[str, Any]]] = {"bare": [], "encoded": [], "per-record": []}

            def raw_slice(records_per_fsync: float, parts: dict[str, list[dict[str, Any]]] = parts) -> None:
                n = max(1, round(records_per_fsync))
                kw: dict[str, Any] = {"record_bytes": RECORD_BYTES, "per_fsync": n, "total": slice_total}
                parts["bare"].append(raw_fsync_loop(base, **kw))
                parts["encoded"].append(raw_encoded_loop(base, **kw))
                parts["per-record"].append(raw_fsync_loop(base, **kw, write_per_record=True))

            b = trio.run(lambda: _queue_run(base, payload_bytes=RECORD_BYTES - HEADER_BYTES,
                                            producers=PRODUCERS, total=total, slices=SLICES,
                                            between=raw_slice))  # fmt: skip
            a, ae, a1 = (_combine(parts[key]) for key in ("bare", "encoded", "per-record"))
            k = trio.run(lambda: _queue_run(base, payload_bytes=1024, producers=PRODUCERS, total=total))
            kt = trio.run(lambda: _queue_run(base, payload_bytes=1024, producers=PRODUCERS, total=total,
                                             commit_process=False))  # fmt: skip
            k["ratio_to_threads"] = k["records_per_second"] / kt["records_per_second"]
            b["ratio_to_raw"] = b["records_per_second"] / a["records_per_second"]
            b["ratio_to_raw_encoded"] = b["records_per_second"] / ae["records_per_second"]
            b["ratio_to_raw_per_record"] = b["records_per_second"] / a1["records_per_second"]
            per_fsync = ae["records_per_fsync"]
            fsync_seconds = ae["fsync_seconds"] - ae["cpu_microseconds_per_record"] * 1e-6 * per_fsync
            loop_seconds = b["loop_cpu_microseconds_per_record"] * 1e-6 * b["records_per_fsync"]
            b["serial_bound"] = max(0.0, fsync_seconds) / (max(0.0, fsync_seconds) + loop_seconds)
            records += [dict(r, run=run) for r in (a, ae, a1, b, k, kt)]
        variants = ("raw-loop", "raw-loop-encoded", "raw-loop-per-record", "queue-256", "queue-1k",
                    "queue-1k-threads")  # fmt: skip
        for variant in variants if repeats else ():
            runs = [r for r in records if r["variant"] == variant]
            summary = {
                "variant": variant, "run": "median",
                "records_per_second": statistics.median(r["records_per_second"] for r in runs),
                "records_per_fsync": statistics.median(r["records_per_fsync"] for r in runs),
            }  # fmt: skip
            for key in (
                "cpu_microseconds_per_record", "loop_cpu_microseconds_per_record",
                "helper_cpu_microseconds_per_record",
            ):  # fmt: skip
                if all(r.get(key) is not None for r in runs):
                    summary[key] = statistics.median(r[key] for r in runs)
            if variant == "queue-256":
                for key in ("ratio_to_raw_encoded", "ratio_to_raw", "ratio_to_raw_per_record"):
                    summary[key] = statistics.median(r[key] for r in runs)
                for key in ("serial_bound",):
                    summary[key] = statistics.median(r[key] for r in runs)
                summary["target"] = "ratio_to_raw_encoded >= 0.5 (same records per fsync, format and CRC)"
                summary["meets_target"] = summary["ratio_to_raw_encoded"] >= 0.5
            if variant == "queue-1k":
                summary["ratio_to_threads"] = statistics.median(r["ratio_to_threads"] for r in runs)
                summary["target"] = "records_per_second >= 50000 (1 KiB, durable, group commit)"
                summary["meets_target"] = summary["records_per_second"] >= 50_000
            records.append(summary)
        if recovery_messages:
            rec = trio.run(lambda: _recovery_run(base, messages=recovery_messages, payload_bytes=1024))
            rec["run"] = 0
            rec["target"] = "seconds <= 5"
            rec["meets_target"] = rec["seconds"] <= 5.0
            records.append(rec)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    machine = f"{platform.machine()} {os.cpu_count()} cpu, Python {platform.python_version()}"
    for r in records:
        r.setdefault("benchmark", "wal")
        r["machine"] = machine
    return records


def run_producer_sweep(
    *, directory: str | None = None, producers: tuple[int, ...] = (1, 4, 16, 64), repeats: int = 3
) -> list[dict[str, Any]]:
    """1 KiB durable enqueues at several producer counts, commit process against worker threads (each
    pair run back to back); one record per run plus a median per (producers, commit)."""
    base = tempfile.mkdtemp(prefix="wal-sweep-", dir=directory)
    records: list[dict[str, Any]] = []
    try:
        for run in range(repeats):
            for count in producers:
                total = min(64_000, 2_000 * count)
                for process in (True, False):
                    run_one = functools.partial(_queue_run, base, payload_bytes=1024, producers=count,
                                                total=total, commit_process=process)  # fmt: skip
                    r = trio.run(run_one)
                    r.update(variant="sweep", commit="process" if process else "threads", run=run)
                    records.append(r)
        for count in producers:
            for commit in ("process", "threads"):
                runs = [r for r in records if r["producers"] == count and r["commit"] == commit]
                records.append({
                    "variant": "sweep", "run": "median", "producers": count, "commit": commit,
                    "records_per_second": statistics.median(r["records_per_second"] for r in runs),
                    "records_per_fsync": statistics.median(r["records_per_fsync"] for r in runs),
                })  # fmt: skip
    finally:
        shutil.rmtree(base, ignore_errors=True)
    for r in records:
        r["benchmark"] = "wal"
    return records


async def _keyed_run(directory: str, *, value_bytes: int, writers: int, total: int) -> dict[str, Any]:
    """``writers`` tasks put ``value_bytes`` values to a keyed log (each on its own keys) until ``total``
    puts returned; the log shares the queues' group commit and commit helper."""
    path = tempfile.mkdtemp(prefix="keyed-", dir=directory)
    try:
        async with store.open_broker(path) as broker:
            log = await broker.open_keyed_log("checkpoints")
            value = b"v" * value_bytes
            per_writer = total // writers

            async def writer(w: int) -> None:
                for i in range(per_writer):
                    await log.put(b"flow-%d-%d" % (w, i % 16), value)

            started = time.perf_counter()
            async with trio.open_nursery() as nursery:
                for w in range(writers):
                    nursery.start_soon(writer, w)
            elapsed = time.perf_counter() - started
            stats = log.statistics()
        return {
            "variant": f"keyed-put-{value_bytes // 1024}k", "run": 0, "writers": writers,
            "records": per_writer * writers, "seconds": elapsed,
            "records_per_second": per_writer * writers / elapsed,
            "records_per_fsync": stats.records_per_fsync,
        }  # fmt: skip
    finally:
        shutil.rmtree(path, ignore_errors=True)


def run_keyed_benchmark(
    *, directory: str | None = None, total: int = 64_000, writers: int = PRODUCERS
) -> dict[str, Any]:
    """Durable puts per second of 1 KiB values to a keyed log (checkpoints), ``writers`` concurrent."""
    record = trio.run(lambda: _keyed_run(directory or tempfile.gettempdir(), value_bytes=1024,
                                         writers=writers, total=total))  # fmt: skip
    record["benchmark"] = "wal"
    return record


def _keyed_smoke(directory: str | None) -> bool:
    record = run_keyed_benchmark(directory=directory, total=PRODUCERS * 4)
    return record["records"] == PRODUCERS * 4 and record["records_per_fsync"] >= 1


def smoke(directory: str | None = None) -> list[str]:
    """A tiny end-to-end run (a few seconds, nothing timed): every variant reports comparable records.
    Returns the problems found (empty: fine). ``python -m bench.wal --smoke`` runs it."""
    total = PRODUCERS * SLICES * 2
    records = run_wal_benchmark(directory=directory, total=total, repeats=1, recovery_messages=500)
    by_variant = {(r["variant"], r["run"]): r for r in records}
    queue = by_variant[("queue-256", 0)]
    encoded = by_variant[("raw-loop-encoded", 0)]
    bare = by_variant[("raw-loop", 0)]
    one_k, threads = by_variant[("queue-1k", 0)], by_variant[("queue-1k-threads", 0)]
    summary = by_variant[("queue-256", "median")]
    checks = {
        "every variant ran the same slices": encoded["slices"] == bare["slices"] == queue["slices"] == SLICES,
        "every variant wrote the same records": (
            encoded["records"] == bare["records"] == queue["records"] == total
        ),
        "fsyncs were counted": encoded["records_per_fsync"] >= 1 and queue["fsyncs"] >= 1,
        "ratio to raw is computed from the same run": (
            queue["ratio_to_raw_encoded"] == queue["records_per_second"] / encoded["records_per_second"]
        ),
        "serial bound is a fraction": 0.0 <= queue["serial_bound"] <= 1.0,
        "1 KiB ratio to threads": one_k["ratio_to_threads"]
        == one_k["records_per_second"] / threads["records_per_second"],
        "helper CPU accounted only with the helper": (
            one_k["helper_cpu_microseconds_per_record"] is not None
            and threads["helper_cpu_microseconds_per_record"] is None
        ),
        "1 KiB runs wrote every record": one_k["records"] == threads["records"] == total,
        "keyed log puts are counted": _keyed_smoke(directory),
        "target verdict matches the ratio": (
            summary["meets_target"] == (summary["ratio_to_raw_encoded"] >= 0.5)
        ),
    }
    return [name for name, ok in checks.items() if not ok]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.wal", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small run (a few seconds, no 1M recovery)")
    parser.add_argument("--json", action="store_true", help="print one JSON record per line")
    parser.add_argument("--dir", default=None, help="directory for the files (default: system temp)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--recovery-messages", type=int, default=None)
    parser.add_argument(
        "--sweep",
        action="store_true",
        help="only the producer sweep: 1 KiB at 1-64 producers, commit process vs threads",
    )
    parser.add_argument("--keyed", action="store_true", help="only the keyed log: puts/s of 1 KiB values")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="a tiny run that only checks the records are consistent (nothing timed)",
    )
    args = parser.parse_args(argv)
    if args.smoke:
        problems = smoke(args.dir)
        for problem in problems:
            print(f"bench.wal smoke: FAILED: {problem}", file=sys.stderr)
        print("bench.wal smoke: OK" if not problems else "bench.wal smoke: FAILED")
        return 1 if problems else 0
    if args.keyed:
        for _ in range(args.repeats):
            r = run_keyed_benchmark(directory=args.dir, total=12_800 if args.quick else 64_000)
            if args.json:
                print(json.dumps(r))
            else:
                print(
                    f"{r['variant']:<19} {r['writers']} writers {r['records_per_second']:>10,.0f} puts/s  "
                    f"{r['records_per_fsync']:6.1f} records/fsync"
                )
        return 0
    if args.sweep:
        sweep = run_producer_sweep(directory=args.dir, repeats=args.repeats)
        for r in sweep:
            if args.json:
                print(json.dumps(r))
            elif r["run"] == "median":
                print(
                    f"sweep {r['producers']:>3} producers  {r['commit']:<8} "
                    f"{r['records_per_second']:>9,.0f} records/s  "
                    f"{r['records_per_fsync']:5.1f} records/fsync  (median of {args.repeats})"
                )
        return 0
    total = 12_800 if args.quick else 64_000
    recovery = (
        args.recovery_messages if args.recovery_messages is not None else (0 if args.quick else 1_000_000)
    )
    records = run_wal_benchmark(
        directory=args.dir, total=total, repeats=args.repeats, recovery_messages=recovery
    )
    if args.json:
        for r in records:
            print(json.dumps(r))
        return 0
    for r in records:
        if r["variant"].startswith("recovery"):
            print(
                f"{r['variant']:<12} ready in {r['seconds']:.2f} s (scan {r['scan_seconds']:.2f} s), first "
                f"delivery {r['first_delivery_seconds']:.2f} s, {r['disk_bytes'] / 2**20:.0f} MiB in "
                f"{r['segments']} segments, RSS +{r['max_rss_growth_bytes'] / 2**20:.0f} MiB"
                f"  [{'OK' if r['meets_target'] else 'MISSED'}: {r['target']}]"
            )
            continue
        line = (
            f"{r['variant']:<19} run {r['run']!s:<6} {r['records_per_second']:>10,.0f} records/s  "
            f"{r['records_per_fsync']:6.1f} records/fsync"
        )
        if "cpu_microseconds_per_record" in r:
            line += f"  cpu {r['cpu_microseconds_per_record']:.1f} us/record"
        if "loop_cpu_microseconds_per_record" in r:
            line += f" (event loop {r['loop_cpu_microseconds_per_record']:.1f}"
            if r.get("helper_cpu_microseconds_per_record") is not None:
                line += f"; commit helper {r['helper_cpu_microseconds_per_record']:.1f}"
            line += ")"
        if "ratio_to_raw" in r:
            line += f"  ratio to encoded raw {r['ratio_to_raw_encoded']:.2f}"
            line += f", to bare raw {r['ratio_to_raw']:.2f}"
            line += f", to per-record-write raw {r['ratio_to_raw_per_record']:.2f}"
            line += f"; serial bound {r['serial_bound']:.2f}"
        if "ratio_to_threads" in r:
            line += f"  ratio to threads {r['ratio_to_threads']:.2f}"
        if "meets_target" in r:
            line += f"  [{'OK' if r['meets_target'] else 'MISSED'}: {r['target']}]"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
