"""Sequence-level IS: every token of response i takes w_i = min(R_i, cap), a constant (stop-gradient), with
R_i = prod_t r_t (``form: product``) or exp(mean_t log r_t) (``form: geometric``, length-free).

The log of R_i is clamped above at ``MAX_LOG_RATIO`` before exp, so a long response's product cannot
overflow; the cap is applied after, so the clamp only matters for caps beyond exp(20)."""

from __future__ import annotations

import torch

from ringzero.rl.corrections.base import CorrectionOutput, fraction, report, sequence_log_ratio
from ringzero.rl.corrections.config import SeqISCorrection
from ringzero.rl.losses.base import MAX_LOG_RATIO


def seq_is(log_r_NT: torch.Tensor, mask_NT: torch.Tensor, settings: SeqISCorrection) -> CorrectionOutput:
    seq_N = sequence_log_ratio(log_r_NT.detach(), mask_NT, settings.form).clamp(max=MAX_LOG_RATIO).exp()
    weight_N = seq_N.clamp(max=settings.cap)
    weight_NT = torch.where(mask_NT, weight_N[:, None].expand_as(log_r_NT), torch.ones_like(log_r_NT))
    keep_NT = torch.ones_like(mask_NT)
    clipped = fraction(seq_N > settings.cap, mask_NT.any(dim=1))
    return CorrectionOutput(weight_NT, keep_NT, report("seq_is", weight_NT, keep_NT, mask_NT, clipped))
