"""HybridLM: a decoder-only stack of MLA and Lightning-attention layers (Ling 2.5 layout).

Architecture choices:
- token embedding, no absolute position embedding: positions enter only through RoPE, as *absolute*
  indices passed in (a context-parallel shard passes its global positions);
- layer pattern from ``ModelConfig.layer_types()``: hybrid (MLA iff ``(l + 1) % mla_every == 0``),
  all-MLA, all-Lightning, or an explicit M/L string;
- pre-norm residual blocks: ``x + attn(RMSNorm(x))``, then ``x + SwiGLU(RMSNorm(x))``;
- final RMSNorm and an LM head, untied or tied to the embedding; no biases anywhere;
- precision from one ``PrecisionPolicy``: parameters and activations in the body dtype, the attention
  softmax island in ``attention.py``, the LM-head island here (normed hidden state, head weight and
  logits in fp32); RMSNorm statistics and the Lightning state are always at least fp32.

Letter legend: B batch, S sequence, D d_model, V vocab.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ringzero.model.cache import DecodeCache, LightningLayerCache, MLALayerCache
from ringzero.model.config import ModelConfig, PrecisionPolicy
from ringzero.model.lightning import LightningAttention
from ringzero.model.mla import MLAttention
from ringzero.model.mlp import SwiGLU
from ringzero.model.norms import RMSNorm
from ringzero.model.precision import at_least_fp32, body_dtype, state_dtype


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, kind: str, policy: PrecisionPolicy):
        super().__init__()
        self.kind = kind
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        attn_cls = MLAttention if kind == "mla" else LightningAttention
        self.attn = attn_cls(cfg, layer_idx, policy)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = SwiGLU(cfg.d_model, cfg.mlp_hidden)

    def forward(self, x_BSD, positions, cache=None, key_positions=None):
        x_BSD = x_BSD + self.attn(self.attn_norm(x_BSD), positions, cache, key_positions)
        return x_BSD + self.mlp(self.mlp_norm(x_BSD))


class HybridLM(nn.Module):
    def __init__(self, cfg: ModelConfig, policy: PrecisionPolicy):
        super().__init__()
        self.cfg, self.policy = cfg, policy
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(
            Block(cfg, i, kind, policy) for i, kind in enumerate(cfg.layer_types())
        )
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = None if cfg.tie_embeddings else nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.reset_parameters()
        self.to(body_dtype(policy))

    @torch.no_grad()
    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """Normal(0, init_std) matrices; output projections of each residual branch scaled by
        ``1/sqrt(2 n_layers)`` so the residual stream's variance does not grow with depth; norms at 1."""
        std = self.cfg.init_std
        for name, p in self.named_parameters():
            if p.dim() == 1:
                p.fill_(1.0)
                continue
            residual_out = name.endswith(("o_proj.weight", "down_proj.weight"))
            scale = 1 / math.sqrt(2 * self.cfg.n_layers) if residual_out else 1.0
            p.copy_(torch.randn(p.shape, generator=generator, dtype=torch.float64) * std * scale)

    @property
    def head_weight(self) -> torch.Tensor:
        return self.embed.weight if self.lm_head is None else self.lm_head.weight

    def new_cache(self, batch_size: int, capacity: int | None = None) -> DecodeCache:
        """An empty cache for ``batch_size`` rows; ``capacity`` is the columns preallocated (grows if exceeded)."""
        device = self.embed.weight.device
        cap = capacity or min(self.cfg.max_seq_len, 256)
        layers = []
        for block in self.layers:
            a = block.attn
            if block.kind == "mla":
                layers.append(MLALayerCache(batch_size, a.latent_width, body_dtype(self.policy), device, cap))
            else:
                layers.append(LightningLayerCache(batch_size, a.n_heads, a.head_dim, a.head_dim,
                                                  state_dtype(self.policy), device))
        return DecodeCache(layers, batch_size, device, cap)

    def hidden(self, input_ids_BS, positions=None, cache: DecodeCache | None = None) -> torch.Tensor:
        """Residual stream after the last block (before the final norm)."""
        B, S = input_ids_BS.shape
        device = input_ids_BS.device
        key_positions = None
        if positions is None:
            start = cache.next_positions()[:, None] if cache is not None else 0
            positions = start + torch.arange(S, device=device)
        positions = positions.to(device)
        if cache is not None:
            if positions.dim() == 1:
                positions = positions[None].expand(B, S)
            key_positions = cache.append_positions(positions)
        x = self.embed(input_ids_BS)
        for i, block in enumerate(self.layers):
            x = block(x, positions, None if cache is None else cache.layers[i], key_positions)
        return x

    def logits(self, hidden_BSD: torch.Tensor) -> torch.Tensor:
        if self.policy.lm_head_fp32:
            # FP32 island (the paper's fix): logits feed the softmax whose ratio RL exponentiates; a bf16
            # head rounds them to ~3 significant digits. Upcast normed state and weight, keep logits fp32.
            h = self.norm(hidden_BSD, out_dtype=at_least_fp32(hidden_BSD.dtype))
            return F.linear(h, self.head_weight.to(h.dtype))
        return F.linear(self.norm(hidden_BSD), self.head_weight)

    def forward(self, input_ids_BS, positions=None, cache: DecodeCache | None = None) -> torch.Tensor:
        """Logits ``[B, S, V]``.

        ``positions``: absolute indices, ``[S]`` or per row ``[B, S]`` (negative = padding); default
        ``0..S-1``, or with a ``cache`` each row's next positions. With a cache the tokens are appended
        to it (a prefill chunk or one decode step) and attend to everything cached before them.
        """
        return self.logits(self.hidden(input_ids_BS, positions, cache))
