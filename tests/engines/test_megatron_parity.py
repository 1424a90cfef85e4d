"""MegatronLM equals HybridLM on identical fp32 weights: per-token log-probs and the gradient of every
parameter (compared under HybridLM's names, TP shards gathered), at TP = 1 in this process and at
TP = 2 on two gloo ranks, with the fp32 tolerance of ``ringzero.model.tolerances`` (atol = rtol = 1e-4
elementwise; measured: log-probs within 2e-6, gradients within 6e-5 of values up to ~20)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("megatron.core")

from megatron_kit import cp_parity_job, parity, parity_job, tiny_config  # noqa: E402

from ringzero.parallel.launch import RankPool  # noqa: E402

CASES = [
    pytest.param(dict(q_lora_rank=None, rope_interleave=True, tie=False), id="q-full-interleaved"),
    pytest.param(dict(q_lora_rank=12, rope_interleave=False, tie=True), id="q-lora-halves-tied"),
]


def _assert_parity(report: dict) -> None:
    assert report["logprobs"]["ok"], report["logprobs"]
    assert not report["missing_grads"]
    bad = {n: (r["max_abs"], r["max_rel"]) for n, r in report["grads"].items() if not r["ok"]}
    assert not bad, f"gradients past the fp32 tolerance: {bad}"
    assert report["state_round_trip"], "hybrid_state(MegatronLM) differs from the weights loaded"


@pytest.mark.parametrize("case", CASES)
def test_tp1_equals_hybrid(one_rank, case):
    _assert_parity(parity(tiny_config(**case)))


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_tp2_equals_hybrid(two_ranks, case):
    reports = two_ranks.run(parity_job, tiny_config(**case), 2)
    for report in reports:
        _assert_parity(report)


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_cp2_equals_hybrid(two_ranks, case):
    """Context parallelism inside the megatron layers: zigzag shards of an odd length (layout padding),
    MLA's all-to-all over heads and the Lightning all-gather of states, against HybridLM on the whole
    sequence: log-probs on the global grid and every gradient (summed over CP) within fp32 tolerance."""
    for report in two_ranks.run(cp_parity_job, tiny_config(**case), 1, 2):
        _assert_parity({**report, "state_round_trip": True})
        assert report["calls"] == [("lightning", "allgather"), ("mla", "a2a-heads")]


@pytest.mark.distributed
@pytest.mark.slow
def test_tp2_cp2_equals_hybrid():
    """TP = 2 x CP = 2 on four ranks: 4 heads, 2 per TP rank, 1 per CP rank in MLA's all-to-all."""
    cfg = tiny_config().model_copy(update={"num_attention_heads": 4})
    with RankPool(4, timeout_s=300) as pool:
        for report in pool.run(cp_parity_job, cfg, 2, 2):
            _assert_parity({**report, "state_round_trip": True})


def test_tp1_bf16_body_within_bf16_tolerance(one_rank):
    """Under fp32-islands (bf16 body) the models round differently (megatron's projections and norms
    are its own kernels), so they agree at the bf16 tolerance only; the head stays fp32."""
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron_kit import random_hybrid, weighted_logprob_loss

    from ringzero.engines.megatron import cpu_shim
    from ringzero.engines.megatron.convert import hybrid_grads, load_hybrid_state_
    from ringzero.engines.megatron.model import MegatronLM
    from ringzero.model.config import PrecisionPolicy
    from ringzero.model.tolerances import compare, tolerance

    cpu_shim.apply()
    model_parallel_cuda_manual_seed(0)
    cfg, policy = tiny_config(), PrecisionPolicy.model_validate("fp32-islands")
    ref = random_hybrid(cfg, policy)
    mlm = MegatronLM(cfg, policy)
    load_hybrid_state_(mlm, ref.state_dict())
    assert mlm.output_layer.weight.dtype == torch.float32
    assert mlm.decoder.layers[0].self_attention.query_key_value.weight.dtype == torch.bfloat16
    gen = torch.Generator().manual_seed(1)
    ids, weights = torch.randint(0, cfg.vocab_size, (2, 9), generator=gen), torch.randn(2, 9, generator=gen)
    lp_ref, loss_ref = weighted_logprob_loss(ref, ids, weights)
    lp_mlm, loss = weighted_logprob_loss(mlm, ids, weights)
    loss_ref.backward()
    loss.backward()
    assert lp_mlm.dtype == torch.float32
    report = compare(lp_mlm, lp_ref, torch.bfloat16)
    assert report["ok"], report
    # Every parameter's gradient, under megatron's names mapped back. A bf16 gradient sums many
    # bf16-rounded products, so its error scales with the tensor's largest entries, not with each entry:
    # the test is the bf16 rtol on the max-norm (max |a - b| over max |b|). A zero or missing gradient,
    # or one of the wrong sign, is far outside it.
    grads, expected = hybrid_grads(mlm), {n: p.grad for n, p in ref.named_parameters()}
    assert not (missing := sorted(set(expected) - set(grads))), f"no megatron gradient for {missing}"
    assert all(g is not None and g.abs().max() > 0 for g in expected.values())  # the reference did backward
    rtol = tolerance(torch.bfloat16).rtol
    rel = {n: compare(grads[n].to(g.dtype), g, torch.bfloat16)["max_rel"] for n, g in expected.items()}
    assert max(rel.values()) <= rtol, {n: r for n, r in rel.items() if r > rtol}
