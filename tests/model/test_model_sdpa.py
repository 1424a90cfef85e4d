"""The ``sdpa`` attention implementation (``scaled_dot_product_attention``) against the explicit softmax
island: same outputs and gradients at each dtype's tolerance, over every mask the explicit path
handles, in the layer, the whole model, the cached prefill and under context parallelism."""

from __future__ import annotations

import pytest
import torch
from model_cp_jobs import SEQ, cp_batch, cp_forward_backward, sdpa_model_cfg
from model_kit import policy, randomize, tiny_cfg
from model_tolerances import assert_close
from pydantic import ValidationError
from torch.nn.attention import SDPBackend, sdpa_kernel

from ringzero.model.attention import attention_fn, causal_attention, sdpa_causal_attention
from ringzero.model.config import ModelConfig, PrecisionPolicy
from ringzero.model.decode_check import random_weights_
from ringzero.model.hybrid import HybridLM
from ringzero.model.mla import MLACore
from ringzero.parallel.launch import RankPool
from ringzero.parallel.sharding import SeqLayout

F64, F32, BF16 = torch.float64, torch.float32, torch.bfloat16

# name -> (q_pos, k_pos, Q, K): every visibility pattern the explicit path is specified for.
CASES = {
    "plain": (torch.arange(7), torch.arange(7)),
    "shifted": (torch.arange(3, 10), torch.arange(3, 10)),
    "left_padded_rows": (torch.tensor([[-2, -1, 0, 1, 2, 3, 4], [0, 1, 2, 3, 4, 5, 6]]),) * 2,
    "unordered_with_padding": (
        torch.tensor([[9, 2, -1, 5], [0, 1, 2, 3]]),
        torch.tensor([[-2, -1, 0, 1, 5, 2], [0, 1, 2, 3, 4, 5]]),
    ),
    "cache_keys": (
        torch.tensor([[5, 6], [3, 4]]),
        torch.tensor([[-1, 0, 1, 2, 3, 4, 5, 6], [-3, -2, -1, 0, 1, 2, 3, 4]]),
    ),
    "all_future_keys": (torch.tensor([0, 1, 2]), torch.tensor([3, 4, 5, 6])),
}


def _inputs(gen, case: str, dtype, shared_kv: bool, e: int = 7):
    q_pos, k_pos = CASES[case]
    Q, K = q_pos.shape[-1], k_pos.shape[-1]
    hk = 1 if shared_kv else 3
    q = torch.randn(2, Q, 3, 5, generator=gen, dtype=F64)
    k = torch.randn(2, K, hk, 5, generator=gen, dtype=F64)
    v = torch.randn(2, K, hk, e, generator=gen, dtype=F64)
    return [t.to(dtype).requires_grad_(True) for t in (q, k, v)], q_pos, k_pos


def _run(fn, qkv, q_pos, k_pos, softmax_fp32=True):
    o = fn(*qkv, q_pos, k_pos, 0.37, softmax_fp32)
    grads = torch.autograd.grad(o.square().sum(), qkv)
    return o, grads


@pytest.mark.parametrize("dtype", [F64, F32])
@pytest.mark.parametrize("shared_kv", [False, True])
@pytest.mark.parametrize("case", sorted(CASES))
def test_sdpa_equals_explicit(gen, dtype, shared_kv, case):
    qkv, q_pos, k_pos = _inputs(gen, case, dtype, shared_kv)
    o_sdpa, g_sdpa = _run(sdpa_causal_attention, qkv, q_pos, k_pos)
    o_ref, g_ref = _run(causal_attention, qkv, q_pos, k_pos)
    assert o_sdpa.dtype == dtype
    assert_close(o_sdpa, o_ref)
    for a, b in zip(g_sdpa, g_ref, strict=True):
        assert torch.isfinite(a).all()
        assert_close(a, b)


def test_rows_that_see_nothing_are_zero_with_zero_gradients(gen):
    qkv, q_pos, k_pos = _inputs(gen, "unordered_with_padding", F64, shared_kv=False)
    o, (dq, dk, dv) = _run(sdpa_causal_attention, qkv, q_pos, k_pos)
    assert (o[0, 2] == 0).all() and (dq[0, 2] == 0).all()  # query at position -1 reads nothing
    assert (dk[0, :2] == 0).all() and (dv[0, :2] == 0).all()  # nobody reads the padding keys
    qkv, q_pos, k_pos = _inputs(gen, "all_future_keys", F64, shared_kv=False)
    o, grads = _run(sdpa_causal_attention, qkv, q_pos, k_pos)
    assert (o == 0).all() and all((g == 0).all() for g in grads)


@pytest.mark.parametrize("case", ["plain", "left_padded_rows"])
def test_sdpa_keeps_the_island_in_a_bf16_body(gen, case):
    """bf16 inputs: under softmax_fp32 the SDPA call runs on fp32 copies, so it is as close to the fp64
    answer as the explicit island (and within bf16 tolerance of it), and closer than plain bf16."""
    q_pos, k_pos = CASES[case]
    S = q_pos.shape[-1]
    q, k, v = (torch.randn(2, S, 4, 16, generator=gen, dtype=F64).mul(3).to(BF16) for _ in range(3))
    exact = causal_attention(q.double(), k.double(), v.double(), q_pos, k_pos, 0.5, True)
    island = causal_attention(q, k, v, q_pos, k_pos, 0.5, True)
    sdpa = sdpa_causal_attention(q, k, v, q_pos, k_pos, 0.5, True)
    plain = causal_attention(q, k, v, q_pos, k_pos, 0.5, False)
    assert sdpa.dtype == BF16
    assert_close(sdpa, island, BF16)
    err = {
        name: float((t.double() - exact).abs().max())
        for name, t in [("island", island), ("sdpa", sdpa), ("plain", plain)]
    }
    assert err["sdpa"] <= 1.01 * err["island"] + 1e-6 < err["plain"], err


@pytest.mark.parametrize("backend", [SDPBackend.MATH, SDPBackend.FLASH_ATTENTION])
def test_cpu_kernels_upcast_bf16_inside(gen, backend):
    """What docs/bench/memory.md states about torch's CPU kernels: given bf16 inputs (no island cast),
    both the math fallback and the flash kernel compute in fp32 inside, so their error against fp64
    matches the explicit island's rather than the plain bf16 path's."""
    S = 64
    pos = torch.arange(S)
    q, k, v = (torch.randn(2, S, 4, 16, generator=gen, dtype=F64).mul(3).to(BF16) for _ in range(3))
    exact = causal_attention(q.double(), k.double(), v.double(), pos, pos, 0.5, True)
    island = causal_attention(q, k, v, pos, pos, 0.5, True)
    plain = causal_attention(q, k, v, pos, pos, 0.5, False)
    with sdpa_kernel([backend]):
        raw = sdpa_causal_attention(q, k, v, pos, pos, 0.5, softmax_fp32=False)
    err_raw = float((raw.double() - exact).abs().max())
    err_island = float((island.double() - exact).abs().max())
    assert err_raw <= 1.01 * err_island + 1e-6 < float((plain.double() - exact).abs().max())


def test_sdpa_refuses_lse_and_unknown_impls():
    with pytest.raises(ValueError, match="log-sum-exp"):
        sdpa_causal_attention(
            *(torch.zeros(1, 2, 1, 4) for _ in range(3)),
            torch.arange(2),
            torch.arange(2),
            1.0,
            True,
            return_lse=True,
        )
    with pytest.raises(ValueError, match="unknown attention impl"):
        attention_fn("flash")
    with pytest.raises(ValidationError):
        tiny_cfg(mla_attention_impl="flash")


def _model_pair(body: str, layout: str = "LMLM"):
    explicit = randomize(HybridLM(tiny_cfg(layout=layout), policy(body)))
    sdpa = HybridLM(tiny_cfg(layout=layout, mla_attention_impl="sdpa"), policy(body))
    sdpa.load_state_dict(explicit.state_dict())
    return explicit, sdpa


def test_config_field_reaches_the_core():
    explicit, sdpa = _model_pair("float64")
    mla = [b.attention for b in sdpa.layers if b.kind == "mla"]
    assert mla and all(isinstance(a.core, MLACore) and a.core.impl == "sdpa" for a in mla)
    assert all(b.attention.core.impl == "explicit" for b in explicit.layers if b.kind == "mla")
    assert ModelConfig().mla_attention_impl == "explicit"  # the default keeps the explicit island


@pytest.mark.parametrize("body", ["float64", "float32", "bfloat16"])
def test_model_sdpa_equals_explicit(gen, body):
    """Whole model, left-padded per-row positions: logits and every parameter gradient."""
    explicit, sdpa = _model_pair(body)
    ids = torch.randint(0, 64, (2, 9), generator=gen)
    pos = torch.arange(9).repeat(2, 1)
    pos[1] -= 3
    real = pos >= 0
    out = {}
    for name, model in (("explicit", explicit), ("sdpa", sdpa)):
        logits = model(ids, pos)
        (logits.float().square().mean(-1) * real).sum().backward()
        out[name] = (logits, {n: p.grad for n, p in model.named_parameters()})
    dtype = out["explicit"][0].dtype if body != "bfloat16" else BF16
    assert_close(out["sdpa"][0][real], out["explicit"][0][real], dtype)
    for n, g in out["explicit"][1].items():
        assert_close(out["sdpa"][1][n], g, dtype)


def test_cached_prefill_through_sdpa_matches_the_parallel_form(gen):
    """A decode cache with left-padded rows: prefill chunks (expanded form over the cache's key positions,
    through sdpa) and single-token steps (absorbed form) equal the explicit parallel forward."""
    explicit, sdpa = _model_pair("float64", layout="MLMM")
    lens = [7, 4]
    ids = torch.randint(0, 64, (2, 10), generator=gen)
    pos = torch.stack([torch.arange(10) - (7 - n) for n in lens])  # row 1 left-padded by 3
    want = explicit(ids, pos)
    cache = sdpa.new_cache(2)
    parts = [
        sdpa(ids[:, :5], pos[:, :5], cache=cache),
        sdpa(ids[:, 5:8], pos[:, 5:8], cache=cache),
        sdpa(ids[:, 8:9], pos[:, 8:9], cache=cache),
        sdpa(ids[:, 9:], pos[:, 9:], cache=cache),
    ]
    got = torch.cat(parts, dim=1)
    real = pos >= 0
    assert_close(got[real], want[real])


@pytest.mark.distributed
def test_sdpa_model_under_context_parallelism():
    """parallelize swaps the sdpa-configured single-device cores for the CP cores of the default plan
    (MLA a2a, Lightning allgather); the sharded forward equals the single-device sdpa forward, and
    backward runs."""
    cp = 2
    with RankPool(cp, timeout_s=120) as pool:
        per_rank = pool.run(cp_forward_backward, cp)
    assert per_rank[0]["cores"] == ["LightningAllGatherCore", "MLAAllToAllCore"]
    assert all(torch.isfinite(g).all() for r in per_rank for g in r["grads"].values())
    logits = SeqLayout(SEQ, cp, "contiguous").unshard([r["logits"] for r in per_rank])
    single = random_weights_(
        HybridLM(sdpa_model_cfg(), PrecisionPolicy.preset("fp64")), torch.Generator().manual_seed(0)
    )
    ids, pos = cp_batch()
    want = single(ids, pos)
    real = pos >= 0
    assert_close(logits[:, :SEQ][real], want[real])
