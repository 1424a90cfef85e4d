"""What the console stage table and report.html both show: the metric columns, their labels, the number
format and a target's label. A leaf module, so the console summary and the report import it, not each
other."""

from __future__ import annotations

import math

# The metric columns of the stage table, in order: the numbers a person compares across stages. The engine
# gap (gap/*: the first minibatch, which the shipped gates read) next to the whole batch's tail (ratio/*:
# staleness too).
TABLE_METRICS = [
    "reward/mean",
    "eval/accuracy",
    "eval/pass@k",
    "trace/rate",
    "len/mean",
    "gap/ratio/p99",
    "gap/ratio/max",
    "ratio/p99",
    "ratio/p99_median",
    "ratio/max",
]
STAGE_COLUMNS = ["stage", "kind", "status", "stop", "steps", "wall s"]
METRIC_LABELS = {
    "reward/mean": "reward",
    "eval/accuracy": "accuracy",
    "eval/pass@k": "pass@k",
    "trace/rate": "trace rate",
    "len/mean": "length",
    "gap/ratio/p99": "gap p99",
    "gap/ratio/max": "gap max",
    "ratio/p99": "ratio p99",
    "ratio/p99_median": "ratio p99 median",
    "ratio/max": "ratio max",
}


def fmt(v) -> str:
    if v is None or isinstance(v, bool) or not isinstance(v, int | float):
        return "-"
    if not math.isfinite(v) or abs(v) >= 1e300:  # the metric writer stores inf as 1e308
        return "inf" if v > 0 else ("-inf" if v < 0 else "nan")
    return f"{v:.4g}"


def target_label(t) -> str:
    """A target's name, with its expression when it was named."""
    return t.expr if t.name == t.expr else f"{t.name}: {t.expr}"
