"""Slow, plainly written fp64 references for the CP tests (deliberately not the model's functions).

Letter legend: B batch, S sequence, H heads, D q/k dim, E value dim.
"""

from __future__ import annotations

import torch


def softmax_attention(q_BSHD, k_BSHD, v_BSHE, pos_BS, scale):
    """Causal softmax attention, one query row at a time: key j is visible to query i iff
    ``0 <= pos[j] <= pos[i]``; a row with no visible key outputs zeros."""
    B, S, H, _ = q_BSHD.shape
    out = torch.zeros(B, S, H, v_BSHE.shape[-1], dtype=torch.float64)
    for b in range(B):
        for i in range(S):
            keys = [j for j in range(S) if 0 <= pos_BS[b, j] <= pos_BS[b, i]]
            if not keys:
                continue
            scores_HK = torch.einsum("hd,khd->hk", q_BSHD[b, i], k_BSHD[b, keys]) * scale
            out[b, i] = torch.einsum("hk,khe->he", torch.softmax(scores_HK, dim=-1), v_BSHE[b, keys])
    return out


def mla_core(q_nope, q_rope, c_kv, k_rope, w_uk, w_uv, pos_BS, scale):
    """MLA training form: per-head keys/values up-projected from the latent, shared RoPE key."""
    H = q_nope.shape[2]
    k = torch.cat([torch.einsum("bsr,hnr->bshn", c_kv, w_uk), k_rope[:, :, None].expand(-1, -1, H, -1)], -1)
    v = torch.einsum("bsr,hvr->bshv", c_kv, w_uv)
    return softmax_attention(torch.cat([q_nope, q_rope], -1), k, v, pos_BS, scale)


def decayed_linear_attention(q_BSHD, k_BSHD, v_BSHE, log_decay_H):
    """The recurrence itself: ``S_t = exp(log_decay) S_{t-1} + k_t^T v_t``, ``o_t = q_t S_t``."""
    B, S, H, D = q_BSHD.shape
    state = torch.zeros(B, H, D, v_BSHE.shape[-1], dtype=torch.float64)
    decay = torch.exp(log_decay_H)[None, :, None, None]
    outs = []
    for t in range(S):
        state = decay * state + k_BSHD[:, t, :, :, None] * v_BSHE[:, t, :, None, :]
        outs.append(torch.einsum("bhd,bhde->bhe", q_BSHD[:, t], state))
    return torch.stack(outs, dim=1)
