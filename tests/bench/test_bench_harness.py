"""The benchmark harness: record format, load profiles, open loop free of coordinated omission."""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

import bench

# ----------------------------------------------------------------------------------------- records


def _record(**changes: Any) -> dict[str, Any]:
    base = bench.make_record(
        run_id="r1", scenario="s", link="l", size_bytes=10, seq=0, intended_ns=100,
        stages={"created": 100, "enqueued": 150, "delivered": 400},
    )  # fmt: skip
    data = json.loads(base.to_json_line())
    data.update(changes)
    return data


def test_record_json_line_has_every_field_in_order() -> None:
    data = _record()
    assert list(data) == list(bench.RECORD_FIELDS)
    assert data["sent_ns"] is None and data["delivered_ns"] == 400 and data["outcome"] == "ok"
    assert bench.Record.from_mapping(data) == bench.Record(**data)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"run_id": ""}, "run_id"),
        ({"size_bytes": -1}, "size_bytes"),
        ({"seq": True}, "seq"),
        ({"sent_ns": "12"}, "sent_ns"),
        ({"outcome": "maybe"}, "outcome"),
        ({"outcome": "error"}, "error text"),
        ({"error": "boom"}, "error text"),
    ],
)
def test_record_validation_names_the_bad_field(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(bench.BenchError, match=message):
        bench.Record.from_mapping(_record(**changes))


@pytest.mark.parametrize("phase", ["duration_seconds", "warmup_seconds", "drain_seconds"])
def test_a_load_phase_longer_than_a_week_is_refused(phase: str) -> None:
    """1e20 s passed (the run never ended), 1e308 s too (its nanosecond schedule overflowed, a traceback)."""
    bench.LoadProfile(**{phase: float(bench.MAX_PHASE_SECONDS)})  # type: ignore[arg-type]
    for seconds in (bench.MAX_PHASE_SECONDS + 1.0, 1e20, 1e308):
        with pytest.raises(bench.BenchError, match="at most 604,800 s"):
            bench.LoadProfile(**{phase: seconds})  # type: ignore[arg-type]


def test_record_missing_field() -> None:
    data = _record()
    del data["accepted_ns"]
    with pytest.raises(bench.BenchError, match=r"lacks field.*accepted_ns"):
        bench.Record.from_mapping(data)


def test_make_record_rejects_unknown_stage_and_formats_errors() -> None:
    with pytest.raises(bench.BenchError, match="unknown stage"):
        bench.make_record(
            run_id="r", scenario="s", link="l", size_bytes=1, seq=0, intended_ns=0, stages={"landed": 1}
        )
    rec = bench.make_record(
        run_id="r", scenario="s", link="l", size_bytes=1, seq=0, intended_ns=0, stages={},
        error=ValueError("x" * 500),
    )  # fmt: skip
    assert rec.outcome == "error" and rec.error is not None
    assert rec.error.startswith("ValueError: xxx") and len(rec.error) == 200


def test_writer_publishes_only_on_finish(tmp_path: Path) -> None:
    writer = bench.RecordWriter(tmp_path, "run-a")
    for i in range(10_000):  # crosses a flush batch
        writer.add_sync(bench.Record(**_record(seq=i, run_id="run-a")))
    assert not writer.records_path.exists()
    writer.finish({"run_id": "run-a"})
    lines = writer.records_path.read_text().splitlines()
    assert len(lines) == 10_000
    assert [r.seq for r in bench.read_records(writer.records_path)] == list(range(10_000))
    assert json.loads(writer.meta_path.read_text()) == {"run_id": "run-a"}
    assert [p.name for p in tmp_path.iterdir() if p.suffix == ".part"] == []
    with pytest.raises(bench.BenchError, match="already exists"):
        bench.RecordWriter(tmp_path, "run-a")


def test_writer_abort_leaves_nothing(tmp_path: Path) -> None:
    writer = bench.RecordWriter(tmp_path, "run-b")
    writer.add_sync(bench.Record(**_record(run_id="run-b")))
    writer.abort()
    assert list(tmp_path.iterdir()) == []


def test_run_id_is_checked(tmp_path: Path) -> None:
    with pytest.raises(bench.BenchError, match="run id"):
        bench.RecordWriter(tmp_path, "../escape")
    assert bench.RecordWriter(tmp_path, bench.new_run_id("a b/c")).run_id


def test_read_records_names_the_bad_line(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    path.write_text(json.dumps(_record()) + "\n{not json\n")
    with pytest.raises(bench.BenchError, match=r"x.jsonl:2"):
        list(bench.read_records(path))


# ----------------------------------------------------------------------------------------- configuration


def test_size_distribution_forms() -> None:
    rng = random.Random(3)
    assert bench.SizeDistribution.parse("4k").sample(rng) == 4096
    choice = bench.SizeDistribution.parse("256,1m")
    assert {choice.sample(rng) for _ in range(200)} == {256, 1024 * 1024}
    weighted = bench.SizeDistribution.parse("10:9,20:1")
    draws = [weighted.sample(rng) for _ in range(5000)]
    assert 0.87 < draws.count(10) / len(draws) < 0.93
    uniform = bench.SizeDistribution.parse("uniform:100-200")
    values = {uniform.sample(rng) for _ in range(2000)}
    assert min(values) >= 100 and max(values) <= 200 and len(values) > 90
    assert bench.SizeDistribution.parse(weighted.describe()) == weighted
    assert bench.SizeDistribution.parse(uniform.describe()) == uniform


@pytest.mark.parametrize(
    "text",
    # (a run holds a payload of its largest size: 99999999999999 was a MemoryError traceback)
    [
        *("", "abc", "10:0", "10:-1", "uniform:5", "uniform:9-3", "-5", "1:x"),
        *("99999999999999", "65m", "uniform:0-65m"),
    ],
)
def test_size_distribution_rejects(text: str) -> None:
    with pytest.raises(bench.BenchError):
        bench.SizeDistribution.parse(text)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"mode": "open"},
        {"mode": "open", "rate_per_second": 0},
        {"mode": "closed", "rate_per_second": 10},
        {"mode": "sideways"},
        {"concurrency": 0},
        {"concurrency": 10**8},  # one task each, at once: the process ran out of memory
        {"mode": "open", "rate_per_second": 1e-300},  # 1e9 / rate is inf: the schedule's first slot was NaN
        {"mode": "open", "rate_per_second": 1.5e9},  # more than one due per nanosecond
        {"mode": "open", "rate_per_second": 1e308},  # issued for the whole drain time, and never measured
        {"duration_seconds": 0},
        {"max_ops": 0},
    ],
)
def test_load_profile_rejects(kwargs: dict[str, Any]) -> None:
    with pytest.raises(bench.BenchError):
        bench.LoadProfile(**kwargs)


def test_scenario_param_conversion(tmp_path: Path) -> None:
    config = bench.RunConfig(scenario="x", params={"peers": "3", "fsync": "off", "bad": "x"})
    ctx = bench.ScenarioContext(config=config, scratch_dir=tmp_path, clock=bench.Clock())
    assert ctx.param("peers", 1) == 3
    assert ctx.param("fsync", True) is False
    assert ctx.param("missing", 2.5) == 2.5
    with pytest.raises(bench.BenchError, match="expected int"):
        ctx.param("bad", 1)


def test_unknown_scenario_lists_known() -> None:
    with pytest.raises(bench.BenchError, match=r"known: .*loopback"):
        bench.load_scenario("nope")


# ------------------------------------------------------------------------------ running (virtual time)


@attrs.define
class _StallingService:
    """A service that takes ``service_s`` per operation, one at a time, and stalls once for ``stall_s``."""

    service_s: float
    stall_at_seq: int
    stall_s: float
    fail_seq: int | None = None
    lock: trio.Lock = attrs.field(factory=trio.Lock)

    @property
    def links(self) -> list[str]:
        return ["a", "b"]

    async def run(self, op: bench.Operation) -> None:
        async with self.lock:  # a single server: requests queue behind a stall
            op.mark("sent")
            await trio.sleep(self.stall_s if op.seq == self.stall_at_seq else self.service_s)
            if op.seq == self.fail_seq:
                raise RuntimeError("refused")
            op.mark("delivered")


@attrs.define
class _Scenario:
    service: _StallingService
    name: str = "stall"
    description: str = "test service"

    @asynccontextmanager
    async def open(self, ctx: bench.ScenarioContext) -> AsyncIterator[_StallingService]:
        yield self.service


async def test_open_loop_charges_a_stall_to_every_operation_due_during_it(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    # 100 ops/s = one due every 10 ms; service 1 ms; op 20 (the first measured one after 0.2 s warm-up) stalls
    # 100 ms. Coordinated-omission-free: the ops due during the stall wait for it, and their latency is
    # measured from when they were due, so it decreases in 10 ms steps from the stall's end.
    service = _StallingService(service_s=0.001, stall_at_seq=20, stall_s=0.1, fail_seq=35)
    config = bench.RunConfig(
        scenario="stall",
        load=bench.LoadProfile(mode="open", rate_per_second=100, duration_seconds=0.5, warmup_seconds=0.2),
        run_id="open-1",
    )
    summary = await bench.run_benchmark(_Scenario(service), config, tmp_path, clock=bench.TrioClock())
    records = {r.seq: r for r in bench.read_records(summary.records_path)}
    assert sorted(records) == list(range(20, 70))
    assert summary.warmup_ops == 20 and summary.recorded_ops == 50 and summary.error_ops == 1

    def latency_ms(seq: int) -> float:
        r = records[seq]
        assert r.delivered_ns is not None
        return (r.delivered_ns - r.intended_ns) / 1e6

    assert latency_ms(20) == pytest.approx(100, abs=0.01)
    for k in range(1, 10):  # due at +10k ms, done at 100 + k ms
        assert latency_ms(20 + k) == pytest.approx(100 - 10 * k + k, abs=0.01)
    assert latency_ms(31) == pytest.approx(1, abs=0.01)  # backlog drained
    assert records[35].outcome == "error" and records[35].error == "RuntimeError: refused"
    assert records[35].delivered_ns is None and records[35].sent_ns is not None
    assert {records[s].link for s in records} == {"a", "b"}
    assert records[20].link == "a" and records[21].link == "b"
    assert summary.latency_ns["max"] == pytest.approx(100e6, abs=1e4)
    meta = json.loads(summary.meta_path.read_text())
    assert meta["config"]["load"]["rate_per_second"] == 100
    assert meta["environment"]["cpu_count"] >= 1 and meta["schema_version"] == bench.SCHEMA_VERSION
    assert meta["summary"]["recorded_ops"] == 50


async def test_closed_loop_runs_back_to_back_and_honours_max_ops(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    service = _StallingService(service_s=0.002, stall_at_seq=-1, stall_s=0)
    config = bench.RunConfig(
        scenario="stall",
        load=bench.LoadProfile(
            mode="closed", concurrency=1, duration_seconds=10, warmup_seconds=0, max_ops=40
        ),
    )
    summary = await bench.run_benchmark(_Scenario(service), config, tmp_path, clock=bench.TrioClock())
    records = list(bench.read_records(summary.records_path))
    assert len(records) == 40
    for r in records:
        assert r.intended_ns == r.created_ns
        assert r.delivered_ns is not None
        assert r.delivered_ns - r.intended_ns == pytest.approx(2e6, abs=1e3)
    assert summary.throughput_per_second == pytest.approx(500, rel=0.01)


async def test_unfinished_operations_time_out_as_errors(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    service = _StallingService(service_s=0.001, stall_at_seq=3, stall_s=1000)
    config = bench.RunConfig(
        scenario="stall",
        load=bench.LoadProfile(
            mode="open", rate_per_second=10, duration_seconds=1, warmup_seconds=0, drain_seconds=2
        ),
    )
    summary = await bench.run_benchmark(_Scenario(service), config, tmp_path, clock=bench.TrioClock())
    records = list(bench.read_records(summary.records_path))
    assert len(records) == 10
    timed_out = [r for r in records if r.outcome == "error"]
    assert sorted(r.seq for r in timed_out) == list(range(3, 10))
    assert all(r.error is not None and r.error.startswith("Timeout") for r in timed_out)


async def test_a_schedule_behind_by_more_than_the_drain_counts_what_never_started(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """1,000 ops/s offered to a service of 10 ops/s at most 5 in flight: the schedule falls behind, and the
    drain deadline (1 s after the 1 s run) ends it with most of the run's 1,000 operations never started."""
    service = _StallingService(service_s=0.1, stall_at_seq=-1, stall_s=0)
    config = bench.RunConfig(
        scenario="stall",
        load=bench.LoadProfile(
            mode="open", rate_per_second=1000, duration_seconds=1, warmup_seconds=0, drain_seconds=1,
            max_in_flight=5,
        ),
    )  # fmt: skip
    summary = await bench.run_benchmark(_Scenario(service), config, tmp_path, clock=bench.TrioClock())
    # one at a time, 0.1 s each: 19 done in the run and its drain, 5 waiting at the deadline (timed out)
    assert (summary.recorded_ops, summary.error_ops, summary.unstarted_ops) == (24, 5, 976)
    assert "operations due in the run never started" in summary.format()
    assert json.loads(summary.meta_path.read_text())["summary"]["unstarted_ops"] == summary.unstarted_ops


def test_cli_bench_a_run_that_recorded_nothing_exits_1(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Everything due in the warm-up: the run measured nothing, and says so in one line, exit 1."""
    from corda_trio.node._cli import main

    argv = ["bench", "run", "codec", "--out", str(tmp_path), "--rate", "20", "--duration", "0.01"]
    assert main([*argv, "--warmup", "0.51", "--drain", "1"]) == 1  # due at 0.5 and 0.55, measured 0.51-0.52
    out, err = capsys.readouterr()
    assert "0 ops recorded" in out
    assert err.startswith("corda-trio: error: run ") and err.endswith(
        " recorded no operation (nothing was due after the warm-up)\n"
    )


async def test_setup_failure_leaves_no_partial_run(tmp_path: Path) -> None:
    class Broken:
        name = "broken"
        description = "fails to set up"

        @asynccontextmanager
        async def open(self, ctx: bench.ScenarioContext) -> AsyncIterator[Any]:
            raise OSError("no such device")
            yield  # pragma: no cover

    with pytest.raises(OSError, match="no such device"):
        await bench.run_benchmark(Broken(), bench.RunConfig(scenario="broken"), tmp_path)
    assert not any(p.name for p in await trio.Path(tmp_path).iterdir())


# ----------------------------------------------------------------------------------------- real scenario


async def test_loopback_scenario_passes_on_the_error_its_run_ended_with(tmp_path: Path) -> None:
    """Its clean-up awaited after cancelling its own nursery: the Cancelled took the place of the run's
    error, the nursery swallowed it, and ``run_benchmark`` failed with UnboundLocalError (a full disk)."""
    config = bench.RunConfig(scenario="loopback")
    ctx = bench.ScenarioContext(config=config, scratch_dir=tmp_path, clock=bench.Clock())
    with pytest.raises(BaseExceptionGroup) as info:  # (from inside the scenario's nursery)
        async with bench.load_scenario("loopback").open(ctx):
            raise OSError(28, "No space left on device")
    assert info.value.subgroup(OSError) is not None


async def test_loopback_scenario_ends_cleanly_with_a_frame_still_being_sent(tmp_path: Path) -> None:
    """A run at a rate the socket cannot take (``bench run loopback --rate 1e7``) ends with frames queued and
    the writer inside ``send_all``: closing the stream there raised ClosedResourceError in the writer, and
    the command printed a traceback after its run."""
    config = bench.RunConfig(scenario="loopback", sizes=bench.SizeDistribution.parse("64m"))
    ctx = bench.ScenarioContext(config=config, scratch_dir=tmp_path, clock=bench.Clock())
    async with bench.load_scenario("loopback").open(ctx) as session:
        link = session.link_by_name["loopback-0"]
        await link.send.send((0, session.payload))  # far more than a loopback socket's buffers
        for _ in range(3):  # the writer is now inside send_all, waiting for room
            await trio.lowlevel.checkpoint()
    assert link.stream is not None and link.stream.socket.fileno() == -1  # closed, and no error raised


def test_cli_bench_a_store_failure_of_the_scenario_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wal scenario on a full --scratch disk: its queue stops with StoreFailedError, raised in a consumer
    task of the scenario's nursery (it was a traceback)."""
    from corda_trio import store
    from corda_trio.node._cli import main

    class FullDisk:
        name = "wal"
        description = "its queue fails"
        parameters: dict[str, str] = {}

        @asynccontextmanager
        async def open(self, ctx: bench.ScenarioContext) -> AsyncIterator[Any]:
            async with trio.open_nursery():
                raise store.StoreFailedError("write-ahead log write failed: No space left on device")
            yield  # pragma: no cover

    monkeypatch.setattr(bench, "load_scenario", lambda name: FullDisk())
    assert main(["bench", "run", "wal", "--out", str(tmp_path), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "corda-trio: error: scenario wal failed: write-ahead log write failed: No space left on device"
    ]


async def test_loopback_scenario_real_sockets(tmp_path: Path) -> None:
    config = bench.RunConfig(
        scenario="loopback",
        load=bench.LoadProfile(mode="open", rate_per_second=400, duration_seconds=0.5, warmup_seconds=0.1),
        sizes=bench.SizeDistribution.parse("16,4k"),
        params={"peers": 2},
    )
    summary = await bench.run_benchmark(bench.load_scenario("loopback"), config, tmp_path)
    records = list(bench.read_records(summary.records_path))
    assert 150 <= len(records) <= 200 and summary.error_ops == 0
    assert {r.link for r in records} == {"loopback-0", "loopback-1"}
    assert {r.size_bytes for r in records} == {16, 4096}
    for r in records:
        assert None not in (r.created_ns, r.enqueued_ns, r.sent_ns, r.delivered_ns)
        assert r.accepted_ns is None and r.flow_finished_ns is None
        assert r.delivered_ns >= r.enqueued_ns >= r.created_ns >= r.intended_ns  # type: ignore[operator]


async def test_codec_scenario_encodes_and_decodes_for_real(tmp_path: Path) -> None:
    config = bench.RunConfig(
        scenario="codec",
        load=bench.LoadProfile(mode="closed", duration_seconds=5, warmup_seconds=0, max_ops=200),
        sizes=bench.SizeDistribution.parse("10,300,70k"),
    )
    summary = await bench.run_benchmark(bench.load_scenario("codec"), config, tmp_path)
    records = list(bench.read_records(summary.records_path))
    assert len(records) == 200 and summary.error_ops == 0
    assert {r.link for r in records} == {"message", "transfer-frame"}
    assert {r.size_bytes for r in records} == {10, 300, 70 * 1024}
    for r in records:
        assert r.sent_ns is not None and r.delivered_ns is not None
        assert r.intended_ns <= r.sent_ns <= r.delivered_ns
        assert r.enqueued_ns is None and r.accepted_ns is None


async def test_wal_scenario_stores_every_operation_durably(tmp_path: Path) -> None:
    from corda_trio import store

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    config = bench.RunConfig(
        scenario="wal",
        load=bench.LoadProfile(
            mode="closed", concurrency=8, duration_seconds=5, warmup_seconds=0, max_ops=120
        ),
        sizes=bench.SizeDistribution.parse("100,1k"),
        params={"queues": 2, "consume": "false"},
    )
    scenario = bench.load_scenario("wal")
    summary = await bench.run_benchmark(scenario, config, tmp_path / "out", scratch_dir=scratch)
    records = list(bench.read_records(summary.records_path))
    assert len(records) == 120 and summary.error_ops == 0
    assert all(r.enqueued_ns is not None and r.delivered_ns is None for r in records)
    # the messages really are in the store: reopen it and count (workers may finish a few past max_ops)
    async with store.open_broker(scratch / "broker") as broker:
        depths = {name: broker.get_queue(name).statistics().depth for name in ("bench.wal.0", "bench.wal.1")}
    assert 120 <= sum(depths.values()) <= 120 + 8
    assert all(d > 0 for d in depths.values())


async def test_wal_scenario_delivers_to_a_consumer(tmp_path: Path) -> None:
    config = bench.RunConfig(
        scenario="wal",
        load=bench.LoadProfile(mode="open", rate_per_second=300, duration_seconds=0.5, warmup_seconds=0.1),
        sizes=bench.SizeDistribution.parse("512"),
        params={"fsync": "always"},
    )
    summary = await bench.run_benchmark(bench.load_scenario("wal"), config, tmp_path)
    records = list(bench.read_records(summary.records_path))
    assert 140 <= len(records) <= 151 and summary.error_ops == 0
    for r in records:
        assert r.enqueued_ns is not None and r.delivered_ns is not None
        assert r.intended_ns <= r.enqueued_ns
    meta = json.loads(summary.meta_path.read_text())
    assert meta["config"]["params"] == {"fsync": "always"} and meta["links"] == ["bench.wal.0"]


async def test_amqp_link_scenario_over_mutual_tls(tmp_path: Path) -> None:
    config = bench.RunConfig(
        scenario="amqp-link",
        load=bench.LoadProfile(mode="open", rate_per_second=400, duration_seconds=0.5, warmup_seconds=0.1),
        sizes=bench.SizeDistribution.parse("100,8k"),
        params={"peers": 2},
    )
    summary = await bench.run_benchmark(bench.load_scenario("amqp-link"), config, tmp_path)
    records = list(bench.read_records(summary.records_path))
    assert 180 <= len(records) <= 201 and summary.error_ops == 0
    assert {r.link for r in records} == {"p2p.inbound.bench-0", "p2p.inbound.bench-1"}
    for r in records:
        assert None not in (r.enqueued_ns, r.delivered_ns, r.accepted_ns)
        assert r.intended_ns <= r.enqueued_ns <= r.delivered_ns <= r.accepted_ns  # type: ignore[operator]


async def test_unknown_parameters_are_refused(tmp_path: Path) -> None:
    config = bench.RunConfig(scenario="wal", params={"fsyncc": "none"})
    with pytest.raises(bench.BenchError, match=r"no parameter\(s\) fsyncc; its parameters: consume, credit"):
        await bench.run_benchmark(bench.load_scenario("wal"), config, tmp_path)
    with pytest.raises(bench.BenchError, match="its parameters: none"):
        config = bench.RunConfig(scenario="codec", params={"peers": 2})
        await bench.run_benchmark(bench.load_scenario("codec"), config, tmp_path)
    assert not any(p.name for p in await trio.Path(tmp_path).iterdir())


def test_cli_bench_list_and_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from corda_trio.node._cli import main

    assert main(["bench", "list"]) == 0
    listing = capsys.readouterr().out
    for name in ("amqp-link", "codec", "loopback", "wal", "--param fsync=..."):
        assert name in listing
    assert main(["bench", "run", "wal", "--out", str(tmp_path), "--param", "oops"]) == 2
    assert "expected KEY=VALUE" in capsys.readouterr().err
    assert main(["bench", "run", "codec", "--out", str(tmp_path), "--nodes", "3"]) == 2
    assert "scenario codec has no parameter(s) nodes" in capsys.readouterr().err
    assert main(["bench", "run", "codec", "--out", str(tmp_path), "--rate", "-5"]) == 2
    assert "positive rate" in capsys.readouterr().err
    for option in ("--rate", "--duration", "--warmup"):  # infinity is no time to run for
        assert main(["bench", "run", "codec", "--out", str(tmp_path), option, "inf"]) == 2
        assert "finite" in capsys.readouterr().err


def test_fast_json_lines_equal_json_dumps(tmp_path: Path) -> None:
    odd = bench.make_record(
        run_id="r", scenario="s", link='O=Bänk "1"\\x\n->O=N', size_bytes=0, seq=2**62, intended_ns=0,
        stages={"created": 1, "delivered": 2**63 - 1}, error="Boom: ünïcode \"quoted\" \t tab",
    )  # fmt: skip
    writer = bench.RecordWriter(tmp_path, "odd")
    writer.add_sync(odd)
    writer.finish({})
    line = writer.records_path.read_text(encoding="utf-8")
    assert line == json.dumps(attrs.asdict(odd), separators=(",", ":"), ensure_ascii=False) + "\n"
    assert list(bench.read_records(writer.records_path)) == [odd]
