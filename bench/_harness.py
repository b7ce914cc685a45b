"""The common load-benchmark harness: scenarios, open / closed loop, records, run metadata.

Theory of operation
===================

A benchmark *run* executes one *scenario* (codec, wal, amqp-link, p2p, flows, loopback ...) under one *load
profile* and writes two files into an output directory::

    run-<run_id>.records.jsonl   one JSON object per measured operation (message, enqueue, flow ...)
    run-<run_id>.meta.json       what was measured and on what: machine, Python, git commit, config, counts

``protocol_spec/bench-records.md`` is the normative description of both files; ``spark_reports`` reads them.
The records file is written as ``....jsonl.part`` and renamed when the run ends, so a reader never sees a
half-written run.

**Records.** One :class:`Record` per operation: ``run_id``, ``scenario``, ``link`` (the unit a reader wants
to compare: a peer link, a queue, a message kind), ``size_bytes``, ``seq``, and nanosecond timestamps at each
stage it passes through (:data:`STAGES`: created, enqueued, sent, accepted, delivered, flow_finished; a stage
the scenario does not have is ``null``), plus ``intended_ns``, ``outcome`` (``"ok"`` / ``"error"``) and
``error``. Every latency is ``stage_ns - intended_ns``.

**Clock.** Timestamps come from :class:`Clock`: ``time.perf_counter_ns()`` (monotonic, ns resolution) shifted
by an anchor taken once from ``time.time_ns()``. Within a process they are monotonic; across processes on one
machine they agree to within the wall clock's error (they are Unix-epoch nanoseconds), which is what a p2p
run with sender and receiver in different processes needs.

**Open loop, free of coordinated omission.** With ``LoadProfile(mode="open", rate_per_second=R)`` operation
``i`` is *due* at ``t0 + i / R`` whatever happened before; that due time is its ``intended_ns``. If the system
under test stalls, operations start late but their latency is still measured from the due time, so the stall
shows up in every operation that should have been sent during it (wrk2, HdrHistogram's "coordinated
omission"). ``created_ns - intended_ns`` is the harness's own schedule lag. At most ``max_in_flight``
operations run at once; when that bound is hit the schedule slips, and the slip is charged to latency.
An offered rate far beyond what the scenario sustains slips the schedule past the drain deadline: the
operations due in the run that never started by then are counted (``unstarted_ops``), and a run that
recorded nothing says so (``corda-trio bench run`` exits 1).

**Closed loop** (``mode="closed"``): ``concurrency`` workers each run one operation after another as fast as
the system allows; ``intended_ns == created_ns``. This measures maximum throughput, not latency under load.

**Warm-up.** Operations due in the first ``warmup_seconds`` run but are not recorded (the meta file counts
them). Measurement lasts ``duration_seconds`` after warm-up, or until ``max_ops`` operations were recorded.

**Cost of measuring.** The hot path is kept small so that it does not become the benchmark: one cancel scope
(the drain deadline) around all operations instead of one per operation, records queued as tuples and
turned into JSON by a flusher task in a worker thread a batch at a time, a scheduler checkpoint every 16
closed-loop operations. Measured with a scenario that does nothing: about 9 us per operation (110k
operations/s on one core of the 2-core build machine), of which the ``Operation`` object and record tuple
are a few us and Trio's scheduler the rest.

Writing a scenario
==================

A scenario is an object with ``name``, ``description`` and ``open(ctx)``, an async context manager that sets
up the system under test (files, sockets, peers) and yields a :class:`ScenarioSession`: ``links`` (the link
names operations are spread over, round-robin) and ``async run(op)``, which performs one operation and stamps
``op`` as it passes each stage::

    async def run(self, op: Operation) -> None:
        payload = make_payload(op.size_bytes)
        op.mark("created")            # the harness stamps created itself if you do not
        await queue.enqueue(payload)
        op.mark("enqueued")

Raise to report a failed operation: the harness records ``outcome="error"`` with ``"<ExceptionType>:
<message>"`` and the stages reached so far. A scenario that runs its own loop (a tight CPU micro-benchmark)
can instead build :class:`Record` objects with :func:`make_record` and hand them to :class:`RecordWriter`.
"""

from __future__ import annotations

import math
import random
from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Literal, Protocol

import attrs
import trio

from corda_trio import records

__all__ = [
    "RECORD_FIELDS",
    "SCHEMA_VERSION",
    "STAGES",
    "BenchClock",
    "BenchError",
    "Clock",
    "LoadProfile",
    "Operation",
    "Record",
    "RecordWriter",
    "RunConfig",
    "RunSummary",
    "Scenario",
    "ScenarioContext",
    "ScenarioSession",
    "SizeDistribution",
    "TrioClock",
    "check_parameters",
    "environment_metadata",
    "make_record",
    "new_run_id",
    "read_records",
    "run_benchmark",
]

#: The record format, its writer and clock live in the product (``corda_trio.records``).
SCHEMA_VERSION: Final = records.SCHEMA_VERSION
STAGES: Final = records.STAGES
RECORD_FIELDS: Final = records.RECORD_FIELDS
Clock = records.Clock
TrioClock = records.TrioClock
BenchClock = records.BenchClock
Record = records.Record
RecordWriter = records.RecordWriter
make_record = records.make_record
new_run_id = records.new_run_id
read_records = records.read_records
environment_metadata = records.environment_metadata
#: One error class for a bad benchmark set-up and a bad record or run id (``records.RecordError``), so that
#: callers catch both alike.
BenchError = records.RecordError


# --------------------------------------------------------------------------------------------- configuration


@attrs.frozen(kw_only=True)
class SizeDistribution:
    """Message sizes: a weighted choice over fixed sizes, or a uniform integer range.

    Text forms (CLI ``--sizes``): ``"1024"``; ``"256,1024,65536"`` (equal weights); ``"256:3,65536:1"``
    (weights); ``"uniform:100-2000"``. Sizes accept ``k`` / ``m`` suffixes (KiB / MiB).
    """

    sizes: tuple[int, ...] = (1024,)
    weights: tuple[float, ...] = (1.0,)
    uniform: tuple[int, int] | None = None

    @classmethod
    def parse(cls, text: str) -> SizeDistribution:
        """Parse the text form; raises :class:`BenchError` with the reason on bad input."""
        text = text.strip().lower()
        if text.startswith("uniform:"):
            lo_text, sep, hi_text = text[len("uniform:") :].partition("-")
            if not sep:
                raise BenchError(f"size distribution {text!r}: expected uniform:LOW-HIGH")
            lo, hi = _parse_size(lo_text), _parse_size(hi_text)
            if lo > hi:
                raise BenchError(f"size distribution {text!r}: LOW > HIGH")
            return cls(sizes=(lo, hi), weights=(1.0, 1.0), uniform=(lo, hi))
        sizes: list[int] = []
        weights: list[float] = []
        for part in text.split(","):
            size_text, _, weight_text = part.partition(":")
            sizes.append(_parse_size(size_text))
            try:
                weight = float(weight_text) if weight_text else 1.0
            except ValueError:
                raise BenchError(f"size distribution {text!r}: bad weight {weight_text!r}") from None
            if not weight > 0 or math.isinf(weight):
                raise BenchError(f"size distribution {text!r}: weights must be positive")
            weights.append(weight)
        return cls(sizes=tuple(sizes), weights=tuple(weights))

    def sample(self, rng: random.Random) -> int:
        """Draw one size."""
        if self.uniform is not None:
            return rng.randint(*self.uniform)
        if len(self.sizes) == 1:
            return self.sizes[0]
        return rng.choices(self.sizes, self.weights)[0]

    def describe(self) -> str:
        """The canonical text form (goes into the run's meta file)."""
        if self.uniform is not None:
            return f"uniform:{self.uniform[0]}-{self.uniform[1]}"
        return ",".join(f"{s}:{w:g}" for s, w in zip(self.sizes, self.weights, strict=True))


def _parse_size(text: str) -> int:
    text = text.strip().lower()
    factor = 1
    if text.endswith(("k", "m")):
        factor = 1024 if text[-1] == "k" else 1024 * 1024
        text = text[:-1]
    try:
        value = int(text) * factor
    except ValueError:
        raise BenchError(f"bad size {text!r}: expected an integer with optional k/m suffix") from None
    if value < 0:
        raise BenchError(f"bad size {text!r}: negative")
    if value > MAX_SIZE_BYTES:  # (a scenario holds a payload of the largest size; 10^14 was a MemoryError)
        raise BenchError(f"bad size {value}: at most {MAX_SIZE_BYTES} (64m)")
    return value


#: Largest message size a run may ask for (bytes).
MAX_SIZE_BYTES: Final = 64 * 1024 * 1024
#: Most closed-loop workers a run may start.
MAX_CONCURRENCY: Final = 10_000
#: Highest open-loop rate: one operation due per nanosecond, the schedule's resolution.
MAX_RATE_PER_SECOND: Final = 1e9

#: Longest duration, warm-up or drain of a run, in seconds (a week): a longer one is a slip of the finger
#: (1e308 overflowed the nanosecond schedule, a traceback; 1e20 ran for ever).
MAX_PHASE_SECONDS: Final = 7 * 24 * 3600


@attrs.frozen(kw_only=True)
class LoadProfile:
    """How operations are issued.

    Attributes:
        mode: ``"open"`` (fixed rate, latency from the schedule) or ``"closed"`` (max throughput).
        rate_per_second: open loop only: operations due per second (over all links).
        concurrency: closed loop only: number of workers, each with one operation outstanding.
        duration_seconds: measured time after warm-up.
        warmup_seconds: operations due during this leading time run but are not recorded.
        max_ops: stop after this many recorded operations (``None``: time-limited only).
        max_in_flight: open loop only: bound on concurrent operations (the schedule slips beyond it).
        drain_seconds: after the last operation was issued, wait this long for stragglers; an operation
            still unfinished then is recorded as an error ``"Timeout: ..."``.
    """

    mode: Literal["open", "closed"] = "closed"
    rate_per_second: float | None = None
    concurrency: int = 1
    duration_seconds: float = 10.0
    warmup_seconds: float = 1.0
    max_ops: int | None = None
    max_in_flight: int = 10_000
    drain_seconds: float = 30.0

    def __attrs_post_init__(self) -> None:
        if self.mode not in ("open", "closed"):
            raise BenchError(f"load mode must be 'open' or 'closed', not {self.mode!r}")
        if self.mode == "open" and (
            self.rate_per_second is None
            or not 0 < self.rate_per_second < math.inf
            or math.isinf(1e9 / self.rate_per_second)  # (1e-300: the schedule's 0 * inf interval was NaN)
        ):
            raise BenchError("open-loop load needs a positive rate (operations per second), and a finite one")
        if self.rate_per_second is not None and self.rate_per_second > MAX_RATE_PER_SECOND:
            raise BenchError(
                f"open-loop rate {self.rate_per_second:g} is beyond {MAX_RATE_PER_SECOND:,.0f} operations "
                "per second (the schedule's resolution is a nanosecond)"
            )
        if self.mode == "closed" and self.rate_per_second is not None:
            raise BenchError("a rate applies to open-loop load only; closed loop runs as fast as it can")
        if self.concurrency < 1 or self.max_in_flight < 1:
            raise BenchError("concurrency and max_in_flight must be at least 1")
        if self.concurrency > MAX_CONCURRENCY:  # (one task each, all at once: 10^8 ran out of memory)
            raise BenchError(f"concurrency must be at most {MAX_CONCURRENCY:,}, got {self.concurrency:,}")
        inf = math.inf
        if not (
            0 < self.duration_seconds < inf
            and 0 <= self.warmup_seconds < inf
            and 0 <= self.drain_seconds < inf
        ):
            raise BenchError("duration must be positive; warm-up and drain must not be negative; all finite")
        longest = max(self.duration_seconds, self.warmup_seconds, self.drain_seconds)
        if longest > MAX_PHASE_SECONDS:
            raise BenchError(
                f"duration, warm-up and drain must each be at most {MAX_PHASE_SECONDS:,} s (a week), "
                f"got {longest:g} s"
            )
        if self.max_ops is not None and self.max_ops < 1:
            raise BenchError("max_ops must be at least 1")


@attrs.frozen(kw_only=True)
class RunConfig:
    """Everything that defines a run (it is written verbatim into the meta file).

    ``params`` are the scenario's own knobs (``nodes``, ``peers``, ``fsync`` ...), as scalars.
    """

    scenario: str
    load: LoadProfile = attrs.field(factory=LoadProfile)
    sizes: SizeDistribution = attrs.field(factory=SizeDistribution)
    params: Mapping[str, str | int | float | bool] = attrs.field(factory=dict)
    seed: int = 1
    run_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready description of the configuration."""
        load = attrs.asdict(self.load)
        return {
            "scenario": self.scenario,
            "load": load,
            "sizes": self.sizes.describe(),
            "params": dict(self.params),
            "seed": self.seed,
        }


@attrs.frozen(kw_only=True)
class ScenarioContext:
    """What a scenario gets when it sets up: the config, a scratch directory, the clock."""

    config: RunConfig
    scratch_dir: Path
    clock: BenchClock

    def param(self, name: str, default: Any) -> Any:
        """A scenario parameter converted to the type of ``default`` (CLI values arrive as strings)."""
        value = self.config.params.get(name, default)
        if isinstance(default, bool) and isinstance(value, str):
            if value.lower() not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                raise BenchError(f"parameter {name}={value!r}: expected a boolean")
            return value.lower() in ("1", "true", "yes", "on")
        if default is not None and not isinstance(value, type(default)):
            try:
                return type(default)(value)
            except (TypeError, ValueError):
                raise BenchError(f"parameter {name}={value!r}: expected {type(default).__name__}") from None
        return value


# --------------------------------------------------------------------------------------------- scenarios


@attrs.define(slots=True, eq=False)
class Operation:
    """One operation in flight; the scenario stamps it with :meth:`mark` as it passes each stage."""

    seq: int
    link: str
    size_bytes: int
    intended_ns: int
    clock: BenchClock
    created_ns: int | None = None
    enqueued_ns: int | None = None
    sent_ns: int | None = None
    accepted_ns: int | None = None
    delivered_ns: int | None = None
    flow_finished_ns: int | None = None

    def mark(self, stage: str, ns: int | None = None) -> int:
        """Stamp ``stage`` (one of :data:`STAGES`) now, or at ``ns``; returns the timestamp."""
        if stage not in STAGES:
            raise BenchError(f"unknown stage {stage!r}; stages are {STAGES}")
        when = self.clock.now_ns() if ns is None else ns
        setattr(self, f"{stage}_ns", when)
        return when


class ScenarioSession(Protocol):
    """A scenario that is set up and ready to run operations."""

    @property
    def links(self) -> Sequence[str]:
        """Names of the links operations are spread over (round-robin by ``seq``)."""
        ...

    async def run(self, op: Operation) -> None:
        """Perform one operation, stamping ``op``; raise if it failed."""
        ...


class Scenario(Protocol):
    """A named benchmark. ``open`` sets up the system under test and tears it down on exit.

    ``parameters`` maps each parameter the scenario understands to a one-line help text; the harness
    refuses a run with any other parameter (a misspelt ``--param`` must not be silently ignored). An
    optional ``choices`` maps a parameter to its valid values; the harness refuses any other value before
    the run starts.
    """

    name: str
    description: str
    parameters: Mapping[str, str]

    def open(self, ctx: ScenarioContext) -> AbstractAsyncContextManager[ScenarioSession]:
        """Set up; yields the session that runs operations."""
        ...


# --------------------------------------------------------------------------------------------- running


@attrs.frozen(kw_only=True)
class RunSummary:
    """The end-of-run summary (also stored in the meta file under ``"summary"``).

    Latencies are exact, over the recorded successful operations, from intended time to the last stage.
    """

    run_id: str
    scenario: str
    records_path: Path
    meta_path: Path
    recorded_ops: int
    error_ops: int
    warmup_ops: int
    elapsed_seconds: float
    throughput_per_second: float
    latency_ns: Mapping[str, int]
    max_schedule_lag_ns: int
    #: Open loop: operations due within warm-up and duration that had not started when the drain deadline
    #: ended the run (the offered rate was beyond what the scenario sustains).
    unstarted_ops: int = 0

    def to_json(self) -> dict[str, Any]:
        """JSON-ready form (paths as strings)."""
        data = attrs.asdict(self)
        data["records_path"] = str(self.records_path)
        data["meta_path"] = str(self.meta_path)
        return data

    def format(self) -> str:
        """A few human-readable lines."""
        lat = self.latency_ns
        ms = {k: v / 1e6 for k, v in lat.items()}
        lines = [
            f"run {self.run_id} ({self.scenario}): {self.recorded_ops} ops recorded, "
            f"{self.error_ops} errors, {self.warmup_ops} warm-up ops not recorded",
            f"  throughput {self.throughput_per_second:,.1f} ops/s over {self.elapsed_seconds:.2f} s",
        ]
        if lat:
            lines.append(
                "  latency (intended -> last stage) ms: " + " ".join(f"{k}={v:.3f}" for k, v in ms.items())
            )
        lines.append(f"  max schedule lag {self.max_schedule_lag_ns / 1e6:.3f} ms")
        if self.unstarted_ops:
            lines.append(
                f"  {self.unstarted_ops:,} operations due in the run never started: the schedule fell behind "
                "by more than the drain time (the offered rate is beyond what the scenario sustains)"
            )
        lines.append(f"  records: {self.records_path}")
        return "\n".join(lines)


def _exact_percentiles(values: Iterable[int]) -> dict[str, int]:
    ordered = sorted(values)
    if not ordered:
        return {}
    n = len(ordered)

    def rank(p: float) -> int:  # nearest-rank: smallest value with at least p of the data at or below it
        return ordered[max(0, math.ceil(p * n) - 1)]

    return {
        "p50": rank(0.5),
        "p90": rank(0.9),
        "p99": rank(0.99),
        "p99.9": rank(0.999),
        "max": ordered[-1],
    }


def write_open_loop_run(
    directory: Path | str,
    *,
    scenario: str,
    description: str,
    clock: str,
    link: str,
    size_bytes: int,
    params: Mapping[str, Any],
    rate_per_s: float,
    started_at: datetime,
    finished_at: datetime,
    stages: Sequence[Mapping[str, int]],
) -> str:
    """Write the records and the run meta (``protocol_spec/bench-records.md``) of a benchmark that drives
    its own processes (``bench.p2p``, ``bench.flows``): one link, one open-loop phase at ``rate_per_s``.

    Each entry of ``stages`` is one operation's stage times in order, from ``created`` (its intended
    start) to its last stage; its latency is the last minus ``created``, summarised with the same
    nearest-rank percentiles as :func:`run_benchmark`'s. Such runs count no errors (a lost message fails
    the run instead). Returns the records file's path.
    """
    run_id = new_run_id(scenario)
    writer = RecordWriter(directory, run_id)
    common = {"run_id": run_id, "scenario": scenario, "link": link, "size_bytes": size_bytes}
    latencies: list[int] = []
    for seq, times in enumerate(stages):
        created = times["created"]
        writer.add_sync(make_record(**common, seq=seq, intended_ns=created, stages=dict(times)))
        latencies.append(list(times.values())[-1] - created)
    writer.finish(
        {
            "schema_version": SCHEMA_VERSION,
            "run_id": run_id,
            "scenario": scenario,
            "description": description,
            "started_at": started_at.isoformat(),
            "finished_at": finished_at.isoformat(),
            "clock": clock,
            "links": [link],
            "config": {
                "scenario": scenario,
                "sizes": f"{size_bytes}:1",
                "params": dict(params),
                "load": {"mode": "open", "rate_per_s": rate_per_s},
            },
            "environment": environment_metadata(),
            "summary": {
                "recorded_ops": writer.count,
                "error_ops": 0,
                "elapsed_seconds": len(latencies) / rate_per_s,
                "latency_ns": _exact_percentiles(latencies),
            },
        }
    )
    return str(writer.records_path)


@attrs.define(eq=False)
class _RunState:
    clock: BenchClock
    writer: RecordWriter
    config: RunConfig
    run_id: str
    links: Sequence[str]
    rng: random.Random
    measure_from_ns: int
    end_ns: int
    deadline_ns: int
    issued: int = 0
    unstarted: int = 0
    recorded: int = 0
    errors: int = 0
    warmup: int = 0
    latencies: array[int] = attrs.field(factory=lambda: array("q"))
    max_lag_ns: int = 0
    first_ns: int | None = None
    last_ns: int | None = None
    stop: bool = False
    deadline_scope: trio.CancelScope | None = None
    batch_full: trio.Event = attrs.field(factory=trio.Event)

    def record(self, op: Operation, error: BaseException | str | None) -> None:
        """Account for a finished (or failed) operation and queue its record; never blocks."""
        if op.intended_ns < self.measure_from_ns:
            self.warmup += 1
            return
        max_ops = self.config.load.max_ops
        if max_ops is not None and self.recorded >= max_ops:
            return
        stamps = (
            op.created_ns, op.enqueued_ns, op.sent_ns, op.accepted_ns, op.delivered_ns, op.flow_finished_ns
        )  # fmt: skip
        last = max((v for v in stamps if v is not None), default=op.intended_ns)
        self.recorded += 1
        self.max_lag_ns = max(self.max_lag_ns, (op.created_ns or op.intended_ns) - op.intended_ns)
        self.first_ns = op.intended_ns if self.first_ns is None else min(self.first_ns, op.intended_ns)
        self.last_ns = last if self.last_ns is None else max(self.last_ns, last)
        if error is None:
            self.latencies.append(last - op.intended_ns)
        else:
            self.errors += 1
        self.writer.add_values(
            (
                self.run_id, self.config.scenario, op.link, op.size_bytes, op.seq, op.intended_ns, *stamps,
                "ok" if error is None else "error", None if error is None else records.error_text(error),
            )
        )  # fmt: skip
        if self.writer.batch_ready():
            self.batch_full.set()

    def next_operation(self, intended_ns: int) -> Operation:
        seq = self.issued
        self.issued += 1
        link = self.links[seq % len(self.links)]
        return Operation(
            seq=seq,
            link=link,
            size_bytes=self.config.sizes.sample(self.rng),
            intended_ns=intended_ns,
            clock=self.clock,
        )

    def budget_left(self) -> bool:
        max_ops = self.config.load.max_ops
        return not self.stop and (max_ops is None or self.recorded < max_ops)


async def _perform(state: _RunState, session: ScenarioSession, op: Operation) -> None:
    if op.created_ns is None:
        op.mark("created")
    try:
        await session.run(op)
    except trio.Cancelled:
        # the run's drain deadline (one cancel scope around all operations) ended it: a measurement
        if state.deadline_scope is not None and state.deadline_scope.cancel_called:
            state.record(op, "Timeout: operation not finished within the drain time after the run")
        raise
    except Exception as exc:  # a failed operation is a measurement, not a crash
        state.record(op, exc)
    else:
        state.record(op, None)


async def _flush_records(state: _RunState) -> None:
    """Write full batches of records in a worker thread while the run goes on."""
    while True:
        await state.batch_full.wait()
        state.batch_full = trio.Event()
        await state.writer.flush_batch()


async def _open_loop(state: _RunState, session: ScenarioSession, start_ns: int) -> None:
    rate = state.config.load.rate_per_second
    assert rate is not None
    interval_ns = 1e9 / rate
    in_flight = trio.Semaphore(state.config.load.max_in_flight)

    async def one(op: Operation) -> None:
        try:
            await _perform(state, session, op)
        finally:
            in_flight.release()

    due = math.ceil((state.end_ns - start_ns) / interval_ns)  # slots with start + i * interval < end
    async with trio.open_nursery() as nursery:
        i = 0
        try:
            while state.budget_left():
                intended = start_ns + round(i * interval_ns)
                if intended >= state.end_ns:
                    break
                delay_ns = intended - state.clock.now_ns()
                if delay_ns > 0:
                    await trio.sleep(delay_ns / 1e9)
                await in_flight.acquire()  # beyond max_in_flight the schedule slips; latency still counts
                nursery.start_soon(one, state.next_operation(intended))
                i += 1
        except trio.Cancelled:
            if state.deadline_scope is not None and state.deadline_scope.cancel_called:
                state.unstarted = max(0, due - i)
            raise


async def _closed_loop(state: _RunState, session: ScenarioSession) -> None:
    async def worker() -> None:
        while state.budget_left():
            now = state.clock.now_ns()
            if now >= state.end_ns:
                return
            op = state.next_operation(now)
            op.created_ns = now
            await _perform(state, session, op)
            if op.seq % 16 == 0:  # a scenario that never blocks must not starve the other tasks
                await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        for _ in range(state.config.load.concurrency):
            nursery.start_soon(worker)


ProgressCallback = Callable[[float, int], None]
"""``progress(fraction_of_time_done, recorded_ops)``, called a few times per second."""


def check_parameters(scenario: Scenario, config: RunConfig) -> None:
    """Refuse parameters the scenario does not declare (a scenario without ``parameters`` accepts any), and
    values outside the scenario's ``choices`` for a parameter.

    Raises:
        BenchError: naming the unknown parameters and the scenario's own, or the parameter, its value and
            the valid values.
    """
    choices: Mapping[str, Sequence[str]] = getattr(scenario, "choices", {})
    for name, valid in choices.items():
        if name in config.params and str(config.params[name]) not in valid:
            raise BenchError(
                f"scenario {scenario.name}: parameter {name}={config.params[name]!r}: "
                f"must be one of {', '.join(valid)}"
            )
    known = getattr(scenario, "parameters", None)
    if known is None:
        return
    unknown = sorted(set(config.params) - set(known))
    if unknown:
        offered = ", ".join(sorted(known)) or "none"
        raise BenchError(
            f"scenario {scenario.name} has no parameter(s) {', '.join(unknown)}; its parameters: {offered}"
        )


async def run_benchmark(
    scenario: Scenario,
    config: RunConfig,
    out_dir: Path,
    *,
    scratch_dir: Path | None = None,
    progress: ProgressCallback | None = None,
    clock: BenchClock | None = None,
) -> RunSummary:
    """Run ``scenario`` under ``config`` and write its records and meta file into ``out_dir``.

    Args:
        scenario: what to run (see the module docstring).
        config: load profile, sizes, scenario parameters, seed, optional fixed run id.
        out_dir: where ``run-<id>.records.jsonl`` and ``run-<id>.meta.json`` go.
        scratch_dir: where the scenario may create files (WAL segments ...); a temporary directory by default.
        progress: optional callback for a progress bar.
        clock: the time source (default :class:`Clock`; tests pass :class:`TrioClock` under ``MockClock``).

    Returns:
        The summary; also written into the meta file.

    Raises:
        BenchError: bad configuration or unusable output directory. Errors raised by the scenario's set-up
            propagate (the partial records file is removed); errors of single operations are recorded.
        An interruption (Ctrl-C, SIGTERM, cancellation) once measuring began publishes the records so far,
        with ``"interrupted": true`` in the meta file, then propagates.
    """
    import tempfile

    check_parameters(scenario, config)
    run_id = config.run_id or new_run_id(config.scenario)
    writer = RecordWriter(out_dir, run_id)
    clock = clock or Clock()
    started_at = datetime.now(UTC)
    state: _RunState | None = None
    links: list[str] = []
    measure_from = end_ns = 0
    try:
        with tempfile.TemporaryDirectory(prefix=f"bench-{config.scenario}-") as tmp:
            ctx = ScenarioContext(config=config, scratch_dir=Path(scratch_dir or tmp), clock=clock)
            async with scenario.open(ctx) as session:
                links = list(session.links)
                if not links:
                    raise BenchError(f"scenario {scenario.name} offers no links")
                load = config.load
                start_ns = clock.now_ns()
                measure_from = start_ns + round(load.warmup_seconds * 1e9)
                end_ns = measure_from + round(load.duration_seconds * 1e9)
                state = _RunState(
                    clock=clock,
                    writer=writer,
                    config=config,
                    run_id=run_id,
                    links=links,
                    rng=random.Random(config.seed),
                    measure_from_ns=measure_from,
                    end_ns=end_ns,
                    deadline_ns=end_ns + round(load.drain_seconds * 1e9),
                )
                async with trio.open_nursery() as nursery:
                    if progress is not None:
                        nursery.start_soon(_report_progress, state, start_ns, progress)
                    nursery.start_soon(_flush_records, state)
                    with trio.move_on_at(clock.to_trio_time(state.deadline_ns)) as deadline:
                        state.deadline_scope = deadline
                        if load.mode == "open":
                            await _open_loop(state, session, start_ns)
                        else:
                            await _closed_loop(state, session)
                    nursery.cancel_scope.cancel()
                finished_ns = clock.now_ns()
    except BaseException as exc:
        # Interrupted (Ctrl-C / SIGTERM) after measuring began: keep what was measured, marked as such.
        if state is not None and _is_interrupt(exc):
            summary = _summary(state, run_id, config, writer, clock.now_ns(), measure_from)
            writer.finish(_meta(scenario, config, run_id, started_at, links, summary) | {"interrupted": True})
        else:
            writer.abort()
        raise
    summary = _summary(state, run_id, config, writer, finished_ns, measure_from)
    writer.finish(_meta(scenario, config, run_id, started_at, links, summary))
    return summary


def _is_interrupt(exc: BaseException) -> bool:
    if isinstance(exc, KeyboardInterrupt | trio.Cancelled):
        return True
    return isinstance(exc, BaseExceptionGroup) and (
        exc.subgroup(lambda e: isinstance(e, KeyboardInterrupt | trio.Cancelled)) is not None
    )


def _summary(
    state: _RunState,
    run_id: str,
    config: RunConfig,
    writer: RecordWriter,
    finished_ns: int,
    measure_from: int,
) -> RunSummary:
    elapsed = ((state.last_ns or finished_ns) - (state.first_ns or measure_from)) / 1e9
    return RunSummary(
        run_id=run_id,
        scenario=config.scenario,
        records_path=writer.records_path,
        meta_path=writer.meta_path,
        recorded_ops=state.recorded,
        error_ops=state.errors,
        warmup_ops=state.warmup,
        elapsed_seconds=elapsed,
        throughput_per_second=state.recorded / elapsed if elapsed > 0 else 0.0,
        latency_ns=_exact_percentiles(state.latencies),
        max_schedule_lag_ns=state.max_lag_ns,
        unstarted_ops=state.unstarted,
    )


def _meta(
    scenario: Scenario,
    config: RunConfig,
    run_id: str,
    started_at: datetime,
    links: list[str],
    summary: RunSummary,
) -> dict[str, Any]:
    return {
        "schema_version": SCHEMA_VERSION,
        "run_id": run_id,
        "scenario": config.scenario,
        "description": scenario.description,
        "started_at": started_at.isoformat(),
        "finished_at": datetime.now(UTC).isoformat(),
        "clock": "epoch ns from perf_counter_ns anchored to time_ns at run start",
        "links": links,
        "config": config.to_json(),
        "environment": environment_metadata(),
        "summary": summary.to_json(),
    }


async def _report_progress(state: _RunState, start_ns: int, progress: ProgressCallback) -> None:
    total_ns = state.end_ns - start_ns
    while True:
        done = min(1.0, (state.clock.now_ns() - start_ns) / total_ns)
        max_ops = state.config.load.max_ops
        if max_ops is not None:
            done = max(done, state.recorded / max_ops)
        progress(min(done, 1.0), state.recorded)
        await trio.sleep(0.2)
