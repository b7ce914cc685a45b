"""The Spark job: records -> per-group latency percentiles, throughput series, errors.

Theory of operation
===================

A *group* is (run_id, scenario, link, size class); the size class of an operation is the smallest power of
two >= its ``size_bytes`` (so a run with sizes 256 / 4 KiB / 64 KiB has exactly those classes, and a uniform
size range falls into a few octaves). Two passes read the records:

1. **Main aggregate**, grouped by group: counts (ok / error / bytes), first due time and last completion,
   and for every latency *stage* (created ... flow_finished, plus *end* = the last stage an operation
   reached) a quantile sketch read at p50 / p90 / p99 / p99.9, with exact max and mean. The *end* stage also
   gets a grid of ~100 percentiles for the CDF chart. Records that break the schema form a group of their
   own (their count fails the report, or is reported with ``--skip-bad``). The driver takes at most
   :data:`MAX_GROUPS` groups, the busiest; the others are counted (:class:`LeftOut`).
2. **Follow-up** (:func:`_followup`), one pass fanned out into three aggregations: completions per time
   bin per group, ok and error separately, in bins counted from the run's first due time; the most
   frequent error texts per run / scenario / link; and the number of duplicate records. Only if there are
   some, one more pass tells exact copies (dropped, counted) from records of one operation that differ (all
   bad records: :func:`_conflicting_duplicates`).

JSON lines are parsed once: the main aggregate fills an in-memory cache of the prepared columns, which the
follow-up reads (a partition that does not fit in the cache is parsed again). Parquet is not cached: each
pass reads only the columns it needs, which costs less than filling a cache.

Latency is always ``stage_ns - intended_ns`` over ``ok`` records (see ``protocol_spec/bench-records.md``).

**Approximation error** (:class:`Sketch`). Percentiles are estimated with a quantile sketch; both kinds
return a value whose rank is within ``epsilon * n`` of the exact rank ``p * n`` (n = the group's count):

* ``kll`` (default): Spark's ``kll_sketch_agg_bigint`` (Apache DataSketches ``KllLongsSketch``) with
  ``k`` = 16,384: epsilon = 2.296 / k^0.9723 = 0.018% with 99% confidence (the DataSketches bound for a
  single rank query). A group with fewer than about k values is kept exactly. Measured 2-3x faster than
  ``percentile_approx`` on 10M records (primitive longs instead of boxed doubles).
* ``gk``: ``percentile_approx(col, p, accuracy)`` (Greenwald-Khanna), deterministic epsilon = 1 / accuracy
  (default 10,000: 0.01%).

Max, mean, counts and throughput are exact.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from typing import TYPE_CHECKING, Any, Final

import attrs

from corda_trio import records

from ._errors import BadRecordsError, ReportInputError
from ._schema import STAGES, LoadedRecords, checksum_columns
from ._validate import MAX_LISTED, BadRecord, locate_bad, locate_conflicts

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = [
    "CDF_GRID",
    "LATENCY_STAGES",
    "MAX_GROUPS",
    "MAX_TIMELINE_POINTS",
    "PERCENTILES",
    "PERCENTILE_ACCURACY",
    "ErrorCount",
    "GroupStats",
    "JobResult",
    "LeftOut",
    "RunWindow",
    "SeriesPoint",
    "Sketch",
    "StageLatency",
    "bin_width_seconds",
    "compute",
    "size_class",
]

#: Reported percentiles and their labels.
PERCENTILES: Final = {"p50": 0.5, "p90": 0.9, "p99": 0.99, "p99.9": 0.999}
#: Latency stages: the record stages plus ``end`` (the last stage an operation reached).
LATENCY_STAGES: Final = (*STAGES, "end")
#: Percentiles computed for the end-to-end CDF chart.
CDF_GRID: Final = tuple(
    sorted({round(i / 100, 2) for i in range(1, 100)} | {0.995, 0.999, 0.9995, 0.9999, 0.99995, 0.99999})
)
#: ``percentile_approx`` accuracy for the ``gk`` sketch: rank error <= n / accuracy.
PERCENTILE_ACCURACY: Final = 10_000
#: KLL ``k`` for the default ``kll`` sketch (DataSketches allows 8 .. 65,535).
KLL_K: Final = 16_384


@attrs.frozen(kw_only=True)
class Sketch:
    """Which quantile sketch estimates the percentiles, and its size (see the module docstring).

    Attributes:
        kind: ``"kll"`` (DataSketches KLL, fast, probabilistic bound) or ``"gk"`` (percentile_approx,
            deterministic bound).
        size: KLL ``k`` (8 .. 65,535) or GK ``accuracy`` (>= 1).
    """

    kind: str = "kll"
    size: int = KLL_K

    def __attrs_post_init__(self) -> None:
        if self.kind == "kll" and not 8 <= self.size <= 65_535:
            raise ValueError(f"KLL k must be within 8..65535, not {self.size}")
        if self.kind == "gk" and self.size < 1:
            raise ValueError(f"percentile_approx accuracy must be >= 1, not {self.size}")
        if self.kind not in ("kll", "gk"):
            raise ValueError(f"sketch must be 'kll' or 'gk', not {self.kind!r}")

    @classmethod
    def parse(cls, text: str) -> Sketch:
        """``kll``, ``kll:4096``, ``gk``, ``gk:10000``; raises ``ValueError`` with the reason."""
        kind, _, size = text.strip().lower().partition(":")
        default = KLL_K if kind == "kll" else PERCENTILE_ACCURACY
        try:
            return cls(kind=kind, size=int(size) if size else default)
        except ValueError as exc:
            raise ValueError(f"--sketch {text!r}: {exc}") from None

    @property
    def rank_error(self) -> float:
        """epsilon: the estimate's rank is within epsilon * n, plus one item (:meth:`max_rank_distance`)."""
        if self.kind == "gk":
            return 1.0 / self.size
        return 2.296 / self.size**0.9723

    def max_rank_distance(self, n: int) -> int:
        """The stated bound, in items, between the estimate's rank and the exact nearest rank among n values.

        ``ceil(epsilon * n) + 1``: Spark's ``percentile_approx`` keeps its Greenwald-Khanna summary within
        ``epsilon * n`` of the rank it interpolates, and that rank and the nearest-rank definition used for
        the exact values differ by up to one item (measured: the estimate was up to one item outside
        ``epsilon * n`` before this item was added; ``test_gk_sketch_stays_within_its_stated_bound``).
        """
        return math.ceil(self.rank_error * n) + 1

    def describe(self) -> str:
        """One sentence for the report."""
        if self.kind == "gk":
            return (
                f"Spark percentile_approx (Greenwald-Khanna) with accuracy {self.size:,}: the value's rank "
                f"is within {self.rank_error:.4%} of n plus one item from the exact rank (deterministic)"
            )
        return (
            f"Spark kll_sketch_agg_bigint (Apache DataSketches KLL) with k = {self.size:,}: the value's rank "
            f"is within {self.rank_error:.4%} of n plus one item from the exact rank with 99% confidence; "
            "groups of fewer "
            "than about k operations are exact"
        )


#: How many distinct error texts per (run, scenario, link) the report keeps.
MAX_ERROR_TEXTS: Final = 20


def size_class(size_bytes: int) -> int:
    """The smallest power of two >= ``size_bytes`` (0 and 1 map to themselves); as the Spark expression."""
    return size_bytes if size_bytes <= 1 else 1 << (size_bytes - 1).bit_length()


# Exact next power of two without strings: 2^ceil(log2(n)), corrected by one step if floating point rounding
# of log2 landed on the wrong side (measured: 2 s less per pass over 10M rows than a bin()-based version).
_POW2_SQL: Final = "shiftleft(1L, cast(ceil(log2(size_bytes)) as int))"
_SIZE_CLASS_SQL: Final = (
    f"CASE WHEN size_bytes <= 1 THEN size_bytes "
    f"WHEN shiftright({_POW2_SQL}, 1) >= size_bytes THEN shiftright({_POW2_SQL}, 1) "
    f"WHEN {_POW2_SQL} < size_bytes THEN shiftleft({_POW2_SQL}, 1) ELSE {_POW2_SQL} END"
)
_KEYS: Final = ("run_id", "scenario", "link", "size_class")


@attrs.frozen(kw_only=True)
class StageLatency:
    """Latency of one stage in one group, in nanoseconds from the operation's intended time."""

    stage: str
    count: int
    percentiles_ns: dict[str, int]
    max_ns: int
    mean_ns: float


@attrs.frozen(kw_only=True)
class GroupStats:
    """Everything the report knows about one (run, scenario, link, size class)."""

    run_id: str
    scenario: str
    link: str
    size_class: int
    count: int
    ok: int
    errors: int
    bytes_total: int
    first_intended_ns: int
    last_done_ns: int
    stages: tuple[StageLatency, ...]
    cdf_ns: tuple[tuple[float, int], ...]
    #: 99th percentile of completion times (epoch ns): where the run's window ends is derived from it
    done_p99_ns: int = 0
    #: the last completion inside the run's window (``None``: not computed yet, use ``last_done_ns``)
    window_last_done_ns: int | None = None
    #: operations of this group that completed outside the run's window (counted, not drawn)
    outliers: int = 0

    @property
    def key(self) -> tuple[str, str, str, int]:
        return (self.run_id, self.scenario, self.link, self.size_class)

    @property
    def duration_seconds(self) -> float:
        """From the first operation's due time to the last completion inside the run's window."""
        last = self.last_done_ns if self.window_last_done_ns is None else self.window_last_done_ns
        return max(0.0, (last - self.first_intended_ns) / 1e9)

    @property
    def throughput_per_second(self) -> float:
        """Successful operations per second over :attr:`duration_seconds` (0 if the span is empty)."""
        d = self.duration_seconds
        return self.ok / d if d > 0 else 0.0

    def stage(self, name: str) -> StageLatency | None:
        """The latency of stage ``name``, or ``None`` if no ok operation of this group has it."""
        return next((s for s in self.stages if s.stage == name), None)


@attrs.frozen(kw_only=True)
class SeriesPoint:
    """Completions in one time bin of one group.

    ``second`` is where the bin starts, in seconds from the run's first due time; the bin is
    ``width_seconds`` wide (1 s unless the run is long: see :class:`RunWindow`).
    """

    run_id: str
    scenario: str
    link: str
    size_class: int
    second: int
    ok: int
    errors: int
    width_seconds: int = 1

    @property
    def ok_per_second(self) -> float:
        return self.ok / self.width_seconds

    @property
    def errors_per_second(self) -> float:
        return self.errors / self.width_seconds


#: Timelines have at most this many bins per run (the bin width grows with the run's length).
MAX_TIMELINE_POINTS: Final = 2000
#: Bin widths in seconds (a width is the smallest of these that keeps a run within the limit).
_NICE_WIDTHS: Final = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400)


def bin_width_seconds(span_ns: int) -> int:
    """The timeline bin width for a run spanning ``span_ns``: at most :data:`MAX_TIMELINE_POINTS` bins."""
    need = span_ns / 1e9 / MAX_TIMELINE_POINTS
    for w in _NICE_WIDTHS:
        if w >= need:
            return w
    return math.ceil(need / 86400) * 86400


#: Slack after twice the run's p99 completion time before a completion counts as an outlier.
WINDOW_MARGIN_NS: Final = 10_000_000_000
#: The largest timestamp a record can hold (a Spark ``long``): a window never ends later.
_MAX_NS: Final = 2**63 - 1


@attrs.frozen(kw_only=True)
class RunWindow:
    """The time window of one run that its timelines show.

    It starts at the run's first due operation and ends at ``start + 2 * (p99 of completion - start)
    + 10 s``: a completion later than that (a clock that jumped, a far-future timestamp) is an *outlier*: it
    counts in every total and percentile but is not drawn, and the report names how many there were and when.
    """

    start_ns: int
    end_ns: int
    width_seconds: int
    outliers: int = 0
    outlier_first_ns: int | None = None
    outlier_last_ns: int | None = None


@attrs.frozen(kw_only=True)
class ErrorCount:
    run_id: str
    scenario: str
    link: str
    error: str
    count: int


#: Groups the driver holds in full (the busiest, by operations); the rest are counted in :class:`LeftOut`.
#: With at most :data:`MAX_TIMELINE_POINTS` bins and :data:`MAX_ERROR_TEXTS` error texts each, this bounds
#: what the driver collects whatever the input's size or number of runs and links.
MAX_GROUPS: Final = 200


@attrs.frozen(kw_only=True)
class LeftOut:
    """What the report counts but does not show group by group (more than :data:`MAX_GROUPS` groups)."""

    groups: int = 0
    records: int = 0
    ok: int = 0
    errors: int = 0
    #: runs none of whose groups is shown
    runs: int = 0


@attrs.frozen(kw_only=True)
class JobResult:
    """The collected output of the Spark job (small: one row per group / second / error text)."""

    #: in key order (run, scenario, link, size class), whatever the master and partitioning
    groups: tuple[GroupStats, ...]
    series: tuple[SeriesPoint, ...]
    errors: tuple[ErrorCount, ...]
    run_start_ns: dict[str, int]
    sketch: Sketch
    #: per run: the window its timelines show and the outliers outside it
    windows: dict[str, RunWindow] = attrs.field(factory=dict)
    #: seconds spent in each Spark job (aggregate, series, errors)
    timings: dict[str, float] = attrs.field(factory=dict)
    #: records dropped as exact copies of another (same ``records.DUPLICATE_KEY``, every field equal)
    duplicates: int = 0
    #: bad records left out (``--skip-bad``), and the first of them by file and line
    bad_count: int = 0
    bad_records: tuple[BadRecord, ...] = ()
    #: the groups beyond :data:`MAX_GROUPS` (counted in the totals, not shown)
    left_out: LeftOut = LeftOut()

    @property
    def records(self) -> int:
        """Every record the report counted (shown groups and left-out ones)."""
        return sum(g.count for g in self.groups) + self.left_out.records

    @property
    def error_count(self) -> int:
        """Every failed operation the report counted."""
        return sum(g.errors for g in self.groups) + self.left_out.errors

    @property
    def run_ids(self) -> list[str]:
        """Runs in order of their first due time."""
        return sorted(self.run_start_ns, key=lambda r: (self.run_start_ns[r], r))


#: Text fields (run, scenario, link, error) longer than this are shown cut, with a hash that keeps them apart.
MAX_TEXT_CHARS: Final = 160
_CUT_CHARS: Final = 120


def _capped(name: str) -> Any:
    """``name`` as shown: itself, or its first characters, an ellipsis and a hash of the whole (in Spark)."""
    from pyspark.sql import functions as F

    c = F.col(name)
    cut = F.concat(F.left(c, F.lit(_CUT_CHARS)), F.lit("…#"), F.hex(F.xxhash64(c)))
    # The byte length first: it is stored with the string, while counting its characters reads every byte
    # (that count was 5% of the main aggregate's CPU on 10M records); fewer bytes than the limit means fewer
    # characters too.
    too_long = (F.octet_length(c) > MAX_TEXT_CHARS) & (F.length(c) > MAX_TEXT_CHARS)
    return F.when(too_long, cut).otherwise(c)


def _prepare(df: DataFrame, *, checked: bool = True) -> DataFrame:
    """The columns every job reads. ``checked=False`` when the aggregate found no bad record: the later jobs
    then skip the validity check, which reads every column, and Spark reads only the columns each job needs
    (measured on 10M Parquet records: series + errors + duplicates 52-65 s with the check, see README)."""
    from pyspark.sql import functions as F

    valid = F.col("_reason").isNull() if checked else F.lit(True)
    ok = valid & (F.col("outcome") == "ok")
    stage_cols = [F.col(f"{s}_ns") for s in STAGES]
    done = F.coalesce(F.greatest(*stage_cols), F.col("intended_ns"))
    size_class_col = F.when(valid, F.expr(_SIZE_CLASS_SQL))
    keys = [F.when(valid, _capped(k)).alias(k) for k in _KEYS[:3]]
    return df.select(
        valid.alias("valid"),
        *keys,
        size_class_col.alias("size_class"),
        F.when(valid, F.col("size_bytes")).alias("size_bytes"),
        F.when(valid, F.col("intended_ns")).alias("intended_ns"),
        F.when(valid, done).alias("done_ns"),
        ok.alias("is_ok"),
        (valid & (F.col("outcome") == "error")).alias("is_error"),
        *[F.when(ok, F.col(f"{s}_ns") - F.col("intended_ns")).alias(f"lat_{s}") for s in STAGES],
        F.when(ok, done - F.col("intended_ns")).alias("lat_end"),
        F.when(valid, F.col("seq")).alias("seq"),
        F.when(
            valid & (F.col("outcome") == "error"), F.coalesce(_capped("error"), F.lit("(no error text)"))
        ).alias("error"),
        *([F.col("_canon")] if checked and "_canon" in df.columns else []),
    )


def _ids() -> dict[str, Any]:
    """64-bit ids of a group and of its link, from the (shown) key columns: the follow-up groups by them
    instead of three strings and a long; the group's rows and the follow-up's records compute them alike."""
    from pyspark.sql import functions as F

    link = [F.col(k) for k in _KEYS[:3]]
    return {"gid": F.xxhash64(*link, F.col("size_class")), "lid": F.xxhash64(*link)}


def _sketch_n(name: str) -> Any:
    """The number of values in the KLL sketch column ``name`` (0 for none)."""
    from pyspark.sql import functions as F

    return F.coalesce(F.kll_sketch_get_n_bigint(F.col(name)), F.lit(0))


def _aggregate(prepared: DataFrame, sketch: Sketch) -> tuple[list[Any], int, LeftOut]:
    """The valid groups' rows (at most :data:`MAX_GROUPS`, the busiest), the number of bad records, and
    what was left out."""
    from pyspark.sql import functions as F

    aggs = [
        F.count(F.lit(1)).alias("count"),
        F.sum(F.col("is_ok").cast("long")).alias("ok"),
        F.sum(F.col("is_error").cast("long")).alias("errors"),
        F.try_sum("size_bytes").alias("bytes_total"),
        F.min("intended_ns").alias("first_intended_ns"),
        F.max("done_ns").alias("last_done_ns"),
        F.kll_sketch_agg_bigint("done_ns", 256).alias("done_kll"),
    ]
    pct_values = list(PERCENTILES.values())
    totals = ("count", "ok", "errors", "bytes_total", "first_intended_ns", "last_done_ns")
    # Computed from each group's row, not from every record's: the group's ids (:func:`_ids`), and a KLL
    # sketch's count of values (it counts them exactly). Each aggregate function is work for every record in
    # an aggregation Spark runs without generated code (the sketches make it an ``ObjectHashAggregate``).
    # Whole reports over 10M Parquet records, alternating (with the cheaper ``_capped``): executor threads
    # 60.1 / 64.6 s of CPU against 72.0 / 73.6 s when the ids were hashed and the values counted per record.
    outputs = [F.col(k) for k in ("valid", *_KEYS, *totals)] + [c.alias(n) for n, c in _ids().items()]
    done_p99 = F.kll_sketch_get_quantile_bigint(F.col("done_kll"), F.array(F.lit(0.99)))
    outputs.append(F.when(_sketch_n("done_kll") > 0, done_p99).getItem(0).alias("done_p99"))
    for s in LATENCY_STAGES:
        col = f"lat_{s}"
        grid = sorted(set(pct_values) | set(CDF_GRID)) if s == "end" else pct_values
        # the mean as ``avg`` computes it (a double sum over the count), the count from the sketch (KLL)
        aggs += [F.max(col).alias(f"{s}_max"), F.sum(F.col(col).cast("double")).alias(f"{s}_sum")]
        if sketch.kind == "gk":
            aggs.append(F.count(col).alias(f"{s}_n"))
            aggs.append(F.percentile_approx(col, grid, sketch.size).alias(f"{s}_pct"))
            n = F.col(f"{s}_n")
            outputs.append(F.col(f"{s}_pct"))
        else:
            aggs.append(F.kll_sketch_agg_bigint(col, sketch.size).alias(f"{s}_kll"))
            n = _sketch_n(f"{s}_kll")
            ranks = F.array(*[F.lit(p) for p in grid])
            outputs.append(  # an empty sketch (stage never reached) has no quantiles
                F.when(n > 0, F.kll_sketch_get_quantile_bigint(F.col(f"{s}_kll"), ranks)).alias(f"{s}_pct")
            )
        mean = F.when(n > 0, F.col(f"{s}_sum") / n)
        outputs += [n.alias(f"{s}_n"), F.col(f"{s}_max"), mean.alias(f"{s}_mean")]
    groups = prepared.groupBy("valid", *_KEYS).agg(*aggs).select(*outputs).persist()
    try:
        # bad records form one group of their own (their keys are NULL), hence + 2
        rows = groups.limit(MAX_GROUPS + 2).collect()
        if len(rows) < MAX_GROUPS + 2:
            bad = sum(int(r["count"]) for r in rows if not r["valid"])
            return [r for r in rows if r["valid"]], bad, LeftOut()
        top = groups.where(F.col("valid")).orderBy(F.desc("count"), *_KEYS).limit(MAX_GROUPS).collect()
        totals = {
            bool(t["valid"]): t
            for t in groups.groupBy("valid")
            .agg(
                F.count(F.lit(1)).alias("groups"),
                F.sum("count").alias("records"),
                F.sum("ok").alias("ok"),
                F.sum("errors").alias("errors"),
                F.count_distinct("run_id").alias("runs"),
            )
            .collect()
        }
    finally:
        groups.unpersist()
    bad = int(totals[False]["records"]) if False in totals else 0
    valid = totals[True]
    left_out = LeftOut(
        groups=int(valid["groups"]) - len(top),
        records=int(valid["records"]) - sum(int(r["count"]) for r in top),
        ok=int(valid["ok"] or 0) - sum(int(r["ok"] or 0) for r in top),
        errors=int(valid["errors"] or 0) - sum(int(r["errors"] or 0) for r in top),
        runs=int(valid["runs"]) - len({r["run_id"] for r in top}),
    )
    return top, bad, left_out


def compute(loaded: LoadedRecords, *, sketch: Sketch | None = None, skip_bad: bool = False) -> JobResult:
    """Run the Spark jobs over ``loaded`` (records, as loaded by ``_schema.load_records``).

    Args:
        loaded: the records, each already checked against the schema in Spark.
        sketch: the quantile sketch.
        skip_bad: leave bad records out (counted, the first few named in :attr:`JobResult.bad_records`)
            instead of failing.

    Raises:
        BadRecordsError: bad records (malformed JSON, wrong types, values breaking the schema's rules), unless
            ``skip_bad``; the error names the first :data:`_validate.MAX_LISTED` as ``FILE:LINE: problem``.
        ReportInputError: no (valid) records.
    """
    sketch = sketch or Sketch()
    timings: dict[str, float] = {}
    started = time.perf_counter()
    prepared = _prepare(loaded.frame)
    # Parquet: each later job reads only its own columns, which costs less than a cache (10M records in one
    # session, alternating: 51.9 / 50.0 s uncached against 78.2 / 59.6 s with the cache below).
    checked_cache: list[DataFrame] = []  # the prepared columns of every line checked, if they were needed
    try:
        if not loaded.has_text:
            return _compute(
                loaded,
                prepared,
                sketch,
                timings,
                checked_cache,
                skip_bad=skip_bad,
                cached=False,
                started=started,
            )
        return _compute_cached(
            loaded, prepared, sketch, timings, checked_cache, skip_bad=skip_bad, started=started
        )
    finally:
        for frame in checked_cache:
            frame.unpersist(blocking=True)


def _compute_cached(
    loaded: LoadedRecords,
    prepared: DataFrame,
    sketch: Sketch,
    timings: dict[str, float],
    checked_cache: list[DataFrame],
    *,
    skip_bad: bool,
    started: float,
) -> JobResult:
    from pyspark import StorageLevel

    # JSON lines: the main aggregate fills an in-memory cache of the prepared columns and the later jobs read
    # it instead of parsing every line again (10M lines, one session per run, alternating: the two jobs
    # 84.4 / 107.1 s against 109.3 / 121.8 s uncached; the session keeps the cache uncompressed, see
    # ``_session``).
    # MEMORY_ONLY: a partition that does not fit is not cached, and is parsed again when read.
    prepared = prepared.persist(StorageLevel.MEMORY_ONLY)
    try:
        return _compute(
            loaded, prepared, sketch, timings, checked_cache, skip_bad=skip_bad, cached=True, started=started
        )
    finally:
        prepared.unpersist(blocking=True)


def _compute(
    loaded: LoadedRecords,
    prepared: DataFrame,
    sketch: Sketch,
    timings: dict[str, float],
    checked_cache: list[DataFrame],
    *,
    skip_bad: bool,
    cached: bool,
    started: float,
) -> JobResult:
    from pyspark.sql import functions as F

    mark = started
    rows, bad_count, left_out = _aggregate(prepared, sketch)
    timings["aggregate"] = time.perf_counter() - mark
    # Spark's JSON reader does not show a line's text (a second object after the first, a key twice, a
    # number in a text field read as text): its reading is the whole truth only if no record is bad and
    # the lines are exactly their records in the writer's form (``LoadedRecords.text_checksum``). Otherwise
    # every line's text is checked (slower, so only then) and the aggregate counts from that check.
    exact = not loaded.has_text
    if loaded.has_text and not bad_count:
        mark = time.perf_counter()
        # (over the cache the aggregate filled, not inside that aggregate, which Spark runs without
        # generated code)
        row = prepared.select(*checksum_columns(F.col("_canon"))).collect()[0]
        exact = tuple(int(v or 0) for v in row) == loaded.text_checksum()
        timings["line checksum"] = time.perf_counter() - mark
    located = lines = None
    if bad_count or not exact:
        located, lines = loaded.locate()
    if not exact:
        from pyspark import StorageLevel

        mark = time.perf_counter()
        # cached for the later jobs: read again, the checked lines cost their parses and checks once more per
        # record the follow-up fans out (2M lines: the follow-up took 207 s instead of 3-9 s)
        prepared = _prepare(located).persist(StorageLevel.MEMORY_ONLY)
        checked_cache.append(prepared)
        rows, bad_count, left_out = _aggregate(prepared, sketch)
        timings["aggregate, every line checked"] = time.perf_counter() - mark
    listed: tuple[BadRecord, ...] = ()
    if bad_count:
        mark = time.perf_counter()
        assert located is not None  # (a bad record: located above)
        listed = tuple(locate_bad(located, lines))
        timings["locate bad records"] = time.perf_counter() - mark
        if not skip_bad:
            raise BadRecordsError(listed, bad_count)
    if not rows:
        valid = "valid " if bad_count else ""
        raise ReportInputError(f"the input holds no {valid}benchmark records")
    if bad_count or not exact:
        valid = prepared.where(F.col("valid"))
    elif cached:  # nothing to filter out, every column at hand
        valid = prepared
    else:  # nothing to filter out: let each job read only its own columns
        valid = _prepare(loaded.frame, checked=False)
    result = _series_and_errors(valid, rows, sketch, timings, check_duplicates=True, left_out=left_out)
    conflicting = 0
    if result.duplicates:
        # Some operation was recorded more than once (rare): the copies must be equal, else all are bad.
        mark = time.perf_counter()
        source = loaded.frame if exact else located
        conflicts, conflicting, operations = _conflicting_duplicates(source)
        timings["duplicates that differ"] = time.perf_counter() - mark
        if conflicting:
            mark = time.perf_counter()
            if located is None:
                located, lines = loaded.locate()
            raw = [F.col(k).alias(f"_raw_{k}") for k in records.DUPLICATE_KEY]
            marked = located.where(F.col("_reason").isNull()).select("*", *_dup_keys(), *raw)
            found = locate_conflicts(marked, lines, conflicts, list(_DUP_COLUMNS))
            listed = tuple(sorted((*listed, *found), key=lambda b: (b.path, b.line))[:MAX_LISTED])
            bad_count += conflicting
            timings["locate bad records"] = (
                timings.get("locate bad records", 0.0) + time.perf_counter() - mark
            )
            if not skip_bad:
                conflicts.unpersist()
                raise BadRecordsError(listed, bad_count)
            as_prepared = [
                F.col(d).alias(k) for d, k in zip(_DUP_COLUMNS, records.DUPLICATE_KEY, strict=True)
            ]
            gone = F.broadcast(conflicts.select(*as_prepared))
            valid = valid.join(gone, list(records.DUPLICATE_KEY), "left_anti")
        conflicts.unpersist()
        # the exact copies are counted as duplicates; the records of operations that differ as bad records
        result = attrs.evolve(result, duplicates=result.duplicates - (conflicting - operations))
    if result.duplicates or conflicting:
        mark = time.perf_counter()
        valid = valid.dropDuplicates(list(records.DUPLICATE_KEY))
        rows, _, left_out = _aggregate(valid, sketch)
        if not rows:
            raise ReportInputError("the input holds no valid benchmark records")
        timings["aggregate without duplicates"] = time.perf_counter() - mark
        deduplicated = _series_and_errors(
            valid, rows, sketch, timings, check_duplicates=False, left_out=left_out
        )
        result = attrs.evolve(deduplicated, duplicates=result.duplicates)
    return attrs.evolve(result, bad_count=bad_count, bad_records=listed)


#: The columns :func:`_conflicting_duplicates` names an operation by: ``records.DUPLICATE_KEY``, text shown
#: as the other jobs show it (:func:`_capped`), so that they match the prepared records' columns.
_DUP_COLUMNS: Final = tuple(f"_dup_{k}" for k in records.DUPLICATE_KEY)


def _dup_keys() -> list[Any]:
    """:data:`_DUP_COLUMNS` of a frame with the record columns."""
    from pyspark.sql import functions as F

    return [
        (_capped(k) if k != "seq" else F.col(k)).alias(d)
        for k, d in zip(records.DUPLICATE_KEY, _DUP_COLUMNS, strict=True)
    ]


def _conflicting_duplicates(source: DataFrame) -> tuple[DataFrame, int, int]:
    """The operations (``records.DUPLICATE_KEY``) of the valid records of ``source`` that were recorded more
    than once with other values: ``(frame, records, operations)``; the frame (persisted: unpersist it) has
    :data:`_DUP_COLUMNS` and ``n``, the number of records of the operation.

    Run only when the follow-up counted a repeated operation (rare): one pass groups the records by
    operation, keeping their number and the least and greatest hash of all their fields (with which of
    them are null, as Spark's hash skips nulls); copies that are equal have one hash.
    """
    from pyspark.sql import functions as F

    fields = [*records.RECORD_FIELDS, records.VERSION_FIELD]
    nulls = sum(F.when(F.col(n).isNull(), F.lit(1 << i)).otherwise(F.lit(0)) for i, n in enumerate(fields))
    ident = F.xxhash64(*map(F.col, fields), nulls)
    conflicts = (
        source.where(F.col("_reason").isNull())
        .select(*_dup_keys(), ident.alias("h"))
        .groupBy(*_DUP_COLUMNS)
        .agg(F.count(F.lit(1)).alias("n"), F.min("h").alias("lo"), F.max("h").alias("hi"))
        .where((F.col("n") > 1) & (F.col("lo") != F.col("hi")))
        .select(*_DUP_COLUMNS, "n")
        .persist()
    )
    row = conflicts.agg(F.sum("n"), F.count(F.lit(1))).collect()[0]
    return conflicts, int(row[0] or 0), int(row[1] or 0)


def _series_and_errors(
    prepared: DataFrame,
    rows: list[Any],
    sketch: Sketch,
    timings: dict[str, float],
    *,
    check_duplicates: bool,
    left_out: LeftOut,
) -> JobResult:
    """The series, errors and duplicate count (one pass: :func:`_followup`) over the valid records."""
    pct_values = list(PERCENTILES.values())
    groups = tuple(_group_from_row(row, pct_values) for row in rows)
    run_start: dict[str, int] = {}
    for g in groups:
        run_start[g.run_id] = min(run_start.get(g.run_id, g.first_intended_ns), g.first_intended_ns)

    windows: dict[str, RunWindow] = {}
    for r, start in run_start.items():
        p99 = max(g.done_p99_ns for g in groups if g.run_id == r)
        # (at most the largest long: the window is a literal of Spark's follow-up, and timestamps near it
        # would otherwise take it past 64 bits)
        end = min(_MAX_NS, start + 2 * max(0, p99 - start) + WINDOW_MARGIN_NS)
        last = min(end, max(g.last_done_ns for g in groups if g.run_id == r))
        windows[r] = RunWindow(start_ns=start, end_ns=end, width_seconds=bin_width_seconds(last - start))

    mark = time.perf_counter()
    series_rows, error_rows, duplicates = _followup(
        prepared, rows, groups, windows, check_duplicates, only_shown=left_out.groups > 0
    )
    label = "series + errors + duplicates" if check_duplicates else "series + errors"
    timings[label] = time.perf_counter() - mark
    points = []
    in_window_last: dict[tuple[str, str, str, int], int] = {}
    outliers: dict[tuple[str, str, str, int], int] = defaultdict(int)
    run_outliers: dict[str, list[int]] = {}
    for r in series_rows:
        run_id, scenario, link, size = (r[k] for k in _KEYS)
        key = (run_id, scenario, link, int(size))
        n = int(r["ok"]) + int(r["errors"])
        if int(r["bin"]) < 0:
            outliers[key] += n
            first, last = int(r["first_done"]), int(r["last_done"])
            seen = run_outliers.setdefault(run_id, [0, first, last])
            seen[0] += n
            seen[1], seen[2] = min(seen[1], first), max(seen[2], last)
            continue
        in_window_last[key] = max(in_window_last.get(key, 0), int(r["last_done"]))
        width = windows[run_id].width_seconds
        point = SeriesPoint(
            run_id=run_id, scenario=scenario, link=link, size_class=int(size),
            second=int(r["bin"]) * width, ok=int(r["ok"]), errors=int(r["errors"]), width_seconds=width,
        )  # fmt: skip
        points.append(point)
    series = tuple(sorted(points, key=lambda p: (p.run_id, p.scenario, p.link, p.size_class, p.second)))
    # in key order, as the series: Spark collects the groups in the order of its shuffle partitions, which
    # the master, the number of cores and the partition settings change (the groups table of one input
    # came out in another row order on a cluster than in local mode)
    groups = tuple(
        attrs.evolve(
            g, window_last_done_ns=in_window_last.get(g.key, g.first_intended_ns), outliers=outliers[g.key]
        )
        for g in sorted(groups, key=lambda g: g.key)
    )
    for run_id, (n, first, last) in run_outliers.items():
        w = windows[run_id]
        windows[run_id] = attrs.evolve(w, outliers=n, outlier_first_ns=first, outlier_last_ns=last)

    errors = tuple(
        sorted(
            (ErrorCount(**r) for r in error_rows),
            key=lambda e: (e.run_id, e.scenario, e.link, -e.count, e.error),
        )
    )
    return JobResult(
        groups=groups, series=series, errors=errors, run_start_ns=run_start, sketch=sketch, timings=timings,
        duplicates=duplicates, windows=windows, left_out=left_out,
    )  # fmt: skip


def _followup(
    prepared: DataFrame,
    rows: list[Any],
    groups: tuple[GroupStats, ...],
    windows: dict[str, RunWindow],
    check_duplicates: bool,
    *,
    only_shown: bool,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
    """The throughput series, the most frequent error texts and the duplicate count, in one pass.

    Each record is read once and fanned out (``explode``) into up to three tagged rows that one hash
    aggregation groups: tag 0 by (group, time bin), tag 1 by (link, ``seq >> 6``) with the ``seq`` values
    as bits of a 64-bit ``bit_or`` (so ``count - bit_count`` is the number of repeated keys, exactly, without
    the sort a bitmap aggregate would need), tag 2 (error records only) by (link, error text). A second,
    small aggregation sums tag 1 into one row, and a window keeps the :data:`MAX_ERROR_TEXTS` most frequent
    texts per link. Measured on 10M records: one pass instead of three (see README).

    Returns:
        series rows (the group's key columns, ``bin``, ``ok``, ``errors``, ``first_done``, ``last_done``),
        error rows (``run_id``, ``scenario``, ``link``, ``error``, ``count``) and the number of duplicate
        records (0 unless ``check_duplicates``).
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    def per_run(values: dict[str, int]) -> Any:
        pairs = [x for r, v in sorted(values.items()) for x in (F.lit(r), F.lit(v))]
        return F.element_at(F.create_map(*pairs), F.col("run_id"))

    start_col = per_run({r: w.start_ns for r, w in windows.items()})
    end_col = per_run({r: w.end_ns for r, w in windows.items()})
    width_col = per_run({r: w.width_seconds * 1_000_000_000 for r, w in windows.items()})
    # Bins counted from each run's first due operation; -1 holds the outliers (outside the run's window).
    inside = (F.col("done_ns") >= start_col) & (F.col("done_ns") <= end_col)
    bucket = F.when(inside, F.floor((F.col("done_ns") - start_col) / width_col)).otherwise(F.lit(-1))

    links = {g.key[:3] for g in groups}
    link_of = {int(row["lid"]): g.key[:3] for row, g in zip(rows, groups, strict=True)}
    key_of = {int(row["gid"]): g.key for row, g in zip(rows, groups, strict=True)}
    # a 64-bit hash collision is all but impossible; if there is one, group by the key columns themselves
    by_id = len(key_of) == len(groups) and len(link_of) == len(links)
    tags = [0, 1, 2] if check_duplicates else [0, 2]
    fan_out = F.when(F.col("is_error"), F.array(*map(F.lit, tags))).otherwise(F.array(*map(F.lit, tags[:-1])))
    base = prepared.select(
        "run_id", "scenario", "link", "size_class", *[c.alias(n) for n, c in _ids().items()], "seq",
        "done_ns", "is_ok", "is_error", "error", bucket.alias("bin"), F.explode(fan_out).alias("tag"),
    )  # fmt: skip
    tag = F.col("tag")
    if only_shown:  # by id even if ids collide: at worst a colliding group's rows come along, and are dropped
        shown_group = F.col("gid").isin(*key_of)
        shown_link = F.col("lid").isin(*link_of)
        base = base.where(((tag == 0) & shown_group) | (tag == 1) | ((tag == 2) & shown_link))
    if by_id:
        keys = [F.when(tag == 0, F.col("gid")).otherwise(F.col("lid")).alias("id")]
    else:
        keys = [F.col(k) for k in _KEYS[:3]] + [F.when(tag == 0, F.col("size_class")).alias("size_class")]
    key_names = ["id"] if by_id else list(_KEYS)
    one_bit = F.expr("shiftleft(1L, cast(seq & 63 as int))")  # seq >= 0: the schema says so
    level1 = base.groupBy(
        tag,
        *keys,
        F.when(tag == 0, F.col("bin")).when(tag == 1, F.shiftright(F.col("seq"), 6)).alias("k2"),
        F.when(tag == 2, F.col("error")).alias("text"),
    ).agg(
        F.sum(F.col("is_ok").cast("long")).alias("ok"),
        F.sum(F.col("is_error").cast("long")).alias("errors"),
        F.min("done_ns").alias("first_done"),
        F.max("done_ns").alias("last_done"),
        F.count(F.lit(1)).alias("n"),
        F.bit_or(F.when(tag == 1, one_bit)).alias("bits"),
    )
    dup = tag == 1
    level2 = level1.groupBy(
        "tag", *[F.when(~dup, F.col(k)).alias(k) for k in (*key_names, "k2")], "text"
    ).agg(
        F.sum("ok").alias("ok"),
        F.sum("errors").alias("errors"),
        F.min("first_done").alias("first_done"),
        F.max("last_done").alias("last_done"),
        F.sum("n").alias("n"),
        F.sum(F.col("n") - F.bit_count("bits")).alias("duplicates"),
    )
    ranked = Window.partitionBy("tag", *key_names).orderBy(F.desc("n"), F.col("text"))
    out = level2.withColumn("rank", F.when(F.col("tag") == 2, F.row_number().over(ranked))).where(
        (F.col("tag") != 2) | (F.col("rank") <= MAX_ERROR_TEXTS)
    )
    series: list[dict[str, Any]] = []
    errors: list[dict[str, Any]] = []
    duplicates = 0
    for r in _collect(out):
        if r["tag"] == 1:
            duplicates += int(r["duplicates"] or 0)
            continue
        if by_id:
            names = key_of[int(r["id"])] if r["tag"] == 0 else link_of[int(r["id"])]
        else:
            names = tuple(r[k] for k in key_names)
            if (names if r["tag"] == 0 else names[:3]) not in (key_of.values() if r["tag"] == 0 else links):
                continue  # a group that is not shown, which came along with one that is (same id)
        if r["tag"] == 0:
            series.append(
                {**dict(zip(_KEYS, names, strict=True)), "bin": r["k2"], "ok": r["ok"], "errors": r["errors"],
                 "first_done": r["first_done"], "last_done": r["last_done"]}
            )  # fmt: skip
        else:
            run_id, scenario, link = names[:3]
            errors.append(
                {"run_id": run_id, "scenario": scenario, "link": link, "error": r["text"], "count": r["n"]}
            )
    return series, errors, duplicates


def _collect(df: DataFrame) -> list[Any]:
    """``df.collect()``."""
    return df.collect()


def _group_from_row(row: Any, pct_values: list[float]) -> GroupStats:
    stages: list[StageLatency] = []
    cdf: tuple[tuple[float, int], ...] = ()
    for s in LATENCY_STAGES:
        n = int(row[f"{s}_n"] or 0)
        if n == 0:
            continue
        values = [int(v) for v in row[f"{s}_pct"]]
        if s == "end":
            grid = sorted(set(pct_values) | set(CDF_GRID))
            by_p = dict(zip(grid, values, strict=True))
            cdf = (*((p, by_p[p]) for p in grid), (1.0, int(row["end_max"])))
            values = [by_p[p] for p in pct_values]
        stages.append(
            StageLatency(
                stage=s,
                count=n,
                percentiles_ns=dict(zip(PERCENTILES, values, strict=True)),
                max_ns=int(row[f"{s}_max"]),
                mean_ns=float(row[f"{s}_mean"]),
            )
        )
    return GroupStats(
        run_id=row["run_id"],
        scenario=row["scenario"],
        link=row["link"],
        size_class=int(row["size_class"]),
        count=int(row["count"]),
        ok=int(row["ok"] or 0),
        errors=int(row["errors"] or 0),
        bytes_total=int(row["bytes_total"] or 0),
        first_intended_ns=int(row["first_intended_ns"]),
        last_done_ns=int(row["last_done_ns"]),
        done_p99_ns=int(row["done_p99"]),
        stages=tuple(stages),
        cdf_ns=cdf,
    )


def exact_nearest_rank(sorted_values: list[int], p: float) -> int:
    """Nearest-rank percentile of already sorted values (used by tests and the harness summary)."""
    return sorted_values[max(0, math.ceil(p * len(sorted_values)) - 1)]
