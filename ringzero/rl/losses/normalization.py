"""How a per-token loss becomes a scalar: the denominator is the whole difference between stages.

- ``token_sum`` (stage 1): every token's loss summed over the batch, divided by a constant ``D`` (for
  example sequences x max_new_tokens). A longer correct response contributes more gradient, which is
  how reasoning length is elicited, and what makes length run away.
- ``sample_mean`` (stage 2 on): each sequence's token sum divided by its own token count, then the
  mean over the N sequences; a sequence with no tokens contributes zero. Every response weighs the same
  (verl's ``seq-mean-token-mean``).

The stage setting ``token_mean`` (DAPO, verl's ``token-mean``) is ``token_sum`` whose ``D`` is the
minibatch's loss-token count (ringzero.rl.objective.make_normalization): per token as ``token_sum``, but
the batch's total weight no longer grows with its length.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from ringzero.rl.losses.base import masked


def token_sum(per_token_NT: torch.Tensor, mask_NT: torch.Tensor, denominator: float) -> torch.Tensor:
    return masked(per_token_NT, mask_NT).sum() / denominator


def sample_mean(
    per_token_NT: torch.Tensor,
    mask_NT: torch.Tensor,
    lengths_N: torch.Tensor | None = None,
    num_sequences: int | None = None,
) -> torch.Tensor:
    """``lengths_N`` / ``num_sequences``: the whole sequences' lengths and the whole batch's sequence count,
    when ``per_token_NT`` holds only a shard (some rows, some columns) of the batch."""
    if lengths_N is None:
        lengths_N = mask_NT.sum(dim=1)
    per_seq_N = masked(per_token_NT, mask_NT).sum(dim=1) / lengths_N.clamp(min=1).to(per_token_NT.dtype)
    return per_seq_N.mean() if num_sequences is None else per_seq_N.sum() / max(1, num_sequences)


@dataclass(frozen=True)
class Normalization:
    kind: Literal["token_sum", "sample_mean"]
    denominator: float | None = None
    """The constant D of ``token_sum``; must be None for ``sample_mean``."""
    lengths_N: torch.Tensor | None = None
    """``sample_mean`` over a shard: each row's full response length (default: the mask's row sums)."""
    num_sequences: int | None = None
    """``sample_mean`` over a shard: sequences in the whole batch the mean is over (default: the rows)."""

    def __post_init__(self):
        if self.kind == "token_sum" and (self.denominator is None or not self.denominator > 0):
            raise ValueError(f"token_sum needs a positive denominator (got {self.denominator})")
        if self.kind == "token_sum" and (self.lengths_N is not None or self.num_sequences is not None):
            raise ValueError(
                "token_sum divides by its constant denominator; lengths_N/num_sequences are for sample_mean"
            )
        if self.kind == "sample_mean" and self.denominator is not None:
            raise ValueError("sample_mean divides by each sequence's own length; denominator must be None")
        if self.kind not in ("token_sum", "sample_mean"):
            raise ValueError(f"normalization must be token_sum or sample_mean (got {self.kind!r})")

    def rows(self, index: torch.Tensor) -> Normalization:
        """The same denominator for some of the rows (a shard): ``token_sum``'s constant is the whole batch's;
        ``sample_mean`` keeps each row's whole length and the whole batch's sequence count."""
        if self.kind == "token_sum":
            return self
        if self.lengths_N is None or self.num_sequences is None:
            raise ValueError("sample_mean over a shard needs the whole batch's lengths_N and num_sequences")
        return Normalization("sample_mean", lengths_N=self.lengths_N[index], num_sequences=self.num_sequences)

    def __call__(self, per_token_NT: torch.Tensor, mask_NT: torch.Tensor) -> torch.Tensor:
        mask_NT = mask_NT.bool()
        if self.kind == "token_sum":
            return token_sum(per_token_NT, mask_NT, self.denominator)
        return sample_mean(per_token_NT, mask_NT, self.lengths_N, self.num_sequences)
