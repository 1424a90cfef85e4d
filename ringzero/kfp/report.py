"""What a pipeline step shows in the Kubeflow UI: Markdown summaries, and the run report as HTML.

The HTML is the same report ``ringzero run`` writes, rebuilt from the run manifest and the outcomes and
metrics each stage committed to the store, so every step can show the run as far as it has come; the run's
targets are evaluated over those same stages (the final-status step also records them in the manifest).
"""

from __future__ import annotations

import json

from ringzero.errors import RingzeroError
from ringzero.pipeline.execute import ExecutedStage, metrics_key, outcome_key
from ringzero.pipeline.gates import GateResult
from ringzero.pipeline.local import PipelineResult
from ringzero.pipeline.report import render_report
from ringzero.pipeline.table_columns import target_label
from ringzero.pipeline.targets import TargetResult, run_targets
from ringzero.stages.base import StageInputs, StageOutcome


def _fmt(v) -> str:
    return f"{v:.6g}" if isinstance(v, int | float) else str(v)


def stage_markdown(ex: ExecutedStage) -> str:
    o = ex.outcome
    lines = [
        f"## stage `{ex.name}` ({ex.kind}): {'cached' if ex.skipped else 'ran'}",
        "",
        f"stop: {o.stop_reason} · steps: {o.steps} · wall: {o.wall_s:.0f} s · identity: "
        f"`{ex.stage_hash[:16]}`",
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


def targets_markdown(targets: list[TargetResult]) -> str:
    if not targets:
        return ""
    lines = [
        "",
        "### targets (reported, never stopping the run)",
        "",
        "| target | left | right | result |",
        "|---|---|---|---|",
    ]
    for t in targets:
        missing = f" ({', '.join(t.missing)})" if t.missing else ""
        label = target_label(t).replace("|", "\\|")  # a name's bar would end the cell
        lines.append(
            f"| {label} | {_fmt(t.left) if t.left is not None else '-'} | "
            f"{_fmt(t.right) if t.right is not None else '-'} | {t.status}{missing} |"
        )
    return "\n".join(lines) + "\n"


def run_result(cfg, store, manifest: dict) -> PipelineResult:
    """The run as far as ``manifest`` records it: its stages from the store, its targets over them."""
    stages = [_executed(store, entry) for entry in manifest["stages"]]
    failed_gate = next((ex for ex in stages if not ex.gate.passed), None)
    return PipelineResult(manifest["status"], stages, failed_gate, targets=run_targets(cfg, stages))


def run_report_html(cfg, store, manifest: dict, result: PipelineResult | None = None) -> str:
    """The run report over the stages ``manifest`` records so far, with the manifest's status."""
    return render_report(cfg, result or run_result(cfg, store, manifest), manifest)


def _executed(store, entry: dict) -> ExecutedStage:
    h = entry["stage_hash"]
    outcome = store.get_json(outcome_key(h))  # the full outcome: the manifest leaves out eval's comparison
    if outcome is None:
        raise RingzeroError(f"stage {entry['name']!r}: {outcome_key(h)} is missing from the store")
    lines = (store.get_bytes(metrics_key(h)) or b"").decode().splitlines()
    return ExecutedStage(
        entry["name"],
        entry["kind"],
        h,
        StageInputs(**entry["inputs"]),
        StageOutcome(**outcome),
        GateResult(**entry["gate"]),
        entry["skipped"],
        [json.loads(line) for line in lines if line.strip()],
    )
