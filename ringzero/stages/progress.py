"""Console feedback for long stages: a rich progress bar on a terminal, nothing when output is captured
(CI, pods, tests), where the metrics JSONL and the structured log already say everything."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager


@contextmanager
def step_progress(description: str, total: int, done: int = 0) -> Iterator[Callable[[str], None]]:
    """Yield ``advance(status_text)``; one call per finished step."""
    if not sys.stderr.isatty():
        yield lambda status: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
               TextColumn("{task.fields[status]}"))
    with Progress(*columns, console=Console(file=sys.stderr), transient=True) as progress:
        task = progress.add_task(description, total=total, completed=done, status="")
        yield lambda status: progress.update(task, advance=1, status=status)
