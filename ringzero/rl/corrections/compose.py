"""The listed corrections applied to one rollout batch: weights multiply, masks AND together.

Every correction reads the same raw ratio r_t = exp(logp_old_t - logp_rollout_t), never another
correction's output, so their order changes nothing but the order of the metrics.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch

from ringzero.rl.corrections.base import fraction
from ringzero.rl.corrections.icepop import icepop
from ringzero.rl.corrections.masked_is import masked_is
from ringzero.rl.corrections.seq_is import seq_is
from ringzero.rl.corrections.tis import tis
from ringzero.rl.corrections.veto import veto
from ringzero.rl.losses.base import check_inputs, log_ratio

CORRECTIONS = {"tis": tis, "seq_is": seq_is, "masked_is": masked_is, "icepop": icepop, "veto": veto}


class CorrectionRows(NamedTuple):
    """What the objective needs for some rows: the policy ratio's denominator (the old policy's log-probs),
    the correction weight of each token and the tokens it keeps."""

    logp_old_NT: torch.Tensor
    weight_NT: torch.Tensor
    keep_NT: torch.Tensor


@dataclass(frozen=True)
class BatchCorrection:
    """The corrections of a whole rollout batch. ``keep_N``: false for a response every one of whose tokens
    was dropped (a response with no tokens is kept: no correction saw it)."""

    logp_old_NT: torch.Tensor
    weight_NT: torch.Tensor
    keep_NT: torch.Tensor
    keep_N: torch.Tensor
    metrics: dict[str, float]

    def rows(self, index: torch.Tensor) -> CorrectionRows:
        return CorrectionRows(self.logp_old_NT[index], self.weight_NT[index], self.keep_NT[index])


def apply_corrections(settings: Sequence, logp_old_NT: torch.Tensor, logp_rollout_NT: torch.Tensor,
                      mask_NT: torch.Tensor) -> BatchCorrection:
    """``settings``: ``LossSettings.corrections``. ``logp_old_NT``: the training model's log-probs of the
    sampled tokens under the weights the rollout engine sampled with."""
    mask_NT = check_inputs(logp_old_NT, logp_rollout_NT, mask_NT)
    with torch.no_grad():
        log_r_NT = log_ratio(logp_old_NT.detach(), logp_rollout_NT, mask_NT)
        weight_NT = torch.ones_like(log_r_NT)
        keep_NT = mask_NT.clone()
        metrics: dict[str, float] = {}
        for item in settings:
            out = CORRECTIONS[item.kind](log_r_NT, mask_NT, item)
            weight_NT = weight_NT * out.weight_NT
            keep_NT = keep_NT & out.keep_NT
            metrics.update(out.metrics)
        has_tokens_N = mask_NT.any(dim=1)
        keep_N = keep_NT.any(dim=1) | ~has_tokens_N
        weight_NT = torch.where(keep_NT, weight_NT, torch.zeros_like(weight_NT))
        n_kept = int(keep_NT.sum())
        metrics.update({
            "correction/sequences_dropped": float((~keep_N).sum()),
            "correction/token_masked_frac": fraction(~keep_NT, mask_NT),
            "correction/weight_mean": float(weight_NT.sum()) / n_kept if n_kept else float("nan"),
        })
    return BatchCorrection(logp_old_NT.detach(), weight_NT, keep_NT, keep_N, metrics)
