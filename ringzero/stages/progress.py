"""Console feedback for long stages, so that no run is silent for long.

On a terminal: a transient rich progress bar. Elsewhere (CI, ``kubectl logs``, a pipeline UI's log
pane) a bar is invisible, so a ``progress`` log record says the same: ``stage``, ``phase``, ``step`` /
``total``, the stage's main metric under its own name (``loss=``, ``reward=``), ``tokens_per_s``,
``eta_s`` and ``elapsed_s``. A heartbeat thread writes it at least every ``HEARTBEAT_S`` seconds, so
phases whose step counter does not move (sampling a training set, a held-out measurement) speak too.
"""

from __future__ import annotations

import contextvars
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import structlog

log = structlog.get_logger(__name__)

HEARTBEAT_S = 30.0
"""Longest silence of a captured run: one ``progress`` record at least this often, steps or not."""

_now = time.monotonic  # the clock of rates and ETAs


class Advance:
    """What a stage block holds: ``advance(value, tokens=...)`` once per finished step, with the step's
    main metric and the tokens it processed; ``advance.phase = name`` when a new phase begins."""

    def __init__(
        self,
        stage: str,
        total: int | None,
        done: int,
        metric: str,
        phase: str,
        on_change: Callable[[], None] = lambda: None,
    ):
        self.stage, self.total, self.metric = stage, total, metric
        self.step = self.first = done
        self.tokens, self.value = 0, None
        self.started = _now()
        self._phase, self._on_change = phase, on_change
        self._lock = threading.Lock()  # the heartbeat reads while the stage writes

    def __call__(self, value: float | None = None, tokens: int = 0) -> None:
        with self._lock:
            self.step += 1
            self.tokens += int(tokens)
            if value is not None:
                self.value = float(value)
        self._on_change()

    @property
    def phase(self) -> str:
        return self._phase

    @phase.setter
    def phase(self, name: str) -> None:
        self._phase = name
        self._on_change()

    def fields(self) -> dict:
        """The latest known status as log fields. Rates and the ETA count this block's steps only (a
        resumed stage's earlier steps took no time here); a field is absent while unknown."""
        with self._lock:
            elapsed = _now() - self.started
            fields = {"stage": self.stage, "phase": self._phase, "elapsed_s": round(elapsed, 1)}
            if self.total is not None:
                fields.update(step=self.step, total=self.total)
            if self.value is not None:
                fields[self.metric] = round(self.value, 4)
            if self.tokens and elapsed > 0:
                fields["tokens_per_s"] = round(self.tokens / elapsed, 1)
            if self.total is not None and self.step > self.first:
                fields["eta_s"] = round((self.total - self.step) * elapsed / (self.step - self.first))
        return fields


@contextmanager
def step_progress(
    stage: str, total: int | None = None, done: int = 0, *, metric: str = "loss", phase: str = "train"
) -> Iterator[Advance]:
    """Yield an ``Advance`` for a block of ``total`` steps of which ``done`` are already done; without
    ``total``, a phase with no step counter (it reports its phase and elapsed time)."""
    if sys.stderr.isatty():
        with _bar(stage, total, done, metric, phase) as advance:
            yield advance
        return
    advance = Advance(stage, total, done, metric, phase)
    stopped = threading.Event()
    # The thread runs in a copy of this context, so its records carry the bound fields (the rank).
    beat = threading.Thread(
        target=contextvars.copy_context().run,
        args=(_heartbeat, advance, stopped),
        name=f"progress {stage}",
        daemon=True,
    )
    beat.start()
    try:
        yield advance
    finally:
        stopped.set()
        beat.join()
    log.info("progress", **advance.fields())  # the block's last status: how long it took


def _heartbeat(advance: Advance, stopped: threading.Event) -> None:
    while not stopped.wait(HEARTBEAT_S):
        log.info("progress", **advance.fields())


@contextmanager
def _bar(stage: str, total: int | None, done: int, metric: str, phase: str) -> Iterator[Advance]:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[status]}"),
    )
    with Progress(*columns, console=Console(file=sys.stderr), transient=True) as progress:
        task = progress.add_task(f"{stage} {phase}", total=total, completed=done, status="")

        def redraw() -> None:
            status = advance.fields()
            shown = [f"{metric} {status[metric]:.3f}"] if metric in status else []
            shown += [f"{status['tokens_per_s']:.0f} tok/s"] if "tokens_per_s" in status else []
            progress.update(
                task, completed=advance.step, description=f"{stage} {advance.phase}", status="  ".join(shown)
            )

        advance = Advance(stage, total, done, metric, phase, on_change=redraw)
        yield advance
