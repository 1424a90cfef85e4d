"""The per-forward caches (the LM head's fp32 cast, the Lightning decay tables) against the computation
they replace: the same bits, and new values as soon as the weights change."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ringzero.config.stages import OptimSettings
from ringzero.engines.optimizer import TrainOptimizer
from ringzero.model.config import ModelConfig, PrecisionPolicy
from ringzero.model.hybrid import HybridLM
from ringzero.model.lightning import DecayTables, lightning_blocks, lightning_step
from ringzero.model.precision import at_least_fp32

MICRO = dict(
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
SLOPES = [0.5, 0.05, 1e-5]


def _islands(seed: int = 0, **overrides) -> HybridLM:
    model = HybridLM(
        ModelConfig.model_validate({**MICRO, **overrides}), PrecisionPolicy.preset("fp32-islands")
    )
    model.reset_parameters(torch.Generator().manual_seed(seed))
    return model


def _uncached_logits(model: HybridLM, hidden: torch.Tensor) -> torch.Tensor:
    """The LM-head island as it was written before the cache: a fresh cast on every call."""
    h = model.norm(hidden, out_dtype=at_least_fp32(hidden.dtype))
    return F.linear(h, model.head_weight.to(h.dtype))


def _hidden(seed: int = 1) -> torch.Tensor:
    return torch.randn(3, 5, 32, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)


@pytest.mark.parametrize("tied", [False, True])
def test_cached_head_cast_gives_the_uncached_bits_and_is_reused(tied):
    model, h = _islands(tie_word_embeddings=tied), _hidden()
    with torch.inference_mode():
        first = model.head_weight_as(torch.float32)
        assert model.head_weight_as(torch.float32) is first  # kept between decoding steps
        assert torch.equal(model.logits(h), _uncached_logits(model, h))


def test_head_cast_follows_every_kind_of_weight_change():
    model, other, h = _islands(0), _islands(5), _hidden()
    with torch.inference_mode():
        model.logits(h)  # fills the cache with the old weights
    model.load_state_dict(other.state_dict())  # an engine's update_weights
    with torch.inference_mode():
        assert torch.equal(model.logits(h), _uncached_logits(other, h))
        model.head_weight.copy_(model.head_weight * 2)  # an in-place push inside inference mode
        assert torch.equal(model.logits(h), _uncached_logits(model, h))
    with torch.no_grad():  # the parameter replaced by a new tensor: the old storage is kept, no address reuse
        model.lm_head.weight = torch.nn.Parameter(other.head_weight.clone())
    with torch.inference_mode():
        assert torch.equal(model.logits(h), _uncached_logits(other, h))


def test_head_cast_follows_an_optimizer_step_and_gradients_reach_the_weight():
    model, h = _islands(), _hidden()
    with torch.inference_mode():
        before = model.logits(h).clone()
    optimizer = TrainOptimizer(
        model, OptimSettings(lr=1e-2, warmup_steps=0), total_steps=10, schedule="constant"
    )
    model.logits(h).square().mean().backward()
    assert (
        model.head_weight.grad is not None and model.head_weight.grad.abs().sum() > 0
    )  # autograd reaches it
    optimizer.step()
    with torch.inference_mode():
        after = model.logits(h)
        assert not torch.equal(after, before)
        assert torch.equal(after, _uncached_logits(model, h))


def _uncached_blocks(q, k, v, log_decay, block_size, initial_state=None):
    """``lightning_blocks`` as written before its decay tables were cached (kept verbatim as the
    reference)."""
    B, S, H, dk = q.shape
    dv = v.shape[-1]
    compute = at_least_fp32(q.dtype)
    if initial_state is not None:
        compute = torch.promote_types(compute, initial_state.dtype)
    q_BHSk, k_BHSk, v_BHSv = (t.to(compute).transpose(1, 2) for t in (q, k, v))
    ld_H = log_decay.to(device=q.device, dtype=compute)
    state = q.new_zeros((B, H, dk, dv), dtype=compute) if initial_state is None else initial_state.to(compute)
    outs = []
    for start in range(0, S, block_size):
        L = min(block_size, S - start)
        qb, kb, vb = (t[:, :, start : start + L] for t in (q_BHSk, k_BHSk, v_BHSv))
        a = torch.arange(L, device=q.device, dtype=compute)
        diff_LL = a[:, None] - a[None, :]
        decay_HLL = torch.exp(ld_H[:, None, None] * diff_LL.clamp(min=0)) * (diff_LL >= 0)
        intra = ((qb @ kb.transpose(-1, -2)) * decay_HLL) @ vb
        inter = (qb * torch.exp(ld_H[:, None] * (a + 1))[..., None]) @ state
        outs.append(intra + inter)
        k_decay_HL = torch.exp(ld_H[:, None] * (L - 1 - a))
        state = torch.exp(ld_H * L)[:, None, None] * state + (
            (kb * k_decay_HL[..., None]).transpose(-1, -2) @ vb
        )
    return torch.cat(outs, dim=2).transpose(1, 2).to(q.dtype), state


def _qkv(S: int, dtype, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(2, S, 3, 4, generator=gen).to(dtype) for _ in range(3))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("inference", [False, True])
def test_cached_decay_tables_give_the_uncached_bits(dtype, inference):
    state_dtype = at_least_fp32(dtype)
    tables = DecayTables(SLOPES, state_dtype)
    s0 = torch.randn(2, 3, 4, 4, generator=torch.Generator().manual_seed(3), dtype=state_dtype)
    mode = torch.inference_mode() if inference else torch.no_grad()
    with mode:
        for S in (3, 16, 11, 16, 5, 3):  # full and partial blocks, each length met twice (cache hits)
            q, k, v = _qkv(S, dtype, seed=S)
            for start in (None, s0):
                o, st = lightning_blocks(q, k, v, tables.log_decay(), 4, start, tables)
                want_o, want_st = _uncached_blocks(
                    q, k, v, -torch.tensor(SLOPES, dtype=state_dtype), 4, start
                )
                assert torch.equal(o, want_o) and torch.equal(st, want_st)
        q, k, v = (t[:, 0] for t in _qkv(1, dtype))
        o, st = lightning_step(q, k, v, tables.log_decay(), s0.clone(), tables)
        want_o, want_st = lightning_step(q, k, v, -torch.tensor(SLOPES, dtype=state_dtype), s0.clone())
        assert torch.equal(o, want_o) and torch.equal(st, want_st)


def test_decay_tables_stay_bounded_and_inference_entries_never_reach_autograd():
    tables = DecayTables(SLOPES, torch.float32, max_entries=4)
    with torch.inference_mode():
        for S in range(1, 12):
            lightning_blocks(*_qkv(S, torch.float32), tables.log_decay(), 16, tables=tables)
    assert len(tables._tables) <= 4
    q, k, v = (t.requires_grad_(True) for t in _qkv(11, torch.float32))
    o, _ = lightning_blocks(q, k, v, tables.log_decay(), 16, tables=tables)  # same length, now with autograd
    o.sum().backward()
    assert q.grad is not None and torch.equal(
        o.detach(), _uncached_blocks(q, k, v, -torch.tensor(SLOPES), 16)[0]
    )


def test_model_forward_with_cached_decays_matches_a_fresh_model():
    model = _islands()
    ids = torch.randint(0, 64, (2, 13), generator=torch.Generator().manual_seed(4))
    with torch.inference_mode():
        model(ids)
        cached = model(ids)
    fresh = _islands()
    with torch.inference_mode():
        assert torch.equal(cached, fresh(ids))
