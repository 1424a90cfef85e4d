"""What a finished run shows: console tables of stages and targets, and the files written next to the
manifest."""

from __future__ import annotations

import sys
from pathlib import Path

import structlog
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ringzero.pipeline.local import PipelineResult
from ringzero.pipeline.report import write_report
from ringzero.pipeline.table_columns import METRIC_LABELS, STAGE_COLUMNS, TABLE_METRICS, fmt, target_label

log = structlog.get_logger(__name__)

CONSOLE_WIDTH_PIPED = 200
"""Rich assumes 80 columns when stdout is not a terminal, which folds the stage table into ellipses."""


def stage_table(result: PipelineResult) -> Table:
    table = Table(title="stages")
    for col in [*STAGE_COLUMNS, *(METRIC_LABELS.get(k, k) for k in TABLE_METRICS), "gate"]:
        table.add_column(col)
    for ex in result.stages:
        s = ex.outcome.summary
        table.add_row(
            ex.name,
            ex.kind,
            "cached" if ex.skipped else "ran",
            ex.outcome.stop_reason,
            str(ex.outcome.steps),
            f"{ex.outcome.wall_s:.0f}",
            *(fmt(s.get(k)) for k in TABLE_METRICS),
            "pass" if ex.gate.passed else "FAIL",
        )
    return table


def comparison_tables(result: PipelineResult) -> list[Table]:
    """Each eval stage's checkpoint comparison (``extra['comparison']``): a column per checkpoint, a row
    per metric, as the report shows it (a dozen metrics fit a terminal's height better than its width)."""
    tables = []
    for ex in result.stages:
        comparison = (ex.outcome.extra or {}).get("comparison")
        if not comparison:
            continue
        table = Table(title=f"checkpoints compared by {ex.name}")
        table.add_column("metric")
        for row in comparison["rows"]:
            table.add_column(row["checkpoint"], justify="right")
        for key, label in comparison["columns"]:
            table.add_row(label, *(fmt(row["values"].get(key)) for row in comparison["rows"]))
        tables.append(table)
    return tables


TARGET_STYLES = {"met": "green", "missed": "bold red", "missing": "yellow"}


def targets_table(result: PipelineResult) -> Table | None:
    """Each target with both sides' values (scale and offset applied) and its verdict; None without
    targets."""
    if not result.targets:
        return None
    counts = {s: sum(t.status == s for t in result.targets) for s in TARGET_STYLES}
    table = Table(title="targets (" + ", ".join(f"{n} {s}" for s, n in counts.items()) + ")")
    for col in ("target", "left", "right", "result"):
        table.add_column(col)
    for t in result.targets:
        verdict = t.status + (f" ({', '.join(t.missing)})" if t.missing else "")
        table.add_row(
            escape(target_label(t)),
            fmt(t.left),
            fmt(t.right),
            f"[{TARGET_STYLES[t.status]}]{escape(verdict)}",
        )
    return table


def print_summary(result: PipelineResult) -> None:
    console = Console(width=None if sys.stdout.isatty() else CONSOLE_WIDTH_PIPED)
    console.print(stage_table(result))
    for table in comparison_tables(result):
        console.print(table)
    if (targets := targets_table(result)) is not None:
        console.print(targets)
    if result.failed_gate is not None:
        console.print(f"[bold red]gate failed after stage {result.failed_gate.name!r}; nothing promoted:")
        for reason in result.failed_gate.gate.reasons:
            console.print(f"  {reason}")


def write_outputs(cfg, result: PipelineResult, run_dir: Path) -> Path:
    """Write ``<run_dir>/report.html`` (the manifest is already written by the runner); returns its path."""
    path = write_report(cfg, result, Path(run_dir))
    log.info("report.written", path=str(path))
    return path
