"""Tiny configs, policies and random weights shared by the model tests."""

from __future__ import annotations

import torch

from ringzero.model.config import ModelConfig, PrecisionPolicy
from ringzero.model.decode_check import random_weights_

TINY = dict(
    vocab_size=64,
    hidden_size=32,
    num_hidden_layers=4,
    num_attention_heads=2,
    layer_group_size=4,
    intermediate_size=48,
    max_position_embeddings=64,
    kv_lora_rank=8,
    qk_nope_head_dim=8,
    qk_rope_head_dim=4,
    v_head_dim=6,
    head_dim=8,
    group_norm_size=2,
    lightning_block_size=4,
)
TINY_MOE = dict(
    num_experts=6,
    num_experts_per_tok=2,
    n_group=3,
    topk_group=2,
    moe_intermediate_size=16,
    num_shared_experts=1,
    first_k_dense_replace=1,
)


def tiny_cfg(**overrides) -> ModelConfig:
    return ModelConfig.model_validate({**TINY, **overrides})


def policy(body: str, softmax_fp32: bool = True, lm_head_fp32: bool = True) -> PrecisionPolicy:
    return PrecisionPolicy(body=body, attention_softmax_fp32=softmax_fp32, lm_head_fp32=lm_head_fp32)


def randomize(module, seed: int = 0):
    """Order-1 random weights (norm weights near 1), so that every path of the math matters."""
    return random_weights_(module, torch.Generator().manual_seed(seed))
