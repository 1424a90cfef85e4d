"""What every correction shares: its output type, the raw and the sequence log-ratio, the bounded exp, and
the metrics each reports.

A correction reads the raw per-token log-ratio ``log_r_NT`` (float64, zero outside ``mask_NT``, never
clamped, every masked entry finite: ``compose`` drops a response with a non-finite one before any
correction sees it) and returns a stop-gradient per-token weight (1 where it does not weigh) and a keep
mask (false where it drops). Sequence-level corrections sum (or average) the raw per-token values first
and bound only the total, as verl's rollout correction and slime's MIS do: a +25 and a -24 in one
response are a product of e^1, not of e^(20 - 24).

Its metrics, under ``correction/<kind>/``:

- ``token_masked_frac``: share of the response tokens it drops;
- ``seq_masked_frac``: share of the responses (with at least one token) it drops entirely;
- ``clipped_frac``: share of its weights truncated at the cap, over tokens at token level and over
  responses at sequence level (0 for a pure mask);
- ``weight_mean``: mean weight over the tokens it keeps (1 for a pure mask).
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch

from ringzero.rl.losses.base import MAX_LOG_RATIO


class CorrectionOutput(NamedTuple):
    weight_NT: torch.Tensor
    keep_NT: torch.Tensor
    metrics: dict[str, float]


def raw_log_ratio(
    logp_old_NT: torch.Tensor, logp_rollout_NT: torch.Tensor, mask_NT: torch.Tensor
) -> torch.Tensor:
    """``[N, T]`` float64: log r_t = logp_old_t - logp_rollout_t on the mask, 0 outside it (whatever the
    padding holds), unclamped: +-inf and NaN stay what they are, for ``compose`` to find."""
    old, rollout = logp_old_NT.detach().double(), logp_rollout_NT.detach().double()
    return torch.where(mask_NT, old - rollout, torch.zeros_like(old))


def sequence_log_ratio(
    log_r_NT: torch.Tensor, mask_NT: torch.Tensor, form: Literal["product", "geometric"]
) -> torch.Tensor:
    """``[N]`` float64: log of the product of a response's raw ratios (their sum), or of their geometric
    mean (their mean); 0 for a response with no tokens. Summed before any bound, in float64."""
    log_r_NT = log_r_NT.double()
    total_N = torch.where(mask_NT, log_r_NT, torch.zeros_like(log_r_NT)).sum(dim=1)
    if form == "product":
        return total_N
    return total_N / mask_NT.sum(dim=1).clamp(min=1).to(total_N.dtype)


def bounded_exp(log_x: torch.Tensor) -> torch.Tensor:
    """exp of ``log_x`` clamped to [-MAX_LOG_RATIO, MAX_LOG_RATIO] (e^-20 ~ 2e-9 .. e^20 ~ 5e8), the peers'
    safety bound: applied to a total, after the sum, never to the tokens that make it up."""
    return log_x.clamp(min=-MAX_LOG_RATIO, max=MAX_LOG_RATIO).exp()


def fraction(flag: torch.Tensor, over: torch.Tensor) -> float:
    n = int(over.sum())
    return float((flag & over).sum()) / n if n else 0.0


def report(
    kind: str,
    weight_NT: torch.Tensor,
    keep_NT: torch.Tensor,
    mask_NT: torch.Tensor,
    clipped_frac: float = 0.0,
) -> dict[str, float]:
    has_tokens_N = mask_NT.any(dim=1)
    kept_NT = keep_NT & mask_NT
    n_kept = int(kept_NT.sum())
    return {
        f"correction/{kind}/token_masked_frac": fraction(~keep_NT, mask_NT),
        f"correction/{kind}/seq_masked_frac": fraction(~kept_NT.any(dim=1), has_tokens_N),
        f"correction/{kind}/clipped_frac": clipped_frac,
        f"correction/{kind}/weight_mean": float(weight_NT[kept_NT].sum()) / n_kept
        if n_kept
        else float("nan"),
    }
