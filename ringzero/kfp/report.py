"""What a pipeline step shows in the Kubeflow UI: Markdown summaries and a self-contained HTML report."""

from __future__ import annotations

import html
import math

from ringzero.pipeline.execute import ExecutedStage
from ringzero.pipeline.gates import GateResult
from ringzero.pipeline.summary import TABLE_METRICS


def _fmt(v) -> str:
    return f"{v:.6g}" if isinstance(v, int | float) else str(v)


def stage_markdown(ex: ExecutedStage) -> str:
    o = ex.outcome
    lines = [
        f"## stage `{ex.name}` ({ex.kind}): {'cached' if ex.skipped else 'ran'}",
        "",
        f"stop: {o.stop_reason} · steps: {o.steps} · wall: {o.wall_s:.0f} s · identity: `{ex.stage_hash[:16]}`",
        "",
        f"output: `{o.output_uri}`" if o.output_uri else "output: no checkpoint",
        "",
        "| metric | value |",
        "|---|---|",
        *(f"| {k} | {_fmt(v)} |" for k, v in sorted(o.summary.items())),
    ]
    return "\n".join(lines) + "\n"


def gate_markdown(stage: str, gate: GateResult) -> str:
    verdict = "PASS: the run goes on" if gate.passed else "FAIL: the run stops here, nothing downstream runs"
    return "\n".join([f"## gate after `{stage}`: {verdict}", "", *(f"- {r}" for r in gate.reasons)]) + "\n"


def status_markdown(run: str, status: str, stages: list[dict], error: str | None) -> str:
    lines = [f"## run `{run}`: {status}", ""]
    if error:
        lines += [f"error: {error}", ""]
    lines += ["| stage | kind | status | stop | gate |", "|---|---|---|---|---|"]
    for s in stages:
        ran = "cached" if s["skipped"] else "ran"
        gate = "pass" if s["gate"]["passed"] else "FAIL: " + "; ".join(s["gate"]["reasons"])
        lines.append(f"| {s['name']} | {s['kind']} | {ran} | {s['stop_reason']} | {gate} |")
    return "\n".join(lines) + "\n"


def stage_html(ex: ExecutedStage) -> str:
    """One page, no external resources (the UI shows it in a sandboxed frame): facts, curves, summary."""
    o = ex.outcome
    esc = html.escape
    rows = "".join(f"<tr><td>{esc(k)}</td><td>{esc(_fmt(v))}</td></tr>" for k, v in sorted(o.summary.items()))
    gate = "".join(f"<li>{esc(r)}</li>" for r in ex.gate.reasons)
    curves = "".join(_curve(key, ex.metrics) for key in TABLE_METRICS)
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{esc(ex.name)}</title>"
        "<style>body{font-family:sans-serif;margin:1em}table{border-collapse:collapse}"
        "td{border:1px solid #ccc;padding:2px 8px}figure{display:inline-block;margin:0 1em 1em 0}</style>"
        "</head><body>"
        f"<h2>stage {esc(ex.name)} ({esc(ex.kind)})</h2>"
        f"<p>stop: {esc(o.stop_reason)} · steps: {o.steps} · wall: {o.wall_s:.0f} s · "
        f"output: <code>{esc(o.output_uri or 'no checkpoint')}</code></p>"
        f"<h3>gate: {'pass' if ex.gate.passed else 'FAIL'}</h3><ul>{gate}</ul>"
        f"<div>{curves}</div>"
        f"<h3>summary</h3><table>{rows}</table>"
        "</body></html>\n"
    )


def _curve(key: str, records: list[dict], width: int = 320, height: int = 120) -> str:
    """An inline SVG line of ``key`` against step; empty when the stage did not log it."""
    pts = [(r["step"], r[key]) for r in records if isinstance(r.get(key), int | float) and math.isfinite(r[key])]
    if len(pts) < 2:
        return ""
    (x0, x1), (y0, y1) = _span(p[0] for p in pts), _span(p[1] for p in pts)
    xy = " ".join(
        f"{(x - x0) / (x1 - x0) * (width - 10) + 5:.1f},{height - 5 - (y - y0) / (y1 - y0) * (height - 10):.1f}"
        for x, y in pts
    )
    return (
        f"<figure><figcaption>{html.escape(key)} ({y0:.4g} .. {y1:.4g})</figcaption>"
        f"<svg width='{width}' height='{height}' role='img' aria-label='{html.escape(key)} against step'>"
        f"<polyline fill='none' stroke='#1f77b4' stroke-width='1.5' points='{xy}'/></svg></figure>"
    )


def _span(values) -> tuple[float, float]:
    vals = list(values)
    lo, hi = min(vals), max(vals)
    return (lo, hi) if hi > lo else (lo - 0.5, hi + 0.5)  # a flat line sits mid-height
