"""The precision policy: where each dtype applies, and that the FP32 islands buy accuracy in a bf16 body."""

from __future__ import annotations

import pytest
import torch
from model_kit import policy, randomize, tiny_cfg

from ringzero.model.config import PrecisionPolicy
from ringzero.model.hybrid import HybridLM
from ringzero.model.precision import logits_dtype, state_dtype

BF16, F32, F64 = torch.bfloat16, torch.float32, torch.float64


@pytest.mark.parametrize(
    "preset,body,logits,state",
    [
        ("fp32-islands", BF16, F32, F32),
        ("bf16", BF16, BF16, F32),
        ("fp32", F32, F32, F32),
        ("fp64", F64, F64, F64),
    ],
)
def test_dtypes_follow_the_policy(gen, preset, body, logits, state):
    pol = PrecisionPolicy.preset(preset)
    model = HybridLM(tiny_cfg(), pol)
    assert {p.dtype for p in model.parameters()} == {body}
    assert logits_dtype(pol) == logits and state_dtype(pol) == state
    ids = torch.randint(0, 64, (2, 5), generator=gen)
    cache = model.new_cache(2)
    out = model(ids, cache=cache)
    assert out.dtype == logits
    lightning = [c for c in cache.layers if hasattr(c, "state")]
    mla = [c for c in cache.layers if hasattr(c, "latent")]
    assert all(c.state.dtype == state for c in lightning)
    assert all(c.latent.dtype == body for c in mla)


def test_lm_head_island_alone(gen):
    """Same bf16 hidden state into both heads: only the head's arithmetic differs."""
    cfg = tiny_cfg(vocab_size=512)
    islands = randomize(HybridLM(cfg, policy("bfloat16", lm_head_fp32=True)))
    plain = HybridLM(cfg, policy("bfloat16", lm_head_fp32=False))
    plain.load_state_dict(islands.state_dict())
    h = torch.randn(3, 7, 32, generator=gen).to(BF16)
    w = islands.head_weight.double()
    exact_norm = islands.norm(h.double())
    exact = exact_norm @ w.T
    err_island = (islands.logits(h).double() - exact).abs().max()
    err_plain = (plain.logits(h).double() - exact).abs().max()
    assert islands.logits(h).dtype == F32 and plain.logits(h).dtype == BF16
    assert err_island < err_plain / 10
