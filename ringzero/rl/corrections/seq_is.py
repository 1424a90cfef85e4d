"""Sequence-level IS: every token of response i takes w_i = min(R_i, cap), a constant (stop-gradient), with
R_i = prod_t r_t (``form: product``) or exp(mean_t log r_t) (``form: geometric``, length-free).

log R_i is the sum (or mean) of the raw per-token log-ratios, in float64; only that total is bounded, to
[-20, 20] before exp (so a long response's product cannot overflow), and the cap applies after. A token's
log r of +25 beside one of -24 gives R = e^1; clamping each token first would have given e^-4. The
truncation is counted on the unbounded total, so a cap beyond e^20 still counts what exceeds it."""

from __future__ import annotations

import math

import torch

from ringzero.config.corrections import SeqISCorrection
from ringzero.rl.corrections.base import CorrectionOutput, bounded_exp, fraction, report, sequence_log_ratio


def seq_is(log_r_NT: torch.Tensor, mask_NT: torch.Tensor, settings: SeqISCorrection) -> CorrectionOutput:
    log_seq_N = sequence_log_ratio(log_r_NT.detach(), mask_NT, settings.form)
    weight_N = bounded_exp(log_seq_N).clamp(max=settings.cap)
    weight_NT = torch.where(
        mask_NT, weight_N[:, None].expand(mask_NT.shape), torch.ones_like(weight_N[:, None])
    )
    keep_NT = torch.ones_like(mask_NT)
    clipped = fraction(log_seq_N > math.log(settings.cap), mask_NT.any(dim=1))
    return CorrectionOutput(weight_NT, keep_NT, report("seq_is", weight_NT, keep_NT, mask_NT, clipped))
