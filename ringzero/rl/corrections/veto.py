"""Veto: drop every token of a response when any of its token ratios is below ``floor`` (a token the
trainer finds far less likely than the engine did: the catastrophic tail a truncation cannot fix)."""

from __future__ import annotations

import math

import torch

from ringzero.config.corrections import VetoCorrection
from ringzero.rl.corrections.base import CorrectionOutput, report


def veto(log_r_NT: torch.Tensor, mask_NT: torch.Tensor, settings: VetoCorrection) -> CorrectionOutput:
    vetoed_N = (mask_NT & (log_r_NT.detach() < math.log(settings.floor))).any(dim=1)
    keep_NT = ~vetoed_N[:, None].expand_as(mask_NT) | ~mask_NT
    weight_NT = torch.ones_like(log_r_NT)
    return CorrectionOutput(weight_NT, keep_NT, report("veto", weight_NT, keep_NT, mask_NT))
