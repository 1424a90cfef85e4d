"""A rich progress bar for transfers when stderr is a terminal; nothing at all otherwise (CI, pods)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager


@contextmanager
def transfer_progress(description: str, total_bytes: int) -> Iterator[Callable[[int], None]]:
    """Yield ``advance(n_bytes)``; draws a transient bar on a TTY, does nothing elsewhere."""
    if not sys.stderr.isatty():
        yield lambda n: None
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=Console(file=sys.stderr), transient=True) as progress:
        task = progress.add_task(description, total=total_bytes)
        yield lambda n: progress.advance(task, n)
