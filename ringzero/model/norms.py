"""RMSNorm, plain and grouped (one normalisation per head, per-channel weight)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ringzero.model.precision import at_least_fp32


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, out_dtype: torch.dtype | None = None):
    """``x / rms(x) * weight`` over the last dim.

    The mean of squares is taken in at least fp32, as every reference implementation does: a bf16 sum of
    d squares loses the low bits that decide the scale. Output is ``x``'s dtype unless ``out_dtype``.
    """
    compute = at_least_fp32(x.dtype)
    if x.dtype == compute and weight.dtype == compute and out_dtype in (None, compute):
        # Already at the compute precision: torch's fused kernel does the same arithmetic in one op
        # (half the time of the five ops below at a decoding step's [64, 128]; bitwise equal in
        # tests/model/test_norms_fused.py).
        if weight.dim() == 1:
            return F.rms_norm(x, (x.shape[-1],), weight, eps)
        return F.rms_norm(x, (x.shape[-1],), None, eps) * weight  # GroupRMSNorm's [G, d] weight
    xc = x.to(compute)
    y = xc * torch.rsqrt(xc.pow(2).mean(-1, keepdim=True) + eps)
    return (y * weight.to(compute)).to(out_dtype or x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps, out_dtype)


class GroupRMSNorm(nn.Module):
    """RMS-normalise each of ``n_groups`` equal, contiguous groups of the last dim on its own (Ling 2.5's
    ``g_norm``: groups span heads, ``group_norm_size`` of them over ``H*d`` channels); one weight per
    channel."""

    def __init__(self, n_groups: int, group_dim: int, eps: float):
        super().__init__()
        self.n_groups, self.group_dim, self.eps = n_groups, group_dim, eps
        self.weight = nn.Parameter(torch.ones(n_groups * group_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        grouped = x.unflatten(-1, (self.n_groups, self.group_dim))
        w_Gd = self.weight.view(self.n_groups, self.group_dim)
        return rms_norm(grouped, w_Gd, self.eps).flatten(-2)
