"""The scheduler thread's loop under continuous batching (``ringzero.rollout.server.scheduler``: the policy).

Per turn: take every job queued so far, up to the first one that must run alone (a control call, a stop,
a generate job the running batch cannot take); admit waiting generate jobs while the batch has room;
pass new aborts on; run one decoding step; answer the jobs whose rows all ended. A job that must run alone
waits until the batch has drained, so it keeps its place among the jobs around it.
"""

from __future__ import annotations

import queue
import time
from collections import deque

import structlog

from ringzero.rollout.server.jobs import STOP, CallJob, GenerateJob

log = structlog.get_logger(__name__)

THROUGHPUT_WINDOW_S = 1.0  # how often ``last_gen_throughput`` is refreshed while the batch decodes


class ContinuousLoop:
    def __init__(self, scheduler):
        self.s = scheduler
        self.engine = scheduler.engine
        self.batch = self.engine.open_batch()
        self.waiting: deque[GenerateJob] = deque()  # taken from the queue, not admitted yet (no room)
        self.running: dict[int, GenerateJob] = {}  # batch job id -> job
        self.applied: dict[int, set[int]] = {}  # batch job id -> aborts passed to the batch
        self.abort_version = None
        self._tokens, self._since = 0, time.perf_counter()

    def run(self) -> None:
        while True:
            alone = self._take(block=not (self.running or self.waiting))
            self._admit()
            if alone is None:
                self._step()
                continue
            while self.running or self.waiting:
                self._admit()
                self._step()
            if alone is STOP:
                return
            if isinstance(alone, CallJob):
                self.s._run_call(alone)
            else:
                self.s._run_batch([alone])

    def _takes(self, job) -> bool:
        return (
            isinstance(job, GenerateJob)
            and self.engine.continuous_ok(job.requests)
            and self.batch.rows_of(job.requests) <= self.engine.max_batch
        )

    def _take(self, block: bool):
        """Move queued generate jobs to ``waiting``; the first job that must run alone, if one came."""
        while True:
            try:
                job = self.s._queue.get(block=block)
            except queue.Empty:
                return None
            if not self._takes(job):
                return job
            self.waiting.append(job)
            block = False

    def _admit(self) -> None:
        """Admit waiting jobs in arrival order while rows are free: one prefill for all of them."""
        jobs, room = [], self.engine.max_batch - self.batch.live
        while self.waiting and self.batch.rows_of(self.waiting[0].requests) <= room:
            job = self.waiting.popleft()
            if self.s._start([job]):  # not aborted or cancelled while it waited
                jobs.append(job)
                room -= self.batch.rows_of(job.requests)
        if jobs:
            try:
                ids = self.batch.admit_all([job.requests for job in jobs])
            except Exception as exc:  # noqa: BLE001 - the shared prefill failed: the batch's state is unknown
                self._fail(jobs + list(self.running.values()), exc)
                return
            for job, job_id in zip(jobs, ids, strict=True):
                if isinstance(job_id, Exception):  # a bad request fails alone; the batch is untouched
                    self.s._answer(job, exc=job_id)
                else:
                    self.running[job_id], self.applied[job_id] = job, set()
            self.s.batch_sizes.append(sum(len(job.requests) for job in jobs))
        self._pass_aborts()
        self._answer_finished()

    def _pass_aborts(self) -> None:
        if self.abort_version == self.s.abort_calls:  # an int read: no lock until something changed
            return
        with self.s._lock:
            self.abort_version = self.s.abort_calls
            fresh = {job_id: job.aborted - self.applied[job_id] for job_id, job in self.running.items()}
        for job_id, new in fresh.items():
            if new:
                self.batch.abort(job_id, new)
                self.applied[job_id] |= new

    def _step(self) -> None:
        self.s.busy = bool(self.running)
        if not self.running:
            return
        try:
            self._tokens += self.batch.live
            self.batch.step()
        except Exception as exc:  # noqa: BLE001 - the batch's state is unknown: fail its jobs, start afresh
            self._fail(list(self.running.values()), exc)
            return
        self._answer_finished()
        now = time.perf_counter()
        if now - self._since >= THROUGHPUT_WINDOW_S:
            self.s.last_gen_throughput = self._tokens / (now - self._since)
            self._tokens, self._since = 0, now
        self.s.busy = bool(self.running)

    def _fail(self, jobs: list[GenerateJob], exc: Exception) -> None:
        log.warning("rollout.continuous_batch_failed", jobs=len(jobs), error=str(exc))
        for job in jobs:
            self.s._answer(job, exc=exc)
        self.running.clear()
        self.applied.clear()
        self.batch = self.engine.open_batch()

    def _answer_finished(self) -> None:
        for job_id, groups in self.batch.finished():
            del self.applied[job_id]
            self.s._answer(self.running.pop(job_id), groups)
