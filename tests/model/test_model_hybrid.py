"""The whole HybridLM: fp64 reference, decoding forms, ragged batches, cache surgery, positions."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from model_kit import TINY_MOE, policy, randomize, tiny_cfg
from model_reference import model_logits
from model_tolerances import assert_close

from ringzero.errors import RingzeroError
from ringzero.model.cache import left_padded
from ringzero.model.hybrid import HybridLM

LAYOUTS = {
    "hybrid": {},
    "all_mla": {"layout": "mla", "num_hidden_layers": 2},
    "all_lightning": {"layout": "lightning", "num_hidden_layers": 2},
    "explicit_tied": {"layout": "MLLM", "tie_word_embeddings": True, "q_lora_rank": 12},
    "moe": TINY_MOE,
    "moe_tail": {**TINY_MOE, "num_hidden_layers": 5, "layer_group_size": 2, "first_k_dense_replace": 0},
}


def _model(layout="hybrid", body="float64", seed=0, **extra):
    return randomize(HybridLM(tiny_cfg(**LAYOUTS[layout], **extra), policy(body)), seed)


def _prompts(gen, lengths, vocab=64):
    return [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in lengths]


def test_layer_pattern():
    kinds = [
        b.kind for b in HybridLM(tiny_cfg(num_hidden_layers=8, layer_group_size=4), policy("float32")).layers
    ]
    assert kinds == ["lightning"] * 3 + ["mla"] + ["lightning"] * 3 + ["mla"]
    tied = HybridLM(tiny_cfg(tie_word_embeddings=True), policy("float32"))
    assert tied.lm_head is None and "lm_head.weight" not in tied.state_dict()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_parallel_logits_match_reference(gen, layout):
    model = _model(layout)
    ids, pos = left_padded(_prompts(gen, [9, 4]), pad_id=0)
    got = model(ids, pos)
    want = model_logits(model, ids, pos)
    real = pos >= 0
    assert_close(got[real], want[real])


def _decode(model, ids, pos, prefill, chunk, capacity=3):
    cache = model.new_cache(ids.shape[0], capacity=capacity)
    outs, s = [], 0
    while s < ids.shape[1]:
        e = min(s + chunk, prefill) if s < prefill else s + 1
        outs.append(model(ids[:, s:e], pos[:, s:e], cache))
        s = e
    return torch.cat(outs, 1), cache


@pytest.mark.parametrize("body", ["float64", "float32"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("prefill,chunk", [(0, 1), (13, 5)], ids=["tokens", "chunked_prefill"])
def test_decoding_forms_match_parallel(gen, body, layout, prefill, chunk):
    model = _model(layout, body)
    ids, pos = left_padded(_prompts(gen, [19, 14, 3]), pad_id=0)
    parallel = model(ids, pos)
    decoded, _ = _decode(model, ids, pos, prefill, chunk)
    real = pos >= 0
    assert_close(decoded[real], parallel[real])


def test_left_padded_rows_equal_unpadded_sequences(gen):
    model = _model("hybrid")
    prompts = _prompts(gen, [11, 6, 1])
    ids, pos = left_padded(prompts, pad_id=0)
    batched = model(ids, pos)
    for b, prompt in enumerate(prompts):
        alone = model(torch.tensor([prompt]))
        assert_close(batched[b, -len(prompt) :], alone[0])


def test_prefill_then_default_positions_continue_each_row(gen):
    """After a ragged prefill, decode steps without explicit positions continue every row at its length."""
    model = _model("hybrid")
    prompts = _prompts(gen, [7, 3])
    ids, pos = left_padded(prompts, pad_id=0)
    cache = model.new_cache(2)
    model(ids, pos, cache)
    assert cache.next_positions().tolist() == [7, 3]
    nxt = torch.tensor([[5], [9]])
    step = model(nxt, cache=cache)
    for b, prompt in enumerate(prompts):
        alone = model(torch.tensor([prompt + [int(nxt[b, 0])]]))
        assert_close(step[b, 0], alone[0, -1])


def test_cache_select_drops_and_repeats_rows(gen):
    """Rows finish at different times (drop them) and one prompt fans out into n samples (repeat it)."""
    model = _model("hybrid")
    prompts = _prompts(gen, [6, 4, 8])
    ids, pos = left_padded(prompts, pad_id=0)
    cache = model.new_cache(3, capacity=2)
    model(ids, pos, cache)
    cache.select([2, 0, 0])  # row 1 finished; row 0 gets two samples
    assert cache.batch_size == 3
    follow = torch.tensor([[7, 8], [9, 10], [11, 12]])
    outs = [model(follow[:, t : t + 1], cache=cache) for t in range(2)]
    got = torch.cat(outs, 1)
    for b, src in enumerate([2, 0, 0]):
        alone = model(torch.tensor([prompts[src] + follow[b].tolist()]))
        assert_close(got[b], alone[0, -2:])
    with pytest.raises(RingzeroError, match="out of range"):
        cache.select([3])


@settings(max_examples=10, deadline=None)
@given(offset=st.integers(1, 10_000))
def test_uniform_position_shift_leaves_logits_unchanged(offset):
    """RoPE is relative: absolute positions shifted together (a shard's global offset seen from a whole
    sequence) change nothing, while non-uniform positions do."""
    model = _model("hybrid")
    ids = torch.randint(3, 64, (2, 9), generator=torch.Generator().manual_seed(offset))
    base = model(ids, torch.arange(9))
    assert_close(model(ids, torch.arange(9) + offset), base)
    gapped = torch.cat([torch.arange(4), torch.arange(4, 9) + offset])
    assert (model(ids, gapped) - base)[:, 4:].abs().max() > 1e-6


def test_cache_grows_past_capacity_and_keeps_body_dtype(gen):
    model = _model("hybrid", "float32")
    ids, pos = left_padded(_prompts(gen, [12, 5]), pad_id=0)
    _, cache = _decode(model, ids, pos, prefill=0, chunk=1, capacity=1)
    assert cache.length == 12 and cache.positions[1].tolist() == list(range(-7, 5))
    mla = [c for c in cache.layers if hasattr(c, "latent")][0]
    assert mla.latent.shape == (2, 12, 8 + 4) and mla.latent.dtype == torch.float32


def test_all_parameters_get_gradients(gen):
    model = _model("explicit_tied")
    ids, pos = left_padded(_prompts(gen, [8, 5]), pad_id=0)
    model(ids, pos)[pos >= 0].logsumexp(-1).sum().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name
