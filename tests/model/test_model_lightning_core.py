"""The Lightning block-parallel and recurrent forms against the quadratic fp64 definition."""

from __future__ import annotations

import math

import pytest
import torch
from model_reference import decayed_linear_attention
from model_tolerances import assert_close

from ringzero.model.lightning import decay_slopes, lightning_blocks, lightning_step

F64 = torch.float64


def _inputs(gen, B=2, S=11, H=3, dk=4, dv=5, dtype=F64):
    q = torch.randn(B, S, H, dk, generator=gen, dtype=F64).to(dtype)
    k = torch.randn(B, S, H, dk, generator=gen, dtype=F64).to(dtype)
    v = torch.randn(B, S, H, dv, generator=gen, dtype=F64).to(dtype)
    return q, k, v


SLOPES = [0.5, 0.05, 1e-5]


@pytest.mark.parametrize("block_size", [1, 3, 4, 11, 16])
@pytest.mark.parametrize("with_state", [False, True])
def test_blocks_match_definition(gen, block_size, with_state):
    q, k, v = _inputs(gen)
    s0 = torch.randn(2, 3, 4, 5, generator=gen, dtype=F64) if with_state else None
    o, state = lightning_blocks(q, k, v, -torch.tensor(SLOPES, dtype=F64), block_size, s0)
    for b in range(2):
        want_o, want_state = decayed_linear_attention(q[b], k[b], v[b], SLOPES, None if s0 is None else s0[b])
        assert_close(o[b], want_o)
        assert_close(state[b], want_state)


def test_recurrent_steps_match_blocks(gen):
    q, k, v = _inputs(gen)
    ld = -torch.tensor(SLOPES, dtype=F64)
    o_blocks, s_blocks = lightning_blocks(q, k, v, ld, 4)
    state = torch.zeros(2, 3, 4, 5, dtype=F64)
    steps = []
    for t in range(q.shape[1]):
        o_t, state = lightning_step(q[:, t], k[:, t], v[:, t], ld, state)
        steps.append(o_t)
    assert_close(torch.stack(steps, 1), o_blocks)
    assert_close(state, s_blocks)


def test_state_is_fp32_under_bf16_inputs(gen):
    q, k, v = _inputs(gen, dtype=torch.bfloat16)
    o, state = lightning_blocks(q, k, v, -torch.tensor(SLOPES), 4)
    assert o.dtype == torch.bfloat16 and state.dtype == torch.float32
    exact, _ = lightning_blocks(q.double(), k.double(), v.double(), -torch.tensor(SLOPES, dtype=F64), 4)
    assert_close(o, exact, torch.bfloat16)


def test_empty_sequence_keeps_the_state(gen):
    q, k, v = _inputs(gen, S=0)
    s0 = torch.randn(2, 3, 4, 5, generator=gen, dtype=F64)
    o, state = lightning_blocks(q, k, v, -torch.tensor(SLOPES, dtype=F64), 4, s0)
    assert o.shape == (2, 0, 3, 5)
    assert torch.equal(state, s0)


def test_decay_slopes_are_alibi_scaled_per_layer():
    # ALiBi slopes for 8 heads are 2^-1 .. 2^-8; MiniMax scales them by 1 - l/(L-1) (+1e-5).
    first = decay_slopes(8, 0, 5)
    assert first == pytest.approx([2.0 ** -(h + 1) * (1 + 1e-5) for h in range(8)], rel=1e-12)
    middle = decay_slopes(8, 2, 5)
    assert middle == pytest.approx([2.0 ** -(h + 1) * (0.5 + 1e-5) for h in range(8)], rel=1e-4)
    last = decay_slopes(8, 4, 5)
    assert all(0 < s < 1e-4 for s in last)  # the deepest layer barely forgets
    assert all(math.isfinite(s) for s in decay_slopes(1, 0, 1))
