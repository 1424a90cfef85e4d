"""Pipeline parallelism under the megatron engine: at pp = 2 each rank holds one stage of the micro model
(the Lightning layer with the embedding, the MLA layer with the final norm and head), megatron's 1F1B
schedule runs the micro-batches over the two stages, the loss and the per-token values are computed on
the last stage and summed back to every rank; the run then trains like the torch engine on one process
(pretraining losses and weights, RL tokens, metrics and final weights, within the fp32 tolerances of
``test_megatron_stage``), alone, with megatron's distributed optimizer, with a MoE layer, and with TP = 2
inside each stage (four ranks). Negative controls: per-token
values summed within one stage only (the first stage never sees the last stage's log-probs), and a
gradient norm taken without the other stage's parameters (each stage clips by another factor)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("megatron.core")

from megatron_stage_jobs import (  # noqa: E402
    run_engine,
    run_engine_norm_within_one_stage,
    run_engine_values_within_one_stage,
)
from test_megatron_stage import assert_same  # noqa: E402

from ringzero.engines.megatron.convert import StageLayers  # noqa: E402
from ringzero.parallel.launch import RankPool  # noqa: E402

pytestmark = [pytest.mark.distributed, pytest.mark.slow, pytest.mark.xdist_group("megatron-stage")]


@pytest.fixture(scope="module")
def pp2(pools, tmp_path_factory):
    return pools[2].run(
        run_engine, "megatron", 1, f"file://{tmp_path_factory.mktemp('megatron-pp2')}/store", pp=2
    )[0]


def test_each_stage_holds_its_layers_only(pp2):
    first, last = pp2["stages"]
    assert first["stage"] == StageLayers(0, 1, has_embedding=True, has_head=False)
    assert last["stage"] == StageLayers(1, 1, has_embedding=False, has_head=True)
    assert any(n.startswith("word_embeddings.") for n in first["params"])
    assert not any(n.startswith(("output_layer.", "norm.")) for n in first["params"])
    assert any(n.startswith("output_layer.") for n in last["params"])
    assert not any(n.startswith("word_embeddings.") for n in last["params"])
    # the first stage holds the Lightning layer, the last the MLA layer, each as its layer 0
    assert any(".self_attention.query_key_value." in n for n in first["params"])
    assert any(".self_attention.linear_kv_down_proj." in n for n in last["params"])
    assert all(n.split(".")[2] == "0" for n in first["params"] + last["params"] if n.startswith("decoder."))


def test_pp2_trains_like_the_torch_engine_on_one_process(torch_run, pp2):
    assert pp2["trained"] == "MegatronLM"
    # at the seam the whole model, under HybridLM's names, on every stage
    assert pp2["rl_weights"].keys() == torch_run["rl_weights"].keys()
    assert_same(torch_run, pp2, "megatron pp=2")


def test_pp2_with_the_distributed_optimizer_and_with_moe_trains_like_the_torch_engine(
    torch_run, pools, tmp_path
):
    """megatron's distributed optimizer takes its gradient norm over the stages too; the MoE layer (on the
    last stage) routes and trains as on one process."""
    got = pools[2].run(
        run_engine, "megatron", 1, f"file://{tmp_path}/do/store", pp=2, distributed_optimizer=True
    )[0]
    assert_same(torch_run, got, "megatron pp=2 distributed optimizer")
    torch_moe = pools[1].run(run_engine, "torch", 1, f"file://{tmp_path}/torch-moe/store", 1, True)[0]
    moe = pools[2].run(run_engine, "megatron", 1, f"file://{tmp_path}/moe/store", moe=True, pp=2)[0]
    assert any(".mlp.router." in n for n in moe["stages"][1]["params"])
    assert_same(torch_moe, moe, "megatron moe pp=2")


def test_pp2_scores_logp_old_for_the_corrections_like_one_process(pools, tmp_path):
    """The corrections' no-gradient scoring pass (logp_old) runs through the schedule forward-only."""
    ref = pools[1].run(run_engine, "torch", 1, f"file://{tmp_path}/torch/store", corrections=True)[0]
    got = pools[2].run(run_engine, "megatron", 1, f"file://{tmp_path}/pp2/store", pp=2, corrections=True)[0]
    for want, have in zip(ref["rl_steps"], got["rl_steps"], strict=True):
        # logp_old against the rollout's log-probs: ~1 with both fp32; 0-ish if the stages had not summed it
        w_ref, w_got = (
            want["metrics"]["correction/tis/weight_mean"],
            have["metrics"]["correction/tis/weight_mean"],
        )
        assert w_ref == pytest.approx(1.0, abs=0.05) and w_got == pytest.approx(w_ref, abs=1e-5)
    assert_same(ref, got, "megatron pp=2 with corrections")


def test_tp2_pp2_on_four_ranks_trains_like_the_torch_engine(torch_run, tmp_path):
    with RankPool(4, timeout_s=600) as pool:
        got = pool.run(run_engine, "megatron", 2, f"file://{tmp_path}/store", pp=2)[0]
    assert [s["stage"].first for s in got["stages"]] == [0, 0, 1, 1]
    assert got["tp_shard"] == (32, 32)  # half the vocabulary rows on each TP rank of the first stage
    assert_same(torch_run, got, "megatron tp=2 pp=2")


def test_values_summed_within_one_stage_fail_the_comparison(torch_run, pools, tmp_path):
    bad = pools[2].run(run_engine_values_within_one_stage, "megatron", 1, f"file://{tmp_path}/store", pp=2)[0]
    with pytest.raises(AssertionError, match="pretrain"):
        assert_same(torch_run, bad, "values within one stage")


def test_a_gradient_norm_of_one_stage_fails_the_comparison(torch_run, pools, tmp_path):
    bad = pools[2].run(run_engine_norm_within_one_stage, "megatron", 1, f"file://{tmp_path}/store", pp=2)[0]
    with pytest.raises(AssertionError, match="grad/norm"):
        assert_same(torch_run, bad, "norm within one stage")


@pytest.mark.parametrize("distributed_optimizer", [False, True])
def test_a_rollback_restores_each_stage_s_own_shards_bit_for_bit(pools, tmp_path, distributed_optimizer):
    """The rollback guard snapshots each rank's own shards (no gather): after a step and a restore the weights
    are those of the snapshot, and the same step taken again lands on the same weights, bit for bit."""
    got = pools[2].run(
        run_engine,
        "megatron",
        1,
        f"file://{tmp_path}/store",
        pp=2,
        distributed_optimizer=distributed_optimizer,
        rollback_check=True,
    )[0]["rollback"]
    assert any(
        not torch.equal(got["before"][k], got["after"][k]) for k in got["before"]
    )  # the step moved them
    assert all(torch.equal(got["restored"][k], got["before"][k]) for k in got["before"])
    assert all(torch.equal(got["again"][k], got["after"][k]) for k in got["after"])
