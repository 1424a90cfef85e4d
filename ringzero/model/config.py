"""Typed architecture and precision configs of the hybrid model (no torch import here)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from ringzero.config.base import StrictModel


class MLAConfig(StrictModel):
    """Multi-head Latent Attention (DeepSeek-V2/V3 form)."""

    q_lora_rank: int | None = Field(None, ge=1, description="low-rank query compression; null = full-rank q")
    kv_lora_rank: int = Field(32, ge=1, description="latent size r of c_kv (512 at scale)")
    qk_nope_head_dim: int = Field(32, ge=1, description="per-head non-RoPE query/key dim")
    qk_rope_head_dim: int = Field(16, ge=2, description="decoupled RoPE key dim, shared by all heads")
    v_head_dim: int = Field(32, ge=1, description="per-head value dim")
    rope_theta: float = Field(10000.0, gt=0)
    attention_impl: Literal["explicit", "sdpa"] = Field(
        "explicit", description="attention of the parallel form: explicit softmax island, or torch's "
        "scaled_dot_product_attention (fused kernels, island kept by fp32 inputs; see model/attention.py)"
    )

    @field_validator("qk_rope_head_dim")
    @classmethod
    def _even(cls, v: int) -> int:
        if v % 2:
            raise ValueError(f"must be even for rotary pairs (got {v})")
        return v


class LightningConfig(StrictModel):
    """Lightning (decayed linear) attention as in MiniMax-01 / Ling 2.5."""

    head_dim: int = Field(32, ge=1, description="per-head q/k/v dim")
    block_size: int = Field(64, ge=1, description="block length of the block-parallel training form")
    output_gate: bool = Field(True, description="sigmoid output gate (Ling 2.5)")
    group_norm: bool = Field(True, description="per-head RMSNorm of the attention output (Ling 2.5)")
    qk_norm: bool = Field(True, description="RMSNorm on q and k per head")
    rope_fraction: float = Field(0.5, ge=0.0, le=1.0, description="share of head_dim that gets RoPE")
    rope_theta: float = Field(10000.0, gt=0)

    @model_validator(mode="after")
    def _rope_pairs(self) -> LightningConfig:
        dims = self.head_dim * self.rope_fraction
        if dims != int(dims) or int(dims) % 2:
            raise ValueError(
                f"rope_fraction * head_dim must be an even whole number of rotary dims "
                f"(got {self.rope_fraction} * {self.head_dim} = {dims:g})"
            )
        return self

    @property
    def rope_dim(self) -> int:
        """Leading dims of each q/k head that get RoPE; the rest carry no position."""
        return int(self.head_dim * self.rope_fraction)


class ModelConfig(StrictModel):
    """Decoder-only HybridLM. Layer l is MLA iff ``(l + 1) % mla_every == 0`` under ``layout: hybrid``."""

    vocab_size: int = Field(64, ge=2)
    d_model: int = Field(128, ge=8)
    n_layers: int = Field(4, ge=1)
    n_heads: int = Field(4, ge=1)
    layout: Literal["hybrid", "mla", "lightning"] | str = Field(
        "hybrid", description="hybrid | mla | lightning, or an explicit string of M/L per layer, e.g. 'LLLM'"
    )
    mla_every: int = Field(4, ge=1, description="hybrid layout: one MLA layer per group of this many")
    mla: MLAConfig = MLAConfig()
    lightning: LightningConfig = LightningConfig()
    mlp_hidden: int = Field(352, ge=1, description="SwiGLU hidden width")
    tie_embeddings: bool = False
    max_seq_len: int = Field(512, ge=1)
    norm_eps: float = Field(1e-6, gt=0)
    init_std: float = Field(0.02, gt=0)

    @field_validator("layout")
    @classmethod
    def _layout(cls, v: str) -> str:
        if v in ("hybrid", "mla", "lightning"):
            return v
        if not v or set(v) - {"M", "L"}:
            raise ValueError(f"must be hybrid, mla, lightning or a string of 'M'/'L' per layer (got {v!r})")
        return v

    @model_validator(mode="after")
    def _pattern_length(self) -> ModelConfig:
        if self.layout not in ("hybrid", "mla", "lightning") and len(self.layout) != self.n_layers:
            raise ValueError(
                f"layout has {len(self.layout)} layer letters but n_layers is {self.n_layers}"
            )
        return self

    def layer_types(self) -> list[str]:
        """'mla' or 'lightning' for each layer, in order."""
        if self.layout == "mla":
            return ["mla"] * self.n_layers
        if self.layout == "lightning":
            return ["lightning"] * self.n_layers
        if self.layout == "hybrid":
            return ["mla" if (i + 1) % self.mla_every == 0 else "lightning" for i in range(self.n_layers)]
        return ["mla" if c == "M" else "lightning" for c in self.layout]


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
