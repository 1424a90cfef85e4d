"""A stage's objective from its ``LossSettings``: the chosen policy loss plus ``kl_coef`` x k3 KL,
both reduced by the chosen normalization.

With ``correction`` (the rows of a ``ringzero.rl.corrections.compose.BatchCorrection``): the policy ratio's
denominator is the old policy's log-probs instead of the rollout's, each token's policy loss is
multiplied by its correction weight before the reduction, and dropped tokens leave both terms."""

from __future__ import annotations

import torch

from ringzero.config.stages import LossSettings
from ringzero.rl.corrections.compose import CorrectionRows
from ringzero.rl.losses.base import LossOutput
from ringzero.rl.losses.kl import kl_k3_loss
from ringzero.rl.losses.normalization import Normalization
from ringzero.rl.losses.ppo_clip import ppo_clip_loss
from ringzero.rl.losses.sg_clip_is import sg_clip_is_loss

POLICY_LOSSES = {"sg_clip_is": sg_clip_is_loss, "ppo_clip": ppo_clip_loss}


def make_normalization(settings: LossSettings, lengths_M: torch.Tensor, max_new_tokens: int) -> Normalization:
    """The minibatch's one denominator, from each row's loss tokens ``lengths_M`` (its response tokens less
    those a correction dropped). ``token_sum`` divides by ``token_sum_denominator``, or by sequences x
    max_new_tokens when unset: a constant per minibatch size, never the number of tokens actually generated.
    ``token_mean`` (DAPO, verl's ``token-mean``) divides the same token sum by the minibatch's loss tokens,
    so a batch of longer responses no longer weighs more in total. ``sample_mean`` divides each row by its
    own length and averages over the M rows."""
    M = int(lengths_M.shape[0])
    if settings.normalization == "sample_mean":
        return Normalization("sample_mean", lengths_N=lengths_M, num_sequences=M)
    if settings.normalization == "token_mean":
        return Normalization("token_sum", float(max(1, int(lengths_M.sum()))))
    return Normalization("token_sum", float(settings.token_sum_denominator or M * max_new_tokens))


class _Weighted:
    """A normalization that multiplies each token's loss by a constant weight before reducing it."""

    def __init__(self, normalization: Normalization, weight_NT: torch.Tensor):
        self.normalization, self.weight_NT = normalization, weight_NT.detach()

    def __call__(self, per_token_NT: torch.Tensor, mask_NT: torch.Tensor) -> torch.Tensor:
        return self.normalization(per_token_NT * self.weight_NT.to(per_token_NT.dtype), mask_NT)


def objective(
    settings: LossSettings,
    logp_train_NT: torch.Tensor,
    logp_rollout_NT: torch.Tensor,
    advantages_N: torch.Tensor,
    mask_NT: torch.Tensor,
    normalization: Normalization,
    logp_ref_NT: torch.Tensor | None = None,
    correction: CorrectionRows | None = None,
) -> LossOutput:
    denominator_NT, policy_norm = logp_rollout_NT, normalization
    if correction is not None:
        mask_NT = mask_NT.bool() & correction.keep_NT
        denominator_NT = correction.logp_old_NT.to(logp_train_NT.dtype)
        policy_norm = _Weighted(normalization, correction.weight_NT)
    policy = POLICY_LOSSES[settings.kind](
        logp_train_NT,
        denominator_NT,
        advantages_N,
        mask_NT,
        policy_norm,
        eps_high=settings.eps_high,
        eps_low=settings.eps_low,
    )
    metrics = dict(policy.metrics)
    total = policy.loss
    if settings.kl_coef > 0:
        if logp_ref_NT is None:
            raise ValueError("kl_coef > 0 needs reference log-probs (logp_ref_NT)")
        kl = kl_k3_loss(logp_train_NT, logp_ref_NT, mask_NT, normalization)
        metrics.update(kl.metrics)
        metrics["loss/nonfinite"] = max(policy.metrics["loss/nonfinite"], kl.metrics["loss/nonfinite"])
        total = total + settings.kl_coef * kl.loss
    finite = metrics["loss/nonfinite"] == 0.0
    metrics["loss/tokens"] = float(mask_NT.sum())
    metrics["loss/total"] = float(total.detach()) if finite else float("nan")
    return LossOutput(total if finite else torch.zeros((), dtype=total.dtype, device=total.device), metrics)
