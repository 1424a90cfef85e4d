"""SIGTERM as a preemption notice: the training loop saves a resume point at the next step boundary and
the process exits, within a bounded time.

Kubernetes deletes a pod (eviction, a cancelled pipeline step, a node drain) by sending SIGTERM and, after
``terminationGracePeriodSeconds`` (30 s by default), SIGKILL. Work since the last resume point survives
only if the stage saves before the SIGKILL. ``install(grace_s)`` (called from the CLI's ``main`` path,
never at import) replaces the default handler:

- inside a ``preemptible()`` block (the step loops of pretrain, RL and distill), SIGTERM only raises a
  flag; the loop calls ``due(runtime)`` after each step, which agrees over every rank (one max-reduce of
  one number: every rank of a job must take the same branch, or the save's collectives would hang) and,
  when set, the loop saves a resume point at the step it reached and raises ``Preempted``;
- outside such a block (startup, held-out evaluation, a final save, the eval stage), SIGTERM exits at once
  (``SystemExit``, as before: the stage lease and open files are released on the way out); nothing is
  lost that a rerun would not redo from the last resume point;
- in both cases a watchdog thread ends the process with ``os._exit(143)`` ``grace_s`` seconds after the
  first SIGTERM, whatever it is doing: a rank blocked in a collective with a dead peer (torchrun sends
  SIGTERM to the survivors of a failed job) cannot hold the job. A save cut short by the watchdog leaves
  no visible checkpoint (checkpoints are committed last), so the previous one is what a rerun loads.

A second SIGTERM changes nothing. Exit status 143 (128 + SIGTERM) either way.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time

import structlog
import torch

log = structlog.get_logger(__name__)

EXIT_STATUS = 128 + signal.SIGTERM
DEFAULT_GRACE_S = 25.0  # under Kubernetes' default 30 s between SIGTERM and SIGKILL


class Preempted(SystemExit):
    """Raised by a step loop after it saved a resume point on SIGTERM."""

    def __init__(self, stage: str, step: int):
        super().__init__(EXIT_STATUS)
        self.stage, self.step = stage, step


class _State:
    def __init__(self) -> None:
        self.requested_at: float | None = None
        self.loops = 0
        self.grace_s = DEFAULT_GRACE_S
        self.watchdog: threading.Timer | None = None


_STATE = _State()


def _expire(grace_s: float) -> None:
    log.warning("preemption.watchdog", grace_s=grace_s)
    os._exit(EXIT_STATUS)


def _on_sigterm(signum, frame) -> None:
    first = _STATE.requested_at is None
    if first:
        _STATE.requested_at = time.monotonic()
        _STATE.watchdog = threading.Timer(_STATE.grace_s, _expire, args=(_STATE.grace_s,))
        _STATE.watchdog.daemon = True
        _STATE.watchdog.start()
    if _STATE.loops == 0:
        sys.exit(EXIT_STATUS)
    if first:
        log.warning("preemption.requested", grace_s=_STATE.grace_s)


def install(grace_s: float = DEFAULT_GRACE_S) -> None:
    """Handle SIGTERM as described above (main thread only, as ``signal`` requires)."""
    if grace_s <= 0:
        raise ValueError(f"the SIGTERM grace period must be positive (got {grace_s})")
    _STATE.grace_s = grace_s
    signal.signal(signal.SIGTERM, _on_sigterm)


@contextlib.contextmanager
def installed(grace_s: float = DEFAULT_GRACE_S):
    """``install`` for the duration of a block, the previous handler restored after; nothing (and no
    error) off the main thread, where Python cannot set signal handlers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    install(grace_s)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class preemptible:
    """Context manager marking a step loop that checks ``due`` after every step."""

    def __enter__(self):
        _STATE.loops += 1
        if _STATE.requested_at is not None:  # notice came just before the loop: leave as if outside it
            _STATE.loops -= 1
            sys.exit(EXIT_STATUS)
        return self

    def __exit__(self, *exc) -> None:
        _STATE.loops -= 1


def requested() -> bool:
    return _STATE.requested_at is not None


def due(runtime) -> bool:
    """Whether any rank of the job was asked to stop (every rank returns the same answer)."""
    flag = torch.tensor([1.0 if requested() else 0.0])
    if runtime is not None and runtime.distributed:
        import torch.distributed as dist

        flag = flag.to(runtime.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item() > 0)


def reset() -> None:
    """Forget a notice and stop its watchdog (tests run several loops in one process)."""
    if _STATE.watchdog is not None:
        _STATE.watchdog.cancel()
    _STATE.requested_at, _STATE.loops, _STATE.watchdog = None, 0, None
