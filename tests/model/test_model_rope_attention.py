"""RoPE and causal softmax attention against slow fp64 references."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from model_reference import rope, softmax_attention
from model_tolerances import assert_close

from ringzero.model.attention import causal_attention
from ringzero.model.rope import apply_rope, rope_cos_sin

F64 = torch.float64


@pytest.mark.parametrize("per_row", [False, True])
def test_rope_matches_complex_rotation(gen, per_row):
    x = torch.randn(2, 5, 3, 8, generator=gen, dtype=F64)
    pos = (
        torch.tensor([[0, 1, 7, 100000, -3], [5, 6, 7, 8, 9]])
        if per_row
        else torch.tensor([0, 1, 7, 100000, 3])
    )
    cos, sin = rope_cos_sin(pos, 8, 500.0, F64)
    got = apply_rope(x, cos, sin)
    p = pos if per_row else pos[None].expand(2, -1)
    want = torch.stack(
        [
            torch.stack(
                [torch.stack([rope(x[b, s, h], float(p[b, s]), 500.0) for h in range(3)]) for s in range(5)]
            )
            for b in range(2)
        ]
    )
    assert_close(got, want)


@settings(max_examples=25, deadline=None)
@given(m=st.integers(0, 5000), n=st.integers(0, 5000), shift=st.integers(-100, 5000))
def test_rope_scores_depend_only_on_distance(m, n, shift):
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 1, 1, 16, generator=g, dtype=F64), torch.randn(1, 1, 1, 16, generator=g, dtype=F64)

    def score(a, b):
        ca, sa = rope_cos_sin(torch.tensor([a]), 16, 10000.0, F64)
        cb, sb = rope_cos_sin(torch.tensor([b]), 16, 10000.0, F64)
        return (apply_rope(q, ca, sa) * apply_rope(k, cb, sb)).sum()

    assert_close(score(m + shift, n + shift), score(m, n))


def _reference(q, k, v, q_pos, k_pos, scale):
    B = q.shape[0]
    outs, lses = [], []
    for b in range(B):
        kb = k[b].expand(-1, q.shape[2], -1)
        vb = v[b].expand(-1, q.shape[2], -1)
        qp = q_pos[b] if q_pos.dim() == 2 else q_pos
        kp = k_pos[b] if k_pos.dim() == 2 else k_pos
        o, lse = softmax_attention(q[b], kb, vb, qp, kp, scale)
        outs.append(o)
        lses.append(lse)
    return torch.stack(outs), torch.stack(lses)


@pytest.mark.parametrize("shared_kv", [False, True])
def test_causal_attention_follows_positions_not_order(gen, shared_kv):
    # Unordered positions, padding (-1, -2), a query that sees nothing (pos -1), K longer than Q.
    q = torch.randn(2, 4, 3, 5, generator=gen, dtype=F64)
    hk = 1 if shared_kv else 3
    k = torch.randn(2, 6, hk, 5, generator=gen, dtype=F64)
    v = torch.randn(2, 6, hk, 7, generator=gen, dtype=F64)
    q_pos = torch.tensor([[9, 2, -1, 5], [0, 1, 2, 3]])
    k_pos = torch.tensor([[-2, -1, 0, 1, 5, 2], [0, 1, 2, 3, 4, 5]])
    o, lse = causal_attention(q, k, v, q_pos, k_pos, 0.37, softmax_fp32=True, return_lse=True)
    want_o, want_lse = _reference(q, k, v, q_pos, k_pos, 0.37)
    assert_close(o, want_o)
    assert torch.isneginf(lse[0, 2]).all() and (o[0, 2] == 0).all()
    finite = torch.isfinite(want_lse)
    assert_close(lse[finite], want_lse[finite])


def test_padding_rows_have_finite_gradients(gen):
    q = torch.randn(1, 3, 2, 4, generator=gen, dtype=F64, requires_grad=True)
    k = torch.randn(1, 3, 2, 4, generator=gen, dtype=F64, requires_grad=True)
    v = torch.randn(1, 3, 2, 4, generator=gen, dtype=F64, requires_grad=True)
    pos = torch.tensor([-1, 0, 1])
    causal_attention(q, k, v, pos, pos, 0.5, softmax_fp32=True).square().sum().backward()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all()
    assert (q.grad[0, 0] == 0).all()  # the padding query reads nothing
    assert (k.grad[0, 0] == 0).all() and (v.grad[0, 0] == 0).all()  # nobody reads the padding key


def test_softmax_island_is_closer_to_fp64_in_a_bf16_body(gen):
    # Sharp scores (scale 1, large logits) make bf16 exp/sum rounding visible.
    q = torch.randn(4, 64, 4, 32, generator=gen, dtype=F64) * 2
    k = torch.randn(4, 64, 4, 32, generator=gen, dtype=F64) * 2
    v = torch.randn(4, 64, 4, 32, generator=gen, dtype=F64)
    pos = torch.arange(64)
    qb, kb, vb = (t.to(torch.bfloat16) for t in (q, k, v))
    # The fp64 answer for the same (bf16-rounded) inputs: what is left is the arithmetic's rounding.
    exact = causal_attention(qb.double(), kb.double(), vb.double(), pos, pos, 0.2, softmax_fp32=True)
    island = causal_attention(qb, kb, vb, pos, pos, 0.2, softmax_fp32=True)
    plain = causal_attention(qb, kb, vb, pos, pos, 0.2, softmax_fp32=False)
    assert island.dtype == plain.dtype == torch.bfloat16
    err_island = (island.double() - exact).abs().max()
    err_plain = (plain.double() - exact).abs().max()
    assert err_island < err_plain
    assert_close(island, exact, torch.bfloat16)
