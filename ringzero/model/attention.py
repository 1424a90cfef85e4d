"""Causal softmax attention over absolute positions: the pure function every MLA core is built on.

Letter legend: B batch, Q query tokens, K key tokens, H heads, D q/k dim, E value dim.

Visibility follows positions, not array order: key j is visible to query i iff ``0 <= k_pos[j] <=
q_pos[i]``. A negative position marks a padding token (left-padded batches), which is never visible. A
query that sees no key at all (padding rows, or a context-parallel step whose keys all lie in the future)
gets a zero output and ``lse = -inf``, so partial results merge by log-sum-exp without NaNs.
"""

from __future__ import annotations

import torch

from ringzero.model.precision import at_least_fp32


def visible_mask(q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """``[B or 1, Q, K]`` bool: which keys each query may attend to (positions ``[Q]`` or ``[B, Q]``)."""
    q_pos = q_pos if q_pos.dim() == 2 else q_pos[None]
    k_pos = k_pos if k_pos.dim() == 2 else k_pos[None]
    return (k_pos[:, None, :] <= q_pos[:, :, None]) & (k_pos[:, None, :] >= 0)


def causal_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
    scale: float,
    softmax_fp32: bool,
    return_lse: bool = False,
):
    """``softmax(q k^T * scale + mask) v`` with q ``[B, Q, H, D]``, k ``[B, K, H|1, D]``, v ``[B, K, H|1, E]``.

    Returns o ``[B, Q, H, E]`` in q's dtype, and with ``return_lse`` also the log-sum-exp of the scaled,
    masked scores ``[B, Q, H]`` in at least fp32. A key/value head count of 1 is shared by all heads (MQA,
    as MLA's absorbed form needs).
    """
    # FP32 island (the paper's fix): scores, exp and the probability-weighted sum are where a bf16 body
    # loses the bits that the importance ratio later exponentiates; compute them in fp32, cast back after.
    compute = at_least_fp32(q.dtype) if softmax_fp32 else q.dtype
    qc, kc, vc = q.to(compute), k.to(compute), v.to(compute)
    if kc.shape[2] == 1:
        scores_BHQK = torch.einsum("bqhd,bkd->bhqk", qc, kc[:, :, 0]) * scale
    else:
        scores_BHQK = torch.einsum("bqhd,bkhd->bhqk", qc, kc) * scale
    visible_B1QK = visible_mask(q_pos.to(q.device), k_pos.to(q.device))[:, None]
    scores_BHQK = scores_BHQK.masked_fill(~visible_B1QK, float("-inf"))
    probs_BHQK = torch.softmax(scores_BHQK, dim=-1)
    # Rows with no visible key are all -inf and softmax gives NaN there; their output is defined as 0.
    probs_BHQK = probs_BHQK.masked_fill(~visible_B1QK.any(-1, keepdim=True), 0.0)
    if vc.shape[2] == 1:
        o_BQHE = torch.einsum("bhqk,bke->bqhe", probs_BHQK, vc[:, :, 0])
    else:
        o_BQHE = torch.einsum("bhqk,bkhe->bqhe", probs_BHQK, vc)
    o_BQHE = o_BQHE.to(q.dtype)
    if not return_lse:
        return o_BQHE
    lse_BHQ = torch.logsumexp(scores_BHQK.to(at_least_fp32(compute)), dim=-1)
    return o_BQHE, lse_BHQ.transpose(1, 2)
