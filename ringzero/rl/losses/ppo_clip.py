"""The reference: PPO's clipped surrogate, for comparison with ``sg_clip_is``.

    L = - sum_t min(r_t A_i, clip(r_t, 1 - eps_low, 1 + eps_high) A_i) / D

The ratio carries the gradient, and the clipped branch is flat: tokens with A > 0 above
``1 + eps_high`` and with A < 0 below ``1 - eps_low`` get no gradient at all. ``eps_low`` defaults to
``eps_high`` (symmetric PPO).
"""

from __future__ import annotations

import torch

from ringzero.rl.losses.base import LossOutput, check_inputs, clip_metrics, finish, log_ratio
from ringzero.rl.losses.normalization import Normalization


def ppo_clip_loss(
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
    low = eps_low if eps_low is not None else eps_high
    ratio_NT = log_ratio(logp_train_NT, logp_rollout_NT, mask_NT).exp()
    adv_NT = advantages_N[:, None].expand_as(ratio_NT).to(ratio_NT.dtype)
    surrogate_NT = torch.minimum(ratio_NT * adv_NT, ratio_NT.clamp(1 - low, 1 + eps_high) * adv_NT)
    loss = normalization(-surrogate_NT, mask_NT)
    with torch.no_grad():
        r = ratio_NT.detach()
        unclipped_NT = (r * adv_NT) <= (r.clamp(1 - low, 1 + eps_high) * adv_NT)  # min takes the ratio branch
        coverage_NT = unclipped_NT & (adv_NT != 0) & (r > 0)
        metrics = clip_metrics(
            r, adv_NT, mask_NT, coverage_NT, eps_high=eps_high, eps_low=low, ppo_eps_low=low
        )
    return finish(loss, metrics, "policy")
