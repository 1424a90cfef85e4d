"""Checks of the independent fp64 Ling 2.5 reference (ling_reference_impl) itself, so that it can be trusted
when the project's model is compared against it."""

from __future__ import annotations

import json
import math

import pytest
import torch
from ling_reference_impl import (
    F64,
    alibi_slopes,
    deinterleave,
    is_moe_layer,
    layer_types,
    lightning_recurrence,
    linear_attention_slopes,
    moe_mlp,
    random_reference_tensors,
    read_folder,
    reference_logits,
    reference_tensor_shapes,
    rope_rotate_half,
    route,
    swiglu,
    tiny_config,
    tiny_moe_config,
    write_reference_folder,
)


def _f64(tensors):
    return {k: v.to(F64) for k, v in tensors.items()}


# (a) ------------------------------------------------------------------------------ linear attention


def test_recurrence_equals_quadratic_masked_form(gen):
    B, S, H, dk, dv = 2, 11, 3, 5, 4
    q, k = (
        torch.randn(B, S, H, dk, generator=gen, dtype=F64),
        torch.randn(B, S, H, dk, generator=gen, dtype=F64),
    )
    v = torch.randn(B, S, H, dv, generator=gen, dtype=F64)
    slope = torch.tensor([0.05, 0.5, 2.0], dtype=F64)
    expected = torch.zeros(B, S, H, dv, dtype=F64)
    for t in range(S):
        for j in range(t + 1):
            w = torch.exp(-slope * (t - j)) * (q[:, t] * k[:, j]).sum(-1)  # [B, H]
            expected[:, t] += w[..., None] * v[:, j]
    torch.testing.assert_close(lightning_recurrence(q, k, v, slope), expected, rtol=1e-12, atol=1e-12)


def test_slopes():
    assert alibi_slopes(8) == [2 ** -(i + 1) for i in range(8)]
    assert alibi_slopes(6) == alibi_slopes(4) + alibi_slopes(8)[0::2][:2]
    cfg = tiny_config(num_hidden_layers=5)
    base = torch.tensor(alibi_slopes(4), dtype=F64)
    torch.testing.assert_close(linear_attention_slopes(cfg, 2, "sglang"), base * (1 - 2 / 4 + 1e-5))
    torch.testing.assert_close(linear_attention_slopes(cfg, 2, "hf"), base * (1 - 1 / 4 + 1e-5))
    with pytest.raises(ValueError):
        linear_attention_slopes(cfg, 0, "other")
    with pytest.raises(ValueError):
        linear_attention_slopes(tiny_config(num_hidden_layers=1), 0)


def test_rope_layouts_are_pair_rotations(gen):
    """Rotate-half RoPE turns (x[i], x[i + d/2]) by pos * theta^(-2i/d); the interleaved MLA layout turns
    (x[2i], x[2i + 1]) and returns them in rotate-half order."""
    S, d, theta = 6, 8, 100.0
    x = torch.randn(1, S, 2, d, generator=gen, dtype=F64)
    angles = torch.arange(S, dtype=F64)[:, None] * theta ** (-torch.arange(0, d, 2, dtype=F64) / d)
    turn = torch.polar(torch.ones_like(angles), angles)[None, :, None, :]
    z = torch.complex(x[..., : d // 2], x[..., d // 2 :]) * turn
    torch.testing.assert_close(rope_rotate_half(x, theta), torch.cat([z.real, z.imag], -1))
    zi = torch.complex(x[..., 0::2], x[..., 1::2]) * turn
    torch.testing.assert_close(rope_rotate_half(deinterleave(x), theta), torch.cat([zi.real, zi.imag], -1))
    assert deinterleave(torch.arange(6.0)).tolist() == [0, 2, 4, 1, 3, 5]


# (b) ------------------------------------------------------------------------------------------- MLA


@pytest.mark.parametrize("q_lora_rank", [None, 6])
def test_interleaved_mla_equals_plain_mla_with_permuted_rows(q_lora_rank):
    cfg = tiny_config(layer_group_size=1, num_hidden_layers=2, q_lora_rank=q_lora_rank)
    assert layer_types(cfg) == ["attention", "attention"]
    tensors = _f64(random_reference_tensors(cfg, seed=5))
    H, nope, rope, r = 4, cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["kv_lora_rank"]
    perm = list(range(0, rope, 2)) + list(range(1, rope, 2))
    q_rows = [h * (nope + rope) + j for h in range(H) for j in list(range(nope)) + [nope + p for p in perm]]
    kv_rows = list(range(r)) + [r + p for p in perm]
    permuted = dict(tensors)
    for i in range(2):
        q_name = f"model.layers.{i}.attention." + (
            "q_proj.weight" if q_lora_rank is None else "q_b_proj.weight"
        )
        kv_name = f"model.layers.{i}.attention.kv_a_proj_with_mqa.weight"
        permuted[q_name] = tensors[q_name][q_rows]
        permuted[kv_name] = tensors[kv_name][kv_rows]
    ids = torch.randint(0, cfg["vocab_size"], (2, 7), generator=torch.Generator().manual_seed(0))
    interleaved = reference_logits(cfg, tensors, ids)
    plain = reference_logits({**cfg, "rope_interleave": False}, permuted, ids)
    torch.testing.assert_close(interleaved, plain, rtol=1e-12, atol=1e-12)
    assert not torch.allclose(interleaved, reference_logits({**cfg, "rope_interleave": False}, tensors, ids))


# (c), (d) ------------------------------------------------------------------------------------- MoE


def _moe_weights(cfg, seed):
    tensors = _f64(random_reference_tensors(cfg, seed))
    return {
        k.removeprefix("model.layers.1.mlp."): v
        for k, v in tensors.items()
        if k.startswith("model.layers.1.mlp.")
    }


def test_moe_with_every_expert_is_the_sigmoid_weighted_sum(gen):
    cfg = tiny_moe_config(
        num_experts_per_tok=8,
        n_group=1,
        topk_group=1,
        norm_topk_prob=False,
        routed_scaling_factor=1.0,
        num_shared_experts=0,
    )
    W = _moe_weights(cfg, seed=2)
    assert not any(k.startswith("shared_experts") for k in W)
    x = torch.randn(2, 5, cfg["hidden_size"], generator=gen, dtype=F64)
    y, idx = moe_mlp(cfg, W, "", x)
    scores = torch.sigmoid(x @ W["gate.weight"].T)
    expected = sum(scores[..., e, None] * swiglu(x, W, f"experts.{e}.") for e in range(8))
    torch.testing.assert_close(y, expected, rtol=1e-12, atol=1e-12)
    assert sorted(idx.reshape(-1, 8)[0].tolist()) == list(range(8))

    shared_cfg = {**cfg, "num_shared_experts": 1}
    W_shared = _moe_weights(shared_cfg, seed=2)
    y_shared, _ = moe_mlp(shared_cfg, W_shared, "", x)
    torch.testing.assert_close(y_shared - y, swiglu(x, W_shared, "shared_experts."), rtol=1e-12, atol=1e-12)


def test_grouped_topk_constructed_case():
    """Expert 0 has the best routing score, but its group (top-2 sum) loses to groups 1 and 2."""
    cfg = tiny_moe_config(num_experts_per_tok=3, n_group=4, topk_group=2, routed_scaling_factor=2.5)
    gate = torch.zeros(8, 4, dtype=F64)  # every score sigmoid(0) = 0.5
    bias = torch.tensor([0.45, -0.45, 0.3, 0.3, 0.25, 0.2, 0.0, 0.0], dtype=F64)
    idx, weights = route(cfg, torch.randn(3, 4, dtype=F64), gate, bias)
    for row in idx.tolist():
        assert sorted(row) == [2, 3, 4]
    torch.testing.assert_close(weights, torch.full((3, 3), 2.5 / 3, dtype=F64))  # unbiased scores, normalized


def test_grouped_topk_stays_inside_chosen_groups(gen):
    cfg = tiny_moe_config(num_experts=12, n_group=4, topk_group=2, num_experts_per_tok=3)
    x = torch.randn(200, 6, generator=gen, dtype=F64)
    gate = torch.randn(12, 6, generator=gen, dtype=F64)
    bias = 0.3 * torch.randn(12, generator=gen, dtype=F64)
    idx, weights = route(cfg, x, gate, bias)
    routing = (torch.sigmoid(x @ gate.T) + bias).tolist()
    for n, row in enumerate(idx.tolist()):
        group_score = [sum(sorted(routing[n][3 * g : 3 * g + 3])[-2:]) for g in range(4)]
        groups = sorted(range(4), key=lambda g: -group_score[g])[:2]
        allowed = [e for e in range(12) if e // 3 in groups]
        assert {e // 3 for e in row} <= set(groups)
        assert sorted(row) == sorted(sorted(allowed, key=lambda e: -routing[n][e])[:3])
    torch.testing.assert_close(weights.sum(-1), torch.ones(200, dtype=F64))


# (e) ---------------------------------------------------------------------------------- folder layout


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("max_shard_tensors", [None, 7])
def test_folder_round_trip(tmp_path, dtype, max_shard_tensors):
    cfg = tiny_moe_config(q_lora_rank=6, num_hidden_layers=2)  # 52 tensors: one file unless told otherwise
    tensors = write_reference_folder(tmp_path, cfg, seed=9, dtype=dtype, max_shard_tensors=max_shard_tensors)
    assert list(tensors) == list(reference_tensor_shapes(cfg))
    assert all(t.dtype == dtype for t in tensors.values())
    config, loaded = read_folder(tmp_path)
    assert config["architectures"] == ["BailingMoeV2_5ForCausalLM"]
    assert config["model_type"] == "bailing_moe_v2_5"
    assert config["torch_dtype"] == str(dtype).removeprefix("torch.")
    assert {k: config[k] for k in cfg} == cfg
    assert json.loads((tmp_path / "generation_config.json").read_text()) == {
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
    }
    assert loaded.keys() == tensors.keys()
    for name, t in tensors.items():
        assert loaded[name].dtype == dtype and loaded[name].shape == t.shape
        assert torch.equal(loaded[name].view(torch.uint8), t.view(torch.uint8)), name
    index = tmp_path / "model.safetensors.index.json"
    if max_shard_tensors is None:
        assert (tmp_path / "model.safetensors").exists() and not index.exists()
        return
    meta = json.loads(index.read_text())
    assert meta["weight_map"].keys() == tensors.keys()
    shards = sorted(set(meta["weight_map"].values()))
    K = math.ceil(len(tensors) / 7)
    assert shards == [f"model-{k:05d}-of-{K:05d}.safetensors" for k in range(1, K + 1)]
    assert all((tmp_path / s).exists() for s in shards) and not (tmp_path / "model.safetensors").exists()
    assert meta["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in tensors.values())


def test_folder_shards_many_tensors_by_default_and_ties_embeddings(tmp_path):
    cfg = tiny_moe_config(num_hidden_layers=6, tie_word_embeddings=True)
    tensors = write_reference_folder(tmp_path, cfg, seed=1)
    assert len(tensors) > 64 and "lm_head.weight" not in tensors
    assert (tmp_path / "model.safetensors.index.json").exists()
    _, loaded = read_folder(tmp_path)
    assert all(torch.equal(loaded[k], v) for k, v in tensors.items())
    again = random_reference_tensors(cfg, seed=1)
    assert all(torch.equal(again[k], v) for k, v in tensors.items())


def test_tensor_names_and_shapes():
    shapes = reference_tensor_shapes(tiny_moe_config(q_lora_rank=6))
    assert shapes["model.layers.0.attention.query_key_value.weight"] == (96, 32)
    assert shapes["model.layers.0.attention.g_norm.weight"] == (32,)
    assert shapes["model.layers.0.mlp.gate_proj.weight"] == (40, 32)
    assert shapes["model.layers.1.attention.q_a_proj.weight"] == (6, 32)
    assert shapes["model.layers.1.attention.q_b_proj.weight"] == (48, 6)
    assert shapes["model.layers.1.attention.kv_a_proj_with_mqa.weight"] == (16, 32)
    assert shapes["model.layers.1.attention.kv_b_proj.weight"] == (64, 12)
    assert shapes["model.layers.1.attention.dense.weight"] == (32, 32)
    assert shapes["model.layers.1.mlp.gate.expert_bias"] == (8,)
    assert shapes["model.layers.3.mlp.experts.7.down_proj.weight"] == (32, 16)
    assert shapes["model.layers.3.mlp.shared_experts.up_proj.weight"] == (16, 32)
    assert "model.layers.1.attention.q_proj.weight" not in shapes
    no_norm = reference_tensor_shapes(tiny_config(use_qk_norm=False))
    assert "model.layers.0.attention.query_layernorm.weight" not in no_norm


# (f) --------------------------------------------------------------------------------- layer pattern


def test_layer_pattern_and_tail_rule():
    types = layer_types(tiny_config(num_hidden_layers=10, layer_group_size=4))
    assert [i for i, t in enumerate(types) if t == "attention"] == [3, 7, 8, 9]
    assert layer_types(tiny_config()) == ["linear_attention", "attention"] * 2
    cfg = tiny_moe_config(first_k_dense_replace=2)
    assert [is_moe_layer(cfg, i) for i in range(4)] == [False, False, True, True]
    assert not any(is_moe_layer(tiny_config(), i) for i in range(4))


# forward smoke ------------------------------------------------------------------------------------


def test_forward_is_causal_and_reports_routing(gen):
    cfg = tiny_moe_config(num_hidden_layers=5, layer_group_size=2)
    tensors = random_reference_tensors(cfg, seed=4)
    ids = torch.randint(0, cfg["vocab_size"], (2, 8), generator=gen)
    logits, routing = reference_logits(cfg, tensors, ids, return_routing=True)
    assert logits.dtype == F64 and logits.shape == (2, 8, cfg["vocab_size"]) and logits.isfinite().all()
    assert sorted(routing) == [1, 2, 3, 4] and all(r.shape == (2, 8, 2) for r in routing.values())
    changed = ids.clone()
    changed[:, 5:] = (changed[:, 5:] + 1) % cfg["vocab_size"]
    torch.testing.assert_close(
        reference_logits(cfg, tensors, changed)[:, :5], logits[:, :5], rtol=1e-12, atol=1e-12
    )
    assert not torch.allclose(reference_logits(cfg, tensors, changed)[:, 5:], logits[:, 5:])
    assert not torch.allclose(reference_logits(cfg, tensors, ids, slope_rule="hf"), logits)
    assert not torch.allclose(reference_logits(cfg, tensors, ids, mla_norm_eps=1.0), logits)
