"""``engines.training.distributed_optimizer: true``: megatron-core's DistributedOptimizer (Adam state sharded
over the data-parallel ranks) trains the micro run at dp = 2 (two gloo ranks, TP 1) like the torch engine
and like the megatron engine with ringzero's own optimizer: pretraining losses and weights, RL tokens,
metrics and final weights within the fp32 tolerance (``assert_same``). megatron's Adam is
``torch.optim.AdamW`` with ringzero's betas and eps, so no wider tolerance is needed. Each rank holds
about half of the moments; a resume round trip (``state()`` into a fresh optimizer) takes the same next
step."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("megatron.core")

from megatron_stage_jobs import run_engine  # noqa: E402
from test_megatron_stage import assert_same  # noqa: E402

pytestmark = [pytest.mark.distributed, pytest.mark.slow, pytest.mark.xdist_group("megatron-stage")]


@pytest.fixture(scope="module")
def sharded(two_ranks, tmp_path_factory):
    root = tmp_path_factory.mktemp("dist-opt")
    return two_ranks.run(run_engine, "megatron", 1, f"file://{root}/store", 2, False, True, True)[0]


def test_it_trains_like_the_torch_engine_and_the_megatron_optimizer(two_ranks, sharded, tmp_path):
    torch_run = two_ranks.run(run_engine, "torch", 1, f"file://{tmp_path}/torch", 2)[0]
    megatron_run = two_ranks.run(run_engine, "megatron", 1, f"file://{tmp_path}/megatron", 2)[0]
    assert sharded["trained"] == "MegatronLM"
    assert torch_run["rl_steps"][0]["metrics"]["loss/total"] != 0.0
    assert_same(torch_run, sharded, "distributed optimizer vs torch dp=2")
    assert_same(megatron_run, sharded, "distributed optimizer vs megatron dp=2")
    assert sharded["optim_meta"]["layout"] == "hybrid-names"
    full = {k.split(".", 1)[1] for k in sharded["optim_keys"] if k.startswith("exp_avg.")}
    assert full == set(sharded["rl_weights"])  # resume state: full moments under HybridLM names


def test_the_adam_state_is_sharded_over_the_data_parallel_ranks(sharded):
    counts = sharded["moment_elements"]
    total = sum(
        v.numel() for v in sharded["rl_weights"].values() if v.is_floating_point() and not v.numel() == 0
    )
    assert len(counts) == 2 and sum(counts) <= total
    for count in counts:
        assert 0.45 * sum(counts) < count < 0.55 * sum(counts), counts


def test_a_resume_round_trip_takes_the_same_next_step(sharded):
    original, resumed = sharded["resumed"]["original"], sharded["resumed"]["resumed"]
    assert (original["lr"], original["grad_norm"]) == (resumed["lr"], resumed["grad_norm"])
    for name, value in original["weights"].items():
        assert torch.equal(resumed["weights"][name], value), name
