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

Continuous batching (``continuous=True``, the default for an engine with ``open_batch`` that is not
batch-invariant): generate jobs join the engine's running batch between decoding steps, as many rows as
``engine.max_batch`` leaves room for, in arrival order; each job is answered as soon as its last row ends.
A control job still keeps its place: the jobs before it are admitted and decoded to the end, then it runs.
A job the batch cannot take (``engine.continuous_ok`` says no, or more rows than ``max_batch``) runs through
``engine.generate`` in the same way, as a batch of its own. ``continuous=False`` keeps the static batches.

Aborts (``abort``): a request is aborted by its rid, or all at once, among the jobs submitted and not yet
answered. A job whose every request is aborted before it reaches the engine is answered at once, each
request with ``n`` empty completions that finish ``abort`` ("Abort before prefill", SGLang's words).
Otherwise the engine hears of it while it runs: ``engine.generate(requests, abort=check)`` when the
engine takes ``abort`` (the embedded engine does), and the aborted rows stop within one decoding step.
An engine without it finishes its batch, and the aborted requests come back complete.
"""

from __future__ import annotations

import contextlib
import inspect
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from typing import Any

import structlog

from ringzero.rollout.server.continuous import ContinuousLoop
from ringzero.rollout.server.jobs import STOP, CallJob, GenerateJob
from ringzero.rollout.types import Completion, GenerateRequest

log = structlog.get_logger(__name__)


class EngineScheduler:
    """Owns ``engine`` from ``start()`` to ``stop()``; other threads submit work and get futures."""

    def __init__(
        self, engine, *, window_s: float = 0.005, max_batch_requests: int = 256, continuous: bool = True
    ):
        if window_s < 0 or max_batch_requests < 1:
            raise ValueError("window_s must be >= 0 and max_batch_requests >= 1")
        self.engine = engine
        self.continuous = (
            continuous and hasattr(engine, "open_batch") and not getattr(engine, "deterministic", False)
        )
        self.window_s = window_s
        self.max_batch_requests = max_batch_requests
        self.busy = False  # True while the engine works; health probes read it
        self.batch_sizes: list[int] = []  # prompts per engine.generate call, for logs and tests
        self.last_gen_throughput = 0.0  # output tokens per second of the last batch
        self.abort_calls = 0  # aborts asked for so far; the engine's abort check re-reads on a change
        self.takes_abort = "abort" in inspect.signature(engine.generate).parameters
        self._queue: queue.Queue = queue.Queue()
        self._lock = threading.Lock()  # guards _live, each job's aborted/started and abort_calls
        self._live: list[GenerateJob] = []  # generate jobs submitted and not answered yet
        self._thread = threading.Thread(target=self._run, name="rollout-scheduler", daemon=True)
        self._here = False  # run_here: the loop runs on the caller's thread

    # --- called from other threads ---

    def start(self) -> None:
        self._thread.start()

    def run_here(self) -> None:
        """Run the loop on the calling thread until ``stop()`` (or an exception, KeyboardInterrupt among
        them). ``ringzero serve`` runs it on the process's main thread, so that the thread which loaded the
        model is the only one with an OpenMP team: a second team on another thread makes OpenMP throttle
        its spin-waits once its threads outnumber the cores, and every parallel op then pays a futex
        wake-up (half the decode speed at 2 threads on 2 cores, ``bench/serve_throughput.py``)."""
        self._here = True
        try:
            self._run()
        finally:
            self._here = False

    def stop(self, timeout_s: float = 30.0) -> None:
        if self._here:
            self._queue.put(STOP)
        elif self._thread.is_alive():
            self._queue.put(STOP)
            self._thread.join(timeout_s)

    @property
    def alive(self) -> bool:
        return self._here or self._thread.is_alive()

    def pending(self) -> int:
        """Jobs queued and not yet taken by the thread."""
        return self._queue.qsize()

    def generate(self, requests: list[GenerateRequest]) -> Future:
        """Resolves to ``n`` completions per request, in request order."""
        job = GenerateJob(list(requests))
        with self._lock:
            self._live.append(job)
        self._queue.put(job)
        return job.future

    def live_requests(self) -> tuple[int, int]:
        """``(waiting, running)``: requests submitted and not answered, queued or in the running batch."""
        with self._lock:
            waiting = sum(len(job.requests) for job in self._live if not job.started)
            return waiting, sum(len(job.requests) for job in self._live) - waiting

    def abort(self, rid: str | None = None, *, abort_all: bool = False, message: str | None = None) -> int:
        """Abort the unanswered requests with rid ``rid`` (or all of them); returns how many it hit.

        ``message`` replaces the engine's in the aborted completions' finish reason.
        """
        answered = []
        hits = 0
        with self._lock:
            for job in list(self._live):
                new = {
                    i for i, r in enumerate(job.requests) if abort_all or (rid is not None and r.rid == rid)
                } - job.aborted
                if not new:
                    continue
                job.aborted |= new
                if message:
                    job.messages.update(dict.fromkeys(new, message))
                hits += len(new)
                if not job.started and len(job.aborted) == len(job.requests):
                    self._live.remove(job)
                    answered.append(job)
            self.abort_calls += 1
        for job in answered:  # outside the lock: a future's callbacks may call back into the scheduler
            groups = [self._aborted_group(r, job.messages.get(i)) for i, r in enumerate(job.requests)]
            with contextlib.suppress(InvalidStateError):  # its caller gave up (cancelled) meanwhile
                job.future.set_result(groups)
        return hits

    def _aborted_group(self, req: GenerateRequest, message: str | None) -> list[Completion]:
        version = str(getattr(self.engine, "weight_version", "0"))
        meta = {"rid": req.rid} if req.rid is not None else {}
        return [
            Completion(
                list(req.input_ids),
                [],
                [],
                "abort",
                None,
                version,
                {**meta, "message": message or "Abort before prefill"},
            )
            for _ in range(req.params.n)
        ]

    def call(self, fn: Callable[[Any], Any]) -> Future:
        """Run ``fn(engine)`` on the scheduler thread, between batches."""
        job = CallJob(fn)
        self._queue.put(job)
        return job.future

    # --- the scheduler thread ---

    def _run(self) -> None:
        if self.continuous:
            ContinuousLoop(self).run()
            return
        while True:
            job = self._queue.get()
            if job is STOP:
                return
            if isinstance(job, CallJob):
                self._run_call(job)
                continue
            batch, after = self._collect(job)
            self._run_batch(batch)
            if after is STOP:
                return
            if after is not None:
                self._run_call(after)

    def _collect(self, first: GenerateJob) -> tuple[list[GenerateJob], Any]:
        """``first`` plus the generate jobs that arrive within the window; and the job that closed it."""
        batch, size = [first], len(first.requests)
        deadline = time.monotonic() + self.window_s
        while size < self.max_batch_requests:
            try:
                nxt = self._queue.get(timeout=max(deadline - time.monotonic(), 0.0))
            except queue.Empty:
                return batch, None
            if not isinstance(nxt, GenerateJob):
                return batch, nxt
            batch.append(nxt)
            size += len(nxt.requests)
        return batch, None

    def _run_call(self, job: CallJob) -> None:
        if not job.future.set_running_or_notify_cancel():
            return
        self.busy = True
        try:
            result = job.fn(self.engine)
        except BaseException as exc:  # noqa: BLE001 - the caller's thread re-raises it
            self.busy = False
            job.future.set_exception(exc)
        else:
            # idle again before the caller hears back: a health probe it sends next must not find the
            # engine "busy" with the call it was just answered
            self.busy = False
            job.future.set_result(result)

    def _abort_check(self, batch: list[GenerateJob]):
        """The engine's view of the aborts among ``batch``: indices into its concatenated requests."""
        seen = {"version": None, "value": frozenset()}

        def check() -> frozenset[int]:
            if seen["version"] != self.abort_calls:  # an int read: no lock until something changed
                with self._lock:
                    seen["version"] = self.abort_calls
                    offsets = [0]
                    for job in batch:
                        offsets.append(offsets[-1] + len(job.requests))
                    seen["value"] = frozenset(
                        off + i for job, off in zip(batch, offsets, strict=False) for i in job.aborted
                    )
            return seen["value"]

        return check

    def _generate(self, batch: list[GenerateJob]) -> list[list[Completion]]:
        requests = [r for job in batch for r in job.requests]
        self.batch_sizes.append(len(requests))
        start = time.perf_counter()
        if self.takes_abort:
            groups = self.engine.generate(requests, abort=self._abort_check(batch))
        else:
            groups = self.engine.generate(requests)
        if len(groups) != len(requests):
            raise ValueError(f"engine returned {len(groups)} completion groups for {len(requests)} requests")
        tokens = sum(len(c.output_ids) for group in groups for c in group)
        self.last_gen_throughput = tokens / max(time.perf_counter() - start, 1e-9)
        return groups

    def _answer(self, job: GenerateJob, result=None, exc: BaseException | None = None) -> None:
        with self._lock:
            if job in self._live:
                self._live.remove(job)
        for i, text in job.messages.items() if exc is None else ():
            for c in result[i]:
                if c.finish_reason == "abort":
                    c.meta["message"] = text
        if exc is not None:
            job.future.set_exception(exc)
        else:
            job.future.set_result(result)

    def _start(self, batch: list[GenerateJob]) -> list[GenerateJob]:
        """The jobs of ``batch`` still to run (not answered by an abort, not cancelled), marked started."""
        with self._lock:
            batch = [job for job in batch if job in self._live]  # an abort answers a job by taking it out
            running = [job for job in batch if job.future.set_running_or_notify_cancel()]
            for job in batch:
                if job in running:
                    job.started = True
                else:  # cancelled by its caller while queued
                    self._live.remove(job)
        return running

    def _run_batch(self, batch: list[GenerateJob]) -> None:
        batch = self._start(batch)
        if not batch:
            return
        self.busy = True
        try:
            groups = self._generate(batch)
        except BaseException as exc:  # noqa: BLE001
            if len(batch) == 1:
                self._answer(batch[0], exc=exc)
                return
            log.warning("rollout.batch_failed", jobs=len(batch), error=str(exc), retry="one job at a time")
            for job in batch:
                try:
                    self._answer(job, self._generate([job]))
                except BaseException as job_exc:  # noqa: BLE001
                    self._answer(job, exc=job_exc)
            return
        finally:
            self.busy = False
        start = 0
        for job in batch:
            self._answer(job, groups[start : start + len(job.requests)])
            start += len(job.requests)
