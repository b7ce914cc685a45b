"""Tiny self-contained SVG line charts (no JavaScript, no CDN): the report must open offline.

Scales: ``linear``; ``log`` (base 10, for latency); ``nines`` for percentiles, where p maps to
``-log10(1 - p)`` so that 90%, 99%, 99.9%, 99.99% are equally spaced (the HdrHistogram convention that
makes tails visible) and p = 1 (the maximum) is drawn one half-step to the right of 99.999%.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape
from typing import Final, Literal

import attrs

__all__ = ["PALETTE", "Axis", "Series", "line_chart"]

#: Tableau 10: distinguishable, colour-blind-friendly enough for up to ten series.
PALETTE: Final = (
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
    "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac",
)  # fmt: skip
_NINES_MAX: Final = 5.0  # 99.999%
_NINES_OF_MAX: Final = 5.5


@attrs.frozen(kw_only=True)
class Axis:
    label: str
    scale: Literal["linear", "log", "nines"] = "linear"
    unit_format: Literal["number", "latency_ms", "percent"] = "number"
    include_zero: bool = False


@attrs.frozen(kw_only=True)
class Series:
    name: str
    points: tuple[tuple[float, float], ...]
    color: str | None = None
    dashed: bool = False


def _transform(value: float, scale: str) -> float | None:
    if scale == "linear":
        return value
    if scale == "log":
        return math.log10(value) if value > 0 else None
    # nines
    if value >= 1.0:
        return _NINES_OF_MAX
    return min(_NINES_MAX, -math.log10(1.0 - value))


def _nice_step(span: float, target: int) -> float:
    raw = span / max(1, target)
    mag = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1.0
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def _ticks(lo: float, hi: float, axis: Axis) -> list[tuple[float, str]]:
    """(transformed position, label) pairs."""
    if axis.scale == "nines":
        marks = [(0.0, "0%"), (0.5, "50%"), (0.9, "90%"), (0.99, "99%"), (0.999, "99.9%"),
                 (0.9999, "99.99%"), (0.99999, "99.999%"), (1.0, "max")]  # fmt: skip
        return [(_transform(p, "nines") or 0.0, label) for p, label in marks]
    if axis.scale == "log":
        out = []
        for exp in range(math.floor(lo) - 1, math.ceil(hi) + 1):
            for m in (1, 2, 5):
                v = m * 10.0**exp
                t = math.log10(v)
                if lo - 1e-9 <= t <= hi + 1e-9:
                    out.append((t, _format(v, axis)))
        return out
    step = _nice_step(hi - lo, 6)
    start = math.ceil(lo / step) * step
    out = []
    v = start
    while v <= hi + step * 1e-6:
        out.append((v, _format(v, axis)))
        v += step
    return out


def _format(value: float, axis: Axis) -> str:
    if axis.unit_format == "latency_ms":
        return format_latency_ms(value)
    if axis.unit_format == "percent":
        return f"{value:g}%"
    if abs(value) >= 1_000_000:
        return f"{value / 1e6:g}M"
    if abs(value) >= 1000:
        return f"{value / 1e3:g}k"
    return f"{value:g}"


def format_latency_ms(ms: float) -> str:
    """``0.0123`` -> ``12.3µs``, ``4.5`` -> ``4.5ms``, ``2500`` -> ``2.5s``."""
    if ms >= 1000:
        return f"{ms / 1000:.3g}s"
    if ms >= 1:
        return f"{ms:.3g}ms"
    if ms >= 0.001:
        return f"{ms * 1000:.3g}µs"
    return f"{ms * 1e6:.3g}ns"


def line_chart(
    *,
    title: str,
    series: Sequence[Series],
    x_axis: Axis,
    y_axis: Axis,
    width: int = 570,
    height: int = 320,
) -> str:
    """An ``<svg>`` element: one polyline per series, axes with ticks, a legend below the plot."""
    left, right, top, bottom = 74, 16, 30, 46
    legend_rows = math.ceil(len(series) / 2)
    total_height = height + legend_rows * 18 + 14
    plot_w, plot_h = width - left - right, height - top - bottom
    xs: list[float] = []
    ys: list[float] = []
    transformed: list[list[tuple[float, float]]] = []
    for s in series:
        pts = []
        for x, y in s.points:
            tx, ty = _transform(x, x_axis.scale), _transform(y, y_axis.scale)
            if tx is None or ty is None:
                continue
            pts.append((tx, ty))
            xs.append(tx)
            ys.append(ty)
        transformed.append(pts)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{width}" height="{total_height}" '
        f'viewBox="0 0 {width} {total_height}" role="img" aria-label="{escape(title)}">',
        f'<text x="{left}" y="18" class="chart-title">{escape(title)}</text>',
    ]
    if not xs:
        parts.append(f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle">no data</text></svg>')
        return "".join(parts)
    x_lo, x_hi = min(xs), max(xs)
    y_lo, y_hi = min(ys), max(ys)
    if x_axis.scale == "nines":
        x_lo, x_hi = 0.0, _NINES_OF_MAX
    if y_axis.include_zero and y_axis.scale == "linear":
        y_lo = min(0.0, y_lo)
    if y_axis.scale == "log":
        y_lo, y_hi = math.floor(y_lo * 2) / 2, math.ceil(y_hi * 2) / 2
    if x_hi == x_lo:
        x_hi = x_lo + 1
    if y_hi == y_lo:
        y_hi = y_lo + 1
    if y_axis.scale == "linear":
        y_hi += (y_hi - y_lo) * 0.05

    def px(x: float) -> float:
        return left + (x - x_lo) / (x_hi - x_lo) * plot_w

    def py(y: float) -> float:
        return top + plot_h - (y - y_lo) / (y_hi - y_lo) * plot_h

    parts.append(f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" class="plot-area"/>')
    for t, label in _ticks(y_lo, y_hi, y_axis):
        y = py(t)
        parts.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>')
        parts.append(
            f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" class="tick">{escape(label)}</text>'
        )
    for t, label in _ticks(x_lo, x_hi, x_axis):
        x = px(t)
        parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top}" y2="{top + plot_h}" class="grid"/>')
        parts.append(
            f'<text x="{x:.1f}" y="{top + plot_h + 16}" text-anchor="middle" class="tick">'
            f"{escape(label)}</text>"
        )
    parts.append(
        f'<text x="{left + plot_w / 2}" y="{top + plot_h + 36}" text-anchor="middle" class="axis-label">'
        f"{escape(x_axis.label)}</text>"
    )
    parts.append(
        f'<text transform="translate(14,{top + plot_h / 2}) rotate(-90)" text-anchor="middle" '
        f'class="axis-label">{escape(y_axis.label)}</text>'
    )
    for i, (s, pts) in enumerate(zip(series, transformed, strict=True)):
        color = s.color or PALETTE[i % len(PALETTE)]
        dash = ' stroke-dasharray="6 4"' if s.dashed else ""
        if len(pts) == 1:
            x, y = pts[0]
            parts.append(
                f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{color}">'
                f"<title>{escape(s.name)}</title></circle>"
            )
        elif pts:
            d = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in pts)
            parts.append(
                f'<polyline points="{d}" fill="none" stroke="{color}" stroke-width="1.8"{dash}>'
                f"<title>{escape(s.name)}</title></polyline>"
            )
        row, col = divmod(i, 2)
        lx, ly = left + col * (plot_w / 2), height + 10 + row * 18
        parts.append(
            f'<line x1="{lx:.1f}" x2="{lx + 22:.1f}" y1="{ly - 4}" y2="{ly - 4}" stroke="{color}" '
            f'stroke-width="3"{dash}/>'
            f'<text x="{lx + 28:.1f}" y="{ly}" class="legend">{escape(_shorten(s.name, 38))}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
