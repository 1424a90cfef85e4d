"""Continuous batching on the embedded engine: requests join and leave a batch between decoding steps.

``EmbeddedEngine.generate`` decodes a group in lock step until its longest row ends; requests that arrive
meanwhile wait. A ``ContinuousBatch`` instead keeps one decoding cache whose rows are *slots*:

* ``admit(requests)`` prefills the newcomers' prompts in a cache of their own (each distinct prompt once,
  fanned out to its ``n`` samples, as ``generate`` does) and writes it into free slots, right-aligned to the
  batch's last column (``DecodeCache.put``): MLA latents and positions of those slots only, Lightning
  states of those rows only. A longer prompt adds masked columns at the front for every row;
* ``step()`` samples one token per live row, lets finished rows leave, and feeds the tokens of all slots
  through one forward (free slots decode padding nobody reads: cheaper than rewriting the cache);
* a finished row's slot goes on a free list for the next newcomer. Only when live rows fill less than
  ``compact_below`` of the slots is the cache rewritten down to them (``bench/serve_concurrency.py``
  compares thresholds). Leading columns that no live row can see are dropped by moving the cache's
  start, without a copy.

A row's tokens do not depend on its neighbours: its draws come from its own generator, in its own order
(``UniformStream`` keeps each row's place), its sampling branch is chosen per row, and its attention
masks every column it does not own. Seeded and greedy requests give the tokens they give alone; log-probs
agree to rounding, as between static groups of different sizes. Batch-invariant (``deterministic``)
engines, per-step top-k alternatives and routed experts stay on ``generate`` (see
``EmbeddedEngine.continuous_ok``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ringzero.rollout.engine.logprob_extras import prompt_logprobs
from ringzero.rollout.engine.outcomes import ABORTED, Done, completions, cut
from ringzero.rollout.engine.rows import Finished, RowSpec
from ringzero.rollout.engine.sampling import sample_next
from ringzero.rollout.engine.slot_rows import SlotRows
from ringzero.rollout.engine.stopping import LENGTH
from ringzero.rollout.types import Completion, GenerateRequest


@dataclass
class _Job:
    requests: list[GenerateRequest]
    rows: list[RowSpec]
    done: list[Done | None]
    prompts: dict
    left: int = 0
    capped: set[int] = field(default_factory=set)  # rows cut by an abort


class ContinuousBatch:
    """One engine's running batch; not thread-safe (the server's scheduler thread owns it)."""

    def __init__(self, engine, compact_below: float):
        self.engine = engine
        self.compact_below = compact_below
        self.cache = None
        self.rows = SlotRows(engine.tokenizer, engine.device)
        self.free: list[int] = []  # slots of finished rows, reused before the cache grows
        self.compactions = 0  # times the cache was rewritten down to its live rows
        self._jobs: dict[int, _Job] = {}
        self._where: dict[int, tuple[int, int]] = {}  # live row key -> (job id, row index in the job)
        self._prompt_len: dict[int, int] = {}  # live row key -> prompt tokens
        self._next_key = 0
        self._next_job = 0
        self._ready: list[tuple[int, list[list[Completion]]]] = []
        self._logits_LV: torch.Tensor | None = None
        self._slots_L: torch.Tensor | None = None  # device copy of rows.slots, rebuilt when it changes
        self._tokens_S: torch.Tensor | None = None

    @property
    def live(self) -> int:
        """Rows decoding now."""
        return self.rows.live

    @property
    def slots(self) -> int:
        return 0 if self.cache is None else self.cache.batch_size

    def rows_of(self, requests: Sequence[GenerateRequest]) -> int:
        """Rows ``requests`` would take (prompt-only requests take none)."""
        return sum(r.params.n for r in requests if r.params.max_new_tokens > 0)

    def admit(self, requests: Sequence[GenerateRequest]) -> int:
        """Prefill ``requests`` and add their rows; a job id, answered by ``finished()`` once every row ended.

        Bad requests raise here (``RingzeroError``), before any work and without touching the batch.
        """
        (job_id,) = self.admit_all([requests])
        if isinstance(job_id, Exception):
            raise job_id
        return job_id

    def admit_all(self, jobs: Sequence[Sequence[GenerateRequest]]) -> list[int | Exception]:
        """``admit`` each job, with one prefill for all of them; a refused job gets its exception instead."""
        ids: list[int | Exception] = []
        joining: list[tuple[int, int]] = []  # (job id, row index in the job) of every row to decode
        with torch.inference_mode():
            for requests in jobs:
                try:
                    job_id = self._new_job(list(requests))
                except Exception as exc:  # noqa: BLE001 - the caller answers that job with it
                    ids.append(exc)
                    continue
                ids.append(job_id)
                joining += [(job_id, j) for j, d in enumerate(self._jobs[job_id].done) if d is None]
            if joining:
                self._join(joining)
        for job_id in ids:
            if not isinstance(job_id, Exception):
                self._settle(job_id)
        return ids

    def _new_job(self, requests: list[GenerateRequest]) -> int:
        rows = self.engine._rows(requests)
        wanted = [i for i, r in enumerate(requests) if r.logprobs.prompt_from is not None]
        scored = prompt_logprobs(
            self.engine.model, requests, wanted, deterministic=False, pad_id=self.engine.pad_id
        )
        job = _Job(
            requests,
            rows,
            [None if r.max_new > 0 else Done(Finished([], [], LENGTH, None)) for r in rows],
            scored,
        )
        job.left = sum(d is None for d in job.done)
        job_id, self._next_job = self._next_job, self._next_job + 1
        self._jobs[job_id] = job
        return job_id

    def run(self, requests: Sequence[GenerateRequest]) -> list[list[Completion]]:
        """``admit`` one job and decode until it is answered; other jobs answered meanwhile stay in
        ``finished``."""
        job_id = self.admit(requests)
        while True:
            mine = [groups for done_id, groups in self._ready if done_id == job_id]
            if mine:
                self._ready = [(done_id, groups) for done_id, groups in self._ready if done_id != job_id]
                return mine[0]
            self.step()

    def abort(self, job_id: int, requests: set[int]) -> None:
        """Rows of these requests of job ``job_id`` end with the next step's token (``abort``)."""
        for b, key in enumerate(self.rows.alive):
            where = self._where[key]
            if where[0] == job_id and self._jobs[job_id].rows[where[1]].request in requests:
                self.rows.cap(key, self.rows.steps_of(b) + 1)
                self._jobs[job_id].capped.add(where[1])

    def finished(self) -> list[tuple[int, list[list[Completion]]]]:
        """Jobs answered since the last call: ``(job id, n completions per request)``."""
        ready, self._ready = self._ready, []
        return ready

    def step(self) -> None:
        """One token for every live row; finished rows leave; the rest are fed to the model."""
        if not self.live:
            return
        with torch.inference_mode():
            tokens_L, logp_L = sample_next(self._logits_LV, self.rows.settings, self.rows.uniforms.next())
            slot_of = dict(zip(self.rows.alive, self.rows.slots, strict=True))
            ended, keep = self.rows.advance(tokens_L, logp_L)
            if ended:
                tokens_L = self._leave(ended, keep, slot_of, tokens_L)
            if self.live:
                self._forward(tokens_L)
        for job_id in {self._where_job(k) for k in ended}:
            self._settle(job_id)
        for key in ended:
            del self._where[key], self._prompt_len[key]

    # -- internals -----------------------------------------------------------------------------

    def _where_job(self, key: int) -> int:
        return self._where[key][0]

    def _join(self, joining: list[tuple[int, int]]) -> None:
        specs = [self._jobs[job_id].rows[j] for job_id, j in joining]
        # Each distinct prompt is prefilled once and fanned out to its samples (keyed by job and request).
        prompt_of = {(job_id, s.request): s.prompt for (job_id, _), s in zip(joining, specs, strict=True)}
        prompt_index = {key: i for i, key in enumerate(prompt_of)}
        prompts = list(prompt_of.values())
        logits_PV, fresh = self.engine._prefill(prompts, max(len(p) for p in prompts))
        fan_out = torch.tensor(
            [prompt_index[job_id, s.request] for (job_id, _), s in zip(joining, specs, strict=True)],
            dtype=torch.long,
            device=self.engine.device,
        )
        fresh.select(fan_out, check=False)  # built from the prompts just prefilled: in range
        slots = self._place(fresh)
        keys = list(range(self._next_key, self._next_key + len(specs)))
        self._next_key += len(specs)
        for key, where, s in zip(keys, joining, specs, strict=True):
            self._where[key], self._prompt_len[key] = where, len(s.prompt)
        self.rows.join(specs, keys, slots)
        new_LV = logits_PV[fan_out]
        self._logits_LV = new_LV if self._logits_LV is None else torch.cat([self._logits_LV, new_LV])
        self._slots_L = None

    def _place(self, fresh) -> list[int]:
        """Slots for ``fresh``'s rows: free ones first, then new ones; the batch's first cache is
        ``fresh``."""
        n = fresh.batch_size
        if self.cache is None:
            self.cache, self.free = fresh, []
            self._tokens_S = torch.zeros(n, dtype=torch.long, device=self.engine.device)
            return list(range(n))
        self.free.sort()
        slots, self.free = self.free[:n], self.free[n:]
        grow = n - len(slots)
        if grow:
            slots += range(self.cache.batch_size, self.cache.batch_size + grow)
            self.cache.add_rows(grow)
            self._tokens_S = torch.cat([self._tokens_S, self._tokens_S.new_zeros(grow)])
        self.cache.put(torch.tensor(slots, dtype=torch.long, device=self.engine.device), fresh)
        return slots

    def _leave(self, ended: dict[int, Finished], keep: list[int], slot_of: dict[int, int], tokens_L):
        for key, f in ended.items():
            job_id, j = self._where[key]
            job = self._jobs[job_id]
            job.done[j] = Done(f, abort_message=ABORTED if j in job.capped and cut(f, job.rows[j]) else None)
            job.left -= 1
            self.free.append(slot_of[key])
        keep_L = torch.tensor(keep, dtype=torch.long, device=self.engine.device)
        self._logits_LV = self._logits_LV[keep_L]
        self._slots_L = None
        if not self.live:
            self.cache, self.free, self._logits_LV = None, [], None
        elif self.live < self.compact_below * self.cache.batch_size:
            self._compact()
        return tokens_L[keep_L]

    def _compact(self) -> None:
        """Rewrite the cache down to the live rows, in live order: slot ``b`` is live row ``b``."""
        self.cache.select(self._live_slots(), check=False)
        self.rows.slots = list(range(self.live))
        self.free = []
        self._tokens_S = self._tokens_S[: self.live].clone()
        self._slots_L = None
        self.compactions += 1

    def _live_slots(self) -> torch.Tensor:
        if self._slots_L is None:
            self._slots_L = torch.tensor(self.rows.slots, dtype=torch.long, device=self.engine.device)
        return self._slots_L

    def _forward(self, tokens_L: torch.Tensor) -> None:
        slots_L = self._live_slots()
        self._tokens_S[slots_L] = tokens_L
        hidden_SD = self.engine.model.hidden(self._tokens_S[:, None], cache=self.cache)[:, -1]
        # The LM head runs on live rows only: free slots' logits would be thrown away.
        self._logits_LV = self.engine.model.logits(hidden_SD[slots_L][:, None])[:, 0]
        needed = max(self._prompt_len[k] + self.rows.steps_of(b) for b, k in enumerate(self.rows.alive))
        self.cache.drop_front(self.cache.length - needed)

    def _settle(self, job_id: int) -> None:
        job = self._jobs[job_id]
        if job.left:
            return
        del self._jobs[job_id]
        experts = [None] * len(job.rows)
        self._ready.append(
            (
                job_id,
                completions(
                    job.requests, job.rows, job.done, job.prompts, experts, self.engine.weight_version
                ),
            )
        )
