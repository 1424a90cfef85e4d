"""The one thread that touches the rollout engine, and how it batches concurrent HTTP requests.

Engines are not thread-safe, so every engine call (generate, weight update, health, cache flush) runs
here, in submission order. Batching policy:

* The thread sleeps until a job arrives. A generate job opens a batch; the thread then keeps taking
  generate jobs for at most ``window_s`` or until the batch holds ``max_batch_requests`` prompts, and
  calls ``engine.generate`` once on their concatenation. Jobs that arrive while a batch runs wait in
  the queue and form the next batch, so a busy server batches without waiting for the window.
* A control job (weight update, health, flush) closes the open batch: it runs after the generations
  submitted before it and before those submitted after it, so every completion carries the weights
  it was sampled with.
* A batch that fails is re-run job by job, so one bad request (a prompt longer than the model's
  context, say) fails alone instead of failing the requests it happened to share a batch with.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import structlog

from ringzero.rollout.types import Completion, GenerateRequest

log = structlog.get_logger(__name__)


@dataclass
class _Generate:
    requests: list[GenerateRequest]
    future: Future = field(default_factory=Future)


@dataclass
class _Call:
    fn: Callable[[Any], Any]
    future: Future = field(default_factory=Future)


_STOP = object()


class EngineScheduler:
    """Owns ``engine`` from ``start()`` to ``stop()``; other threads submit work and get futures."""

    def __init__(self, engine, *, window_s: float = 0.005, max_batch_requests: int = 256):
        if window_s < 0 or max_batch_requests < 1:
            raise ValueError("window_s must be >= 0 and max_batch_requests >= 1")
        self.engine = engine
        self.window_s = window_s
        self.max_batch_requests = max_batch_requests
        self.busy = False  # True while the engine works; health probes read it
        self.batch_sizes: list[int] = []  # prompts per engine.generate call, for logs and tests
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="rollout-scheduler", daemon=True)

    # --- called from other threads ---

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join(timeout_s)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def pending(self) -> int:
        """Jobs queued and not yet taken by the thread."""
        return self._queue.qsize()

    def generate(self, requests: list[GenerateRequest]) -> Future:
        """Resolves to ``n`` completions per request, in request order."""
        job = _Generate(list(requests))
        self._queue.put(job)
        return job.future

    def call(self, fn: Callable[[Any], Any]) -> Future:
        """Run ``fn(engine)`` on the scheduler thread, between batches."""
        job = _Call(fn)
        self._queue.put(job)
        return job.future

    # --- the scheduler thread ---

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is _STOP:
                return
            if isinstance(job, _Call):
                self._run_call(job)
                continue
            batch, after = self._collect(job)
            self._run_batch(batch)
            if after is _STOP:
                return
            if after is not None:
                self._run_call(after)

    def _collect(self, first: _Generate) -> tuple[list[_Generate], Any]:
        """``first`` plus the generate jobs that arrive within the window; and the job that closed it."""
        batch, size = [first], len(first.requests)
        deadline = time.monotonic() + self.window_s
        while size < self.max_batch_requests:
            try:
                nxt = self._queue.get(timeout=max(deadline - time.monotonic(), 0.0))
            except queue.Empty:
                return batch, None
            if not isinstance(nxt, _Generate):
                return batch, nxt
            batch.append(nxt)
            size += len(nxt.requests)
        return batch, None

    def _run_call(self, job: _Call) -> None:
        if not job.future.set_running_or_notify_cancel():
            return
        self.busy = True
        try:
            job.future.set_result(job.fn(self.engine))
        except BaseException as exc:  # noqa: BLE001 - the caller's thread re-raises it
            job.future.set_exception(exc)
        finally:
            self.busy = False

    def _generate(self, requests: list[GenerateRequest]) -> list[list[Completion]]:
        groups = self.engine.generate(requests)
        if len(groups) != len(requests):
            raise ValueError(f"engine returned {len(groups)} completion groups for {len(requests)} requests")
        return groups

    def _run_batch(self, batch: list[_Generate]) -> None:
        batch = [job for job in batch if job.future.set_running_or_notify_cancel()]
        if not batch:
            return
        flat = [r for job in batch for r in job.requests]
        self.busy = True
        try:
            self.batch_sizes.append(len(flat))
            groups = self._generate(flat)
        except BaseException as exc:  # noqa: BLE001
            if len(batch) == 1:
                batch[0].future.set_exception(exc)
                return
            log.warning("rollout.batch_failed", jobs=len(batch), error=str(exc), retry="one job at a time")
            for job in batch:
                try:
                    self.batch_sizes.append(len(job.requests))
                    job.future.set_result(self._generate(job.requests))
                except BaseException as job_exc:  # noqa: BLE001
                    job.future.set_exception(job_exc)
            return
        finally:
            self.busy = False
        start = 0
        for job in batch:
            job.future.set_result(groups[start:start + len(job.requests)])
            start += len(job.requests)
