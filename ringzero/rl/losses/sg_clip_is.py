"""The seed's loss: stop-gradient clipped importance sampling (Ring-Zero; CISPO-style).

    L = - sum_t sg(min(r_t, 1 + eps_high)) * A_i * logp_train_t / D, r_t = exp(logp_train_t - logp_rollout_t)

The clipped ratio is a constant weight; the gradient flows through ``logp_train`` alone, so every
token with a non-zero advantage keeps a gradient, however far its ratio has drifted. No lower clip by
default: the low-ratio tokens are the rare ones zero RL must amplify. ``eps_low`` (ablations only)
clamps the weight below at ``1 - eps_low``; that raises low weights and still zeroes no gradient.
"""

from __future__ import annotations

import torch

from ringzero.rl.losses.base import LossOutput, check_inputs, clip_metrics, finish, log_ratio, masked
from ringzero.rl.losses.normalization import Normalization


def sg_clip_is_loss(
    logp_train_NT: torch.Tensor,
    logp_rollout_NT: torch.Tensor,
    advantages_N: torch.Tensor,
    mask_NT: torch.Tensor,
    normalization: Normalization,
    *,
    eps_high: float,
    eps_low: float | None = None,
) -> LossOutput:
    mask_NT = check_inputs(logp_train_NT, logp_rollout_NT, mask_NT, advantages_N)
    with torch.no_grad():
        ratio_NT = log_ratio(logp_train_NT, logp_rollout_NT, mask_NT).exp()
        weight_NT = ratio_NT.clamp(min=1 - eps_low if eps_low is not None else None, max=1 + eps_high)
        adv_NT = advantages_N[:, None].expand_as(ratio_NT).to(ratio_NT.dtype)
    per_token_NT = -weight_NT * adv_NT * masked(logp_train_NT, mask_NT)
    loss = normalization(per_token_NT, mask_NT)
    with torch.no_grad():
        metrics = clip_metrics(
            ratio_NT,
            adv_NT,
            mask_NT,
            coverage_NT=(weight_NT * adv_NT) != 0,
            eps_high=eps_high,
            eps_low=eps_low,
            ppo_eps_low=eps_low if eps_low is not None else eps_high,
        )
    return finish(loss, metrics, "policy")
