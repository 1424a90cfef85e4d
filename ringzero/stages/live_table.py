"""A live console table of a stage's key metrics, printed every few steps to stderr (rich).

On a terminal it redraws the last rows; elsewhere (logs, CI) it prints the same table as plain text.
"""

from __future__ import annotations

import math
import sys
from collections import deque

COLUMNS = (
    ("reward/mean", "reward", "{:.3f}"),
    ("trace/rate", "trace", "{:.2f}"),
    ("len/mean", "len", "{:.0f}"),
    ("len/trunc_rate", "trunc", "{:.2f}"),
    ("gap/ratio/p99", "gap p99", "{:.2e}"),
    ("ratio/p99", "|r-1| p99", "{:.2e}"),
    ("ratio/max", "|r-1| max", "{:.2e}"),
    ("correction/token_masked_frac", "masked", "{:.3f}"),
    ("rollback/count", "rollbacks", "{:.0f}"),
    ("grad/coverage", "cover", "{:.2f}"),
    ("entropy/mean", "entropy", "{:.2f}"),
    ("kl/mean", "kl", "{:.1e}"),
    ("loss/skipped", "skip", "{:.0f}"),
    ("time/step", "s/step", "{:.1f}"),
)


class LiveTable:
    def __init__(self, title: str, every: int = 5, rows: int = 10):
        self.title, self.every = title, every
        self.rows: deque[tuple[int, dict]] = deque(maxlen=rows)

    def add(self, step: int, metrics: dict) -> None:
        self.rows.append((step, metrics))
        if (step + 1) % self.every == 0:
            self.show()

    def show(self) -> None:
        from rich.console import Console
        from rich.table import Table

        table = Table(title=self.title, title_justify="left")
        table.add_column("step", justify="right")
        for _, header, _ in COLUMNS:
            table.add_column(header, justify="right")
        for step, m in self.rows:
            table.add_row(str(step + 1), *(_cell(m.get(key), fmt) for key, _, fmt in COLUMNS))
        Console(file=sys.stderr, width=160).print(table)


def _cell(value, fmt: str) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return fmt.format(value)
