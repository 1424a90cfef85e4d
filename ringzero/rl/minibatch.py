"""One optimizer update's share of a rollout batch, its one denominator, and what its shards add up to.

``Minibatch.cut`` takes M of the batch's N rows with their mask, rollout log-probs, advantages, correction
rows and the whole minibatch's ``Normalization``; ``rows_at(at)`` is the same minibatch restricted to some
of its rows (a micro-batch of this rank's share), still divided by the whole minibatch's denominator, so
the losses of every shard on every rank add up to the loss of one process.

``LossSums`` adds the objective's metrics over those shards and ranks: ``loss/*`` values add (each is
already over the whole denominator; ``loss/nonfinite`` counts), every other metric is a share or mean over
the loss tokens and is weighted by the shard's ``loss/tokens``.

Letter legend: N rows of the batch, M of the minibatch, T response positions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ringzero.config.stages import LossSettings
from ringzero.parallel.runtime import Runtime
from ringzero.rl.corrections.compose import BatchCorrection, CorrectionRows
from ringzero.rl.losses.base import LossOutput
from ringzero.rl.losses.normalization import Normalization
from ringzero.rl.objective import make_normalization, objective
from ringzero.rl.rollout_batch import RolloutBatch


@dataclass(frozen=True)
class Minibatch:
    rows: list[int]  # of the rollout batch
    mask_MT: torch.Tensor  # the response tokens (a correction's drops are in ``correction``)
    logp_rollout_MT: torch.Tensor
    advantages_M: torch.Tensor
    correction: CorrectionRows | None
    normalization: Normalization

    @classmethod
    def cut(
        cls,
        batch: RolloutBatch,
        rows: list[int],
        advantages_N: torch.Tensor,
        correction: BatchCorrection | None,
        loss: LossSettings,
        max_new_tokens: int,
    ) -> Minibatch:
        idx = torch.tensor(rows, device=batch.mask_NT.device)
        mask_MT = batch.mask_NT[idx]
        corr = None if correction is None else correction.rows(idx)
        loss_tokens_MT = mask_MT if corr is None else mask_MT & corr.keep_NT
        norm = make_normalization(loss, loss_tokens_MT.sum(dim=1), max_new_tokens)
        return cls(rows, mask_MT, batch.logp_rollout_NT[idx], advantages_N[idx], corr, norm)

    def rows_at(self, at: list[int]) -> Minibatch:
        """Rows ``at`` (positions in this minibatch), divided by the whole minibatch's denominator."""
        i = torch.tensor(at, device=self.mask_MT.device)
        corr = None if self.correction is None else CorrectionRows(*(t[i] for t in self.correction))
        return Minibatch(
            [self.rows[a] for a in at],
            self.mask_MT[i],
            self.logp_rollout_MT[i],
            self.advantages_M[i],
            corr,
            self.normalization.rows(i),
        )

    def loss(
        self,
        settings: LossSettings,
        logp_MT: torch.Tensor,
        owned_MT: torch.Tensor,
        logp_ref_MT: torch.Tensor | None,
    ) -> LossOutput:
        """The stage's objective over this rank's tokens (``owned_MT``) of these rows."""
        return objective(
            settings,
            logp_MT,
            self.logp_rollout_MT.to(logp_MT.dtype),
            self.advantages_M,
            self.mask_MT & owned_MT,
            self.normalization,
            logp_ref_MT,
            self.correction,
        )


@dataclass
class LossSums:
    """The objective's metrics of one minibatch, summed shard by shard, then over the ranks."""

    keys: tuple[str, ...]
    device: torch.device

    def __post_init__(self):
        self.sums_K = torch.zeros(len(self.keys), dtype=torch.float64, device=self.device)

    def add(self, metrics: dict[str, float]) -> None:
        tokens = metrics["loss/tokens"]
        self.sums_K += torch.tensor(
            [metrics[k] if k.startswith("loss/") else metrics[k] * tokens for k in self.keys],
            dtype=torch.float64,
            device=self.device,
        )

    def total(self, runtime: Runtime) -> dict[str, float]:
        runtime.sum_(self.sums_K)
        sums = dict(zip(self.keys, self.sums_K.tolist(), strict=True))
        tokens = sums["loss/tokens"]
        out = {k: v if k.startswith("loss/") else (v / tokens if tokens else 0.0) for k, v in sums.items()}
        out["loss/nonfinite"] = float(out["loss/nonfinite"] > 0)
        return out


def loss_metric_keys(settings: LossSettings) -> tuple[str, ...]:
    """The keys ``objective`` reports under ``settings``, read off one token: every rank adds the same
    vector, whether or not it scored anything (a pipeline stage other than the last scores nothing)."""
    one_11 = torch.zeros((1, 1))
    out = objective(
        settings,
        one_11,
        one_11,
        torch.zeros(1),
        torch.ones((1, 1), dtype=torch.bool),
        Normalization("token_sum", 1.0),
        one_11 if settings.kl_coef > 0 else None,
    )
    return tuple(sorted(out.metrics))
