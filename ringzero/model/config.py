"""Typed architecture and precision configs of the model (no torch import here).

``ModelConfig`` is the Ling 2.5 / Ring 2.5 architecture (``BailingMoeV2_5ForCausalLM``) at any size. Its
architecture fields carry the names and meaning of that family's ``config.json`` keys, so a checkpoint's
``config.json`` is these fields plus the keys tools expect (``ringzero.model.hf_format``). Three fields are
ringzero's own and never reach ``config.json``'s Ling keys: ``layout`` (a layer pattern the reference
cannot express, used by tests and benchmarks), ``lightning_block_size`` and ``mla_attention_impl``
(how the training forward computes, not what it computes).

Values the reference accepts but ringzero does not implement are refused here, each with the reason,
instead of being carried silently.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from ringzero.strict_model import StrictModel


class ModelConfig(StrictModel):
    """Decoder-only hybrid of Lightning (linear) and MLA layers with a dense or MoE MLP.

    Layer pattern (``layout: hybrid``, the reference's rule): layer ``l`` is MLA iff
    ``(l + 1) % layer_group_size == 0``, or ``l`` lies past the last whole group (the HF reference's tail
    rule; SGLang instead requires ``num_hidden_layers % layer_group_size == 0``).
    """

    vocab_size: int = Field(64, ge=2)
    hidden_size: int = Field(128, ge=8)
    num_hidden_layers: int = Field(4, ge=1)
    num_attention_heads: int = Field(4, ge=1, description="heads of both layer kinds")
    layout: Literal["hybrid", "mla", "lightning"] | str = Field(
        "hybrid",
        description="ringzero's own: hybrid (the reference's rule) | mla | lightning, or an explicit "
        "string of M/L per layer, e.g. 'LLLM'; only hybrid exports as a Ling 2.5 checkpoint",
    )
    layer_group_size: int = Field(4, ge=1, description="one MLA layer closes each group of this many")
    # Lightning (linear-attention) layers
    head_dim: int = Field(32, ge=1, description="per-head q/k/v dim of the Lightning layers")
    use_qk_norm: bool = Field(True, description="RMSNorm on each q and k head of the Lightning layers")
    partial_rotary_factor: float = Field(0.5, ge=0.0, le=1.0, description="share of head_dim that gets RoPE")
    group_norm_size: int = Field(
        4, ge=1, description="groups of the Lightning output's RMSNorm (over H*head_dim)"
    )
    lightning_block_size: int = Field(
        64, ge=1, description="ringzero's own: block length of the training form"
    )
    # MLA layers
    q_lora_rank: int | None = Field(None, ge=1, description="low-rank query compression; null = full-rank q")
    kv_lora_rank: int = Field(32, ge=1, description="latent size r of c_kv (512 at scale)")
    qk_nope_head_dim: int = Field(32, ge=1, description="per-head non-RoPE query/key dim")
    qk_rope_head_dim: int = Field(16, ge=2, description="decoupled RoPE key dim, shared by all heads")
    v_head_dim: int = Field(32, ge=1, description="per-head value dim")
    rope_interleave: bool = Field(True, description="MLA RoPE pairs stored interleaved (x[2i], x[2i+1])")
    mla_attention_impl: Literal["explicit", "sdpa"] = Field(
        "explicit",
        description="ringzero's own: attention of the parallel form: explicit softmax island, or "
        "torch's scaled_dot_product_attention (island kept by fp32 inputs; see model/attention.py)",
    )
    rope_theta: float = Field(10000.0, gt=0, description="RoPE base of both layer kinds")
    # MLP: dense SwiGLU, or routed experts from layer first_k_dense_replace on
    intermediate_size: int = Field(352, ge=1, description="dense SwiGLU hidden width")
    num_experts: int | None = Field(
        None, ge=1, description="routed experts (at least 2); null = every MLP dense"
    )
    num_experts_per_tok: int = Field(2, ge=1)
    num_shared_experts: int | None = Field(
        1, ge=0, description="shared experts (one MLP of this many widths)"
    )
    moe_intermediate_size: int = Field(128, ge=1)
    first_k_dense_replace: int = Field(0, ge=0, description="layers below this index keep a dense MLP")
    n_group: int = Field(1, ge=1, description="expert groups of the grouped top-k")
    topk_group: int = Field(1, ge=1, description="groups kept per token")
    routed_scaling_factor: float = Field(1.0, gt=0)
    norm_topk_prob: bool = Field(True, description="renormalize the chosen experts' weights to sum 1")
    moe_router_enable_expert_bias: bool = Field(
        True, description="routing-only bias per expert (not trained)"
    )
    score_function: Literal["sigmoid"] = "sigmoid"
    router_dtype: Literal["fp32"] = "fp32"
    # the rest of the block
    tie_word_embeddings: bool = False
    max_position_embeddings: int = Field(512, ge=1)
    rms_norm_eps: float = Field(1e-6, gt=0)
    initializer_range: float = Field(0.02, gt=0)
    use_bias: bool = Field(False, description="refused when true: see _unsupported")
    use_qkv_bias: bool = Field(False, description="refused when true: see _unsupported")
    rope_scaling: dict | None = Field(None, description="refused unless null: see _unsupported")

    @field_validator("layout")
    @classmethod
    def _layout(cls, v: str) -> str:
        if v in ("hybrid", "mla", "lightning"):
            return v
        if not v or set(v) - {"M", "L"}:
            raise ValueError(f"must be hybrid, mla, lightning or a string of 'M'/'L' per layer (got {v!r})")
        return v

    @field_validator("qk_rope_head_dim")
    @classmethod
    def _even(cls, v: int) -> int:
        if v % 2:
            raise ValueError(f"must be even for rotary pairs (got {v})")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> ModelConfig:
        problems = []
        if self.layout not in ("hybrid", "mla", "lightning") and len(self.layout) != self.num_hidden_layers:
            problems.append(
                f"layout has {len(self.layout)} layer letters but num_hidden_layers is "
                f"{self.num_hidden_layers}"
            )
        rotary = self.head_dim * self.partial_rotary_factor
        if rotary != int(rotary) or int(rotary) % 2:
            problems.append(
                f"partial_rotary_factor * head_dim must be an even whole number of rotary dims "
                f"(got {self.partial_rotary_factor} * {self.head_dim} = {rotary:g})"
            )
        elif self.has_mla() and int(rotary) != self.qk_rope_head_dim:
            # The reference builds the MLA rotary table from head_dim * partial_rotary_factor, not from
            # qk_rope_head_dim: the two must agree or its MLA layers cannot run.
            problems.append(
                f"qk_rope_head_dim ({self.qk_rope_head_dim}) must equal head_dim * "
                f"partial_rotary_factor ({int(rotary)}): the Ling 2.5 reference sizes the MLA "
                f"rotary table from the latter"
            )
        inner = self.num_attention_heads * self.head_dim
        if inner % self.group_norm_size:
            problems.append(
                f"group_norm_size ({self.group_norm_size}) must divide num_attention_heads * "
                f"head_dim ({inner})"
            )
        if self.num_experts is not None:
            if self.num_experts % self.n_group:
                problems.append(f"n_group ({self.n_group}) must divide num_experts ({self.num_experts})")
            elif self.topk_group > self.n_group:
                problems.append(f"topk_group ({self.topk_group}) must be at most n_group ({self.n_group})")
            elif self.num_experts_per_tok > self.topk_group * (self.num_experts // self.n_group):
                problems.append(
                    f"num_experts_per_tok ({self.num_experts_per_tok}) exceeds the experts in the "
                    f"topk_group ({self.topk_group}) groups kept"
                )
            if self.num_experts // self.n_group < 2 and self.n_group > 1:
                problems.append("each expert group needs at least 2 experts (a group scores by its top two)")
        problems += self._unsupported()
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def _unsupported(self) -> list[str]:
        out = []
        if self.use_bias or self.use_qkv_bias:
            out.append(
                "use_bias / use_qkv_bias must be false: the HF reference and SGLang put the bias on "
                "different projections (SGLang biases query_key_value when either is set), so a biased "
                "checkpoint would not mean one model"
            )
        if self.num_experts == 1:
            out.append(
                "num_experts must be null for a dense model or at least 2: the HF reference reads 1 as a "
                "one-expert MoE and SGLang as dense"
            )
        if self.num_experts is not None and not self.moe_router_enable_expert_bias:
            out.append(
                "moe_router_enable_expert_bias must be true with experts: SGLang routes a sigmoid router "
                "only with its expert bias (without one it falls back to softmax routing)"
            )
        if self.rope_scaling is not None:
            out.append(
                "rope_scaling must be null: YaRN scaling (and its MLA softmax mscale) is not implemented"
            )
        return out

    def has_mla(self) -> bool:
        return "mla" in self.layer_types()

    @property
    def linear_rope_dim(self) -> int:
        """Leading dims of each Lightning q/k head that get RoPE; the rest carry no position."""
        return int(self.head_dim * self.partial_rotary_factor)

    def layer_types(self) -> list[str]:
        """'mla' or 'lightning' for each layer, in order."""
        n, g = self.num_hidden_layers, self.layer_group_size
        if self.layout == "mla":
            return ["mla"] * n
        if self.layout == "lightning":
            return ["lightning"] * n
        if self.layout == "hybrid":
            tail = n // g * g
            return ["mla" if (i + 1) % g == 0 or i >= tail else "lightning" for i in range(n)]
        return ["mla" if c == "M" else "lightning" for c in self.layout]

    def is_moe_layer(self, layer_idx: int) -> bool:
        return self.num_experts is not None and layer_idx >= self.first_k_dense_replace

    def reference_layout(self) -> bool:
        """True when the layer pattern is one the Ling 2.5 reference builds from ``layer_group_size``."""
        return (
            self.layout == "hybrid"
            or self.layer_types()
            == ModelConfig.model_validate({**self.model_dump(), "layout": "hybrid"}).layer_types()
        )


DTypeName = Literal["bfloat16", "float32", "float64"]

PRESETS: dict[str, dict] = {
    # The paper: BF16 body, FP32 where exponentiation happens (attention softmax, LM head / log-softmax).
    "fp32-islands": {"body": "bfloat16", "attention_softmax_fp32": True, "lm_head_fp32": True},
    "bf16": {"body": "bfloat16", "attention_softmax_fp32": False, "lm_head_fp32": False},
    "fp32": {"body": "float32", "attention_softmax_fp32": True, "lm_head_fp32": True},
    "fp64": {"body": "float64", "attention_softmax_fp32": False, "lm_head_fp32": False},
}


class PrecisionPolicy(StrictModel):
    """One object decides dtypes. Lightning recurrent state is always fp32 (or fp64 under an fp64 body).

    Accepts a preset name (``fp32-islands``, ``bf16``, ``fp32``, ``fp64``) or the explicit fields.
    """

    body: DTypeName = "bfloat16"
    attention_softmax_fp32: bool = True
    lm_head_fp32: bool = True

    @model_validator(mode="before")
    @classmethod
    def _preset(cls, data):
        if isinstance(data, str):
            if data not in PRESETS:
                raise ValueError(f"unknown precision preset {data!r}; choose one of {sorted(PRESETS)}")
            return dict(PRESETS[data])
        return data

    @classmethod
    def preset(cls, name: str) -> PrecisionPolicy:
        return cls.model_validate(name)

    def name(self) -> str:
        for key, fields in PRESETS.items():
            if self.model_dump() == fields:
                return key
        return f"{self.body}/softmax_fp32={self.attention_softmax_fp32}/lm_head_fp32={self.lm_head_fp32}"
