"""KL to the frozen reference as a loss term, with the k3 estimator (Schulman's unbiased, always >= 0):

    kl_t = exp(ref_t - cur_t) - (ref_t - cur_t) - 1,   d kl_t / d cur_t = 1 - exp(ref_t - cur_t)

It pulls the policy towards the base only where they differ; in the pilot a small coefficient slowed
the loss of traces. Reduced with the same normalization as the policy loss.
"""

from __future__ import annotations

import torch

from ringzero.rl.losses.base import MAX_LOG_RATIO, LossOutput, check_inputs, finish, masked
from ringzero.rl.losses.normalization import Normalization


def k3(logp_cur_NT: torch.Tensor, logp_ref_NT: torch.Tensor, mask_NT: torch.Tensor) -> torch.Tensor:
    """Per-token k3, zero outside the mask; ref - cur is clamped above so exp cannot overflow."""
    delta_NT = (masked(logp_ref_NT, mask_NT) - masked(logp_cur_NT, mask_NT)).clamp(max=MAX_LOG_RATIO)
    return delta_NT.exp() - delta_NT - 1


def kl_k3_loss(
    logp_train_NT: torch.Tensor,
    logp_ref_NT: torch.Tensor,
    mask_NT: torch.Tensor,
    normalization: Normalization,
) -> LossOutput:
    mask_NT = check_inputs(logp_train_NT, logp_ref_NT, mask_NT)
    kl_NT = k3(logp_train_NT, logp_ref_NT, mask_NT)
    loss = normalization(kl_NT, mask_NT)
    with torch.no_grad():
        n = int(mask_NT.sum())
        metrics = {"kl/token_mean": float(kl_NT.sum()) / n if n else 0.0}
    return finish(loss, metrics, "kl")
