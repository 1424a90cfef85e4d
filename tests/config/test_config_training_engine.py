"""engines.training: the megatron degrees are typed, checked against the model and the layout, and refused
where nothing would act on them."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ringzero.config import parse_config
from ringzero.errors import ConfigError

TINY = Path(__file__).resolve().parents[2] / "configs" / "tiny-cpu.yaml"


def with_engine(training: dict, **sections) -> dict:
    data = yaml.safe_load(TINY.read_text())
    data["engines"]["training"] = training
    data.update(sections)
    return data


def problems(data: dict) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(data, "t.yaml")
    return " | ".join(info.value.problems)


def test_megatron_with_tensor_parallel_validates():
    cfg = parse_config(with_engine({"kind": "megatron", "tp": 2}), "t.yaml")
    assert (cfg.engines.training.kind, cfg.engines.training.tp) == ("megatron", 2)


def test_megatron_takes_context_parallelism_on_zigzag_shards():
    cfg = parse_config(
        with_engine({"kind": "megatron", "tp": 2}, parallel={"cp": 2, "sharding": "zigzag"}), "t.yaml"
    )
    assert (cfg.parallel.cp, cfg.engines.training.tp) == (2, 2)


def test_megatron_takes_pipeline_parallelism_and_refuses_it_with_tied_embeddings():
    cfg = parse_config(with_engine({"kind": "megatron", "pp": 2, "tp": 2}), "t.yaml")
    assert (cfg.engines.training.pp, cfg.engines.training.tp) == (2, 2)
    data = with_engine({"kind": "megatron", "pp": 2})
    data["model"]["tie_word_embeddings"] = True
    assert "engines.training.pp: 2 with model.tie_word_embeddings" in problems(data)


def test_megatron_takes_the_distributed_optimizer():
    cfg = parse_config(with_engine({"kind": "megatron", "tp": 2, "distributed_optimizer": True}), "t.yaml")
    assert cfg.engines.training.distributed_optimizer


@pytest.mark.parametrize(
    "training, sections, expected",
    [
        ({"kind": "torch", "tp": 2}, {}, "tp: 2 is a megatron degree"),
        ({"kind": "torch", "distributed_optimizer": True}, {}, "distributed_optimizer: megatron-core's"),
        ({"kind": "torch", "pp": 2}, {}, "pp: 2 is a megatron degree"),
        (
            {"kind": "megatron", "pp": 3},
            {},
            "engines.training.pp: 3 does not divide model.num_hidden_layers (4)",
        ),
        (
            {"kind": "megatron", "ep": 2},
            {"parallel": {"dp": 2, "cp": 1}},
            "engines.training.ep: 2: the model has no MoE",
        ),
        ({"kind": "megatron", "tp": 3}, {}, "tp: 3 does not divide model.num_attention_heads (4)"),
        (
            {"kind": "megatron"},
            {"parallel": {"dp": 1, "cp": 2}},
            "parallel.cp = 2 needs parallel.sharding: zigzag",
        ),
        (
            {"kind": "megatron"},
            {"parallel": {"cp": 2, "sharding": "zigzag", "cp_plan": {"mla": "ring"}}},
            "parallel.cp_plan must be mla: a2a, lightning: allgather (got mla: ring",
        ),
        (
            {"kind": "megatron", "tp": 4},
            {"parallel": {"cp": 2, "sharding": "zigzag"}},
            "parallel.cp: 2 does not divide the 1 heads of each tensor-parallel rank",
        ),
        (
            {"kind": "megatron"},
            {"precision": {"train": "fp32", "rollout": "fp32", "deterministic": True}},
            "precision.deterministic",
        ),
        ({"kind": "megatron", "tp": 0}, {}, "engines.training.tp"),
    ],
)
def test_what_the_engine_cannot_do_is_refused_by_name(training, sections, expected):
    assert expected in problems(with_engine(training, **sections))


MOE = dict(num_experts=4, num_experts_per_tok=2, n_group=2, topk_group=1, moe_intermediate_size=64)


def test_megatron_trains_a_moe_model_at_tp():
    data = with_engine({"kind": "megatron", "tp": 2})
    data["model"].update(MOE)
    cfg = parse_config(data, "t.yaml")
    assert (cfg.engines.training.kind, cfg.model.num_experts) == ("megatron", 4)


@pytest.mark.parametrize(
    "moe, expected",
    [
        ({"norm_topk_prob": False}, "norm_topk_prob is false"),
        (
            {"num_experts": 8, "num_experts_per_tok": 4, "n_group": 2, "topk_group": 1},
            "num_experts_per_tok // model.topk_group is 4",
        ),
        ({"moe_intermediate_size": 63}, "does not divide model.moe_intermediate_size (63)"),
    ],
)
def test_megatron_refuses_what_its_moe_cannot_express(moe, expected):
    data = with_engine({"kind": "megatron", "tp": 2})
    data["model"].update({**MOE, **moe})
    assert expected in problems(data)


@pytest.mark.parametrize("distributed_optimizer", [False, True])
def test_megatron_splits_experts_over_ep_ranks_of_dp(distributed_optimizer):
    data = with_engine(
        {"kind": "megatron", "ep": 2, "distributed_optimizer": distributed_optimizer},
        parallel={"dp": 2, "cp": 1},
    )
    data["model"].update(MOE)
    cfg = parse_config(data, "t.yaml")
    assert (cfg.engines.training.ep, cfg.parallel.dp) == (2, 2)


@pytest.mark.parametrize(
    "training, dp, expected",
    [
        (
            {"kind": "megatron", "ep": 2},
            3,
            "engines.training.ep: 2 does not divide dp x cp (3 x 1 = 3)",
        ),
        ({"kind": "megatron", "ep": 3}, 3, "engines.training.ep: 3 does not divide model.num_experts (4)"),
        ({"kind": "torch", "ep": 2}, 2, "ep: 2 is a megatron degree"),
    ],
)
def test_expert_parallelism_is_refused_where_it_cannot_split(training, dp, expected):
    training = dict(training)
    cp = training.pop("cp", 1)
    data = with_engine(training, parallel={"dp": dp, "cp": cp, "sharding": "zigzag"})
    data["model"].update(MOE)
    assert expected in problems(data)


def test_expert_parallelism_folds_in_the_context_parallel_ranks():
    """As megatron-core lays it out: ep divides dp x cp, so ep 4 fits dp 2 x cp 2 and ep 2 fits dp 1 x cp
    2."""
    for dp, cp, ep in ((2, 2, 2), (2, 2, 4), (1, 2, 2)):
        data = with_engine(
            {"kind": "megatron", "ep": ep}, parallel={"dp": dp, "cp": cp, "sharding": "zigzag"}
        )
        data["model"].update(MOE)
        cfg = parse_config(data, "t.yaml")
        assert (cfg.engines.training.ep, cfg.parallel.cp) == (ep, cp)


def test_megatron_refuses_routing_replay():
    data = with_engine({"kind": "megatron"})
    data["model"].update(MOE)
    rl = next(i for i, st in enumerate(data["stages"]) if st["kind"] == "rl")
    data["stages"][rl]["loss"]["routing_replay"] = True
    assert f"stages[{rl}].loss.routing_replay: the megatron engine" in problems(data)


def test_the_cluster_config_can_select_megatron():
    from ringzero.config import load_config

    cfg = load_config(
        TINY.parent / "cluster-h200.yaml",
        ["engines.training.kind=megatron", "engines.training.tp=4", "parallel.cp=1"],
    )
    assert (cfg.engines.training.kind, cfg.engines.training.tp, cfg.parallel.dp) == ("megatron", 4, 2)


def test_expert_parallel_minibatches_must_split_evenly_over_data_parallel_ranks():
    """The MoE layers of the dp ranks exchange tokens in every forward: uneven shares would leave one rank
    waiting in a micro-batch its peer never runs."""
    data = with_engine({"kind": "megatron", "ep": 2}, parallel={"dp": 2, "cp": 1})
    data["model"].update(MOE)
    rl = next(s for s in data["stages"] if s["kind"] == "rl")
    rl.update(prompts_per_step=3, samples_per_prompt=2, minibatches=2)
    assert (
        "a minibatch of prompts_per_step x samples_per_prompt / minibatches = 3 responses does not split "
        "evenly over parallel.dp (2)" in problems(data)
    )
