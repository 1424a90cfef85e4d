"""Masked IS (rejection sampling): drop what falls outside [lower, upper], weigh nothing.

- ``level: token``: drop each token whose r_t is outside the bounds;
- ``level: sequence``: drop every token of a response whose sequence ratio (product of its ratios, or
  their geometric mean with ``form: geometric``) is outside the bounds. Compared in log space, so a
  long response's product cannot overflow.
"""

from __future__ import annotations

import math

import torch

from ringzero.config.corrections import MaskedISCorrection
from ringzero.rl.corrections.base import CorrectionOutput, report, sequence_log_ratio


def outside(log_x: torch.Tensor, lower: float, upper: float) -> torch.Tensor:
    return (log_x < math.log(lower)) | (log_x > math.log(upper))


def masked_is(
    log_r_NT: torch.Tensor, mask_NT: torch.Tensor, settings: MaskedISCorrection
) -> CorrectionOutput:
    log_r_NT = log_r_NT.detach()
    if settings.level == "token":
        keep_NT = ~outside(log_r_NT, settings.lower, settings.upper)
    else:
        seq_N = sequence_log_ratio(log_r_NT, mask_NT, settings.form or "product")
        keep_NT = ~outside(seq_N, settings.lower, settings.upper)[:, None].expand_as(mask_NT)
    keep_NT = keep_NT | ~mask_NT
    weight_NT = torch.ones_like(log_r_NT)
    return CorrectionOutput(weight_NT, keep_NT, report("masked_is", weight_NT, keep_NT, mask_NT))
