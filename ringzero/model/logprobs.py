"""Per-token log-probabilities and entropy from logits, in fp32: what the RL loss and the rollout engine read.

Convention (SGLang's): log-softmax of ``logits / temperature`` over the full vocabulary, before any
top-p/top-k renormalisation. Letter legend: B batch, S sequence, D model width, V vocab, N = B*S.

At real sizes the whole ``[B, S, V]`` fp32 tensor does not fit (vocab 157k at 32k tokens is 20 GB per
copy, and log-softmax keeps several). ``chunked_token_logprobs`` takes the hidden states and the LM head
instead of logits and runs head + log-softmax over at most ``chunk_tokens`` positions at a time. With
gradients on, each chunk is wrapped in ``torch.utils.checkpoint`` (non-reentrant): only the chunk's
hidden states are kept, and backward recomputes that chunk's logits, so peak memory is one chunk's
``[chunk, V]`` working set, never ``[N, V]``. The per-position arithmetic is the unchunked functions'
own, so the values agree with ``token_logprobs(head(hidden))`` (bitwise on the CPU kernels tested).
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

from ringzero.errors import RingzeroError
from ringzero.model.precision import at_least_fp32


def scaled_log_softmax(logits_BSV: torch.Tensor, temperature: float) -> torch.Tensor:
    if not temperature > 0:
        raise RingzeroError(f"temperature must be > 0 for log-probs (got {temperature}); greedy has none")
    # FP32 island: exp and the log-normaliser decide the importance ratio; bf16 logits are upcast first.
    logits = logits_BSV.to(at_least_fp32(logits_BSV.dtype))
    return torch.log_softmax(logits / temperature, dim=-1)


def token_logprobs(logits_BSV: torch.Tensor, targets_BS: torch.Tensor, temperature: float = 1.0):
    """``log p(target)`` per position ``[B, S]`` in fp32 (fp64 for fp64 logits)."""
    if targets_BS.shape != logits_BSV.shape[:-1]:
        raise RingzeroError(
            f"targets {tuple(targets_BS.shape)} do not match logits {tuple(logits_BSV.shape)}"
        )
    logp_BSV = scaled_log_softmax(logits_BSV, temperature)
    return logp_BSV.gather(-1, targets_BS.long().unsqueeze(-1)).squeeze(-1)


def entropy(logits_BSV: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Entropy of ``softmax(logits / temperature)`` per position ``[B, S]`` in fp32 (nats)."""
    logp_BSV = scaled_log_softmax(logits_BSV, temperature)
    p_BSV = logp_BSV.exp()
    # Masked-out tokens (logit -inf) have p = 0 and log p = -inf; their term is 0, not NaN.
    return -(p_BSV * logp_BSV.masked_fill(p_BSV == 0, 0.0)).sum(-1)


DEFAULT_CHUNK_TOKENS = 4096


def _chunk_logprobs(head, hidden_1nD, targets_1n, temperature: float, with_entropy: bool):
    logits_1nV = head(hidden_1nD)
    logp_1n = token_logprobs(logits_1nV, targets_1n, temperature)
    if not with_entropy:
        return logp_1n, None
    with torch.no_grad():
        return logp_1n, entropy(logits_1nV, temperature)


def chunked_token_logprobs(
    head,
    hidden_BSD: torch.Tensor,
    targets_BS: torch.Tensor,
    temperature: float = 1.0,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    with_entropy: bool = False,
):
    """``(log p(target) [B, S], entropy [B, S] or None)``, the LM head run over chunks of positions.

    ``head`` maps hidden states ``[B', s, D]`` to logits ``[B', s, V]`` (e.g. ``HybridLM.logits``, which
    applies the final norm and the LM-head island); it must act on each position independently. The
    ``B*S`` positions are flattened and processed ``chunk_tokens`` at a time (the last chunk may be
    shorter). When gradients are enabled each chunk is checkpointed, so no chunk's logits or
    log-softmax stay alive for backward; gradients flow to ``hidden_BSD`` and the head's parameters.
    Entropy, when asked for, carries no gradient. Output dtype: fp32 (fp64 for fp64 logits).
    """
    if not temperature > 0:
        raise RingzeroError(f"temperature must be > 0 for log-probs (got {temperature}); greedy has none")
    if chunk_tokens < 1:
        raise RingzeroError(f"chunk_tokens must be >= 1 (got {chunk_tokens})")
    if hidden_BSD.dim() != 3 or targets_BS.shape != hidden_BSD.shape[:2]:
        raise RingzeroError(
            f"targets {tuple(targets_BS.shape)} do not match hidden {tuple(hidden_BSD.shape)}"
        )
    B, S, D = hidden_BSD.shape
    N = B * S
    if N <= chunk_tokens:  # one chunk: the unchunked call itself (nothing to save by checkpointing)
        return _chunk_logprobs(head, hidden_BSD, targets_BS, temperature, with_entropy)
    hidden_1ND = hidden_BSD.reshape(1, N, D)
    targets_1N = targets_BS.reshape(1, N)
    track = torch.is_grad_enabled()
    logps, ents = [], []
    for start in range(0, N, chunk_tokens):
        h = hidden_1ND[:, start : start + chunk_tokens]
        t = targets_1N[:, start : start + chunk_tokens]
        if track:
            logp, ent = checkpoint(
                _chunk_logprobs, head, h, t, temperature, with_entropy, use_reentrant=False
            )
        else:
            logp, ent = _chunk_logprobs(head, h, t, temperature, with_entropy)
        logps.append(logp)
        ents.append(ent)
    logp_BS = torch.cat(logps, dim=1).view(B, S)
    return logp_BS, (torch.cat(ents, dim=1).view(B, S) if with_entropy else None)
