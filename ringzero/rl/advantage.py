"""GRPO group-normalized advantages: A_i = (R_i - mean_group R) / (std_group R + eps), or only centered.

Responses to one prompt sit next to each other: rewards ``[g0s0, g0s1, ..., g1s0, ...]``. The std is the
sample std (Bessel-corrected), as TRL and verl use; a group whose rewards are all equal gets zero
advantages either way, so it contributes no policy gradient.

``keep_N`` (bool ``[N]``, optional): responses a mismatch correction dropped are false. They add nothing to
their group's mean and std, which are taken over the kept members alone (a group with one kept member
gets zero advantage), and their own advantage is 0.

``anchored_advantages``: the same, except rows given a baseline of their own (AdaptThink's accuracy anchor,
``ringzero.rl.anchor``): there ``A_i = R_i - b_i``, neither centered on the group nor divided by its std.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

STD_EPS = 1e-6


def group_advantages(
    rewards_N: torch.Tensor | Sequence[float],
    group_size: int,
    *,
    use_std: bool = True,
    eps: float = STD_EPS,
    keep_N: torch.Tensor | None = None,
) -> torch.Tensor:
    rewards_N = torch.as_tensor(rewards_N, dtype=torch.float32)
    if rewards_N.dim() != 1:
        raise ValueError(f"rewards must be [N] (got shape {tuple(rewards_N.shape)})")
    if group_size < 1 or rewards_N.numel() % group_size:
        raise ValueError(f"group_size {group_size} must divide the number of rewards {rewards_N.numel()}")
    if keep_N is not None:
        return _kept_group_advantages(rewards_N, group_size, keep_N, use_std, eps)
    groups_GS = rewards_N.view(-1, group_size)
    centered_GS = groups_GS - groups_GS.mean(dim=1, keepdim=True)
    if use_std and group_size > 1:
        centered_GS = centered_GS / (groups_GS.std(dim=1, keepdim=True) + eps)
    return centered_GS.reshape(-1)


def _kept_group_advantages(
    rewards_N: torch.Tensor, group_size: int, keep_N: torch.Tensor, use_std: bool, eps: float
) -> torch.Tensor:
    keep_N = torch.as_tensor(keep_N, device=rewards_N.device)
    if keep_N.shape != rewards_N.shape:
        raise ValueError(f"keep_N shape {tuple(keep_N.shape)} differs from rewards {tuple(rewards_N.shape)}")
    keep_GS = keep_N.bool().view(-1, group_size)
    groups_GS = torch.where(
        keep_GS, rewards_N.view(-1, group_size), torch.zeros_like(rewards_N.view(-1, group_size))
    )
    n_G1 = keep_GS.sum(dim=1, keepdim=True).to(rewards_N.dtype)
    mean_G1 = groups_GS.sum(dim=1, keepdim=True) / n_G1.clamp(min=1)
    centered_GS = torch.where(keep_GS, groups_GS - mean_G1, torch.zeros_like(groups_GS))
    if use_std and group_size > 1:
        std_G1 = (centered_GS.square().sum(dim=1, keepdim=True) / (n_G1 - 1).clamp(min=1)).sqrt()
        centered_GS = centered_GS / (std_G1 + eps)
    return centered_GS.reshape(-1)


def anchored_advantages(
    rewards_N: torch.Tensor | Sequence[float],
    baseline_N: torch.Tensor | Sequence[float],
    group_size: int,
    *,
    use_std: bool = True,
    eps: float = STD_EPS,
    keep_N: torch.Tensor | None = None,
) -> torch.Tensor:
    """``group_advantages`` for rows whose ``baseline_N`` is NaN, ``R_i - baseline_i`` for the others
    (AdaptThink, Zhang et al. 2025: ``R(x, y) - R_ref(x)``, with ``R_ref(x)`` the reference model's mean
    reward on prompt x). Unscaled on purpose: the std of a group says nothing about the distance to the
    reference, and dividing by it would blow up a near-uniform group that sits below it. A dropped row
    (``keep_N`` false) gets 0 either way."""
    rewards_N = torch.as_tensor(rewards_N, dtype=torch.float32)
    baseline_N = torch.as_tensor(baseline_N, dtype=torch.float32, device=rewards_N.device)
    if baseline_N.shape != rewards_N.shape:
        raise ValueError(
            f"baseline_N shape {tuple(baseline_N.shape)} differs from rewards {tuple(rewards_N.shape)}"
        )
    grouped_N = group_advantages(rewards_N, group_size, use_std=use_std, eps=eps, keep_N=keep_N)
    out_N = torch.where(torch.isnan(baseline_N), grouped_N, rewards_N - baseline_N)
    if keep_N is not None:
        out_N = torch.where(
            torch.as_tensor(keep_N, device=out_N.device).bool(), out_N, torch.zeros_like(out_N)
        )
    return out_N
