"""A tiny model, prompts and request builders shared by the rollout tests."""

from __future__ import annotations

import math

import torch

from ringzero.model.config import ModelConfig, PrecisionPolicy
from ringzero.model.hybrid import HybridLM
from ringzero.model.tolerances import tolerance
from ringzero.rollout.types import GenerateRequest, SamplingParams

# Lightning block_size 4 so prompts and outputs straddle blocks; max_position_embeddings 64 caps a sequence's
# length.
TINY = dict(
    vocab_size=64,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    layout="LM",
    intermediate_size=48,
    max_position_embeddings=64,
    kv_lora_rank=8,
    qk_nope_head_dim=8,
    qk_rope_head_dim=4,
    v_head_dim=6,
    head_dim=8,
    lightning_block_size=4,
)


def tiny_cfg(**overrides) -> ModelConfig:
    return ModelConfig.model_validate({**TINY, **overrides})


def tiny_model(body: str = "float64", seed: int = 0, **overrides) -> HybridLM:
    """Order-1 random weights N(0, 1/fan_in): logits with an entropy of a few nats, so samples vary."""
    model = HybridLM(tiny_cfg(**overrides), policy(body))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=gen, dtype=torch.float64))
            else:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) / math.sqrt(p.shape[-1]))
    return model.eval()


def policy(name: str) -> PrecisionPolicy:
    """A preset name, or a bare body dtype (``float64``/``float32``) with both islands on."""
    if name in ("float64", "float32"):
        return PrecisionPolicy(body=name, attention_softmax_fp32=True, lm_head_fp32=True)
    return PrecisionPolicy.preset(name)


def prompts(lengths, seed: int = 0, vocab: int = 64) -> list[list[int]]:
    """Random prompts of the given lengths; ids from 3 on, so no char-tokenizer special appears."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in lengths]


def requests(prompt_list, **params) -> list[GenerateRequest]:
    return [GenerateRequest(p, SamplingParams(**params)) for p in prompt_list]


def assert_close(actual, expected, dtype: torch.dtype) -> None:
    tol = tolerance(dtype)
    torch.testing.assert_close(
        torch.as_tensor(actual, dtype=torch.float64),
        torch.as_tensor(expected, dtype=torch.float64),
        atol=tol.atol,
        rtol=tol.rtol,
    )
