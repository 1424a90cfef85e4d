"""HybridLM <-> MegatronLM weight conversion: every TP shard set converts back to the exact tensors."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("megatron.core")

from megatron_kit import random_hybrid, tiny_config  # noqa: E402

from ringzero.engines.megatron.convert import _split, from_megatron, to_megatron  # noqa: E402
from ringzero.model.config import PrecisionPolicy  # noqa: E402

torch.set_num_threads(1)
FP32 = PrecisionPolicy.model_validate("fp32")


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("q_lora_rank", [None, 12])
@pytest.mark.parametrize("rope_interleave", [True, False])
@pytest.mark.parametrize("tie", [False, True])
def test_round_trip_is_exact(tp, q_lora_rank, rope_interleave, tie):
    cfg = tiny_config(q_lora_rank, rope_interleave, tie)
    state = random_hybrid(cfg, FP32).state_dict()
    shards = [to_megatron(state, cfg, r, tp) for r in range(tp)]
    back = from_megatron(shards, cfg)
    assert set(back) == set(state)
    assert all(torch.equal(back[k], v) for k, v in state.items())


def test_shards_follow_megatron_layouts():
    cfg = tiny_config(q_lora_rank=12)
    state = random_hybrid(cfg, FP32).state_dict()
    full, rank1 = to_megatron(state, cfg, 0, 1), to_megatron(state, cfg, 1, 2)
    inner = cfg.num_attention_heads * cfg.head_dim
    # Lightning's fused rows: rank 1 holds its q heads, then its k heads, then its v heads.
    qkv = state["layers.0.attention.query_key_value.weight"]
    q, k, v = qkv.split(inner)
    half = inner // 2
    assert torch.equal(
        rank1["decoder.layers.0.self_attention.query_key_value.weight"],
        torch.cat([q[half:], k[half:], v[half:]]),
    )
    # gated fc1: rank 1 holds its gate rows, then its up rows.
    gate, up = state["layers.1.mlp.gate_proj.weight"], state["layers.1.mlp.up_proj.weight"]
    n = gate.shape[0] // 2
    assert torch.equal(rank1["decoder.layers.1.mlp.linear_fc1.weight"], torch.cat([gate[n:], up[n:]]))
    assert torch.equal(full["decoder.layers.1.mlp.linear_fc1.weight"], torch.cat([gate, up]))
    # row-parallel projections split columns; norms are whole on every rank.
    assert torch.equal(
        rank1["decoder.layers.1.self_attention.linear_proj.weight"],
        state["layers.1.attention.dense.weight"].chunk(2, dim=1)[1],
    )
    assert torch.equal(
        rank1["decoder.layers.1.self_attention.q_layernorm.weight"],
        state["layers.1.attention.q_a_layernorm.weight"],
    )
    assert torch.equal(_split(torch.arange(12), 0, 3, 1, 2), torch.tensor([2, 3, 6, 7, 10, 11]))


def test_rope_rows_permuted_only_without_interleave():
    dn, dr, r = 8, 4, 8
    for interleave in (True, False):
        cfg = tiny_config(rope_interleave=interleave)
        state = random_hybrid(cfg, FP32).state_dict()
        out = to_megatron(state, cfg, 0, 1)
        kv = state["layers.1.attention.kv_a_proj_with_mqa.weight"]
        mkv = out["decoder.layers.1.self_attention.linear_kv_down_proj.weight"]
        assert torch.equal(mkv[:r], kv[:r])
        # megatron takes the rope rows as pairs (0, 1), (2, 3): ringzero's rotate-half rows 0 and 2 pair.
        expected = kv[r:] if interleave else kv[r:][[0, 2, 1, 3]]
        assert torch.equal(mkv[r:], expected)
        q = state["layers.1.attention.q_proj.weight"].view(2, dn + dr, -1)
        mq = out["decoder.layers.1.self_attention.linear_q_proj.weight"].view(2, dn + dr, -1)
        assert torch.equal(mq[:, :dn], q[:, :dn])
        assert torch.equal(mq[:, dn:], q[:, dn:] if interleave else q[:, dn:][:, [0, 2, 1, 3]])
