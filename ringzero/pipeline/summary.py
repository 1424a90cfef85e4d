"""What a finished run shows: a console table of stages and the files written next to the manifest."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from ringzero.pipeline.local import PipelineResult

# The columns of the stage table, in order: the numbers a person compares across stages.
TABLE_METRICS = ["reward/mean", "eval/accuracy", "trace/rate", "len/mean", "ratio/p99", "ratio/max"]


def stage_table(result: PipelineResult) -> Table:
    table = Table(title="stages")
    for col in ["stage", "kind", "status", "stop", "steps", "wall s", *TABLE_METRICS, "gate"]:
        table.add_column(col)
    for ex in result.stages:
        s = ex.outcome.summary
        table.add_row(
            ex.name, ex.kind, "cached" if ex.skipped else "ran", ex.outcome.stop_reason, str(ex.outcome.steps),
            f"{ex.outcome.wall_s:.0f}", *(_fmt(s.get(k)) for k in TABLE_METRICS),
            "pass" if ex.gate.passed else "FAIL",
        )
    return table


def _fmt(v) -> str:
    return "-" if v is None else f"{v:.4g}"


def print_summary(result: PipelineResult) -> None:
    console = Console()
    console.print(stage_table(result))
    if result.failed_gate is not None:
        console.print(f"[bold red]gate failed after stage {result.failed_gate.name!r}; nothing promoted:")
        for reason in result.failed_gate.gate.reasons:
            console.print(f"  {reason}")


def write_outputs(cfg, result: PipelineResult, run_dir: Path) -> None:
    """Hook for the HTML report; the manifest is already written by the runner."""
    Path(run_dir).mkdir(parents=True, exist_ok=True)
