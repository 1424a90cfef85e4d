"""Multi-head Latent Attention (DeepSeek-V2/V3; Ling 2.5's full-attention layers).

Architecture choices of the layer (``MLAttention``):
- module names are Ling 2.5's: queries full-rank (``q_proj``) or low-rank
  ``q_b_proj(q_a_layernorm(q_a_proj(x)))`` when ``q_lora_rank`` is set; the output projection is ``dense``;
- one latent per token ``c_kv = RMSNorm(x W_dkv)`` of size r, and one RoPE key of size dr shared by all
  heads, both from ``kv_a_proj_with_mqa``; per-head up-projections ``W_uk [H, dn, r]`` and
  ``W_uv [H, dv, r]`` are views of ``kv_b_proj``'s weight (rows head-major, ``dn`` then ``dv``);
- score scale ``1/sqrt(dn + dr)``; RoPE at absolute positions. With ``rope_interleave`` (the Ling 2.5
  default) the projections store each rotary pair as neighbours ``(x[2i], x[2i+1])``; ``project`` reorders
  them to the rotate-half layout ``(x[i], x[i + dr/2])`` first, as the reference does. Both q and k are
  reordered the same way, so every score, the cache and the CP cores see one consistent layout;
- the RMSNorms of the latents use ``rms_norm_eps`` (SGLang's choice; the HF reference hard-codes 1e-6,
  equal to the default ``rms_norm_eps``);
- training runs the expanded form through the swappable ``core``; cached decoding of one token runs the
  absorbed form (``W_uk`` folded into the query, ``W_uv`` into the output) over the cache of
  ``[c_kv; k_rope]``, which costs more FLOPs per token but never materialises per-head keys;
- ``mla_attention_impl`` picks the attention function of the expanded form (training, and prefill
  chunks over a cache): ``explicit`` (default, the written-out softmax island) or ``sdpa``
  (``scaled_dot_product_attention``, fused kernels that never hold the ``[B, H, S, T]`` scores; the
  island is kept by casting q/k/v to fp32 before the call, see ``ringzero.model.attention``). The choice
  lives in the single-device ``MLACore``; ``parallelize`` hands it to the CP core that replaces it (the
  ``a2a`` core attends with the same impl; the ring core stays explicit, since merging key blocks needs
  the log-sum-exp). The absorbed decode step (one query) always runs the explicit function.

Letter legend: B batch, S new tokens, T cached tokens, H heads, D model, r kv_lora_rank,
n qk_nope_head_dim (dn), p qk_rope_head_dim (dr), v v_head_dim (dv).
"""

from __future__ import annotations

import torch
from torch import nn

from ringzero.model.attention import attention_fn, causal_attention
from ringzero.model.config import ModelConfig, PrecisionPolicy
from ringzero.model.norms import RMSNorm
from ringzero.model.rope import apply_rope, rope_cos_sin


def mla_expanded(
    q_nope_BSHn,
    q_rope_BSHp,
    c_kv_BTr,
    k_rope_BTp,
    w_uk_Hnr,
    w_uv_Hvr,
    q_pos,
    k_pos,
    scale: float,
    softmax_fp32: bool,
    impl: str = "explicit",
):
    """Up-project the latents to per-head keys/values and attend (the training form) with the attention
    function of ``impl`` (``explicit`` | ``sdpa``)."""
    H = q_nope_BSHn.shape[2]
    k_nope_BTHn = torch.einsum("btr,hnr->bthn", c_kv_BTr, w_uk_Hnr)
    v_BTHv = torch.einsum("btr,hvr->bthv", c_kv_BTr, w_uv_Hvr)
    k_rope_BTHp = k_rope_BTp[:, :, None].expand(-1, -1, H, -1)
    q = torch.cat([q_nope_BSHn, q_rope_BSHp], dim=-1)
    k = torch.cat([k_nope_BTHn, k_rope_BTHp], dim=-1)
    return attention_fn(impl)(q, k, v_BTHv, q_pos, k_pos, scale, softmax_fp32)


def mla_absorbed(
    q_nope_BSHn,
    q_rope_BSHp,
    c_kv_BTr,
    k_rope_BTp,
    w_uk_Hnr,
    w_uv_Hvr,
    q_pos,
    k_pos,
    scale: float,
    softmax_fp32: bool,
    latent_BTc=None,
):
    """Same result as ``mla_expanded``: ``q_nope . (W_uk c) = (q_nope W_uk) . c`` and the value
    up-projection commutes with the probability-weighted sum, so attention runs in latent space with one
    key/value head shared by all query heads. ``latent_BTc``, when given, is ``[c_kv; k_rope]`` already
    concatenated (the decode cache's layout): it spares copying the whole cache once per token."""
    q_lat_BSHr = torch.einsum("bshn,hnr->bshr", q_nope_BSHn, w_uk_Hnr)
    q = torch.cat([q_lat_BSHr, q_rope_BSHp], dim=-1)
    if latent_BTc is None:
        latent_BTc = torch.cat([c_kv_BTr, k_rope_BTp], dim=-1)
    k = latent_BTc[:, :, None]
    o_lat_BSHr = causal_attention(q, k, c_kv_BTr[:, :, None], q_pos, k_pos, scale, softmax_fp32)
    return torch.einsum("bshr,hvr->bshv", o_lat_BSHr, w_uv_Hvr)


class MLACore(nn.Module):
    """Single-device core (``parallelize`` swaps in a context-parallel one with the same call).

    ``impl`` (``explicit`` | ``sdpa``) is the attention function; it is the core's own choice, so the
    call every core shares is unchanged."""

    def __init__(self, impl: str = "explicit"):
        super().__init__()
        attention_fn(impl)  # refuse an unknown name at construction
        self.impl = impl

    def extra_repr(self) -> str:
        return f"impl={self.impl}"

    def forward(
        self,
        q_nope_BSHn,
        q_rope_BSHp,
        c_kv_BSr,
        k_rope_BSp,
        w_uk_Hnr,
        w_uv_Hvr,
        positions,
        scale: float,
        softmax_fp32: bool,
    ):
        return mla_expanded(
            q_nope_BSHn,
            q_rope_BSHp,
            c_kv_BSr,
            k_rope_BSp,
            w_uk_Hnr,
            w_uv_Hvr,
            positions,
            positions,
            scale,
            softmax_fp32,
            impl=self.impl,
        )


def deinterleave(x: torch.Tensor) -> torch.Tensor:
    """``[..., d]`` from pair-neighbour order ``(0, 1), (2, 3), ...`` to rotate-half order ``0, 2, 4, ..., 1,
    3, ...``."""
    return x.unflatten(-1, (-1, 2)).transpose(-1, -2).flatten(-2)


class MLAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, policy: PrecisionPolicy):
        super().__init__()
        self.num_attention_heads = cfg.num_attention_heads
        self.q_lora_rank, self.kv_lora_rank = cfg.q_lora_rank, cfg.kv_lora_rank
        self.nope_dim, self.rope_dim, self.v_dim = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
        self.rope_theta, self.rope_interleave = cfg.rope_theta, cfg.rope_interleave
        self.scale = (self.nope_dim + self.rope_dim) ** -0.5
        self.softmax_fp32 = policy.attention_softmax_fp32
        H, D = cfg.num_attention_heads, cfg.hidden_size
        q_out = H * (self.nope_dim + self.rope_dim)
        if cfg.q_lora_rank is None:
            self.q_proj = nn.Linear(D, q_out, bias=False)
        else:
            self.q_a_proj = nn.Linear(D, cfg.q_lora_rank, bias=False)
            self.q_a_layernorm = RMSNorm(cfg.q_lora_rank, cfg.rms_norm_eps)
            self.q_b_proj = nn.Linear(cfg.q_lora_rank, q_out, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(D, cfg.kv_lora_rank + self.rope_dim, bias=False)
        self.kv_a_layernorm = RMSNorm(cfg.kv_lora_rank, cfg.rms_norm_eps)
        self.kv_b_proj = nn.Linear(cfg.kv_lora_rank, H * (self.nope_dim + self.v_dim), bias=False)
        self.dense = nn.Linear(H * self.v_dim, D, bias=False)
        self.attention_impl = cfg.mla_attention_impl
        self.core = MLACore(cfg.mla_attention_impl)

    @property
    def latent_width(self) -> int:
        """Cached values per token: ``r + dr``."""
        return self.kv_lora_rank + self.rope_dim

    def up_weights(self):
        """``W_uk [H, dn, r]`` and ``W_uv [H, dv, r]`` as views of ``kv_b_proj.weight``."""
        w = self.kv_b_proj.weight.view(
            self.num_attention_heads, self.nope_dim + self.v_dim, self.kv_lora_rank
        )
        return w[:, : self.nope_dim], w[:, self.nope_dim :]

    def project(self, x_BSD: torch.Tensor, positions: torch.Tensor):
        """q_nope ``[B,S,H,dn]``, q_rope ``[B,S,H,dr]``, c_kv ``[B,S,r]``, k_rope ``[B,S,dr]`` (RoPE
        applied)."""
        B, S, _ = x_BSD.shape
        if self.q_lora_rank is None:
            q = self.q_proj(x_BSD)
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x_BSD)))
        q_nope, q_rope = q.view(B, S, self.num_attention_heads, -1).split(
            [self.nope_dim, self.rope_dim], dim=-1
        )
        c_kv, k_rope = self.kv_a_proj_with_mqa(x_BSD).split([self.kv_lora_rank, self.rope_dim], dim=-1)
        c_kv = self.kv_a_layernorm(c_kv)
        if self.rope_interleave:
            q_rope, k_rope = deinterleave(q_rope), deinterleave(k_rope)
        cos, sin = rope_cos_sin(positions, self.rope_dim, self.rope_theta, x_BSD.dtype)
        q_rope = apply_rope(q_rope, cos, sin)
        k_rope = apply_rope(k_rope[:, :, None], cos, sin)[:, :, 0]
        return q_nope, q_rope, c_kv, k_rope

    def forward(self, x_BSD, positions, cache=None, key_positions=None):
        """Parallel form through ``core`` without ``cache``; with an ``MLALayerCache`` the new latents are
        appended and the queries attend over the whole cache (``key_positions`` ``[B, T]``): the absorbed
        form for a single new token, the expanded form for a prefill chunk."""
        B, S, _ = x_BSD.shape
        q_nope, q_rope, c_kv, k_rope = self.project(x_BSD, positions)
        w_uk, w_uv = self.up_weights()
        if cache is None:
            o = self.core(q_nope, q_rope, c_kv, k_rope, w_uk, w_uv, positions, self.scale, self.softmax_fp32)
        else:
            latent_BTc = cache.append(torch.cat([c_kv, k_rope], dim=-1))
            c_all, k_rope_all = latent_BTc.split([self.kv_lora_rank, self.rope_dim], dim=-1)
            if S == 1:
                o = mla_absorbed(
                    q_nope,
                    q_rope,
                    c_all,
                    k_rope_all,
                    w_uk,
                    w_uv,
                    positions,
                    key_positions,
                    self.scale,
                    self.softmax_fp32,
                    latent_BTc=latent_BTc,
                )
            else:
                o = mla_expanded(
                    q_nope,
                    q_rope,
                    c_all,
                    k_rope_all,
                    w_uk,
                    w_uv,
                    positions,
                    key_positions,
                    self.scale,
                    self.softmax_fp32,
                    impl=self.attention_impl,
                )
        return self.dense(o.reshape(B, S, self.num_attention_heads * self.v_dim))
