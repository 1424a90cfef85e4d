"""Minibatch policy updates over one rollout batch: the numerator, the objective, guarded optimizer steps.

Per minibatch (the paper's 512 / 32 shape, ``minibatches`` updates per rollout batch):

1. ``logp_train``: the TRAINING model's log-probs of the sampled tokens under its current weights,
   from ``score_sequences`` (the one scoring function; with ``batch_invariant`` it is bitwise the one
   a deterministic rollout engine reported). Never a cached inference value;
2. ``objective``: the stage's policy loss against the rollout log-probs (the denominator) plus k3 KL
   to the frozen reference, reduced by the stage's normalization;
3. backward and one optimizer step; a non-finite loss or gradient norm never reaches the weights
   (the step is skipped and counted in ``loss/skipped``).

The first minibatch sees the weights the rollout engine sampled with, so its ratio shows the engine
gap alone (exactly 1 with identical numerics in deterministic mode); later minibatches add staleness,
which is where the clip starts to act. The ratio-tail metrics are taken over the whole batch, each
token at the moment its minibatch was scored.

Letter legend: N responses in the rollout batch, M responses in a minibatch, T response positions.
"""

from __future__ import annotations

import random

import numpy as np
import torch

from ringzero.model.hybrid import HybridLM
from ringzero.model.logprobs import entropy
from ringzero.rl.losses import make_normalization, objective
from ringzero.rl.rollout_batch import RolloutBatch, pad_rows
from ringzero.rl.tail_metrics import entropy_summary, kl_summary, ratio_tail
from ringzero.rollout.scoring import score_sequences


def padded(logps: list[torch.Tensor], width: int) -> torch.Tensor:
    """Stack per-sequence log-probs into ``[M, width]`` (zeros after each row's end), keeping gradients."""
    rows = [torch.nn.functional.pad(lp, (0, width - lp.shape[0])) for lp in logps]
    return torch.stack(rows) if rows else torch.zeros((0, width))


class PolicyTrainer:
    """``train(batch, advantages_N, seed)`` -> metrics; owns no weights, only how they are updated.

    ``optimizer`` is a ``ringzero.stages.optimizer.TrainOptimizer`` (or anything with ``zero_grad``,
    ``step() -> report(lr, grad_norm, skipped)``). ``reference`` is the frozen KL reference model
    (needed when ``loss.kl_coef > 0``).
    """

    def __init__(self, model: HybridLM, optimizer, loss, *, minibatches: int, max_new_tokens: int,
                 temperature: float, reference: HybridLM | None = None, batch_invariant: bool = False,
                 pad_id: int = 0):
        if loss.kl_coef > 0 and reference is None:
            raise ValueError("loss.kl_coef > 0 needs a reference model")
        self.model, self.optimizer, self.loss = model, optimizer, loss
        self.minibatches, self.max_new_tokens, self.temperature = minibatches, max_new_tokens, temperature
        self.reference, self.batch_invariant, self.pad_id = reference, batch_invariant, pad_id

    def score(self, model: HybridLM, batch: RolloutBatch, rows: list[int]) -> torch.Tensor:
        sequences, prompt_lens = batch.sequences(rows)
        logps = score_sequences(model, sequences, prompt_lens, self.temperature, self.batch_invariant,
                                pad_id=self.pad_id)
        return padded(logps, batch.mask_NT.shape[1])

    def minibatch_rows(self, n: int, seed: int) -> list[list[int]]:
        """A seeded shuffle cut into ``minibatches`` equal parts: groups are spread over the updates."""
        if n % self.minibatches:
            raise ValueError(f"minibatches ({self.minibatches}) must divide the batch of {n} responses")
        order = list(range(n))
        random.Random(seed).shuffle(order)
        size = n // self.minibatches
        return [sorted(order[i:i + size]) for i in range(0, n, size)]

    def train(self, batch: RolloutBatch, advantages_N: torch.Tensor, seed: int) -> dict[str, float]:
        mask_NT = batch.mask_NT
        logp_rollout_NT = batch.logp_rollout_NT
        logp_train_NT = torch.zeros_like(logp_rollout_NT, dtype=torch.float32)
        logp_ref_NT = None
        if self.loss.kl_coef > 0:
            with torch.no_grad():
                logp_ref_NT = self.score(self.reference, batch, list(range(len(batch))))
        per_mb: list[dict[str, float]] = []
        skipped, first_mb_ratio_max, entropy_stats = 0, float("nan"), {}
        self.model.train()
        for k, rows in enumerate(self.minibatch_rows(len(batch), seed)):
            idx = torch.tensor(rows)
            logp_MT = self.score(self.model, batch, rows)
            if k == 0:
                entropy_stats = self.entropy_stats(batch, rows)
                diff = (logp_MT.detach().double() - logp_rollout_NT[idx])[mask_NT[idx]]
                first_mb_ratio_max = float((diff.exp() - 1).abs().max()) if diff.numel() else 0.0
            logp_train_NT[idx] = logp_MT.detach().to(logp_train_NT.dtype)
            norm = make_normalization(self.loss, len(rows), self.max_new_tokens)
            out = objective(self.loss, logp_MT, logp_rollout_NT[idx].to(logp_MT.dtype), advantages_N[idx],
                            mask_NT[idx], norm, None if logp_ref_NT is None else logp_ref_NT[idx])
            metrics = dict(out.metrics)
            self.optimizer.zero_grad()
            if not out.finite:
                skipped += 1
                per_mb.append(metrics)
                continue
            out.loss.backward()
            report = self.optimizer.step()
            skipped += report.skipped
            metrics.update({"grad/norm": report.grad_norm, "optim/lr": report.lr})
            per_mb.append(metrics)
        out = _mean_metrics(per_mb)
        out.update(ratio_tail(logp_train_NT, logp_rollout_NT, mask_NT, eps_high=self.loss.eps_high))
        out.update(entropy_stats)
        if logp_ref_NT is not None:
            out.update(kl_summary(logp_train_NT, logp_ref_NT, mask_NT))
        out["ratio/first_minibatch_max"] = first_mb_ratio_max
        out["loss/skipped"] = float(skipped)
        return out

    @torch.no_grad()
    def entropy_stats(self, batch: RolloutBatch, rows: list[int]) -> dict[str, float]:
        """Per-token policy entropy on one minibatch (a sample of the batch: one extra forward, no backward)."""
        sequences, prompt_lens = batch.sequences(rows)
        width = max(len(s) for s in sequences)
        ids_MS = torch.tensor([s + [self.pad_id] * (width - len(s)) for s in sequences])
        logits_MSV = self.model(ids_MS[:, :-1])
        ent_MS = entropy(logits_MSV, self.temperature)
        rows_ent = [ent_MS[i, p - 1: len(s) - 1] for i, (s, p) in enumerate(zip(sequences, prompt_lens, strict=True))]
        ent_MT = pad_rows(rows_ent, batch.mask_NT.shape[1], torch.float32)
        return entropy_summary(ent_MT, batch.mask_NT[torch.tensor(rows)])


def _mean_metrics(records: list[dict[str, float]]) -> dict[str, float]:
    """Per key, the mean over the minibatches that reported it (non-finite values left out)."""
    keys = {k for r in records for k in r}
    out = {}
    for key in keys:
        values = np.asarray([r[key] for r in records if key in r], dtype=np.float64)
        values = values[np.isfinite(values)]
        out[key] = float(values.mean()) if values.size else float("nan")
    return out
