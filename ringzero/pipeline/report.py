"""The run report: one self-contained HTML page a person reads after ``ringzero run``.

It shows the run's status, the stage table (every stage's summary, wall time and stop reason, with the
stages a failed gate kept from running), every gate's reasons, the run's targets (met / missed / missing),
the curves that tell whether the run is healthy (reward, trace usage, length, the engine gap's and the whole
batch's ratio tail p99/max against step, per stage), each eval stage's checkpoint comparison, and every
stage's full summary. Built only from the run result (summaries, metric records, gate results) and the
manifest, so it can be written for cached stages too.
"""

from __future__ import annotations

import html
import json
import time
from pathlib import Path

from ringzero.config.loader import config_hash
from ringzero.pipeline.local import PipelineResult
from ringzero.pipeline.report_plots import PALETTE, Line, Segment, category_plot, line_plot, plottable, series
from ringzero.pipeline.report_template import legend, page, table
from ringzero.pipeline.table_columns import METRIC_LABELS, STAGE_COLUMNS, TABLE_METRICS, fmt, target_label

REPORT_NAME = "report.html"

# (title, metric key): the curves that show whether a run is healthy; the ratio tail is the leading
# indicator of a collapse, length the cause of a widening tail, trace usage what stage 1 elicits. gap/* is
# the first minibatch (the engines alone), ratio/* every minibatch (the policy's own movement added).
CURVES = [
    ("reward", "reward/mean"),
    ("trace usage (share of responses with a worked trace)", "trace/rate"),
    ("response length (tokens)", "len/mean"),
    ("engine gap (first minibatch), p99 of |r - 1|", "gap/ratio/p99"),
    ("engine gap (first minibatch), max of |r - 1|", "gap/ratio/max"),
    ("importance-ratio tail (all minibatches), p99 of |r - 1|", "ratio/p99"),
    ("importance-ratio tail (all minibatches), max of |r - 1|", "ratio/max"),
]


def write_report(cfg, result: PipelineResult, run_dir: Path) -> Path:
    manifest_path = Path(run_dir) / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    path = Path(run_dir) / REPORT_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(render_report(cfg, result, manifest))
    tmp.replace(path)  # a reader never sees half a report
    return path


def render_report(cfg, result: PipelineResult, manifest: dict) -> str:
    colors = {s.name: PALETTE[i % len(PALETTE)] for i, s in enumerate(cfg.stages)}
    body = [
        _header(cfg, result, manifest),
        "<h2>Stages</h2>",
        _stage_table(cfg, result),
        "<h2>Gates</h2>",
        _gates(cfg, result),
        *_targets(result),
        *_rollbacks(result),
        "<h2>Curves</h2>",
        _curves(result, colors),
        *_comparisons(result),
        "<h2>Stage summaries</h2>",
        _summaries(result),
    ]
    return page(f"ringzero run {cfg.run.name}", "\n".join(body))


def _header(cfg, result: PipelineResult, manifest: dict) -> str:
    esc = html.escape
    started, finished = manifest.get("started"), manifest.get("finished")
    when = ""
    if started:
        when = f" · started {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(started))}"
        if finished:
            when += f" · {finished - started:.0f} s wall"
    ran = sum(1 for ex in result.stages if not ex.skipped)
    out = [
        f"<h1>run <code>{esc(cfg.run.name)}</code></h1>",
        f"<p><span class='status {esc(result.status)}'>{esc(result.status)}</span> · "
        f"config <code>{esc(manifest.get('config_hash') or config_hash(cfg))[:16]}</code> · "
        f"{len(result.stages)} of {len(cfg.stages)} stages reached, {ran} ran, "
        f"{len(result.stages) - ran} cached{esc(when)}</p>",
    ]
    if result.failed_gate is not None:
        reasons = "".join(
            f"<li>{esc(r)}</li>" for r in result.failed_gate.gate.reasons if r.startswith("FAIL")
        )
        out.append(
            f"<div class='banner'><b>The gate after stage <code>{esc(result.failed_gate.name)}</code> "
            f"failed; the run stopped and nothing downstream ran.</b><ul class='reasons'>{reasons}</ul></div>"
        )
    return "\n".join(out)


def _stage_table(cfg, result: PipelineResult) -> str:
    reached = {ex.name: ex for ex in result.stages}
    headers = [*STAGE_COLUMNS, *(METRIC_LABELS.get(k, k) for k in TABLE_METRICS), "gate"]
    rows, classes = [], []
    for stage in cfg.stages:
        ex = reached.get(stage.name)
        if ex is None:
            rows.append([html.escape(stage.name), stage.kind, "not run", *["-"] * (len(headers) - 3)])
            classes.append("not-run")
            continue
        o, s = ex.outcome, ex.outcome.summary
        gate = (
            "<span class='gate pass'>pass</span>" if ex.gate.passed else "<span class='gate fail'>FAIL</span>"
        )
        rows.append(
            [
                html.escape(ex.name),
                ex.kind,
                "cached" if ex.skipped else "ran",
                html.escape(o.stop_reason),
                str(o.steps),
                f"{o.wall_s:.1f}",
                *(fmt(s.get(k)) for k in TABLE_METRICS),
                gate,
            ]
        )
        classes.append("")
    return table(headers, rows, text_columns=4, row_classes=classes)


def _gates(cfg, result: PipelineResult) -> str:
    esc = html.escape
    out, ungated = [], []
    for ex in result.stages:
        if not cfg.stage(ex.name).gate:
            ungated.append(ex.name)
            continue
        verdict = (
            "<span class='gate pass'>pass</span>" if ex.gate.passed else "<span class='gate fail'>FAIL</span>"
        )
        items = "".join(
            f"<li class='{'fail' if r.startswith('FAIL') else ''}'>{esc(r)}</li>" for r in ex.gate.reasons
        )
        out.append(f"<div><b>gate after {esc(ex.name)}</b> {verdict}<ul class='reasons'>{items}</ul></div>")
    if ungated:
        out.append(f"<p class='muted'>no gate configured after: {esc(', '.join(ungated))}</p>")
    return "\n".join(out) or "<p class='muted'>no stage ran</p>"


def _targets(result: PipelineResult) -> list[str]:
    """The run's targets: both sides' values and the verdict (reported only, they never stop a run)."""
    if not result.targets:
        return []
    esc = html.escape
    rows = [
        [
            esc(target_label(t)),
            fmt(t.left),
            fmt(t.right),
            f"<span class='target {t.status}'>{t.status}</span>"
            + (f" {esc(', '.join(t.missing))}" if t.missing else ""),
        ]
        for t in result.targets
    ]
    return [
        "<h2>Targets</h2>",
        "<p class='muted'>what the run should reach: reported, never stopping it; "
        "missing: a value the run did not produce</p>",
        table(["target", "left", "right", "result"], rows, text_columns=1),
    ]


def _rollbacks(result: PipelineResult) -> list[str]:
    """Every automatic rollback an RL stage made (``extra['rollbacks']``, see
    ``ringzero.stages.rollback``)."""
    esc = html.escape
    rows = []
    for ex in result.stages:
        for e in (ex.outcome.extra or {}).get("rollbacks", []):
            rows.append(
                [
                    esc(ex.name),
                    str(e["step"]),
                    str(e["to_step"]),
                    esc("; ".join(e["reasons"])),
                    esc(e["remedy"]),
                    esc(e.get("detail", "")),
                ]
            )
    if not rows:
        return []
    return [
        "<h2>Rollbacks</h2>",
        "<p class='muted'>steps whose metrics tripped <code>rollback</code>: restored to "
        "the good state after <i>to step</i> steps, remedied and run again</p>",
        table(["stage", "step", "to step", "reasons", "remedy", "detail"], rows, text_columns=6),
    ]


def _curves(result: PipelineResult, colors: dict[str, str]) -> str:
    with_metrics = [ex for ex in result.stages if any(series(ex.metrics, k) for _, k in CURVES)]
    plots = []
    for title, key in CURVES:
        segments = [Segment(ex.name, colors[ex.name], series(ex.metrics, key)) for ex in with_metrics]
        plots.append(line_plot(title, key, segments))
    return (
        legend([(ex.name, colors[ex.name]) for ex in with_metrics])
        + f"<div class='plots'>{''.join(plots)}</div>"
    )


def _comparisons(result: PipelineResult) -> list[str]:
    """Each eval stage's checkpoint comparison (``extra['comparison']``), one column per checkpoint so
    the stages read side by side, one row per metric."""
    out = []
    for ex in result.stages:
        comparison = ex.outcome.extra.get("comparison") if ex.outcome.extra else None
        if not comparison:
            continue
        rows = comparison["rows"]
        body = [
            [html.escape(label), *(fmt(r["values"].get(key)) for r in rows)]
            for key, label in comparison["columns"]
        ]
        out += [
            f"<h2>Checkpoint comparison (<code>{html.escape(ex.name)}</code>)</h2>",
            f"<div class='scroll'>{table(['metric', *(r['checkpoint'] for r in rows)], body)}</div>",
        ]
        out += _difficulty_plots(comparison)
        if comparison.get("notes"):
            out.append(f"<p class='muted'>{html.escape(comparison['notes'])}</p>")
    return out


def _difficulty_plots(comparison: dict) -> list[str]:
    """Length and accuracy against difficulty: one line per checkpoint and tier (untiered solid, each
    tier its own dash), when the eval measured difficulty buckets."""
    spec = comparison.get("difficulty") or {}
    buckets = spec.get("buckets") or []
    if not buckets:
        return []
    rows = comparison["rows"]
    heads = [(None, "eval")] + [(t, f"eval/{t}") for t in spec.get("tiers", [])]
    plots = []
    for measure, title in (
        ("len_mean", "length (tokens) against difficulty"),
        ("accuracy", "accuracy against difficulty"),
    ):
        lines = []
        for n, r in enumerate(rows):
            color = PALETTE[n % len(PALETTE)]
            for tier, head in heads:
                label = r["checkpoint"] if tier is None else f"{r['checkpoint']} [{tier}]"
                values = [r["values"].get(f"{head}/{b}/{measure}") for b in buckets]
                lines.append(Line(label, color, values, dashed=tier is not None))
        plots.append(category_plot(title, f"eval/<tier>/<bucket>/{measure}", buckets, lines))
    return [
        f"<div class='plots'>{''.join(plots)}</div>",
        "<p class='muted'>one colour per checkpoint; solid: the prompt without a tier tag, dashed: asked at "
        "a "
        "tier (hover a line for its name)</p>",
    ]


def _summaries(result: PipelineResult) -> str:
    esc = html.escape
    out = []
    for ex in result.stages:
        s = ex.outcome.summary
        rows = [[esc(k), fmt(v) if plottable(v) or v is None else esc(str(v))] for k, v in sorted(s.items())]
        out.append(
            f"<details><summary><b>{esc(ex.name)}</b> ({esc(ex.kind)}) · identity "
            f"<code>{esc(ex.stage_hash[:16])}</code> · output "
            f"<code>{esc(ex.outcome.output_uri or 'none')}</code>"
            f"</summary>{table(['metric', 'value'], rows)}</details>"
        )
    return "\n".join(out) or "<p class='muted'>no stage ran</p>"
