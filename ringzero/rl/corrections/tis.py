"""Token-level truncated IS (TIS): weight_t = min(r_t, cap), a constant (stop-gradient)."""

from __future__ import annotations

import torch

from ringzero.config.corrections import TISCorrection
from ringzero.rl.corrections.base import CorrectionOutput, fraction, report


def tis(log_r_NT: torch.Tensor, mask_NT: torch.Tensor, settings: TISCorrection) -> CorrectionOutput:
    ratio_NT = log_r_NT.detach().exp()
    weight_NT = torch.where(mask_NT, ratio_NT.clamp(max=settings.cap), torch.ones_like(ratio_NT))
    keep_NT = torch.ones_like(mask_NT)
    clipped = fraction(ratio_NT > settings.cap, mask_NT)
    return CorrectionOutput(weight_NT, keep_NT, report("tis", weight_NT, keep_NT, mask_NT, clipped))
