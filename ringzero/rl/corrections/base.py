"""What every correction shares: its output type, the sequence log-ratio and the metrics each reports.

A correction reads the raw per-token log-ratio ``log_r_NT`` (zero outside ``mask_NT``) and returns a
stop-gradient per-token weight (1 where it does not weigh) and a keep mask (false where it drops).
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


class CorrectionOutput(NamedTuple):
    weight_NT: torch.Tensor
    keep_NT: torch.Tensor
    metrics: dict[str, float]


def sequence_log_ratio(log_r_NT: torch.Tensor, mask_NT: torch.Tensor,
                       form: Literal["product", "geometric"]) -> torch.Tensor:
    """``[N]``: log of the product of a response's ratios (their sum), or of their geometric mean (their mean);
    0 for a response with no tokens."""
    total_N = torch.where(mask_NT, log_r_NT, torch.zeros_like(log_r_NT)).sum(dim=1)
    if form == "product":
        return total_N
    return total_N / mask_NT.sum(dim=1).clamp(min=1).to(total_N.dtype)


def fraction(flag: torch.Tensor, over: torch.Tensor) -> float:
    n = int(over.sum())
    return float((flag & over).sum()) / n if n else 0.0


def report(kind: str, weight_NT: torch.Tensor, keep_NT: torch.Tensor, mask_NT: torch.Tensor,
           clipped_frac: float = 0.0) -> dict[str, float]:
    has_tokens_N = mask_NT.any(dim=1)
    kept_NT = keep_NT & mask_NT
    n_kept = int(kept_NT.sum())
    return {
        f"correction/{kind}/token_masked_frac": fraction(~keep_NT, mask_NT),
        f"correction/{kind}/seq_masked_frac": fraction(~kept_NT.any(dim=1), has_tokens_N),
        f"correction/{kind}/clipped_frac": clipped_frac,
        f"correction/{kind}/weight_mean": float(weight_NT[kept_NT].sum()) / n_kept if n_kept else float("nan"),
    }
