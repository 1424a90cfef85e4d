"""Expert parallelism under the megatron engine: at dp = 2, ep = 2 (2 gloo ranks) each rank holds half of
every MoE layer's routed experts, megatron's allgather dispatcher moves each rank's tokens to the experts'
ranks and back, and the expert gradients are summed over the ranks holding the same experts only. The
MoE micro run then trains like the torch engine at dp = 2 (pretraining losses and weights, RL tokens,
metrics and final weights, within the fp32 tolerances of ``test_megatron_stage``); summing the expert
gradients over every DP rank instead (a negative control) does not. With megatron's distributed
optimizer the expert state is sharded over the expert-data-parallel group (here one rank) and the run
trains the same."""

from __future__ import annotations

import pytest

pytest.importorskip("megatron.core")

from megatron_stage_jobs import (  # noqa: E402
    MOE,
    assert_state_sharded,
    run_engine,
    run_engine_experts_summed_over_dp,
    uneven_pretrain_loss,
)
from test_megatron_stage import assert_same  # noqa: E402

pytestmark = [pytest.mark.distributed, pytest.mark.slow, pytest.mark.xdist_group("megatron-stage")]


@pytest.fixture(scope="module")
def torch_dp2(two_ranks, tmp_path_factory):
    store = f"file://{tmp_path_factory.mktemp('torch-moe-dp2')}/store"
    return two_ranks.run(run_engine, "torch", 1, store, dp=2, moe=True)[0]


@pytest.fixture(scope="module")
def megatron_ep2(two_ranks, tmp_path_factory):
    store = f"file://{tmp_path_factory.mktemp('megatron-ep2')}/store"
    return two_ranks.run(run_engine, "megatron", 1, store, dp=2, moe=True, ep=2)[0]


def test_each_rank_holds_half_the_routed_experts(megatron_ep2):
    E, half, width, hidden = MOE["num_experts"], MOE["num_experts"] // 2, MOE["moe_intermediate_size"], 32
    shards = megatron_ep2["expert_shards"]
    assert [s["ep_rank"] for s in shards] == [0, 1]
    for s in shards:
        local = {n.split(".local_experts.")[1].split(".")[0] for n in s["experts"]}
        assert local == {str(j) for j in range(half)}
        for name, shape in s["experts"].items():
            assert shape == (
                (2 * width, hidden) if name.endswith("linear_fc1.weight") else (hidden, width)
            ), name
    # at the seam every expert, full, under HybridLM's global names
    names = megatron_ep2["rl_weights"]
    assert {j for j in range(E) if f"layers.1.mlp.experts.{j}.gate_proj.weight" in names} == set(range(E))


def test_megatron_ep2_trains_like_the_torch_engine_at_dp2(torch_dp2, megatron_ep2):
    assert any(".mlp.experts." in k for k in torch_dp2["rl_weights"])
    assert megatron_ep2["trained"] == "MegatronLM"
    assert megatron_ep2["rl_weights"].keys() == torch_dp2["rl_weights"].keys()
    assert_same(torch_dp2, megatron_ep2, "megatron dp=2 ep=2")


def test_expert_gradients_summed_over_every_dp_rank_fail_the_comparison(torch_dp2, two_ranks, tmp_path):
    bad = two_ranks.run(
        run_engine_experts_summed_over_dp, "megatron", 1, f"file://{tmp_path}/store", dp=2, moe=True, ep=2
    )[0]
    # every EP rank's expert j is another expert: the sum mixes experts 0 and 2 (1 and 3), already in
    # pretraining
    with pytest.raises(AssertionError, match=r"pretrained layers\.1\.mlp\.experts\."):
        assert_same(torch_dp2, bad, "experts summed over dp")


def test_megatron_ep2_with_the_distributed_optimizer_trains_like_the_torch_engine(
    torch_dp2, two_ranks, tmp_path
):
    got = two_ranks.run(
        run_engine,
        "megatron",
        1,
        f"file://{tmp_path}/store",
        dp=2,
        moe=True,
        ep=2,
        distributed_optimizer=True,
    )[0]
    assert got["rl_weights"].keys() == torch_dp2["rl_weights"].keys()
    assert_same(torch_dp2, got, "megatron dp=2 ep=2 distributed optimizer")
    # the dense parameters' moments are split over the two DP ranks, each rank's experts' are its own
    assert_state_sharded(got)


@pytest.fixture(scope="module")
def four_ranks():
    from ringzero.parallel.launch import RankPool

    with RankPool(4, timeout_s=600) as pool:
        yield pool


def test_cp2_ep2_folds_the_cp_ranks_into_expert_groups_and_trains_like_the_torch_engine(
    torch_dp2, four_ranks, tmp_path
):
    """dp 2 x cp 2 x ep 2 on four ranks: megatron puts the two CP ranks of a sequence on two expert shards
    (expert-data-parallel ranks [0, 2] and [1, 3]), the engine checks that layout at join and sums the
    expert gradients over those groups; the run equals the torch engine's at dp 2 (any layout trains the
    same)."""
    got = four_ranks.run(run_engine, "megatron", 1, f"file://{tmp_path}/store", dp=2, moe=True, ep=2, cp=2)[0]
    assert [s["ep_rank"] for s in got["expert_shards"]] == [0, 1, 0, 1]
    assert got["cp_calls"], "context parallelism ran in the layers"
    assert_same(torch_dp2, got, "megatron dp=2 cp=2 ep=2")


def test_cp2_ep2_with_expert_gradients_summed_over_every_replica_rank_fails(torch_dp2, four_ranks, tmp_path):
    bad = four_ranks.run(
        run_engine_experts_summed_over_dp,
        "megatron",
        1,
        f"file://{tmp_path}/store",
        dp=2,
        moe=True,
        ep=2,
        cp=2,
    )[0]
    with pytest.raises(AssertionError, match=r"layers\.1\.mlp\.experts\."):
        assert_same(torch_dp2, bad, "experts summed over dp x cp")


def test_uneven_data_parallel_shares_run_as_many_micro_batches_on_every_rank(two_ranks):
    """5 rows over dp 2 in micro-batches of 2: shares of 3 and 2 rows would need 2 and 1 micro-batches, and
    the second rank's MoE layers would never meet the first's second forward. Every rank now cuts its share
    into as many micro-batches; the loss is the one-process loss."""
    one = two_ranks.run(uneven_pretrain_loss, "torch", 5, dp=2)[0]  # the torch engine: the one-process loss
    got = two_ranks.run(uneven_pretrain_loss, "megatron", 5, dp=2, ep=2)[0]
    assert got == pytest.approx(one, rel=1e-5)
