"""Inline SVG line plots for the run report: one metric against step, one coloured segment per stage.

Stages are laid side by side on one x axis in run order (stage 1's steps, then stage 2's, ...), so a
plot reads as the run's history: length running away in stage 1, the reset at distillation, and so on.
Each stage's own step numbers stay visible in the hover titles. Pure string building: no JS, no fonts
or images fetched, so the page renders the same offline and inside a sandboxed frame.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass

PALETTE = [
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
]

INFINITE_SENTINEL = 1e300
"""The metric writer stores +-inf as +-1e308 (JSON has no inf); such points are left out of a plot."""

WIDTH, HEIGHT = 440, 210
MARGIN_LEFT, MARGIN_RIGHT, MARGIN_TOP, MARGIN_BOTTOM = 52, 12, 22, 30
MIN_LABELLED_SPAN_PX = 40  # a stage narrower than this shows only its first step, or the labels collide


@dataclass(frozen=True)
class Segment:
    """One stage's points of one metric, as ``(stage step, value)``."""

    stage: str
    color: str
    points: list[tuple[int, float]]


def plottable(value) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and abs(value) < INFINITE_SENTINEL
    )


def series(records: list[dict], key: str) -> list[tuple[int, float]]:
    """``(step, value)`` of ``key`` in a stage's metric records, in step order; unplottable values left
    out."""
    pts = {int(r["step"]): float(r[key]) for r in records if "step" in r and plottable(r.get(key))}
    return sorted(pts.items())


def nice_ticks(lo: float, hi: float, want: int = 4) -> list[float]:
    """Round tick values inside ``[lo, hi]``: the step of 1, 2 or 5 times a power of ten nearest to a
    ``want``-th of the range."""
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / want
    mag = 10 ** math.floor(math.log10(raw))
    step = min((m * mag for m in (1, 2, 5, 10)), key=lambda c: abs(math.log(c / raw)))
    first = math.ceil(lo / step - 1e-9) * step
    ticks = []
    t = first
    while t <= hi + step * 1e-9:
        ticks.append(0.0 if abs(t) < step * 1e-9 else t)
        t += step
    return ticks


def _fmt_tick(v: float) -> str:
    return f"{v:.3g}" if abs(v) < 1e4 else f"{v:.2g}"


def _y_range(values: list[float]) -> tuple[float, float]:
    lo, hi = min(values), max(values)
    if hi == lo:  # a flat line sits mid-height instead of on an axis
        pad = abs(lo) * 0.1 or 0.5
        return lo - pad, hi + pad
    pad = (hi - lo) * 0.05
    return lo - pad, hi + pad


def _frame(y_lo: float, y_hi: float, py) -> list[str]:
    """The plot's frame, horizontal grid lines and y tick labels (``py`` maps a value to its pixel row)."""
    plot_w, plot_h = WIDTH - MARGIN_LEFT - MARGIN_RIGHT, HEIGHT - MARGIN_TOP - MARGIN_BOTTOM
    parts = [f"<rect class='frame' x='{MARGIN_LEFT}' y='{MARGIN_TOP}' width='{plot_w}' height='{plot_h}'/>"]
    for t in nice_ticks(y_lo, y_hi):
        y = py(t)
        parts.append(
            f"<line class='grid' x1='{MARGIN_LEFT}' x2='{WIDTH - MARGIN_RIGHT}' y1='{y:.1f}' y2='{y:.1f}'/>"
        )
        parts.append(
            f"<text class='tick' x='{MARGIN_LEFT - 4}' y='{y + 3:.1f}' "
            f"text-anchor='end'>{_fmt_tick(t)}</text>"
        )
    return parts


def line_plot(title: str, key: str, segments: list[Segment]) -> str:
    """One ``<figure>`` with an SVG plot of ``key``; stages with no points take no room on the axis."""
    segments = [s for s in segments if s.points]
    esc = html.escape
    if not segments:
        return (
            f"<figure class='plot empty' data-metric='{esc(key)}'><figcaption>{esc(title)}"
            f" <code>{esc(key)}</code></figcaption><p class='muted'>not logged by any stage</p></figure>"
        )
    # Each stage gets a span as wide as its step range (at least one step), in run order.
    spans, offset = [], 0.0
    for s in segments:
        first, last = s.points[0][0], s.points[-1][0]
        spans.append((offset - first, offset, offset + max(last - first, 1)))
        offset = spans[-1][2] + 1
    x_total = max(offset - 1, 1)
    y_lo, y_hi = _y_range([v for s in segments for _, v in s.points])
    plot_w = WIDTH - MARGIN_LEFT - MARGIN_RIGHT
    plot_h = HEIGHT - MARGIN_TOP - MARGIN_BOTTOM

    def px(x: float) -> float:
        return MARGIN_LEFT + x / x_total * plot_w

    def py(y: float) -> float:
        return MARGIN_TOP + (1 - (y - y_lo) / (y_hi - y_lo)) * plot_h

    parts = _frame(y_lo, y_hi, py)
    for s, (shift, start, end) in zip(segments, spans, strict=True):
        x0, x1 = px(start), px(end)
        label = f"{s.stage}: steps {s.points[0][0]}-{s.points[-1][0]}"
        parts.append(f"<g class='series' data-stage='{esc(s.stage)}'>")
        if start > 0:
            parts.append(
                f"<line class='boundary' x1='{x0:.1f}' x2='{x0:.1f}' y1='{MARGIN_TOP}' "
                f"y2='{HEIGHT - MARGIN_BOTTOM}'/>"
            )
        parts.append(
            f"<text class='stage-label' x='{(x0 + x1) / 2:.1f}' y='{MARGIN_TOP - 6}' "
            f"text-anchor='middle' fill='{s.color}'>{esc(s.stage)}</text>"
        )
        parts.append(
            f"<text class='tick' x='{x0:.1f}' y='{HEIGHT - MARGIN_BOTTOM + 12}' "
            f"text-anchor='start'>{s.points[0][0]}</text>"
        )
        if x1 - x0 > MIN_LABELLED_SPAN_PX:
            parts.append(
                f"<text class='tick' x='{x1:.1f}' y='{HEIGHT - MARGIN_BOTTOM + 12}' "
                f"text-anchor='end'>{s.points[-1][0]}</text>"
            )
        xy = " ".join(f"{px(step + shift):.1f},{py(v):.1f}" for step, v in s.points)
        parts.append(f"<polyline points='{xy}' stroke='{s.color}'><title>{esc(label)}</title></polyline>")
        if len(s.points) <= 12:  # few points: mark each, or a one-point stage would be invisible
            for step, v in s.points:
                parts.append(
                    f"<circle cx='{px(step + shift):.1f}' cy='{py(v):.1f}' r='2.5' fill='{s.color}'>"
                    f"<title>{esc(s.stage)} step {step}: {v:.6g}</title></circle>"
                )
        parts.append("</g>")
    parts.append(
        f"<text class='axis' x='{MARGIN_LEFT + plot_w / 2:.1f}' y='{HEIGHT - 4}' text-anchor='middle'>"
        "step within each stage (stages in run order)</text>"
    )
    return (
        f"<figure class='plot' data-metric='{esc(key)}'><figcaption>{esc(title)} <code>{esc(key)}</code>"
        f"</figcaption><svg viewBox='0 0 {WIDTH} {HEIGHT}' width='{WIDTH}' height='{HEIGHT}' role='img' "
        f"aria-label='{esc(key)} against step'>{''.join(parts)}</svg></figure>"
    )


@dataclass(frozen=True)
class Line:
    """One line of a category plot: a value (or None) per category."""

    label: str
    color: str
    values: list[float | None]
    dashed: bool = False


def category_plot(
    title: str, key: str, categories: list[str], lines: list[Line], axis: str = "difficulty"
) -> str:
    """One ``<figure>``: ``key`` against ``categories`` (evenly spaced, in order), one line per entry,
    labelled at its end; a missing value breaks nothing, its point is left out."""
    esc = html.escape
    lines = [ln for ln in lines if any(plottable(v) for v in ln.values)]
    if not lines or not categories:
        return (
            f"<figure class='plot empty' data-metric='{esc(key)}'><figcaption>{esc(title)}"
            f" <code>{esc(key)}</code></figcaption><p class='muted'>not measured</p></figure>"
        )
    y_lo, y_hi = _y_range([v for ln in lines for v in ln.values if plottable(v)])
    plot_w = WIDTH - MARGIN_LEFT - MARGIN_RIGHT
    plot_h = HEIGHT - MARGIN_TOP - MARGIN_BOTTOM

    def px(i: int) -> float:
        return MARGIN_LEFT + (i + 0.5) / len(categories) * plot_w

    def py(y: float) -> float:
        return MARGIN_TOP + (1 - (y - y_lo) / (y_hi - y_lo)) * plot_h

    parts = _frame(y_lo, y_hi, py)
    for i, c in enumerate(categories):
        parts.append(
            f"<text class='tick' x='{px(i):.1f}' y='{HEIGHT - MARGIN_BOTTOM + 12}' "
            f"text-anchor='middle'>{esc(c)}</text>"
        )
    for ln in lines:
        pts = [(i, v) for i, v in enumerate(ln.values) if plottable(v)]
        dash = " stroke-dasharray='4 3'" if ln.dashed else ""
        parts.append(f"<g class='series' data-line='{esc(ln.label)}'>")
        xy = " ".join(f"{px(i):.1f},{py(v):.1f}" for i, v in pts)
        parts.append(
            f"<polyline points='{xy}' stroke='{ln.color}'{dash}><title>{esc(ln.label)}</title></polyline>"
        )
        for i, v in pts:
            parts.append(
                f"<circle cx='{px(i):.1f}' cy='{py(v):.1f}' r='2.5' fill='{ln.color}'>"
                f"<title>{esc(ln.label)}, {esc(categories[i])}: {v:.4g}</title></circle>"
            )
        parts.append("</g>")
    parts.append(
        f"<text class='axis' x='{MARGIN_LEFT + plot_w / 2:.1f}' y='{HEIGHT - 4}' text-anchor='middle'>"
        f"{esc(axis)}</text>"
    )
    return (
        f"<figure class='plot' data-metric='{esc(key)}'><figcaption>{esc(title)} <code>{esc(key)}</code>"
        f"</figcaption><svg viewBox='0 0 {WIDTH} {HEIGHT}' width='{WIDTH}' height='{HEIGHT}' role='img' "
        f"aria-label='{esc(key)} against {esc(axis)}'>{''.join(parts)}</svg></figure>"
    )
