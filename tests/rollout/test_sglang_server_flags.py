"""Every flag the launcher passes to ``sglang.launch_server`` is one the pinned SGLang release defines,
and a stage that replays MoE routing starts its servers with ``--enable-return-routed-experts`` (without
it SGLang refuses ``return_routed_experts`` on every request, so the first MoE RL step would fail)."""

from __future__ import annotations

import pytest
import yaml
from sglang_source import ROOT, distribution, image_version, server_flags

from ringzero.cluster.rollout import RolloutSpec, sglang_args
from ringzero.config.cluster import ClusterSettings
from ringzero.config.loader import parse_config
from ringzero.store.config import S3Settings

SETTINGS = ClusterSettings.model_validate(
    {
        "namespace": "ml",
        "images": {k: {"repository": k, "tag": "1"} for k in ("trainer", "rollout", "cpu")},
        "s3_secret": {"name": "s3"},
        "rollout": {"replicas": 1, "tp_size": 4},
    }
)


def flags(args: list[str]) -> list[str]:
    return [a for a in args if a.startswith("--")]


def test_the_installed_sglang_is_the_image_s():
    assert distribution().version == image_version()


@pytest.mark.parametrize("routed", [False, True])
@pytest.mark.parametrize("deterministic", [False, True])
def test_every_flag_is_sglang_s(routed, deterministic):
    spec = RolloutSpec(
        "s3://b/c",
        S3Settings(),
        lm_head_fp32=True,
        deterministic=deterministic,
        seed=1,
        routed_experts=routed,
    )
    args = sglang_args(SETTINGS, spec)
    unknown = [f for f in flags(args) if f not in server_flags()]
    assert not unknown, f"not flags of sglang {image_version()}: {unknown}"
    assert ("--enable-return-routed-experts" in args) == routed


def test_a_routing_replay_stage_asks_its_servers_for_routed_experts():
    data = yaml.safe_load((ROOT / "configs" / "cluster-h200.yaml").read_text())
    data["model"].update(
        num_experts=4, num_experts_per_tok=2, n_group=2, topk_group=1, moe_intermediate_size=64
    )
    first_rl = next(s for s in data["stages"] if s["kind"] == "rl")
    first_rl["loss"]["routing_replay"] = True
    data["engines"]["training"] = {"kind": "torch"}  # megatron's MoE layers do not replay routing (refused)
    cfg = parse_config(data, "cluster-h200.yaml")
    replay = [s for s in cfg.stages if s.name == first_rl["name"]]
    others = [s for s in cfg.stages if s.kind in ("rl", "distill", "eval") and s not in replay]
    assert replay[0].loss.routing_replay and others
    for stage in replay:
        assert RolloutSpec.from_run_config(cfg, "s3://b/c", stage).routed_experts
    for stage in others:
        assert not RolloutSpec.from_run_config(cfg, "s3://b/c", stage).routed_experts


def test_the_loadability_rules_follow_the_pinned_sglang_and_its_loader_still_says_what_they_rest_on():
    """``ringzero.model.sglang_loader`` was read from the SGLang release the rollout image pins; when the pin
    moves, this fails until the rules are reread. Each rule's ground is checked in that release's source."""
    from pathlib import Path

    from ringzero.model.sglang_loader import SGLANG_VERSION

    assert SGLANG_VERSION == image_version()
    source = Path(distribution().locate_file("sglang/srt/models/bailing_moe_linear.py")).read_text()
    compact = " ".join(source.split())
    # tied embeddings: the causal-LM class reads an attribute only its inner model has
    assert "self.lm_head = ( self.word_embeddings if config.tie_word_embeddings" in compact
    # null shared experts: compared with 0 as read (hf_config writes 0)
    assert 'self.num_shared_experts = getattr(config, "num_shared_experts", 0)' in compact
    assert "if self.num_shared_experts > 0:" in compact
    # every MLA layer's dense loads: renamed to o_proj when its name is not a parameter
    assert 'name = name.replace(".dense.", ".o_proj.")' in compact
    # the group-size assert
    assert "assert self.num_layers % self.layer_group_size == 0" in compact


def test_a_cluster_run_on_sglang_with_tied_embeddings_is_refused_at_load():
    from ringzero.errors import ConfigError

    data = yaml.safe_load((ROOT / "configs" / "cluster-h200.yaml").read_text())
    data["model"]["tie_word_embeddings"] = True
    data["cluster"] = SETTINGS.model_dump(mode="json")  # what the chart's pipeline upload fills in
    data["cluster"]["gpus_per_node"] = 4
    with pytest.raises(
        ConfigError, match="the cluster's SGLang servers cannot serve it: tie_word_embeddings"
    ):
        parse_config(data, "cluster-h200.yaml")
    data["engines"]["rollout"] = {"kind": "embedded"}  # the embedded server ties them fine
    parse_config(data, "cluster-h200.yaml")
