"""The stage code trains the same under the megatron engine as under the torch engine: a micro run's
pretraining losses and weights, its RL rollouts token for token, its losses and its final weights, at
TP = 1 and TP = 2 and at CP = 2 (gloo ranks), and with a MoE layer at TP = 1, within the fp32 tolerance helper
(the engines differ in kernels and summation order only); resume state is layout-free (full tensors under the
model's names, the MoE routing biases included)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("megatron.core")

from layout_compare import MIN_RL_MOVE, rl_moved  # noqa: E402
from layout_compare import assert_same as shared_assert_same  # noqa: E402
from megatron_stage_jobs import assert_state_sharded, run_engine  # noqa: E402

pytestmark = [pytest.mark.distributed, pytest.mark.slow, pytest.mark.xdist_group("megatron-stage")]
STEP_KEYS = ("loss/total", "ratio/p99", "ratio/max", "reward/mean", "len/mean", "grad/norm", "kl/mean")


@pytest.fixture(scope="module")
def torch_moe_run(pools, tmp_path_factory):
    return pools[1].run(
        run_engine, "torch", 1, f"file://{tmp_path_factory.mktemp('torch-moe')}/store", 1, True
    )[0]


def assert_same(ref: dict, got: dict, label: str) -> None:
    shared_assert_same(ref, got, label, STEP_KEYS)


@pytest.mark.parametrize("tp", [1, 2])
def test_megatron_trains_like_the_torch_engine(torch_run, pools, tmp_path, tp):
    assert torch_run["rl_steps"][0]["metrics"]["loss/total"] != 0.0  # the comparison has something to compare
    assert rl_moved(torch_run) > MIN_RL_MOVE  # RL really updated, measured from RL's own start
    got = pools[tp].run(run_engine, "megatron", tp, f"file://{tmp_path}/store")[0]
    assert (torch_run["trained"], got["trained"]) == ("HybridLM", "MegatronLM")
    assert got["tp_shard"] == (64 // tp, 32)  # each rank holds its share of the vocabulary rows
    assert_same(torch_run, got, f"megatron tp={tp}")
    # resume state by parameter name, full tensors: the same whatever the TP degree that wrote it
    assert got["optim_meta"]["layout"] == "hybrid-names"
    assert {k.split(".", 1)[1] for k in got["optim_keys"] if k.startswith("exp_avg.")} == set(
        got["rl_weights"]
    )


@pytest.mark.parametrize("distributed_optimizer", [False, True])
def test_megatron_cp2_trains_like_the_torch_engine(torch_run, pools, tmp_path, distributed_optimizer):
    """Context parallelism inside the megatron layers (MLA all-to-all over heads, Lightning all-gather of
    states, zigzag shards) trains as the torch engine does on one rank; megatron's distributed optimizer
    then shards the state over the two CP ranks."""
    got = pools[2].run(
        run_engine, "megatron", 1, f"file://{tmp_path}/store", 1, False, distributed_optimizer, False, 1, 2
    )[0]
    if distributed_optimizer:
        assert_state_sharded(got)
    assert got["trained"] == "MegatronLM"
    assert got["cp_calls"] == [("lightning", "allgather"), ("mla", "a2a-heads")]
    assert_same(torch_run, got, "megatron cp=2")


def test_megatron_trains_moe_like_the_torch_engine(torch_moe_run, pools, tmp_path):
    assert any(".mlp.experts." in k for k in torch_moe_run["rl_weights"])
    got = pools[1].run(run_engine, "megatron", 1, f"file://{tmp_path}/store", 1, True)[0]
    assert got["trained"] == "MegatronLM"
    assert_same(torch_moe_run, got, "megatron moe tp=1")


def test_the_comparison_catches_a_wrong_update(torch_run):
    """Negative control: weights that moved one more small step do not pass for the same run."""
    bent = {
        **torch_run,
        "rl_weights": {k: v + 1e-3 * torch.sign(v) for k, v in torch_run["rl_weights"].items()},
    }
    with pytest.raises(AssertionError, match="RL weights"):
        assert_same(torch_run, bent, "bent")
