"""The listed corrections applied to one rollout batch: weights multiply, masks AND together.

Every correction reads the same raw ratio r_t = exp(logp_old_t - logp_rollout_t), never another
correction's output, so their order changes nothing but the order of the metrics.

The non-finite rule (``NONFINITE_RULE``, "drop_response"): a response with any token whose log r is not
finite (a rollout log-prob of -inf, which SGLang reports as null for a token it gave no mass; NaN or +inf
from either side) is dropped whole, before any correction runs. Its sequence ratio is undefined, and a
finite stand-in (the peers bound +inf to e^20 and so hand such a token, or its whole response, the cap)
would train on a number nobody measured. Its tokens leave the loss, it leaves its group's baseline
(``keep_N``), the corrections' own metrics are over the other responses, and the batch reports
``correction/nonfinite_tokens`` and ``correction/nonfinite_sequences``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch

from ringzero.rl.corrections.base import fraction, raw_log_ratio
from ringzero.rl.corrections.icepop import icepop
from ringzero.rl.corrections.masked_is import masked_is
from ringzero.rl.corrections.seq_is import seq_is
from ringzero.rl.corrections.tis import tis
from ringzero.rl.corrections.veto import veto
from ringzero.rl.losses.base import check_inputs

CORRECTIONS = {"tis": tis, "seq_is": seq_is, "masked_is": masked_is, "icepop": icepop, "veto": veto}
NONFINITE_RULE = "drop_response"
"""What happens to a response with a non-finite per-token log-ratio: it is dropped whole (module
docstring)."""


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


def apply_corrections(
    settings: Sequence, logp_old_NT: torch.Tensor, logp_rollout_NT: torch.Tensor, mask_NT: torch.Tensor
) -> BatchCorrection:
    """``settings``: ``LossSettings.corrections``. ``logp_old_NT``: the training model's log-probs of the
    sampled tokens under the weights the rollout engine sampled with."""
    mask_NT = check_inputs(logp_old_NT, logp_rollout_NT, mask_NT)
    with torch.no_grad():
        log_r_NT = raw_log_ratio(logp_old_NT, logp_rollout_NT, mask_NT)
        nonfinite_NT = mask_NT & ~torch.isfinite(log_r_NT)
        finite_rows_NT = ~nonfinite_NT.any(dim=1, keepdim=True).expand_as(mask_NT)
        seen_NT = mask_NT & finite_rows_NT  # what the corrections see: the responses the rule keeps
        log_r_NT = torch.where(seen_NT, log_r_NT, torch.zeros_like(log_r_NT))
        weight_NT = torch.ones_like(log_r_NT)
        keep_NT = seen_NT.clone()
        metrics: dict[str, float] = {
            "correction/nonfinite_tokens": float(nonfinite_NT.sum()),
            "correction/nonfinite_sequences": float(nonfinite_NT.any(dim=1).sum()),
        }
        for item in settings:
            out = CORRECTIONS[item.kind](log_r_NT, seen_NT, item)
            weight_NT = weight_NT * out.weight_NT
            keep_NT = keep_NT & out.keep_NT
            metrics.update(out.metrics)
        has_tokens_N = mask_NT.any(dim=1)
        keep_N = keep_NT.any(dim=1) | ~has_tokens_N
        # computed in float64; handed on in the log-probs' own precision (at least fp32), as before
        out_dtype = torch.promote_types(logp_old_NT.dtype, torch.float32)
        weight_NT = torch.where(keep_NT, weight_NT, torch.zeros_like(weight_NT)).to(out_dtype)
        n_kept = int(keep_NT.sum())
        metrics.update(
            {
                "correction/sequences_dropped": float((~keep_N).sum()),
                "correction/token_masked_frac": fraction(~keep_NT, mask_NT),
                "correction/weight_mean": float(weight_NT.sum()) / n_kept if n_kept else float("nan"),
            }
        )
    return BatchCorrection(logp_old_NT.detach(), weight_NT, keep_NT, keep_N, metrics)
