"""Tiny configs, policies and random weights shared by the model tests."""

from __future__ import annotations

import torch

from ringzero.model.config import ModelConfig, PrecisionPolicy
from ringzero.model.decode_check import random_weights_

TINY = dict(
    vocab_size=64, d_model=32, n_layers=4, n_heads=2, mla_every=4, mlp_hidden=48, max_seq_len=64,
    mla=dict(kv_lora_rank=8, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6),
    lightning=dict(head_dim=8, block_size=4),
)


def tiny_cfg(**overrides) -> ModelConfig:
    data = {**TINY, **overrides}
    for section in ("mla", "lightning"):
        data[section] = {**TINY[section], **overrides.get(section, {})}
    return ModelConfig.model_validate(data)


def policy(body: str, softmax_fp32: bool = True, lm_head_fp32: bool = True) -> PrecisionPolicy:
    return PrecisionPolicy(body=body, attention_softmax_fp32=softmax_fp32, lm_head_fp32=lm_head_fp32)


def randomize(module, seed: int = 0):
    """Order-1 random weights (norm weights near 1), so that every path of the math matters."""
    return random_weights_(module, torch.Generator().manual_seed(seed))
