"""Comparison of like runs: each run against a baseline, matching groups and ratios (pure Python)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from ._errors import ReportInputError
from ._job import PERCENTILES, GroupStats, JobResult

__all__ = ["ComparisonRow", "compare_runs", "comparison_table", "resolve_run", "resolve_runs"]


@attrs.frozen(kw_only=True)
class ComparisonRow:
    """One stage of one (scenario, link, size class) in the baseline and one other run; ratios are
    run / baseline (``after`` / ``before``)."""

    scenario: str
    link: str
    size_class: int
    stage: str
    before_run: str
    after_run: str
    before: dict[str, float | None]
    after: dict[str, float | None]

    def ratio(self, metric: str) -> float | None:
        b, a = self.before.get(metric), self.after.get(metric)
        if a is None or b is None or b == 0:
            return None
        return a / b


#: Metrics compared, in table order: latency percentiles and max (ms), throughput, error rate.
METRICS = (*PERCENTILES, "max", "throughput_per_s", "error_rate")


def resolve_run(result: JobResult, text: str) -> str:
    """The run id that equals ``text`` or uniquely starts with it.

    Raises:
        ReportInputError: no run or several runs match.
    """
    runs = result.run_ids
    if text in runs:
        return text
    matches = [r for r in runs if r.startswith(text)]
    if len(matches) != 1:
        what = "no run" if not matches else f"{len(matches)} runs"
        raise ReportInputError(f"--compare {text!r}: {what} match; runs in the input: {', '.join(runs)}")
    return matches[0]


NEED_TWO = "--compare needs at least two runs: the baseline, then the runs to compare"


def resolve_runs(result: JobResult, texts: Sequence[str]) -> tuple[str, ...]:
    """``--compare RUN...``: two or more distinct runs (ids or unique prefixes), the baseline first.

    Raises:
        ReportInputError: fewer than two runs, a run named twice, or a name that matches no run or several.
    """
    if len(texts) < 2:
        raise ReportInputError(NEED_TWO)
    runs = tuple(resolve_run(result, t) for t in texts)
    repeated = sorted({r for r in runs if runs.count(r) > 1})
    if repeated:
        raise ReportInputError(f"--compare names run {', '.join(repeated)} more than once")
    return runs


def _metrics(group: GroupStats, stage: str) -> dict[str, float | None]:
    s = group.stage(stage)
    out: dict[str, float | None] = {
        label: (s.percentiles_ns[label] / 1e6 if s else None) for label in PERCENTILES
    }
    out["max"] = s.max_ns / 1e6 if s else None
    out["throughput_per_s"] = group.throughput_per_second
    out["error_rate"] = group.errors / group.count if group.count else None
    return out


def compare_runs(result: JobResult, runs: Sequence[str]) -> list[ComparisonRow]:
    """Rows for every (scenario, link, size class, stage) present in the baseline ``runs[0]`` and in another
    of ``runs``, in the order of ``runs``."""
    baseline, *others = runs
    by_key: dict[tuple[str, str, str, int], GroupStats] = {g.key: g for g in result.groups}
    rows: list[ComparisonRow] = []
    for g in sorted(result.groups, key=lambda g: (g.scenario, g.link, g.size_class)):
        if g.run_id != baseline:
            continue
        for run in others:
            other = by_key.get((run, g.scenario, g.link, g.size_class))
            if other is None:
                continue
            for s in g.stages:
                if other.stage(s.stage) is None:
                    continue
                rows.append(
                    ComparisonRow(
                        scenario=g.scenario,
                        link=g.link,
                        size_class=g.size_class,
                        stage=s.stage,
                        before_run=baseline,
                        after_run=run,
                        before=_metrics(g, s.stage),
                        after=_metrics(other, s.stage),
                    )
                )
    return rows


def comparison_table(rows: list[ComparisonRow]) -> list[dict[str, Any]]:
    """Flat rows for CSV / Parquet: one column per metric for the baseline (before), the run (after) and
    their ratio."""
    out = []
    for r in rows:
        row: dict[str, Any] = {
            "before_run": r.before_run,
            "after_run": r.after_run,
            "scenario": r.scenario,
            "link": r.link,
            "size_class_bytes": r.size_class,
            "stage": r.stage,
        }
        for m in METRICS:
            name = m.replace(".", "_")
            unit = "" if m in ("throughput_per_s", "error_rate") else "_ms"
            row[f"{name}{unit}_before"] = r.before[m]
            row[f"{name}{unit}_after"] = r.after[m]
            row[f"{name}_ratio"] = r.ratio(m)
        out.append(row)
    return out
