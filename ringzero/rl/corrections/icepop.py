"""IcePop: a two-sided token mask with the calibration weight kept, M(r_t) = r_t on [lower, upper], 0 outside
(default 0.5..5.0). Tokens whose ratio leaves the band are dropped; the kept ones are weighted by r_t, a
constant (stop-gradient), untruncated inside the band."""

from __future__ import annotations

import torch

from ringzero.config.corrections import IcePopCorrection
from ringzero.rl.corrections.base import CorrectionOutput, report
from ringzero.rl.corrections.masked_is import outside


def icepop(log_r_NT: torch.Tensor, mask_NT: torch.Tensor, settings: IcePopCorrection) -> CorrectionOutput:
    log_r_NT = log_r_NT.detach()
    keep_NT = ~outside(log_r_NT, settings.lower, settings.upper) | ~mask_NT
    weight_NT = torch.where(mask_NT & keep_NT, log_r_NT.exp(), torch.ones_like(log_r_NT))
    return CorrectionOutput(weight_NT, keep_NT, report("icepop", weight_NT, keep_NT, mask_NT))
