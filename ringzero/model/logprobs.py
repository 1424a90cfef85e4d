"""Per-token log-probabilities and entropy from logits, in fp32: what the RL loss and the rollout engine read.

Convention (SGLang's): log-softmax of ``logits / temperature`` over the full vocabulary, before any
top-p/top-k renormalisation. Letter legend: B batch, S sequence, V vocab.
"""

from __future__ import annotations

import torch

from ringzero.errors import RingzeroError
from ringzero.model.precision import at_least_fp32


def _scaled_log_softmax(logits_BSV: torch.Tensor, temperature: float) -> torch.Tensor:
    if not temperature > 0:
        raise RingzeroError(f"temperature must be > 0 for log-probs (got {temperature}); greedy has none")
    # FP32 island: exp and the log-normaliser decide the importance ratio; bf16 logits are upcast first.
    logits = logits_BSV.to(at_least_fp32(logits_BSV.dtype))
    return torch.log_softmax(logits / temperature, dim=-1)


def token_logprobs(logits_BSV: torch.Tensor, targets_BS: torch.Tensor, temperature: float = 1.0):
    """``log p(target)`` per position ``[B, S]`` in fp32 (fp64 for fp64 logits)."""
    if targets_BS.shape != logits_BSV.shape[:-1]:
        raise RingzeroError(f"targets {tuple(targets_BS.shape)} do not match logits {tuple(logits_BSV.shape)}")
    logp_BSV = _scaled_log_softmax(logits_BSV, temperature)
    return logp_BSV.gather(-1, targets_BS.long().unsqueeze(-1)).squeeze(-1)


def entropy(logits_BSV: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Entropy of ``softmax(logits / temperature)`` per position ``[B, S]`` in fp32 (nats)."""
    logp_BSV = _scaled_log_softmax(logits_BSV, temperature)
    p_BSV = logp_BSV.exp()
    # Masked-out tokens (logit -inf) have p = 0 and log p = -inf; their term is 0, not NaN.
    return -(p_BSV * logp_BSV.masked_fill(p_BSV == 0, 0.0)).sum(-1)
