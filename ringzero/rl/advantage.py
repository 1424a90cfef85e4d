"""GRPO group-normalized advantages: A_i = (R_i - mean_group R) / (std_group R + eps), or only centered.

Responses to one prompt sit next to each other: rewards ``[g0s0, g0s1, ..., g1s0, ...]``. The std is the
sample std (Bessel-corrected), as TRL and verl use; a group whose rewards are all equal gets zero
advantages either way, so it contributes no policy gradient.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

STD_EPS = 1e-6


def group_advantages(rewards_N: torch.Tensor | Sequence[float], group_size: int, *, use_std: bool = True,
                     eps: float = STD_EPS) -> torch.Tensor:
    rewards_N = torch.as_tensor(rewards_N, dtype=torch.float32)
    if rewards_N.dim() != 1:
        raise ValueError(f"rewards must be [N] (got shape {tuple(rewards_N.shape)})")
    if group_size < 1 or rewards_N.numel() % group_size:
        raise ValueError(f"group_size {group_size} must divide the number of rewards {rewards_N.numel()}")
    groups_GS = rewards_N.view(-1, group_size)
    centered_GS = groups_GS - groups_GS.mean(dim=1, keepdim=True)
    if use_std and group_size > 1:
        centered_GS = centered_GS / (groups_GS.std(dim=1, keepdim=True) + eps)
    return centered_GS.reshape(-1)
