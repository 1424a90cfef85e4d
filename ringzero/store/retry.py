"""Retries with exponential backoff and jitter, for operations that may hit transient faults."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import structlog

log = structlog.get_logger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class Backoff:
    """Wait before retry ``n`` (0-based): half of ``min(max_s, base_s * 2**n)`` plus up to as much again.

    The random half keeps many clients that failed together from retrying in lockstep; the fixed
    half keeps the waits growing, so a restarting server gets time to come back.
    """

    max_retries: int
    base_s: float
    max_s: float

    def delay(self, retry: int, rng: random.Random) -> float:
        ceiling = min(self.max_s, self.base_s * 2**retry)
        return ceiling / 2 + rng.uniform(0, ceiling / 2)


def call_with_retries(
    fn: Callable[[], T],
    *,
    what: str,
    backoff: Backoff,
    is_transient: Callable[[BaseException], bool],
    describe: Callable[[BaseException], str],
    sleep: Callable[[float], None] = time.sleep,
    rng: random.Random | None = None,
) -> T:
    """Run ``fn``; on a transient error wait and run it again, up to ``backoff.max_retries`` times.

    Anything else, and the last transient error, propagates unchanged: the caller turns it into a
    message. ``describe`` renders an error for the log (it must keep secrets out).
    """
    rng = rng or random.Random()
    retry = 0
    while True:
        try:
            return fn()
        except Exception as exc:
            if retry >= backoff.max_retries or not is_transient(exc):
                raise
            wait = backoff.delay(retry, rng)
            retry += 1
            log.warning(
                "store.retry",
                what=what,
                retry=retry,
                max_retries=backoff.max_retries,
                wait_s=round(wait, 3),
                error=describe(exc),
            )
            sleep(wait)
