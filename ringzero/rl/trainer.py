"""Minibatch policy updates over one rollout batch: the numerator, the objective, guarded optimizer steps.

Per minibatch (``Minibatch``: the paper's 512 / 32 shape, ``minibatches`` updates per rollout batch), one
forward and backward of this rank's rows (``policy_scores``), one objective call per micro-batch against the
rollout log-probs, divided by the whole minibatch's one denominator, and one optimizer step; a non-finite
loss or gradient norm never reaches the weights (the step is skipped and counted in ``loss/skipped``). The
log-probs are always the TRAINING model's under its current weights, never a cached inference value; with
``batch_invariant`` they are bitwise the ones a deterministic rollout engine reported.

With ``loss.corrections`` (``ringzero.rl.corrections``), ``correct(batch)`` first scores the whole batch
once without gradient under the sampling weights (logp_old): the policy ratio's denominator becomes
logp_old, correction weights multiply the per-token loss, dropped tokens leave it.

The first minibatch sees the weights the rollout engine sampled with, so its ratio shows the engine gap
alone (exactly 1 with identical numerics in deterministic mode), under ``gap/*``, which gates and stop
conditions read; later minibatches add staleness, where the clip starts to act. ``ratio/*``, ``logratio/*``,
``drift/*`` and ``mismatch/*`` are over the whole batch, each token scored when its minibatch was.

Across ranks (``runtime``) every rank holds the whole rollout batch; a minibatch's rows split over the
data-parallel replicas and each row's tokens over the context-parallel ranks. Per-token values are summed
into the global grid on every rank and the objective's metrics over every shard (``LossSums``), so every
metric is over the whole token population, never an average over ranks.

Letter legend: N responses in the rollout batch, M in a minibatch, T response positions.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
import torch

from ringzero.config.stages import LossSettings
from ringzero.model.hybrid import HybridLM
from ringzero.model.routing import moe_layers
from ringzero.parallel.runtime import Runtime, single
from ringzero.rl.corrections.compose import BatchCorrection, apply_corrections
from ringzero.rl.minibatch import LossSums, Minibatch, loss_metric_keys
from ringzero.rl.mismatch_metrics import mismatch_metrics
from ringzero.rl.policy_scores import PolicyScorer, Scores
from ringzero.rl.rollout_batch import RolloutBatch
from ringzero.rl.tail_metrics import entropy_summary, kl_summary, ratio_tail


class PolicyTrainer:
    """``train(batch, advantages_N, seed)`` -> metrics; owns no weights, only how they are updated.

    ``optimizer`` is a ``ringzero.engines.optimizer.TrainOptimizer`` (or anything with ``zero_grad``,
    ``step() -> report(lr, grad_norm, skipped)``). ``reference`` is the frozen KL reference model
    (needed when ``loss.kl_coef > 0``). ``model`` and ``reference`` must already be parallelized for
    ``runtime`` (``ringzero.parallel.parallelize``) when its cp degree is above 1. The run config has
    refused what cannot apply (``batch_invariant`` with cp > 1, routing replay without MoE layers or with
    ``batch_invariant``, minibatches that do not divide the batch); the trainer asserts it.
    """

    def __init__(
        self,
        model: HybridLM,
        optimizer,
        loss: LossSettings,
        *,
        minibatches: int,
        max_new_tokens: int,
        temperature: float,
        reference: HybridLM | None = None,
        batch_invariant: bool = False,
        pad_id: int = 0,
        runtime: Runtime | None = None,
        sharding: str = "contiguous",
        micro_batch: int,
    ):
        runtime = runtime or single(model.word_embeddings.weight.device)
        assert reference is not None or loss.kl_coef == 0, "loss.kl_coef > 0 needs a reference model"
        assert not (batch_invariant and runtime.dims.cp > 1), "batch_invariant scoring needs cp = 1"
        assert not loss.routing_replay or (moe_layers(model) and not batch_invariant), "routing_replay"
        self.model, self.optimizer, self.loss, self.reference = model, optimizer, loss, reference
        self.runtime, self.minibatches, self.max_new_tokens = runtime, minibatches, max_new_tokens
        self.micro_batch, self.routing_replay = micro_batch, loss.routing_replay
        self.scorer = PolicyScorer(runtime, temperature, pad_id, sharding, batch_invariant)
        self.metric_keys = loss_metric_keys(loss)

    @property
    def device(self) -> torch.device:
        return self.runtime.device

    def score(self, model, batch: RolloutBatch, rows: list[int], T: int, with_entropy=False) -> Scores:
        """``Scores`` of ``rows``: this rank's tokens of them (zeros elsewhere), without gradient."""
        replay = self.routing_replay and model is self.model  # the frozen reference routes on its own
        with torch.no_grad():
            return self.scorer.scores(model, batch, [rows], T, with_entropy=with_entropy, replay=replay)[0]

    def correct(self, batch: RolloutBatch) -> BatchCorrection | None:
        """The stage's corrections of ``batch`` (None when it lists none): call before the advantages, whose
        group baselines must leave out the responses it drops (``keep_N``), and pass it to ``train``.

        logp_old is scored like the minibatches (rows over dp, tokens over cp, micro-batch by micro-batch,
        summed into the global grid), without gradient, before any update of this step."""
        if not self.loss.corrections:
            return None
        mask_NT = batch.mask_NT
        N, T = mask_NT.shape
        logp_old_NT = torch.zeros((N, T), dtype=torch.float32, device=self.device)
        groups = self._micro_batches(list(range(N)))
        self.model.train()
        with torch.no_grad():
            scored = self.scorer.scores(self.model, batch, groups, T, replay=self.routing_replay)
        for rows_m, scores in zip(groups, scored, strict=True):
            if scores is not None:  # None: a pipeline stage other than the last; the sum brings the values
                at = torch.tensor(rows_m, device=self.device)
                logp_old_NT[at] = scores.logp_mT.float() * (mask_NT[at] & scores.owned_mT).float()
        self.runtime.sum_(logp_old_NT)
        return apply_corrections(self.loss.corrections, logp_old_NT, batch.logp_rollout_NT, mask_NT)

    def train(
        self,
        batch: RolloutBatch,
        advantages_N: torch.Tensor,
        seed: int,
        correction: BatchCorrection | None = None,
    ) -> dict[str, float]:
        if self.loss.corrections and correction is None:
            raise ValueError(
                "loss.corrections is set: pass correction=trainer.correct(batch), computed before the "
                "advantages so that dropped responses stay out of the group baselines"
            )
        mask_NT, logp_rollout_NT = batch.mask_NT, batch.logp_rollout_NT  # made on this device by collect()
        values = TokenValues.zeros(*mask_NT.shape, device=self.device)
        per_mb, out, skipped = [], {}, 0
        self.model.train()
        for k, rows in enumerate(self.minibatch_rows(len(batch), seed)):
            mb = Minibatch.cut(batch, rows, advantages_N, correction, self.loss, self.max_new_tokens)
            metrics, got = self._update(batch, mb, with_entropy=k == 0)
            values.put(rows, torch.ones_like(got.logp_NT), *got.grids())
            if k == 0:  # before any update of this step: the engines' difference alone
                out.update(entropy_summary(got.entropy_NT, mb.mask_MT))
                out.update(engine_gap(got.logp_NT, mb.logp_rollout_MT, mb.mask_MT, self.loss.eps_high))
            skipped += int(metrics.pop("optim/skipped"))
            per_mb.append(metrics)
        out.update(_mean_metrics(per_mb))
        logp_NT = values.logp_NT
        out.update(ratio_tail(logp_NT, logp_rollout_NT, mask_NT, eps_high=self.loss.eps_high))
        out.update(mismatch_metrics(logp_NT, logp_rollout_NT, mask_NT))
        if self.reference is not None:
            out.update(kl_summary(logp_NT, values.ref_NT, mask_NT))
        out["loss/skipped"] = float(skipped)
        return out

    def _update(self, batch: RolloutBatch, mb: Minibatch, with_entropy: bool) -> tuple[dict, TokenValues]:
        """One optimizer update from ``mb``: forward and backward of this rank's share of its rows, one
        objective call per micro-batch, and the minibatch's metrics and per-token values over every rank."""
        T = mb.mask_MT.shape[1]
        local = self._micro_batches(list(range(len(mb.rows))))  # positions in the minibatch
        groups = [[mb.rows[i] for i in at] for at in local]
        refs: list = [None] * len(local)
        if self.reference is not None:
            with torch.no_grad():
                refs = [
                    None if r is None else r.logp_mT
                    for r in self.scorer.scores(self.reference, batch, groups, T)
                ]
        sums = LossSums(self.metric_keys, self.device)
        values = TokenValues.zeros(len(mb.rows), T, device=self.device)

        def loss_of(i: int, scores: Scores):
            part = mb.rows_at(local[i])
            out = part.loss(self.loss, scores.logp_mT, scores.owned_mT, refs[i])
            sums.add(out.metrics)
            values.put(
                local[i], (part.mask_MT & scores.owned_mT).float(), scores.logp_mT, refs[i], scores.entropy_mT
            )
            # A non-finite loss skips the step on every rank, but every CP rank (and pipeline stage) must
            # still run the backward its peers' collectives wait in.
            return out.loss if out.finite else 0.0 * scores.logp_mT.sum(), None

        self.optimizer.zero_grad()
        self.scorer.backward(
            self.model, batch, groups, T, loss_of, with_entropy=with_entropy, replay=self.routing_replay
        )
        values.sum_(self.runtime)  # every rank's tokens into the whole minibatch, on every rank
        metrics = sums.total(self.runtime)
        if metrics["loss/nonfinite"]:
            self.optimizer.zero_grad()
            return {**metrics, "optim/skipped": 1.0}, values
        if self.runtime.distributed:
            self.optimizer.reduce_grads(self.runtime.groups)
        report = self.optimizer.step()
        return {
            **metrics,
            "grad/norm": report.grad_norm,
            "optim/lr": report.lr,
            "optim/skipped": float(report.skipped),
        }, values

    def minibatch_rows(self, n: int, seed: int) -> list[list[int]]:
        """A seeded shuffle cut into ``minibatches`` equal parts: groups are spread over the updates."""
        assert n % self.minibatches == 0, "the config's minibatches divide the batch"
        order = list(range(n))
        random.Random(seed).shuffle(order)
        size = n // self.minibatches
        return [sorted(order[i : i + size]) for i in range(0, n, size)]

    def _micro_batches(self, rows: list) -> list[list]:
        """This data-parallel replica's share of ``rows``, cut into micro-batches."""
        mine = rows[self.runtime.dp_slice(len(rows))]
        return [mine[start : start + self.micro_batch] for start in range(0, len(mine), self.micro_batch)]


@dataclass
class TokenValues:
    """Per-token values of some rows, each rank's own tokens (zeros elsewhere) until ``sum_``: the trainer's
    log-probs, the reference's (zeros without one) and the entropy; dropped tokens included (the ratio tail
    is over every token)."""

    logp_NT: torch.Tensor
    ref_NT: torch.Tensor
    entropy_NT: torch.Tensor

    @classmethod
    def zeros(cls, n: int, T: int, device) -> TokenValues:
        return cls(*torch.zeros((3, n, T), dtype=torch.float32, device=device))

    def put(self, rows: list[int], keep_mT: torch.Tensor, *values_mT: torch.Tensor | None) -> None:
        """``values_mT`` (log-probs, reference, entropy; None: zeros) of ``rows``, 0 outside ``keep_mT``."""
        at = torch.tensor(rows, device=self.logp_NT.device)
        for grid, v in zip(self.grids(), values_mT, strict=True):
            if v is not None:
                grid[at] = v.detach().float() * keep_mT

    def grids(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.logp_NT, self.ref_NT, self.entropy_NT

    def sum_(self, runtime: Runtime) -> TokenValues:
        self.logp_NT, self.ref_NT, self.entropy_NT = runtime.sum_(torch.stack(self.grids())).unbind(0)
        return self


def engine_gap(
    logp_MT: torch.Tensor, logp_rollout_MT: torch.Tensor, mask_MT: torch.Tensor, eps_high: float
) -> dict[str, float]:
    """The first minibatch's tail and mismatch, under ``gap/``: scored before any update of the step, so the
    ratio there is the engines' difference alone (``gap/ratio/*``, ``gap/logratio/*``, ``gap/drift/*``,
    ``gap/mismatch/*``); the whole-batch ``ratio/*`` and ``mismatch/*`` add the later minibatches'
    staleness. ``ratio/first_minibatch_max``: the largest |r - 1| there."""
    tail = ratio_tail(logp_MT, logp_rollout_MT, mask_MT, eps_high=eps_high)
    gap_MT = ((logp_MT.double() - logp_rollout_MT).exp() - 1).abs()
    return {
        **{f"gap/{k}": v for k, v in tail.items()},
        **mismatch_metrics(logp_MT, logp_rollout_MT, mask_MT, prefix="gap/mismatch"),
        "ratio/first_minibatch_max": float(torch.where(mask_MT, gap_MT, torch.zeros_like(gap_MT)).max()),
    }


def _mean_metrics(records: list[dict[str, float]]) -> dict[str, float]:
    """Per key, the mean over the minibatches that reported it (non-finite values left out)."""
    keys = {k for r in records for k in r}
    out = {}
    for key in keys:
        values = np.asarray([r[key] for r in records if key in r], dtype=np.float64)
        values = values[np.isfinite(values)]
        out[key] = float(values.mean()) if values.size else float("nan")
    return out
