"""The HTML report: one self-contained file (inline CSS and SVG, no scripts, no network).

Order: what was measured and on what (runs, machine, configuration), the per-link table, per run and
scenario the latency CDF and the throughput-over-time charts, the comparison of like runs, per-stage
latency, errors, and how to read the numbers (definitions, approximation error).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from html import escape
from typing import Any

import attrs

from ._compare import METRICS, ComparisonRow
from ._job import PERCENTILES, GroupStats, JobResult
from ._svg import PALETTE, Axis, Series, format_latency_ms, line_chart
from ._tables import peak_per_second

__all__ = ["ReportContext", "render_html"]

_NA = "\u2013"  # en dash: "no value"
_TIMES = "\u00d7"

#: At most this many series per chart; the rest are in the tables.
MAX_SERIES_PER_CHART = 10
#: Runs described and charted one by one (the first, by start time); the rest are in the tables.
MAX_RUNS_SHOWN = 12

_STAGE_MEANING = {
    "created": "the harness created the operation (open loop: schedule lag behind its due time)",
    "enqueued": "accepted by the first queue (durable queue, send channel)",
    "sent": "handed to the transport (AMQP transfer written, socket send returned)",
    "accepted": "peer settled it accepted / durable on disk",
    "delivered": "the receiving side handed it to its consumer",
    "flow_finished": "the flow the message belongs to finished",
    "end": "the last stage the operation reached (end-to-end)",
}

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;max-width:1180px;
color:#1d2330;padding:0 16px}
h1{font-size:24px;margin:0 0 4px}h2{font-size:19px;margin:30px 0 8px;border-bottom:1px solid #dde;
padding-bottom:4px}h3{font-size:15px;margin:18px 0 6px}
.sub{color:#5a6274}.banner{background:#fde2e1;border:1px solid #e15759;padding:8px 12px;border-radius:4px;
margin:12px 0}
table{border-collapse:collapse;margin:6px 0 12px;font-size:12.5px}
th,td{border:1px solid #dfe3ea;padding:3px 7px;text-align:right;white-space:nowrap}
th{background:#f3f5f9;font-weight:600}td.l,th.l{text-align:left}
tr:nth-child(even) td{background:#fafbfd}
td.bad{background:#fde2e1!important}td.good{background:#e3f4e1!important}td.warn{background:#fff4d6!important}
.charts{display:flex;flex-wrap:wrap;gap:14px}
.chart{background:#fff;border:1px solid #e4e7ee;border-radius:4px;max-width:100%;height:auto}
.chart .plot-area{fill:#fcfdff;stroke:#c9ced8}.chart .grid{stroke:#e6e9ef}
.chart .tick{font-size:10.5px;fill:#5a6274}
.chart .axis-label{font-size:11.5px;fill:#333}.chart .chart-title{font-size:13px;font-weight:600;fill:#1d2330}
.chart .legend{font-size:11px;fill:#333}
.caption{color:#5a6274;font-size:12.5px;max-width:760px;margin:2px 0 10px}
dl.kv{display:grid;grid-template-columns:max-content auto;gap:2px 14px;margin:6px 0}
dl.kv dt{color:#5a6274}dl.kv dd{margin:0;font-family:ui-monospace,Menlo,monospace;font-size:12.5px}
.scroll{overflow-x:auto;max-width:100%}
code{font-family:ui-monospace,Menlo,monospace;font-size:12.5px}
"""


@attrs.frozen(kw_only=True)
class ReportContext:
    """Facts about the report run itself (stated in the report)."""

    generated_at: str
    input_dirs: tuple[str, ...]
    tables_dir: str
    spark_version: str
    master: str
    driver_memory: str
    report_host: Mapping[str, Any]
    records: int
    elapsed_seconds: float | None = None
    #: seconds per phase (spark start, input schema, aggregate, series, errors, tables)
    phases: Mapping[str, float] = attrs.field(factory=dict)
    #: why the runs in the input were not compared (empty: they were, or there was only one)
    comparison_note: str = ""


def _size(n: int) -> str:
    for unit, factor in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= factor and n % factor == 0:
            return f"{n // factor} {unit}"
    return f"{n} B"


def _ms(ns: float | None) -> str:
    return _NA if ns is None else format_latency_ms(ns / 1e6)


def _ms_or_na(ms: float | None) -> str:
    return _NA if ms is None else format_latency_ms(ms)


def _rate(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:,.1f}"


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]], left: int = 0) -> str:
    """Cells are values (escaped) or ``(text, css_class)``; the first ``left`` columns align left."""
    out = ['<div class="scroll"><table><tr>']
    out += [f'<th class="{"l" if i < left else ""}">{escape(h)}</th>' for i, h in enumerate(headers)]
    out.append("</tr>")
    for row in rows:
        out.append("<tr>")
        for i, cell in enumerate(row):
            text, css = cell if isinstance(cell, tuple) else (cell, "")
            classes = " ".join(c for c in ("l" if i < left else "", css) if c)
            out.append(f'<td class="{classes}">{escape(_cut(str(text)))}</td>')
        out.append("</tr>")
    out.append("</table></div>")
    return "".join(out)


def _mapping(value: Any) -> Mapping[str, Any]:
    """``value`` if it is a JSON object, else an empty one (a meta file's section of the wrong type)."""
    return value if isinstance(value, Mapping) else {}


def _run_section(run_id: str, meta: Mapping[str, Any] | None, result: JobResult) -> str:
    groups = [g for g in result.groups if g.run_id == run_id]
    count = sum(g.count for g in groups)
    errors = sum(g.errors for g in groups)
    scenarios = sorted({g.scenario for g in groups})
    parts = [f"<h3>Run <code>{escape(run_id)}</code></h3>"]
    if meta is None:
        parts.append(
            '<p class="banner">No meta file for this run: machine and configuration were not recorded.</p>'
        )
    elif meta.get("synthetic"):
        parts.append(
            '<p class="banner"><b>Synthetic data</b>: these records were generated, not measured. '
            f"{escape(_cut(str(meta.get('description', ''))))}</p>"
        )
    # (a meta file is only checked for its run id and version: a section of another type is "not recorded")
    env = _mapping((meta or {}).get("environment"))
    config = (meta or {}).get("config", {})
    load = _mapping(config.get("load")) if isinstance(config, dict) else {}
    kv = [
        ("scenario", ", ".join(scenarios)),
        ("what it measures", (meta or {}).get("description", "not recorded")),
        ("records", f"{count:,} ({errors:,} errors)"),
        ("started", (meta or {}).get("started_at", "not recorded")),
        (
            "machine",
            f"{env.get('cpu_count', '?')} CPUs, {env.get('platform', '?')}, host {env.get('hostname', '?')}",
        ),
        ("python", f"{env.get('python_implementation', '')} {env.get('python', '?')}".strip()),
        ("git commit", env.get("git_commit") or "not recorded"),
    ]
    if load:
        rate = load.get("rate_per_second")
        if load.get("mode") == "open":
            shown = f"{rate:,}" if isinstance(rate, int | float) and not isinstance(rate, bool) else rate
            mode = f"open loop, {shown} ops/s on a fixed schedule"
        else:
            mode = f"closed loop, {load.get('concurrency')} concurrent"
        kv.append(
            (
                "load",
                f"{mode}; {load.get('duration_seconds')} s measured after "
                f"{load.get('warmup_seconds')} s warm-up"
                + (f"; max {load['max_ops']} ops" if load.get("max_ops") else ""),
            )
        )
    if isinstance(config, dict) and config:
        kv.append(("sizes", str(config.get("sizes", "?"))))
        kv.append(("config", json.dumps(config, sort_keys=True)))
    parts.append('<dl class="kv">')
    parts += [f"<dt>{escape(k)}</dt><dd>{escape(_cut(str(v), 1000))}</dd>" for k, v in kv]
    parts.append("</dl>")
    return "".join(parts)


def _ordered(result: JobResult) -> list[GroupStats]:
    order = {r: i for i, r in enumerate(result.run_ids)}
    return sorted(result.groups, key=lambda g: (order[g.run_id], g.scenario, g.link, g.size_class))


def _group_table(result: JobResult) -> str:
    peaks = peak_per_second(result)
    rows = []
    for g in _ordered(result):
        end = g.stage("end")
        rate = g.errors / g.count if g.count else 0.0
        pct = [(_ms(end.percentiles_ns[p]) if end else _NA) for p in PERCENTILES]
        rows.append(
            [
                g.run_id,
                g.scenario,
                g.link,
                _size(g.size_class),
                f"{g.count:,}",
                (f"{g.errors:,} ({rate:.2%})", "bad" if rate > 0.01 else ("warn" if g.errors else "")),
                _rate(g.throughput_per_second),
                f"{peaks.get(g.key, 0):,.0f}",
                f"{g.bytes_total / 1e6 / g.duration_seconds:,.2f}" if g.duration_seconds > 0 else _NA,
                *pct,
                _ms(end.max_ns) if end else _NA,
            ]
        )
    headers = ["run", "scenario", "link", "size ≤", "ops", "errors", "ops/s", "peak ops/s (1 bin)", "MB/s",
               *[f"end {p}" for p in PERCENTILES], "end max"]  # fmt: skip
    return _table(headers, rows, left=3)


def _stage_table(result: JobResult) -> str:
    rows = []
    for g in _ordered(result):
        for s in g.stages:
            rows.append(
                [g.run_id, g.scenario, g.link, _size(g.size_class), s.stage, f"{s.count:,}",
                 *[_ms(s.percentiles_ns[p]) for p in PERCENTILES], _ms(s.max_ns), _ms(s.mean_ns)]
            )  # fmt: skip
    headers = ["run", "scenario", "link", "size ≤", "stage", "n", *PERCENTILES, "max", "mean"]
    return _table(headers, rows, left=5)


def _label(g: GroupStats, prefix: str | None = None) -> str:
    text = f"{g.link} · {_size(g.size_class)}"
    return f"{prefix} · {text}" if prefix else text


def _when(ns: int | None) -> str:
    if ns is None:
        return _NA
    try:
        return datetime.fromtimestamp(ns / 1e9, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (OverflowError, ValueError, OSError):
        return f"{ns:,} ns since the epoch"


def _cut(text: str, limit: int = 300) -> str:
    """``text`` cut to ``limit`` characters (every text shown in the report is bounded)."""
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def _top(groups: list[GroupStats]) -> list[GroupStats]:
    return sorted(groups, key=lambda g: (-g.count, g.link, g.size_class))[:MAX_SERIES_PER_CHART]


def cdf_points(g: GroupStats) -> tuple[tuple[float, float], ...]:
    """(percentile, latency ms) of a group's end-to-end CDF, stopping at the data.

    A percentile finer than 1/n of n values is only the maximum again, so the grid ends at the last percentile
    the data resolves, and then the maximum itself (p = 1).
    """
    end = g.stage("end")
    finest = 1.0 - 1.0 / max(end.count if end is not None else 0, 1)
    return tuple((p, ns / 1e6) for p, ns in g.cdf_ns if ns > 0 and (p >= 1.0 or p <= finest))


def _cdf_chart(
    title: str,
    groups: list[GroupStats],
    dashed_run: str | None = None,
    prefixes: dict[str, str] | None = None,
    result: JobResult | None = None,
) -> str:
    series = []
    for i, g in enumerate(groups):
        pts = cdf_points(g)
        series.append(
            Series(
                name=_label(g, (prefixes or {}).get(g.run_id)),
                points=pts,
                color=(_color(result, g.run_id, g.link) if result is not None else PALETTE[i % len(PALETTE)]),
                dashed=g.run_id == dashed_run,
            )
        )
    return line_chart(
        title=title,
        series=series,
        x_axis=Axis(label="percentile of operations (tail-stretched: 90, 99, 99.9 ... equally spaced)",
                    scale="nines"),
        y_axis=Axis(label="latency from due time (log)", scale="log", unit_format="latency_ms"),
    )  # fmt: skip


def _throughput_charts(title: str, result: JobResult, run_id: str, scenario: str) -> str:
    """ok/s per link over time, and errors/s on a chart of their own (their scale is often 1000x smaller)."""
    ok: dict[str, dict[int, float]] = defaultdict(dict)
    err: dict[str, dict[int, float]] = defaultdict(dict)
    width = result.windows[run_id].width_seconds if run_id in result.windows else 1
    for p in result.series:
        if p.run_id == run_id and p.scenario == scenario:
            ok[p.link][p.second] = ok[p.link].get(p.second, 0.0) + p.ok_per_second
            err[p.link][p.second] = err[p.link].get(p.second, 0.0) + p.errors_per_second
    links = sorted(ok, key=lambda k: -sum(ok[k].values()))
    shown = links[:MAX_SERIES_PER_CHART]
    # The run's last bin is cut short by the run's end: leave it out so the line does not dip at the end.
    last_full = max((s for link in ok for s in ok[link]), default=0) - width
    ok_series, err_series = [], []
    for link in shown:
        bins = ok[link]
        lo, hi = min(bins), max(bins)
        if last_full > lo:
            hi = min(hi, last_full)
        xs = range(lo, hi + 1, width)  # bounded: at most MAX_TIMELINE_POINTS bins per run
        color = _color(result, run_id, link)
        points = tuple((s, bins.get(s, 0)) for s in xs)
        ok_series.append(Series(name=f"{link} ok/s", points=points, color=color))
        if any(err[link].values()):
            errs = err[link]
            err_series.append(
                Series(name=f"{link} errors/s", points=tuple((s, errs.get(s, 0)) for s in xs), color=color)
            )
    x_label = f"seconds since the run's first due operation (completions per {width} s bin, as a rate)"
    out = line_chart(
        title=title,
        series=ok_series,
        x_axis=Axis(label=x_label),
        y_axis=Axis(label="operations completed per second", include_zero=True),
    )
    if err_series:
        out += line_chart(
            title=f"{title}: errors",
            series=err_series,
            x_axis=Axis(label=x_label),
            y_axis=Axis(label="failed operations per second", include_zero=True),
        )
    if len(links) > len(shown):
        left = ", ".join(escape(_cut(link, 80)) for link in links[len(shown) :])
        out += (
            f'<p class="sub">{len(links) - len(shown)} more link(s) not drawn here to keep the chart legible '
            f"(the {len(shown)} busiest are shown; every link is in the tables): {left}</p>"
        )
    return out


def _color(result: JobResult, run_id: str, link: str) -> str:
    """One colour per (run, link) across every chart of the report."""
    keys = sorted({(g.run_id, g.link) for g in result.groups})
    return PALETTE[keys.index((run_id, link)) % len(PALETTE)] if (run_id, link) in keys else PALETTE[0]


def _comparison_section(rows: list[ComparisonRow], runs: Sequence[str], result: JobResult) -> str:
    """One row per (scenario, link, size) and run, the baseline first: the table grows down, not across,
    however many runs are compared (and scrolls sideways on a narrow screen)."""
    baseline, others = runs[0], runs[1:]
    parts = [
        '<h2 id="comparison">Comparison</h2>',
        f'<p class="caption">Baseline: <code>{escape(baseline)}</code>; compared with it: '
        + ", ".join(f"<code>{escape(r)}</code>" for r in others)
        + ". Each run's row gives its values and, in brackets, the ratio run ÷ baseline: for latency and "
        "error rate below 1 is better (green when &lt; 0.9, red when &gt; 1.1); for throughput above 1 is "
        "better.</p>",
    ]
    if not rows:
        parts.append("<p>The runs have no (scenario, link, size) in common with the baseline.</p>")
        return "".join(parts)
    by_key: dict[tuple[str, str, int], list[ComparisonRow]] = defaultdict(list)
    for r in rows:
        if r.stage == "end":
            by_key[(r.scenario, r.link, r.size_class)].append(r)
    table_rows = []
    for (scenario, link, size), found in by_key.items():
        first: list[Any] = [scenario, link, _size(size)]
        cells: list[Any] = [*first, (escape(baseline) + " (baseline)", "")]
        for m in METRICS:
            cells.append(_metric_text(m, found[0].before[m]))
        table_rows.append(cells)
        for r in found:
            cells = ["", "", "", r.after_run]
            for m in METRICS:
                ratio = r.ratio(m)
                higher_is_better = m == "throughput_per_s"
                better = ratio is not None and (ratio > 1.1 if higher_is_better else ratio < 0.9)
                worse = ratio is not None and (ratio < 0.9 if higher_is_better else ratio > 1.1)
                text = _metric_text(m, r.after[m])
                css = "good" if better else ("bad" if worse else "")
                cells.append((f"{text} ({_TIMES}{ratio:.2f})" if ratio is not None else text, css))
            table_rows.append(cells)
    headers = ["scenario", "link", "size ≤", "run", *[f"end {p}" for p in PERCENTILES], "end max", "ops/s",
               "error rate"]  # fmt: skip
    parts.append(_table(headers, table_rows, left=4))
    parts.append(
        '<p class="caption">End-to-end latency only; every stage\'s ratios are in '
        "<code>comparison.csv</code> / <code>comparison.parquet</code>.</p>"
    )
    charts = []
    notes = []
    for scenario in sorted({r.scenario for r in rows}):
        keys = {(r.link, r.size_class) for r in rows if r.scenario == scenario}
        groups = [g for g in result.groups if g.scenario == scenario and (g.link, g.size_class) in keys
                  and g.run_id in runs and g.cdf_ns]  # fmt: skip
        groups.sort(key=lambda g: (g.link, g.size_class, runs.index(g.run_id)))
        shown = groups[:MAX_SERIES_PER_CHART]
        prefixes = {r: f"{r} (baseline)" if r == baseline else r for r in runs}
        title = f"{scenario}: end-to-end latency, baseline (dashed) and compared runs"
        charts.append(_cdf_chart(title, shown, dashed_run=baseline, prefixes=prefixes, result=result))
        if len(groups) > len(shown):
            left = ", ".join(escape(_cut(_label(g, g.run_id), 80)) for g in groups[len(shown) :])
            notes.append(
                f'<p class="caption">{escape(scenario)}: {len(groups) - len(shown)} more line(s) would make '
                f"the chart illegible (the first {len(shown)} are drawn; all are in the table): {left}</p>"
            )
    parts.append('<div class="charts">' + "".join(charts) + "</div>")
    parts += notes
    parts.append(
        '<p class="caption">Colours as in every other chart (one per run and link); the baseline is '
        "dashed.</p>"
    )
    return "".join(parts)


def _metric_text(metric: str, value: float | None) -> str:
    if metric == "throughput_per_s":
        return _rate(value or 0)
    if metric == "error_rate":
        return f"{(value or 0):.2%}"
    return _ms_or_na(value)


def render_html(
    result: JobResult,
    metas: Mapping[str, Mapping[str, Any]],
    context: ReportContext,
    comparison: tuple[list[ComparisonRow], Sequence[str]] | None,
) -> str:
    """The whole report as one HTML document."""
    runs = result.run_ids
    total, errors = result.records, result.error_count
    shown_runs = runs[:MAX_RUNS_SHOWN]
    more_runs = len(runs) - len(shown_runs) + result.left_out.runs
    run_list = ", ".join(shown_runs) + (f" and {more_runs:,} more" if more_runs else "")
    title = "corda-trio benchmark report"
    synthetic = any(metas.get(r, {}).get("synthetic") for r in runs)
    out = [
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{title}</title>'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<style>{_CSS}</style></head><body>",
        f"<h1>{title}</h1>",
        f'<p class="sub">{total:,} records, {errors:,} errors, {len(runs) + result.left_out.runs:,} run(s): '
        f"{escape(run_list)}. Generated {escape(context.generated_at)}.</p>",
    ]
    nav = [("measured", "what was measured"), ("per-link", "per link"), ("charts-1", "charts"),
           *([("comparison", "comparison")] if comparison else []), ("stages", "per stage"),
           ("errors", "errors"), ("notes", "how to read")]  # fmt: skip
    out.append('<p class="sub">' + " · ".join(f'<a href="#{a}">{t}</a>' for a, t in nav) + "</p>")
    if synthetic:
        out.append('<p class="banner">This report includes <b>synthetic</b> records (marked below).</p>')
    if result.bad_count:
        listed = "".join(f"<li><code>{escape(_cut(b.format()))}</code></li>" for b in result.bad_records)
        more = result.bad_count - len(result.bad_records)
        out.append(
            f'<div class="banner"><b>{result.bad_count:,} bad record(s) were left out</b> (<code>--skip-bad'
            f"</code>): they break the record schema. The first by file and line:<ul>{listed}</ul>"
            + (f"... and {more:,} more.</div>" if more > 0 else "</div>")
        )
    for r, w in sorted(result.windows.items()):
        if w.outliers:
            out.append(
                f'<p class="banner"><b>{w.outliers:,} operation(s) of run <code>{escape(r)}</code> completed '
                f"outside the run's window</b> (which ends {(w.end_ns - w.start_ns) / 1e9:,.1f} s after its "
                f"first due operation): between {_when(w.outlier_first_ns)} and {_when(w.outlier_last_ns)}. "
                "They count in every total and percentile but are not drawn in the timelines, and throughput "
                "is measured over the window. A clock that jumped, or a corrupt timestamp?</p>"
            )
    left = result.left_out
    if left.groups:
        out.append(
            f'<p class="banner"><b>{left.groups:,} of {left.groups + len(result.groups):,} groups</b> (run, '
            f"scenario, link, size) are counted in the totals but not shown one by one: this report shows "
            f"the {len(result.groups):,} busiest. The others hold {left.records:,} records ({left.errors:,} "
            f"errors)" + (f", and all of {left.runs:,} more run(s)" if left.runs else "") + ".</p>"
        )
    if result.duplicates:
        out.append(
            f'<p class="banner"><b>{result.duplicates:,} duplicate record(s) were dropped</b>: they repeat '
            "the run, scenario, link and seq of another record (an input given twice, or a run copied into "
            "two files). Every count in this report is over the records that remained.</p>"
        )
    out.append('<h2 id="measured">What was measured, and on what</h2>')
    for r in shown_runs:
        out.append(_run_section(r, metas.get(r), result))
    if len(runs) > len(shown_runs):
        names = ", ".join(f"<code>{escape(_cut(r, 80))}</code>" for r in runs[len(shown_runs) :])
        out.append(
            f'<p class="sub">{len(runs) - len(shown_runs):,} more run(s) are in the tables, and not '
            f"described or charted here to keep the page readable: {names}</p>"
        )
    host = context.report_host
    out.append('<h3>This report</h3><dl class="kv">')
    for k, v in [
        ("input", ", ".join(context.input_dirs)),
        ("summary tables", f"{context.tables_dir} (groups, stages, throughput, errors"
                           + (", comparison" if comparison else "") + ": CSV and Parquet)"),
        ("spark", f"{context.spark_version}, master {context.master}, driver memory {context.driver_memory}"),
        ("report machine",
         f"{host.get('cpu_count')} CPUs, Python {host.get('python')}, {host.get('platform')}"),
        ("report git commit", host.get("git_commit") or "not recorded"),
        ("job time", (f"{context.elapsed_seconds:.1f} s" if context.elapsed_seconds is not None else _NA)
         + (" (" + ", ".join(f"{k} {v:.1f} s" for k, v in context.phases.items()) + ")"
            if context.phases else "")),
    ]:  # fmt: skip
        out.append(f"<dt>{escape(k)}</dt><dd>{escape(str(v))}</dd>")
    out.append("</dl>")

    out.append('<h2 id="per-link">Per link</h2>')
    out.append(
        '<p class="caption">One row per run, scenario, link and size class (sizes rounded up to a power of '
        "two). <i>ops/s</i>: successful operations ÷ time from the first due operation to the last "
        "completion in the run's window; <i>peak</i>: the busiest timeline bin (1 s unless the run is long). "
        "<i>end pXX</i>: end-to-end latency, from the moment each operation was due to the last stage it "
        "reached.</p>"
    )
    out.append(_group_table(result))

    chart_no = 0
    for r in shown_runs:
        for scenario in sorted({g.scenario for g in result.groups if g.run_id == r}):
            everything = [g for g in result.groups if g.run_id == r and g.scenario == scenario and g.cdf_ns]
            groups = _top(everything)
            chart_no += 1
            out.append(f'<h2 id="charts-{chart_no}">{escape(scenario)} — run <code>{escape(r)}</code></h2>')
            out.append('<div class="charts">')
            # the run's link colours, unless a link has several size classes here (then one colour each)
            by_link = len({g.link for g in groups}) == len(groups)
            title = f"{scenario}: end-to-end latency distribution"
            out.append(_cdf_chart(title, groups, result=result if by_link else None))
            if len(everything) > len(groups):
                left = ", ".join(escape(_label(g)) for g in everything if g not in groups)
                more = len(everything) - len(groups)
                out.append(
                    f'<p class="sub">{more} more link / size group(s) not drawn in the latency chart to keep '
                    f"it legible (the {len(groups)} largest are; all are in the tables): {left}</p>"
                )
            out.append(_throughput_charts(f"{scenario}: throughput over time", result, r, scenario))
            out.append("</div>")
            out.append(
                '<p class="caption"><b>Latency CDF</b>: for each link and size, the latency (log scale) that '
                "the given fraction of operations stayed under, measured from each operation's <i>due</i> "
                "time, so open-loop stalls are charged to every operation they delayed (no coordinated "
                "omission). The x axis stretches the tail: 90%, 99%, 99.9% ... are equally spaced; the last "
                "point is the maximum. <b>Throughput</b>: operations completed in each one-second bin per "
                "link, counted from the run's first due operation (dashed: errors per second, when there are "
                "any); the run's last, partial second is left out (it is in <code>throughput.csv</code>).</p>"
            )

    if comparison is not None:
        out.append(_comparison_section(*comparison, result))
    elif context.comparison_note:
        out.append(f'<p class="sub">{escape(context.comparison_note)}</p>')

    out.append('<h2 id="stages">Latency per stage</h2>')
    out.append(
        '<p class="caption">Latency of each stage from the operation\'s due time: '
        + "; ".join(f"<i>{escape(k)}</i>: {escape(v)}" for k, v in _STAGE_MEANING.items())
        + ". Stages a scenario does not have are omitted.</p>"
    )
    out.append(_stage_table(result))

    out.append('<h2 id="errors">Errors</h2>')
    if result.errors:
        out.append(
            _table(
                ["run", "scenario", "link", "error", "count"],
                [[e.run_id, e.scenario, e.link, e.error, f"{e.count:,}"] for e in result.errors],
                left=4,
            )
        )
    else:
        out.append("<p>No operation failed.</p>")

    out.append('<h2 id="notes">How to read the numbers</h2><ul>')
    out.append(
        f"<li>Percentiles are estimated by {escape(result.sketch.describe())} (n = operations in the "
        "row). Counts, maxima, means and throughput are exact.</li>"
        "<li>Open-loop runs issue operations on a fixed schedule; latency counts from the scheduled time. "
        "Closed-loop runs measure maximum throughput; their latency is service time under full load.</li>"
        "<li>Warm-up operations are not recorded. Failed operations are excluded from latency and counted "
        "as errors.</li>"
        "<li>Record format: <code>protocol_spec/bench-records.md</code>.</li></ul>"
    )
    out.append("</body></html>")
    return "\n".join(out)
