"""Cross-checks on identical weights against Hugging Face transformers' independent implementations.

- MLA vs ``DeepseekV3Attention`` (eager, fp32), both RoPE layouts: with ``rope_interleave=True`` DeepSeek
  rotates pairs (x0, x1), (x2, x3)...; ours rotates (x_i, x_{i+d/2}). The two agree once the RoPE rows of
  the query and latent projections are permuted evens-then-odds, which the test does.
- Lightning vs ``MiniMaxLightningAttention`` (fp32). Intended differences switched off or mapped: no q/k
  norm, no RoPE (``partial_rotary_factor=0``), identity q/k/v activation (``hidden_act="linear"``; MiniMax
  uses SiLU), our ``head_dim**-0.5`` query scale folded into the mapped q weight. The sigmoid output gate is
  the same in both and stays on. MiniMax normalises all heads together, Ling per head: they coincide for one
  head (compared with both norms on); for several heads the group norm is off and MiniMax's norm removed.
"""

from __future__ import annotations

import math

import pytest
import torch
from ci_require import require_module
from model_kit import policy, randomize, tiny_cfg
from model_tolerances import assert_close

from ringzero.model.cache import left_padded
from ringzero.model.lightning import LightningAttention
from ringzero.model.mla import MLAttention

pytestmark = pytest.mark.transformers
transformers = require_module("transformers")
F32 = torch.float32


def _causal_mask(S):
    return torch.full((S, S), float("-inf")).triu(1)[None, None]


@pytest.mark.parametrize("q_lora_rank", [None, 12])
@pytest.mark.parametrize("interleave", [False, True])
def test_mla_matches_deepseek_v3_attention(gen, q_lora_rank, interleave):
    from transformers.models.deepseek_v3.configuration_deepseek_v3 import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import (
        DeepseekV3Attention,
        DeepseekV3RotaryEmbedding,
    )

    # Both sides store the rope rows in the same layout (interleaved pairs or rotate-half): same weights.
    cfg = tiny_cfg(q_lora_rank=q_lora_rank, rope_interleave=interleave)
    ours = randomize(MLAttention(cfg, 0, policy("float32")).float())
    hf_cfg = DeepseekV3Config(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_attention_heads,
        num_hidden_layers=1,
        q_lora_rank=q_lora_rank,
        kv_lora_rank=cfg.kv_lora_rank,
        qk_nope_head_dim=cfg.qk_nope_head_dim,
        qk_rope_head_dim=cfg.qk_rope_head_dim,
        v_head_dim=cfg.v_head_dim,
        rope_interleave=interleave,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
        attention_bias=False,
        max_position_embeddings=64,
        rms_norm_eps=cfg.rms_norm_eps,
    )
    hf_cfg._attn_implementation = "eager"
    hf = DeepseekV3Attention(hf_cfg, layer_idx=0).float().eval()
    rope_hf = DeepseekV3RotaryEmbedding(hf_cfg)
    with torch.no_grad():
        if q_lora_rank is None:
            hf.q_proj.weight.copy_(ours.q_proj.weight)
        else:
            hf.q_a_proj.weight.copy_(ours.q_a_proj.weight)
            hf.q_a_layernorm.weight.copy_(ours.q_a_layernorm.weight)
            hf.q_b_proj.weight.copy_(ours.q_b_proj.weight)
        hf.kv_a_proj_with_mqa.weight.copy_(ours.kv_a_proj_with_mqa.weight)
        hf.kv_a_layernorm.weight.copy_(ours.kv_a_layernorm.weight)
        hf.kv_b_proj.weight.copy_(ours.kv_b_proj.weight)
        hf.o_proj.weight.copy_(ours.dense.weight)

    S = 13
    x = torch.randn(2, S, cfg.hidden_size, generator=gen)
    positions = torch.arange(S)
    with torch.no_grad():
        cos_sin = rope_hf(x, positions[None].expand(2, -1))
        want, _ = hf(x, cos_sin, _causal_mask(S))
        got = ours(x, positions)
    assert_close(got, want, F32)


def _minimax(cfg, layer_idx, block_size):
    from transformers.models.minimax.configuration_minimax import MiniMaxConfig
    from transformers.models.minimax.modeling_minimax import MiniMaxLightningAttention

    hf_cfg = MiniMaxConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_attention_heads,
        head_dim=cfg.head_dim,
        num_hidden_layers=cfg.num_hidden_layers,
        layer_types=["linear_attention"] * cfg.num_hidden_layers,
        block_size=block_size,
        hidden_act="linear",
        intermediate_size=cfg.intermediate_size,
    )
    return MiniMaxLightningAttention(hf_cfg, layer_idx).float().eval()


def minimax_slopes(H: int, layer_idx: int, L: int) -> list[float]:
    """MiniMax's decay: ``2**(-8 (h+1) / H)`` for every head count, scaled by ``1 - l/(L - 1 + 1e-5) + 1e-5``.
    Ling 2.5 (ours) uses ALiBi's rule for head counts that are not powers of two and SGLang's layer factor
    (tested in test_model_lightning_core.py); the cross-check compares everything else."""
    return [2 ** (-8 * (h + 1) / H) * (1 - layer_idx / (L - 1 + 1e-5) + 1e-5) for h in range(H)]


def _copy_lightning(ours, hf):
    H, d = ours.num_attention_heads, ours.head_dim
    with torch.no_grad():
        qkv = hf.qkv_proj.weight.view(H, 3, d, -1)  # MiniMax: per head [q | k | v]
        ling = ours.query_key_value.weight.view(3, H, d, -1)  # Ling 2.5: all q heads, then k, then v
        qkv[:, 0].copy_(ling[0] / math.sqrt(d))  # our q is scaled by d^-1/2 later
        qkv[:, 1].copy_(ling[1])
        qkv[:, 2].copy_(ling[2])
        hf.output_gate.weight.copy_(ours.g_proj.weight)
        hf.out_proj.weight.copy_(ours.dense.weight)
        hf.norm.weight.copy_(ours.g_norm.weight)  # MiniMax normalizes all H*d channels: one group


@pytest.mark.parametrize("num_attention_heads", [1, 3])
@pytest.mark.parametrize("layer_idx", [0, 2])
def test_lightning_matches_minimax_lightning_attention(gen, num_attention_heads, layer_idx):
    cfg = tiny_cfg(
        num_attention_heads=num_attention_heads,
        layout="lightning",
        use_qk_norm=False,
        partial_rotary_factor=0.0,
        group_norm_size=1,
        lightning_block_size=3,
    )
    ours = randomize(LightningAttention(cfg, layer_idx, policy("float32")).float())
    ours.slopes = minimax_slopes(num_attention_heads, layer_idx, cfg.num_hidden_layers)
    hf = _minimax(cfg, layer_idx, block_size=4)  # different block sizes: the block split must not matter
    _copy_lightning(ours, hf)
    S = 14
    x = torch.randn(2, S, cfg.hidden_size, generator=gen)
    with torch.no_grad():
        want, _ = hf(x, None, None)
        got = ours(x, torch.arange(S))
    assert_close(got, want, F32)


def test_lightning_left_padding_matches_minimax_padding_mask(gen):
    cfg = tiny_cfg(
        num_attention_heads=2,
        layout="lightning",
        use_qk_norm=False,
        partial_rotary_factor=0.0,
        group_norm_size=1,
    )
    ours = randomize(LightningAttention(cfg, 1, policy("float32")).float())
    ours.slopes = minimax_slopes(2, 1, cfg.num_hidden_layers)
    hf = _minimax(cfg, 1, block_size=4)
    _copy_lightning(ours, hf)
    _, pos = left_padded([[0] * 11, [0] * 6], pad_id=0)
    x = torch.randn(2, 11, cfg.hidden_size, generator=gen)
    with torch.no_grad():
        want, _ = hf(x, None, (pos >= 0).float())
        got = ours(x, pos)
    real = pos >= 0
    assert_close(got[real], want[real], F32)
