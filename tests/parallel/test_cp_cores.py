"""Each CP core's forward and every gradient equal a plain fp64 single-process reference, and each other.

CP 2 and 4; fp64 (1e-10) and fp32 (1e-4) from ``ringzero.model.tolerances``; contiguous and zigzag
shards; one row left-padded (negative positions); fp64 cases use a length no shard count divides, so
the end padding of ``SeqLayout`` is covered too.
"""

from __future__ import annotations

import pytest
import torch
from cp_jobs import SCALE, core_inputs, core_job
from cp_params import CP_SIZES
from cp_reference import decayed_linear_attention, mla_core, softmax_attention

from ringzero.model.tolerances import compare
from ringzero.parallel.mla_cp import blocked_causal_attention
from ringzero.parallel.sharding import SeqLayout

pytestmark = pytest.mark.distributed

CASES = [
    ("mla", ["a2a", "ring"], "contiguous"),
    ("mla", ["a2a", "ring"], "zigzag"),
    ("lightning", ["allgather", "ring"], "contiguous"),
    ("lightning", ["allgather"], "zigzag"),
]


def reference(kind: str, seq_len: int, dtype: torch.dtype) -> dict:
    """Outputs and gradients of the plain references on the inputs rounded to ``dtype``."""
    inputs = core_inputs(kind, seq_len, seed=0)
    tokens = {k: v.to(dtype).double().requires_grad_(True) for k, v in inputs["tokens"].items()}
    weights = {k: v.to(dtype).double().requires_grad_(True) for k, v in inputs["weights"].items()}
    if kind == "mla":
        out = mla_core(*tokens.values(), *weights.values(), inputs["positions"], SCALE)
    else:
        out = decayed_linear_attention(*tokens.values(), inputs["log_decay"])
    (out * inputs["cotangent"].to(dtype).double()).sum().backward()
    res = {"out": out.detach()}
    res.update({"d_" + k: t.grad for k, t in {**tokens, **weights}.items()})
    return res, inputs["positions"] >= 0


def assert_close(actual, expected, dtype, what):
    result = compare(actual, expected, dtype)
    assert result["ok"], f"{what}: max abs {result['max_abs']:.3e}, max rel {result['max_rel']:.3e}"


@pytest.mark.parametrize("cp", CP_SIZES)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("kind,strategies,mode", CASES, ids=[f"{k}-{m}" for k, _, m in CASES])
def test_core_equals_reference(pools, cp, dtype, kind, strategies, mode):
    seq_len = 27 if dtype == "float64" else 24
    tdtype = getattr(torch, dtype)
    got = pools(cp).run(core_job, kind, strategies, seq_len, dtype, mode)[0]
    expected, real_BS = reference(kind, seq_len, tdtype)
    for strategy in strategies:
        for name, ref in expected.items():
            act = got[strategy][name]
            if act.dim() >= 3 and act.shape[:2] == real_BS.shape:
                act, ref = act[real_BS], ref[real_BS]  # per-token tensors: real tokens only
            assert_close(act, ref, tdtype, f"{strategy} {name}")
    first, *others = strategies
    for other in others:
        for name in expected:
            assert_close(got[other][name], got[first][name], tdtype, f"{other} vs {first} {name}")


def test_reference_is_causal_and_skips_padding():
    """The references themselves: a future token never changes an earlier output, padding is ignored."""
    inputs = core_inputs("mla", 6, seed=1)
    out = mla_core(*inputs["tokens"].values(), *inputs["weights"].values(), inputs["positions"], SCALE)
    changed = {k: v.clone() for k, v in inputs["tokens"].items()}
    changed["c_kv"][:, -1] += 1.0
    out2 = mla_core(*changed.values(), *inputs["weights"].values(), inputs["positions"], SCALE)
    assert torch.equal(out[:, :-1], out2[:, :-1]) and not torch.equal(out[:, -1], out2[:, -1])
    assert torch.all(out[1, :2] == 0)  # row 1's two padding tokens see no key
    lin = core_inputs("lightning", 6, seed=1)
    o = decayed_linear_attention(*lin["tokens"].values(), lin["log_decay"])
    q, k, v = lin["tokens"].values()
    lam = torch.exp(lin["log_decay"])
    by_hand = sum(lam[None, :, None] ** (5 - j) * (q[:, 5] * k[:, j]).sum(-1)[..., None] * v[:, j] for j in range(6))
    torch.testing.assert_close(o[:, 5], by_hand, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("order", ["contiguous", "zigzag"])
def test_blocked_full_sequence_attention_equals_reference(order):
    """The a2a core's query-blocked attention (blocks far smaller than in production) keeps every
    visible key: outputs and gradients equal the plain reference, in gathered-zigzag order too."""
    gen = torch.Generator().manual_seed(3)
    T, H, D, E = 23, 2, 6, 5
    lay = SeqLayout(T, 2, order)
    perm = torch.cat([lay.positions(r) for r in range(2)])
    perm = perm[perm < T]
    pos = torch.arange(T).repeat(2, 1)[:, perm]
    pos[1] -= 4  # row 1 left-padded
    q, k, v = (torch.randn(2, T, H, d, generator=gen, dtype=torch.float64, requires_grad=True) for d in (D, D, E))
    cot = torch.randn(2, T, H, E, generator=gen, dtype=torch.float64)
    got = blocked_causal_attention(q, k, v, pos, 0.4, True, block=5)
    grads = torch.autograd.grad((got * cot).sum(), (q, k, v))
    want = softmax_attention(q, k, v, pos, 0.4)
    want_grads = torch.autograd.grad((want * cot).sum(), (q, k, v))
    for a, b, what in zip((got, *grads), (want, *want_grads), ("out", "dq", "dk", "dv"), strict=True):
        assert_close(a, b, torch.float64, what)


@pytest.mark.parametrize("cp", CP_SIZES)
@pytest.mark.parametrize("mode", ["contiguous", "zigzag"])
def test_mla_cores_in_small_blocks_equal_reference(pools, cp, mode):
    """Ring pieces and a2a query blocks of 3 rows (512 in production): many skipped and partly
    visible piece pairs, blocks straddling shard and padding boundaries."""
    got = pools(cp).run(core_job, "mla", ["a2a", "ring"], 27, "float64", mode, 0, 3)[0]
    expected, real_BS = reference("mla", 27, torch.float64)
    for strategy in ("a2a", "ring"):
        for name, ref in expected.items():
            act = got[strategy][name]
            if act.dim() >= 3 and act.shape[:2] == real_BS.shape:
                act, ref = act[real_BS], ref[real_BS]
            assert_close(act, ref, torch.float64, f"{strategy} {name}")
