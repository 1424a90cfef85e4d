"""A study's page: its claim and verdicts, the arms' table (mean ± half-range over seeds) and plots (each
arm's mean over seeds: the ``through`` stage's per-step curves and the study's category plots)."""

from __future__ import annotations

import html
import math
from pathlib import Path

from ringzero.pipeline.report_plots import PALETTE, Line, category_plot
from ringzero.pipeline.report_template import page, table


def _mean(values: list) -> float | None:
    vals = [float(v) for v in values if isinstance(v, int | float) and math.isfinite(v)]
    return sum(vals) / len(vals) if vals else None


def _curve_plot(key: str, result: dict) -> str:
    by_arm = {}
    for r in result["readouts"]:
        for step, value in r.get(f"curve/{key}", []):
            by_arm.setdefault(r["arm"], {}).setdefault(int(step), []).append(value)
    steps = sorted({s for pts in by_arm.values() for s in pts})
    lines = [
        Line(arm, PALETTE[i % len(PALETTE)], [_mean(by_arm.get(arm, {}).get(s, [])) for s in steps])
        for i, arm in enumerate(result["arms"])
    ]
    return category_plot(f"{key} per step, mean over seeds", key, [str(s) for s in steps], lines, axis="step")


def _category(title: str, categories, keys, axis: str, result: dict) -> str:
    lines = []
    for i, arm in enumerate(result["arms"]):
        mine = [r for r in result["readouts"] if r["arm"] == arm]
        lines.append(Line(arm, PALETTE[i % len(PALETTE)], [_mean([r.get(k) for r in mine]) for k in keys]))
    return category_plot(title, keys[0], list(categories), lines, axis=axis)


def spread(values: list[float]) -> tuple[float, float]:
    """Mean and half-range over seeds of the finite values (nan, nan when none are finite)."""
    vals = [v for v in values if v is not None and math.isfinite(v)]
    if not vals:
        return float("nan"), float("nan")
    return sum(vals) / len(vals), (max(vals) - min(vals)) / 2


def fmt_cell(mean: float, half: float) -> str:
    if not math.isfinite(mean):
        return "-"
    digits = ".3g" if abs(mean) < 1e-2 or abs(mean) >= 1e3 else ".3f"
    return f"{mean:{digits}}" if not half else f"{mean:{digits}} ± {half:.2g}"


def table_rows(study, result: dict) -> tuple[list[str], list[list[str]]]:
    """One row per arm: each column's mean ± half-range over the seeds."""
    headers = ["arm", *(label for _, label in study.columns)]
    rows = []
    for arm in result["arms"]:
        mine = [r for r in result["readouts"] if r["arm"] == arm]
        cells = [fmt_cell(*spread([r.get(key, float("nan")) for r in mine])) for key, _ in study.columns]
        rows.append([arm, *cells])
    return headers, rows


def render_study(study, result: dict) -> str:
    esc = html.escape
    headers, rows = table_rows(study, result)
    verdicts = "".join(
        f"<li><b>{esc(v['verdict'])}</b>: {esc(v['claim'])} "
        f"<span class='muted'>({esc(v['detail'])})</span></li>"
        for v in result["verdicts"]
    )
    arms = "".join(
        f"<li><code>{esc(a)}</code>: {esc(' '.join(sets) or '(the config as shipped)')}</li>"
        for a, sets in result["arms"].items()
    )
    plots = [_curve_plot(k, result) for k in study.curves]
    plots += [_category(t, c, k, a, result) for t, c, k, a in study.plots]
    body = [
        f"<h1>ablation: {esc(study.name)}</h1>",
        f"<p>{esc(study.claim)}. Config <code>{esc(result['config'])}</code>, seeds {result['seeds']}; "
        "each arm from the same pretrained base, every later stage seeded with the seed.</p>",
        f"<ul>{arms}</ul>",
        f"<h2>verdicts</h2><ul>{verdicts or '<li>none: a --vary comparison reports numbers only</li>'}</ul>",
        table(headers, rows, caption="mean ± half-range over seeds"),
        "<h2>plots</h2>",
        "".join(plots),
    ]
    return page(f"ringzero ablation {study.name}", "\n".join(body))


def write_study_report(study, result: dict, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(render_study(study, result))
    tmp.replace(path)
    return path
