"""MLA and Lightning layers: parallel form vs the fp64 formula references, and vs their decoding forms."""

from __future__ import annotations

import pytest
import torch
from model_kit import policy, randomize, tiny_cfg
from model_reference import lightning_layer, mla_layer
from model_tolerances import assert_close

from ringzero.model.cache import DecodeCache, LightningLayerCache, MLALayerCache, left_padded
from ringzero.model.lightning import LightningAttention
from ringzero.model.mla import MLAttention, mla_absorbed, mla_expanded

F64 = torch.float64
DTYPES = {"float64": F64, "float32": torch.float32}

MLA_VARIANTS = {"full_rank_q": {}, "low_rank_q": {"q_lora_rank": 12}}
LIGHTNING_VARIANTS = {
    "ling": {},
    "plain": {"use_qk_norm": False, "partial_rotary_factor": 0.0, "layout": "lightning"},
    "one_norm_group": {"group_norm_size": 1},
    "full_rope": {"partial_rotary_factor": 1.0, "layout": "lightning"},
}


def _batch(gen, lengths, hidden_size, dtype):
    """Left-padded positions for rows of ``lengths`` and random inputs."""
    _, pos = left_padded([[0] * n for n in lengths], pad_id=0)
    x = torch.randn(len(lengths), pos.shape[1], hidden_size, generator=gen, dtype=F64).to(dtype)
    return x, pos


def _layer(kind, variant, body="float64", layer_idx=1):
    if kind == "mla":
        cfg = tiny_cfg(**MLA_VARIANTS[variant])
        return randomize(MLAttention(cfg, layer_idx, policy(body)).to(DTYPES[body]))
    cfg = tiny_cfg(**LIGHTNING_VARIANTS[variant])
    return randomize(LightningAttention(cfg, layer_idx, policy(body)).to(DTYPES[body]))


CASES = [("mla", v) for v in MLA_VARIANTS] + [("lightning", v) for v in LIGHTNING_VARIANTS]


@pytest.mark.parametrize("kind,variant", CASES)
def test_parallel_form_matches_reference(gen, kind, variant):
    layer = _layer(kind, variant)
    x, pos = _batch(gen, [10, 7, 1], layer.dense.out_features, F64)
    got = layer(x, pos)
    ref = mla_layer if kind == "mla" else lightning_layer
    for b in range(x.shape[0]):
        real = pos[b] >= 0
        assert_close(got[b][real], ref(layer, x[b], pos[b])[real])


def _decode(layer, x, pos, prefill: int, chunk: int, body_dtype):
    """Run columns through the layer's cache: chunks up to ``prefill``, then one token at a time."""
    B = x.shape[0]
    if isinstance(layer, MLAttention):
        inner = MLALayerCache(B, layer.latent_width, body_dtype, "cpu", capacity=2)
    else:
        inner = LightningLayerCache(
            B, layer.num_attention_heads, layer.head_dim, layer.head_dim, layer.state_dtype, "cpu"
        )
    cache = DecodeCache([inner], B, "cpu", capacity=2)
    outs, s = [], 0
    while s < x.shape[1]:
        e = min(s + chunk, prefill) if s < prefill else s + 1
        keys = cache.append_positions(pos[:, s:e])
        outs.append(layer(x[:, s:e], pos[:, s:e], cache.layers[0], keys))
        s = e
    return torch.cat(outs, 1)


@pytest.mark.parametrize("body", ["float64", "float32"])
@pytest.mark.parametrize("kind,variant", CASES)
@pytest.mark.parametrize("prefill,chunk", [(0, 1), (9, 3), (14, 5)], ids=["tokens", "chunks3", "chunks5"])
def test_decoding_forms_match_parallel(gen, body, kind, variant, prefill, chunk):
    dtype = DTYPES[body]
    layer = _layer(kind, variant, body)
    x, pos = _batch(gen, [17, 12, 5], layer.dense.out_features, dtype)
    parallel = layer(x, pos)
    decoded = _decode(layer, x, pos, prefill, chunk, dtype)
    real = pos >= 0
    assert_close(decoded[real], parallel[real])


def test_absorbed_equals_expanded_for_multi_token_queries(gen):
    layer = _layer("mla", "low_rank_q")
    x, pos = _batch(gen, [9, 6], layer.dense.out_features, F64)
    q_nope, q_rope, c_kv, k_rope = layer.project(x, pos)
    w_uk, w_uv = layer.up_weights()
    args = (q_nope[:, -4:], q_rope[:, -4:], c_kv, k_rope, w_uk, w_uv, pos[:, -4:], pos, layer.scale, True)
    assert_close(mla_absorbed(*args), mla_expanded(*args))


def test_up_projection_views_carry_gradients(gen):
    layer = _layer("mla", "full_rank_q")
    x, pos = _batch(gen, [6, 4], layer.dense.out_features, F64)
    layer(x, pos).sum().backward()
    for name, p in layer.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_swapped_core_receives_the_contract_arguments(gen):
    seen = {}

    def mla_core(q_nope, q_rope, c_kv, k_rope, w_uk, w_uv, positions, scale, softmax_fp32):
        seen["mla"] = (
            q_nope.shape,
            q_rope.shape,
            c_kv.shape,
            k_rope.shape,
            w_uk.shape,
            w_uv.shape,
            positions,
            scale,
            softmax_fp32,
        )
        return torch.zeros(*q_nope.shape[:3], w_uv.shape[1], dtype=q_nope.dtype)

    def lightning_core(q, k, v, log_decay, block_size):
        seen["lightning"] = (q.shape, k.shape, v.shape, log_decay, block_size)
        return torch.zeros_like(v)

    class Spy(torch.nn.Module):  # cores are modules: parallelize assigns nn.Module replacements
        def __init__(self, fn):
            super().__init__()
            self.fn = fn

        def forward(self, *args):
            return self.fn(*args)

    mla, light = _layer("mla", "full_rank_q"), _layer("lightning", "ling")
    mla.core, light.core = Spy(mla_core), Spy(lightning_core)
    x = torch.randn(2, 5, 32, generator=gen, dtype=F64)
    pos = torch.arange(100, 105)
    assert (mla(x, pos) == 0).all() and (light(x, pos) == 0).all()
    assert seen["mla"][:6] == ((2, 5, 2, 8), (2, 5, 2, 4), (2, 5, 8), (2, 5, 4), (2, 8, 8), (2, 6, 8))
    assert torch.equal(seen["mla"][6], pos) and seen["mla"][7] == pytest.approx(12**-0.5) and seen["mla"][8]
    assert seen["lightning"][:3] == ((2, 5, 2, 8),) * 3 and seen["lightning"][4] == 4
    assert (seen["lightning"][3] < 0).all()
