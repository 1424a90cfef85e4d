"""HybridLM: the Ling 2.5 / Ring 2.5 decoder (``BailingMoeV2_5ForCausalLM``) as single-device code.

Architecture choices:
- token embedding, no absolute position embedding: positions enter only through RoPE, as *absolute*
  indices passed in (a context-parallel shard passes its global positions);
- layer pattern from ``ModelConfig.layer_types()``: the reference's rule (MLA iff
  ``(l + 1) % layer_group_size == 0`` or past the last whole group), or for tests all-MLA, all-Lightning
  or an explicit M/L string;
- pre-norm residual blocks: ``x + attention(RMSNorm(x))``, then ``x + mlp(RMSNorm(x))`` where the MLP is
  a dense SwiGLU or, from ``first_k_dense_replace`` on when ``num_experts`` is set, the MoE of ``moe.py``;
- module names follow the reference, so a state-dict key is the checkpoint's tensor name without its
  ``model.`` prefix (``ringzero.model.hf_format``);
- final RMSNorm and an LM head, untied or tied to the embedding; no biases anywhere;
- precision from one ``PrecisionPolicy``: parameters and activations in the body dtype, the attention
  softmax island in ``attention.py``, the LM-head island here (normed hidden state, head weight and
  logits in fp32); RMSNorm statistics and the Lightning state are always at least fp32.

Letter legend: B batch, S sequence, D hidden_size, V vocab.
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
from ringzero.model.moe import MoE
from ringzero.model.norms import RMSNorm
from ringzero.model.precision import at_least_fp32, body_dtype, state_dtype
from ringzero.model.rope import shared_tables


class Block(nn.Module):
    """One decoder layer; module names are Ling 2.5's (``input_layernorm``, ``attention``, ...)."""

    def __init__(self, cfg: ModelConfig, layer_idx: int, kind: str, policy: PrecisionPolicy):
        super().__init__()
        self.kind = kind
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        attn_cls = MLAttention if kind == "mla" else LightningAttention
        self.attention = attn_cls(cfg, layer_idx, policy)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MoE(cfg) if cfg.is_moe_layer(layer_idx) else SwiGLU(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, x_BSD, positions, cache=None, key_positions=None):
        x_BSD = x_BSD + self.attention(self.input_layernorm(x_BSD), positions, cache, key_positions)
        return x_BSD + self.mlp(self.post_attention_layernorm(x_BSD))


class HybridLM(nn.Module):
    def __init__(self, cfg: ModelConfig, policy: PrecisionPolicy):
        super().__init__()
        self.cfg, self.policy = cfg, policy
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Block(cfg, i, kind, policy) for i, kind in enumerate(cfg.layer_types()))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = (
            None if cfg.tie_word_embeddings else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        )
        self._head_cast: tuple | None = None  # (key, source alias, cast weight): see head_weight_as
        self.reset_parameters()
        self.to(body_dtype(policy))

    @torch.no_grad()
    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """Normal(0, initializer_range) matrices; output projections of each residual branch scaled by
        ``1/sqrt(2 num_hidden_layers)`` so the residual stream's variance does not grow with depth; norms at
        1."""
        std = self.cfg.initializer_range
        for name, p in self.named_parameters():
            if p.dim() == 1:
                p.fill_(1.0)
                continue
            residual_out = name.endswith(("dense.weight", "down_proj.weight"))
            scale = 1 / math.sqrt(2 * self.cfg.num_hidden_layers) if residual_out else 1.0
            p.copy_(torch.randn(p.shape, generator=generator, dtype=torch.float64) * std * scale)

    @property
    def head_weight(self) -> torch.Tensor:
        return self.word_embeddings.weight if self.lm_head is None else self.lm_head.weight

    def head_weight_as(self, dtype: torch.dtype) -> torch.Tensor:
        """The head weight in ``dtype``; inside ``torch.inference_mode()`` the cast is kept between calls.

        A decoding step feeds one token per row, so a fresh ``[V, D]`` fp32 copy per step costs more than
        the step's head matmul. Only inference mode keeps it: autograd must reach the weight itself, and
        no-grad scoring runs the head over thousands of tokens per cast. The key is the weight's storage
        and version counter (bumped by ``copy_``, ``load_state_dict``, optimizer steps); the alias held
        with it keeps the old storage alive, so a replaced weight can never reuse its address.
        Writes through ``.data`` bypass the version counter and are not seen.
        """
        w = self.head_weight
        if w.dtype == dtype or not torch.is_inference_mode_enabled():
            return w.to(dtype)
        key = (w.data_ptr(), w._version, w.shape, w.device, dtype)
        if self._head_cast is None or self._head_cast[0] != key:
            self._head_cast = (key, w.detach(), w.detach().to(dtype))
        return self._head_cast[2]

    def new_cache(self, batch_size: int, capacity: int | None = None) -> DecodeCache:
        """An empty cache for ``batch_size`` rows; ``capacity`` is the columns preallocated (grows if
        exceeded)."""
        device = self.word_embeddings.weight.device
        cap = capacity or min(self.cfg.max_position_embeddings, 256)
        layers = []
        for block in self.layers:
            a = block.attention
            if block.kind == "mla":
                layers.append(MLALayerCache(batch_size, a.latent_width, body_dtype(self.policy), device, cap))
            else:
                layers.append(
                    LightningLayerCache(
                        batch_size,
                        a.num_attention_heads,
                        a.head_dim,
                        a.head_dim,
                        state_dtype(self.policy),
                        device,
                    )
                )
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
        x = self.word_embeddings(input_ids_BS)
        with shared_tables():
            for i, block in enumerate(self.layers):
                x = block(x, positions, None if cache is None else cache.layers[i], key_positions)
        return x

    def logits(self, hidden_BSD: torch.Tensor) -> torch.Tensor:
        if self.policy.lm_head_fp32:
            # FP32 island (the paper's fix): logits feed the softmax whose ratio RL exponentiates; a bf16
            # head rounds them to ~3 significant digits. Upcast normed state and weight, keep logits fp32.
            h = self.norm(hidden_BSD, out_dtype=at_least_fp32(hidden_BSD.dtype))
            return F.linear(h, self.head_weight_as(h.dtype))
        return F.linear(self.norm(hidden_BSD), self.head_weight)

    def forward(self, input_ids_BS, positions=None, cache: DecodeCache | None = None) -> torch.Tensor:
        """Logits ``[B, S, V]``.

        ``positions``: absolute indices, ``[S]`` or per row ``[B, S]`` (negative = padding); default
        ``0..S-1``, or with a ``cache`` each row's next positions. With a cache the tokens are appended
        to it (a prefill chunk or one decode step) and attend to everything cached before them.
        """
        return self.logits(self.hidden(input_ids_BS, positions, cache))
