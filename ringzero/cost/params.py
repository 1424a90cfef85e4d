"""Parameters of a Ling 2.5 model from its config, by the modules ``HybridLM`` builds (``model.hybrid``):

- embedding ``V x D``; LM head ``D x V`` unless tied; final norm ``D``;
- per layer two RMSNorms (``2 D``), then attention:
  - MLA: ``q`` (``D x H(dn + dr)``, or ``D x rq + rq + rq x H(dn + dr)`` with a q LoRA), ``kv_a``
    ``D x (r + dr)`` and its norm ``r``, ``kv_b`` ``r x H(dn + dv)``, output ``H dv x D``;
  - Lightning: ``qkv`` ``D x 3 H d``, q/k norms ``2 d`` (with ``use_qk_norm``), gate ``D x H d``, group norm
    ``H d``, output ``H d x D``;
- then the MLP: dense SwiGLU ``3 D I``; or, from ``first_k_dense_replace`` on, the router ``E x D`` (its
  expert bias is a buffer, not a parameter), ``E`` routed experts of ``3 D Im`` and one shared SwiGLU of
  ``3 D (Im x shared)``.

``active`` counts what one token's forward computes with: everything but the ``E - k`` routed experts it is
not sent to, and but the embedding table (a row lookup, no arithmetic: the published active counts leave it
out; Ring-2.5-1T's 63B is met this way, ``tests/cost``).

Letter legend: D hidden, V vocab, H heads, dn / dr / dv MLA nope / rope / value head dims, r kv LoRA rank,
rq q LoRA rank, d Lightning head dim, I dense intermediate, Im expert intermediate, E experts, k top-k.
"""

from __future__ import annotations

from dataclasses import dataclass

from ringzero.model.config import ModelConfig


@dataclass(frozen=True)
class LayerParams:
    kind: str  # mla | lightning
    norms: int
    attention: int
    dense_mlp: int
    router: int
    expert: int  # one routed expert
    experts: int  # routed experts on this layer
    shared: int

    @property
    def total(self) -> int:
        return (
            self.norms
            + self.attention
            + self.dense_mlp
            + self.router
            + self.experts * self.expert
            + self.shared
        )

    def active(self, top_k: int) -> int:
        return self.total - (self.experts - min(top_k, self.experts)) * self.expert


@dataclass(frozen=True)
class ParamCount:
    embedding: int
    head: int  # 0 when tied
    final_norm: int
    layers: tuple[LayerParams, ...]
    top_k: int

    @property
    def total(self) -> int:
        return self.embedding + self.head + self.final_norm + sum(layer.total for layer in self.layers)

    @property
    def active(self) -> int:
        return self.head + self.final_norm + sum(layer.active(self.top_k) for layer in self.layers)

    @property
    def routed(self) -> int:
        """Parameters in routed experts (what expert parallelism splits)."""
        return sum(layer.experts * layer.expert for layer in self.layers)


def attention_params(cfg: ModelConfig, kind: str) -> int:
    D, H = cfg.hidden_size, cfg.num_attention_heads
    if kind == "mla":
        dn, dr, dv, r = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim, cfg.kv_lora_rank
        q_out = H * (dn + dr)
        q = (
            D * q_out
            if cfg.q_lora_rank is None
            else D * cfg.q_lora_rank + cfg.q_lora_rank + cfg.q_lora_rank * q_out
        )
        return q + D * (r + dr) + r + r * H * (dn + dv) + H * dv * D
    inner = H * cfg.head_dim
    qk_norms = 2 * cfg.head_dim if cfg.use_qk_norm else 0
    return D * 3 * inner + qk_norms + D * inner + inner + inner * D


def count(cfg: ModelConfig) -> ParamCount:
    D = cfg.hidden_size
    layers = []
    for i, kind in enumerate(cfg.layer_types()):
        moe = cfg.is_moe_layer(i)
        layers.append(
            LayerParams(
                kind=kind,
                norms=2 * D,
                attention=attention_params(cfg, kind),
                dense_mlp=0 if moe else 3 * D * cfg.intermediate_size,
                router=cfg.num_experts * D if moe else 0,
                expert=3 * D * cfg.moe_intermediate_size if moe else 0,
                experts=cfg.num_experts if moe else 0,
                shared=3 * D * cfg.moe_intermediate_size * (cfg.num_shared_experts or 0) if moe else 0,
            )
        )
    return ParamCount(
        embedding=cfg.vocab_size * D,
        head=0 if cfg.tie_word_embeddings else D * cfg.vocab_size,
        final_norm=D,
        layers=tuple(layers),
        top_k=cfg.num_experts_per_tok if cfg.num_experts else 0,
    )


def attention_flops(cfg: ModelConfig, context: float) -> float:
    """Forward FLOPs of one token's attention against ``context`` earlier ones: MLA ``2 H (dn + dr + dv)``
    a context token, Lightning ``4 H d^2`` whatever the context (its state)."""
    kinds = cfg.layer_types()
    H = cfg.num_attention_heads
    mla = (
        kinds.count("mla") * 2 * H * (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim + cfg.v_head_dim) * context
    )
    return mla + kinds.count("lightning") * 4 * H * cfg.head_dim * cfg.head_dim
