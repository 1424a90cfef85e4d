"""Causal softmax attention over absolute positions: the pure function every MLA core is built on.

Letter legend: B batch, Q query tokens, K key tokens, H heads, D q/k dim, E value dim.

Visibility follows positions, not array order: key j is visible to query i iff ``0 <= k_pos[j] <=
q_pos[i]``. A negative position marks a padding token (left-padded batches), which is never visible. A
query that sees no key at all (padding rows, or a context-parallel step whose keys all lie in the future)
gets a zero output and ``lse = -inf``, so partial results merge by log-sum-exp without NaNs.

Two implementations of the same function, chosen by ``ModelConfig.mla_attention_impl``:

- ``explicit`` (``causal_attention``): scores, mask, softmax and the weighted sum written out. It keeps
  the ``[B, H, Q, K]`` scores and probabilities alive for backward, and it is the only one that can
  return the log-sum-exp (the context-parallel cores merge partial results with it).
- ``sdpa`` (``sdpa_causal_attention``): ``torch.nn.functional.scaled_dot_product_attention``, which
  picks a fused kernel (flash / memory-efficient on CUDA, a blocked flash kernel on CPU) that never
  materialises the scores: O(Q) memory per head instead of O(Q K).

How ``sdpa`` keeps the FP32 island. It does not rely on what a kernel does inside: under
``softmax_fp32`` q, k and v are cast to the island dtype (fp32, or fp64 for fp64 inputs) *before* the
call, exactly as the explicit path casts them, and the output is cast back to q's dtype after, so the
scores, the exp/normaliser and the probability-weighted sum all run in fp32 whatever kernel is picked.
This matters on CUDA: the flash kernels keep the running max/sum in fp32 for bf16 inputs, but round the
probabilities to bf16 before the ``P V`` product, so a bf16 call would only half satisfy the island.
Without ``softmax_fp32`` (the ``bf16`` preset) the call runs in the body dtype and the precision is the
kernel's. Verified on torch 2.13 CPU (``tests/model/test_model_sdpa.py``, docs/bench/memory.md): for
bf16 inputs both the math fallback and the CPU flash kernel upcast to fp32 internally (their error
against fp64 equals the explicit island's, not the plain bf16 path's); fully masked rows give zeros
with finite gradients there, but this path does not depend on it (see below).

Masks on the ``sdpa`` path: when q and k share one ``[Q]`` position vector that is non-negative and
strictly increasing (the training and prefill case), visibility is plain ``j <= i`` and the call uses
``is_causal`` with no mask tensor. Anything else (per-row ``[B, Q]`` positions, negative = padding, key
positions of a decode cache, K longer than Q) passes the boolean ``visible_mask`` (``[B, 1, Q, K]``,
one byte per pair, the explicit path builds the same). Rows that see no key are given all keys inside
the kernel and their output is then set to 0, so no kernel ever sees an empty row. When the value
width differs from the q/k width (MLA: ``dv`` vs ``dn + dr``), the narrower side is zero-padded to the
wider for the call (zero columns add nothing to ``q . k`` and the extra output columns are sliced off):
flash kernels need equal widths. The scale is always passed explicitly, so padding does not change it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ringzero.model.precision import at_least_fp32

ATTENTION_IMPLS = ("explicit", "sdpa")


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
    """``softmax(q k^T * scale + mask) v`` with q ``[B, Q, H, D]``, k ``[B, K, H|1, D]``, v ``[B, K, H|1,
    E]``.

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


def _plain_causal(q_pos: torch.Tensor, k_pos: torch.Tensor) -> bool:
    """True when visibility is ``j <= i``: one shared ``[Q]`` position vector, >= 0, strictly increasing."""
    if q_pos.dim() != 1 or k_pos.dim() != 1 or q_pos.shape != k_pos.shape:
        return False
    if q_pos is not k_pos and not torch.equal(q_pos, k_pos):
        return False
    return bool((q_pos[:1] >= 0).all()) and bool((q_pos[1:] > q_pos[:-1]).all())


def sdpa_causal_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
    scale: float,
    softmax_fp32: bool,
    return_lse: bool = False,
):
    """``causal_attention`` through ``scaled_dot_product_attention`` (same call, same result within the
    dtype's tolerance); see the module docstring for the island, the masks and the value padding.
    The log-sum-exp is not available here (``return_lse`` is refused)."""
    if return_lse:
        raise ValueError("the sdpa path does not return the log-sum-exp; use causal_attention")
    compute = at_least_fp32(q.dtype) if softmax_fp32 else q.dtype
    H, D, E = q.shape[2], q.shape[3], v.shape[3]
    # SDPA's layout is [B, H, L, D]; a shared key/value head is expanded (a view, no copy).
    # Equal widths for the fused kernels: zero columns add nothing to q.k nor to the output kept.
    W = max(D, E)
    q_c, k_c, v_c = q.to(compute), k.to(compute).expand(-1, -1, H, -1), v.to(compute).expand(-1, -1, H, -1)
    if D < W:
        q_c, k_c = F.pad(q_c, (0, W - D)), F.pad(k_c, (0, W - D))
    if E < W:
        v_c = F.pad(v_c, (0, W - E))
    q_BHQD, k_BHKD, v_BHKD = q_c.transpose(1, 2), k_c.transpose(1, 2), v_c.transpose(1, 2)
    q_pos, k_pos = q_pos.to(q.device), k_pos.to(q.device)
    if _plain_causal(q_pos, k_pos):
        o_BHQW = F.scaled_dot_product_attention(q_BHQD, k_BHKD, v_BHKD, is_causal=True, scale=scale)
        empty_B1Q1 = None
    else:
        visible_B1QK = visible_mask(q_pos, k_pos)[:, None]
        empty_B1Q1 = ~visible_B1QK.any(-1, keepdim=True)
        o_BHQW = F.scaled_dot_product_attention(
            q_BHQD, k_BHKD, v_BHKD, attn_mask=visible_B1QK | empty_B1Q1, scale=scale
        )
    o_BQHE = o_BHQW.transpose(1, 2)[..., :E]
    if empty_B1Q1 is not None:
        o_BQHE = o_BQHE.masked_fill(empty_B1Q1.transpose(1, 2), 0.0)
    return o_BQHE.to(q.dtype)


def attention_fn(impl: str):
    """The attention function of ``impl`` (``explicit`` or ``sdpa``); both have ``causal_attention``'s
    call."""
    if impl == "explicit":
        return causal_attention
    if impl == "sdpa":
        return sdpa_causal_attention
    raise ValueError(f"unknown attention impl {impl!r}; choose one of {ATTENTION_IMPLS}")
