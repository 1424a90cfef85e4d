"""Whole layers (projections, norms, RoPE around the CP core) and whole HybridLM training steps under
context parallelism equal the single-process run: output, input gradient, every parameter gradient,
and for the model the globally normalised loss and the parameters after one step of the training
optimizer (AdamW on fp32 masters with global-norm clipping)."""

from __future__ import annotations

import pytest
from cp_jobs import loss_job
from cp_params import CP_SIZES, cp_param

from ringzero.stages.cp_equivalence import CheckSpec, run_check

pytestmark = pytest.mark.distributed


def _assert_ok(report: dict) -> None:
    bad = {}

    def walk(node, path):
        for key, value in node.items():
            if isinstance(value, dict) and "ok" in value:
                if not value["ok"]:
                    bad[path + key] = (value["max_abs"], value["max_rel"])
            elif isinstance(value, dict) and key not in ("comm", "spec", "plan"):
                walk(value, path + key + ".")

    walk(report, "")
    assert report["ok"] and not bad, f"past tolerance: {bad}"


@pytest.mark.parametrize("cp", CP_SIZES)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize(
    "layer,strategy", [("mla", "a2a"), ("mla", "ring"), ("lightning", "allgather"), ("lightning", "ring")]
)
def test_layer_equals_single_process(pools, cp, dtype, layer, strategy):
    spec = CheckSpec(layer=layer, strategy=strategy, cp=cp, seq_len=23, dtype=dtype)
    report = run_check(spec, pools(cp))
    _assert_ok(report)
    names = set(report["grads"])
    inputs = "q_proj.weight" if layer == "mla" else "query_key_value.weight"
    assert {"dense.weight", inputs} <= names and "input_grad" in report


@pytest.mark.parametrize("cp", [cp_param(2)])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize(
    "strategy,sharding", [("a2a", "contiguous"), ("ring", "contiguous"), ("a2a", "zigzag")]
)
def test_hybrid_training_step_cp2_equals_cp1(pools, cp, dtype, strategy, sharding):
    spec = CheckSpec(layer="model", strategy=strategy, cp=cp, seq_len=30, dtype=dtype, sharding=sharding)
    report = run_check(spec, pools(cp))
    _assert_ok(report)
    assert set(report["update"]) == set(report["grads"]) and len(report["grads"]) > 30
    assert "loss" in report


@pytest.mark.parametrize("cp", [cp_param(4)])
def test_hybrid_training_step_cp4_equals_cp1(pools, cp):
    _assert_ok(run_check(CheckSpec(layer="model", strategy="a2a", cp=cp, seq_len=37), pools(cp)))


@pytest.mark.parametrize("world", [cp_param(4)])
def test_hybrid_training_step_dp2_cp2_equals_one_process(pools, world):
    """Rows split over two data-parallel replicas, each sequence over two CP ranks."""
    spec = CheckSpec(layer="model", strategy="a2a", cp=2, dp=2, batch=4, seq_len=26)
    _assert_ok(run_check(spec, pools(world)))


@pytest.mark.parametrize("world", [cp_param(4)])
@pytest.mark.parametrize("dp,cp", [(1, 4), (2, 2)])
def test_token_and_sequence_normalisation_over_shards(pools, world, dp, cp):
    """Both RL normalisations, computed from (dp, cp) shards with padding, equal the unsharded formulas
    in value and in gradient."""
    import torch

    (out, values, mask), *_ = pools(world).run(loss_job, dp, cp)
    v = values.clone().requires_grad_(True)
    m = mask.double()
    token = (v * m).sum() / m.sum()
    sequence = ((v * m).sum(-1) / m.sum(-1)).mean()
    for name, ref in (("token", token), ("sequence", sequence)):
        (grad,) = torch.autograd.grad(ref, v)
        value, sharded_grad = out[name]
        assert value == pytest.approx(ref.item(), abs=1e-12)
        torch.testing.assert_close(sharded_grad, grad, atol=1e-12, rtol=0)
