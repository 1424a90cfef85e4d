"""Each CP core's forward and every gradient equal a plain fp64 single-process reference, and each other.

CP 2 and 4; fp64 (1e-10) and fp32 (1e-4) from ``ringzero.model.tolerances``; contiguous and zigzag
shards; one row left-padded (negative positions); fp64 cases use a length no shard count divides, so
the end padding of ``SeqLayout`` is covered too. The MLA ``a2a`` core runs with both attention impls
(``explicit`` and ``sdpa``, the layer's ``model.mla_attention_impl``), each against the same reference.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from cp_jobs import SCALE, core_inputs, core_job
from cp_params import CP_SIZES, cp_param
from cp_reference import decayed_linear_attention, mla_core, softmax_attention

from ringzero.model import attention as attention_module
from ringzero.model.tolerances import compare
from ringzero.parallel.mla_cp import MLAAllToAllCore, blocked_causal_attention, sdpa_full_sequence_attention
from ringzero.parallel.sharding import SeqLayout
from ringzero.parallel.strategies import STRATEGIES

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
    by_hand = sum(
        lam[None, :, None] ** (5 - j) * (q[:, 5] * k[:, j]).sum(-1)[..., None] * v[:, j] for j in range(6)
    )
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
    q, k, v = (
        torch.randn(2, T, H, d, generator=gen, dtype=torch.float64, requires_grad=True) for d in (D, D, E)
    )
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


# --- a2a with the layer's attention impl -------------------------------------------------------------


def a2a_impls_job(ctx, seq_len: int, dtype: str, mode: str):
    """``core_job`` for the a2a core built as ``parallelize`` builds it for an ``sdpa`` layer (listed as
    ``a2a-sdpa`` for this call only) and for an ``explicit`` one."""
    base = STRATEGIES[("mla", "a2a")]
    key = ("mla", "a2a-sdpa")
    STRATEGIES[key] = dataclasses.replace(
        base,
        name=key[1],
        build=lambda group, ledger, sharding, impl="explicit": base.build(group, ledger, sharding, "sdpa"),
    )
    try:
        return core_job(ctx, "mla", ["a2a-sdpa", "a2a"], seq_len, dtype, mode)
    finally:
        del STRATEGIES[key]


@pytest.mark.parametrize("cp", CP_SIZES)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("mode", ["contiguous", "zigzag"])
def test_a2a_with_sdpa_equals_reference(pools, cp, dtype, mode):
    """The a2a core with ``sdpa`` attention: output and every gradient equal the plain reference (real
    tokens; left padding and, in fp64, end padding), the explicit a2a core, and its collectives are the
    explicit core's."""
    seq_len = 27 if dtype == "float64" else 24
    tdtype = getattr(torch, dtype)
    got = pools(cp).run(a2a_impls_job, seq_len, dtype, mode)
    expected, real_BS = reference("mla", seq_len, tdtype)
    sdpa, explicit = got[0]["a2a-sdpa"], got[0]["a2a"]
    for name, ref in expected.items():
        act = sdpa[name]
        if act.dim() >= 3 and act.shape[:2] == real_BS.shape:
            if name == "out":
                assert torch.all(act[~real_BS] == 0)  # left-padding rows see no key
            act, ref = act[real_BS], ref[real_BS]
        assert_close(act, ref, tdtype, f"a2a sdpa {name}")
        assert_close(sdpa[name], explicit[name], tdtype, f"a2a sdpa vs explicit {name}")
    assert all(r["a2a-sdpa"]["comm"] == r["a2a"]["comm"] for r in got)


def _gathered_positions(T: int, cp: int, mode: str, left_pad: tuple[int, ...]) -> torch.Tensor:
    """``[B, T]`` positions in the order the a2a core holds them after its all-gather (group-rank order
    of ``mode`` shards, end padding ``-1``), row b left-padded by ``left_pad[b]``."""
    lay = SeqLayout(T, cp, mode)
    pos = torch.arange(lay.padded_len)
    pos = torch.where(pos < T, pos, -1)[torch.cat([lay.positions(r) for r in range(cp)])]
    rows = pos.repeat(len(left_pad), 1)
    for b, pad in enumerate(left_pad):
        rows[b] = torch.where(rows[b] >= 0, rows[b] - pad, -1)
    return rows


@pytest.mark.parametrize("mode", ["contiguous", "zigzag"])
@pytest.mark.parametrize("left_pad", [(0, 0), (0, 4), (2, 5)], ids=["shared", "one-padded", "both-padded"])
def test_sdpa_full_sequence_attention_equals_reference(mode, left_pad):
    """Gathered token order (zigzag is not sequence order), end padding, left padding per row; rows
    that agree share one call, rows that differ run one at a time; fp64 outputs and gradients."""
    gen = torch.Generator().manual_seed(5)
    T, H, D, E = 23, 2, 6, 5
    pos = _gathered_positions(T, 2, mode, left_pad)
    q, k, v = (
        torch.randn(2, pos.shape[1], H, d, generator=gen, dtype=torch.float64, requires_grad=True)
        for d in (D, D, E)
    )
    cot = torch.randn(2, pos.shape[1], H, E, generator=gen, dtype=torch.float64)
    for positions in [pos[0], pos] if left_pad == (0, 0) else [pos]:
        got = sdpa_full_sequence_attention(q, k, v, positions, 0.4, True)
        grads = torch.autograd.grad((got * cot).sum(), (q, k, v))
        want = softmax_attention(q, k, v, positions.expand_as(pos), 0.4)
        want_grads = torch.autograd.grad((want * cot).sum(), (q, k, v))
        for a, b, what in zip((got, *grads), (want, *want_grads), ("out", "dq", "dk", "dv"), strict=True):
            assert_close(a, b, torch.float64, what)
        assert torch.all(got[pos < 0] == 0)


def test_sdpa_full_sequence_attention_edge_rows():
    """A row of nothing but padding gives zeros; positions shared by two tokens take the masked call."""
    gen = torch.Generator().manual_seed(6)
    q, k, v = (
        torch.randn(2, 7, 2, 4, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(3)
    )
    pos = torch.tensor([[-1] * 7, [0, 1, 1, 2, 5, 3, -1]])
    got = sdpa_full_sequence_attention(q, k, v, pos, 0.5, True)
    want = softmax_attention(q, k, v, pos, 0.5)
    assert torch.all(got[0] == 0)
    assert_close(got, want, torch.float64, "out")
    grads = torch.autograd.grad(got.square().sum(), (q, k, v))
    want_grads = torch.autograd.grad(want.square().sum(), (q, k, v))
    for a, b in zip(grads, want_grads, strict=True):
        assert_close(a, b, torch.float64, "grad")


def test_sdpa_full_sequence_attention_keeps_the_island(monkeypatch):
    """bf16 tokens under ``softmax_fp32``: the kernel gets fp32 q/k/v and no mask tensor (zigzag order
    with padding is put in position order first); the output comes back in bf16."""
    calls = []
    real_sdpa = attention_module.F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, is_causal=False, scale=None):
        calls.append((q.dtype, k.dtype, v.dtype, attn_mask, is_causal))
        return real_sdpa(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale)

    monkeypatch.setattr(attention_module.F, "scaled_dot_product_attention", spy)
    gen = torch.Generator().manual_seed(7)
    pos = _gathered_positions(21, 2, "zigzag", (0, 0))[0]
    q, k, v = (torch.randn(1, pos.numel(), 2, d, generator=gen).bfloat16() for d in (6, 6, 5))
    out = sdpa_full_sequence_attention(q, k, v, pos, 0.4, True)
    assert out.dtype == torch.bfloat16
    assert calls == [(torch.float32, torch.float32, torch.float32, None, True)]
    want = softmax_attention(q.double(), k.double(), v.double(), pos[None], 0.4)
    assert_close(out, want, torch.bfloat16, "bf16 island")
    calls.clear()
    sdpa_full_sequence_attention(q, k, v, pos, 0.4, False)
    assert calls[0][:3] == (torch.bfloat16,) * 3  # no island: the body dtype goes to the kernel


def test_a2a_core_refuses_an_unknown_impl():
    with pytest.raises(ValueError, match="unknown attention impl"):
        MLAAllToAllCore(None, None, impl="flash")


def parallelized_cores_job(ctx, impl: str, mla_strategy: str):
    """Every rank: a tiny HybridLM configured with ``impl``, parallelized; each attention core and its
    impl."""
    from ringzero.model.config import ModelConfig, PrecisionPolicy
    from ringzero.model.hybrid import HybridLM
    from ringzero.parallel.dims import ParallelDims
    from ringzero.parallel.parallelize import parallelize

    groups = ctx.groups(ParallelDims(dp=1, cp=ctx.world_size, world_size=ctx.world_size))
    cfg = ModelConfig(
        vocab_size=16,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        layout="LM",
        intermediate_size=16,
        max_position_embeddings=32,
        head_dim=8,
        lightning_block_size=4,
        kv_lora_rank=8,
        qk_nope_head_dim=8,
        qk_rope_head_dim=4,
        v_head_dim=6,
        mla_attention_impl=impl,
    )
    model = HybridLM(cfg, PrecisionPolicy.preset("fp32"))
    parallelize(model, groups, {"mla": mla_strategy, "lightning": "allgather"})
    return [
        (type(layer.attention.core).__name__, getattr(layer.attention.core, "impl", None))
        for layer in model.layers
    ]


@pytest.mark.parametrize("cp", [cp_param(2)])
@pytest.mark.parametrize("impl", ["explicit", "sdpa"])
def test_parallelize_passes_the_layer_impl_to_a2a(pools, cp, impl):
    """``parallelize`` builds the a2a core with the replaced ``MLACore``'s impl; the ring stays explicit."""
    a2a = pools(cp).run(parallelized_cores_job, impl, "a2a")
    assert all(r == [("LightningAllGatherCore", None), ("MLAAllToAllCore", impl)] for r in a2a)
    ring = pools(cp).run(parallelized_cores_job, impl, "ring")
    assert all(r == [("LightningAllGatherCore", None), ("MLARingCore", None)] for r in ring)
