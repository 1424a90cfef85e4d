"""Run configs: the shipped files validate; bad input is reported field by field, all at once."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ringzero.config import config_hash, load_config, parse_config
from ringzero.config.gates import parse_threshold
from ringzero.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "configs" / "tiny-cpu.yaml"


def tiny_data() -> dict:
    return yaml.safe_load(TINY.read_text())


def problems_of(data: dict) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(data, "test.yaml")
    return info.value.problems


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_configs_validate(path):
    cfg = load_config(path)
    assert cfg.stages, "a shipped config must run at least one stage"


def test_tiny_config_is_the_full_staged_pipeline():
    cfg = load_config(TINY)
    assert [s.kind for s in cfg.stages] == ["pretrain", "rl", "distill", "rl", "rl", "eval"]
    stage1, stage2 = cfg.stage("stage1"), cfg.stage("stage2")
    assert stage1.loss.normalization == "token_sum"
    assert stage2.loss.normalization == "sample_mean"
    assert cfg.stage("tier").tiers, "tier RL needs tiers"
    # A CPU without bf16 matrix units runs the tiny config in fp32; the paper's islands are one switch away.
    assert cfg.precision.train.name() == cfg.precision.rollout.name() == "fp32"
    islands = load_config(TINY, ["precision.train=fp32-islands"]).precision.train
    assert islands.body == "bfloat16" and islands.attention_softmax_fp32 and islands.lm_head_fp32


def test_cluster_config_runs_the_papers_islands_on_megatron():
    cfg = load_config(ROOT / "configs" / "cluster-h200.yaml")
    assert cfg.precision.train.name() == "fp32-islands"
    # the production engine on the cluster; the embedded torch engine stays the default elsewhere
    assert cfg.engines.training.kind == "megatron" and cfg.engines.training.distributed_optimizer
    assert load_config(TINY).engines.training.kind == "torch"
    # the two-node profile's override is a layout megatron takes too
    assert load_config(ROOT / "configs" / "cluster-h200.yaml", ["parallel.cp=4"]).parallel.cp == 4


def test_three_mistakes_are_all_reported_with_paths():
    data = tiny_data()
    data["model"]["hiden_size"] = 3
    data["stages"][1]["loss"]["eps_high"] = -1
    data["run"]["name"] = "Bad_Name"
    problems = problems_of(data)
    assert len(problems) == 3, problems
    joined = "\n".join(problems)
    assert "model.hiden_size: unknown key; did you mean 'hidden_size'?" in joined
    assert "stages[1].loss.eps_high: Input should be greater than 0 (got -1)" in joined
    assert "run.name:" in joined and "'Bad_Name'" in joined


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (
            lambda d: d["model"].update(num_attention_heads=0),
            "model.num_attention_heads: Input should be greater than or equal to 1 (got 0)",
        ),
        (
            lambda d: d["model"].update(layout="LLX"),
            "model.layout: must be hybrid, mla, lightning or a string",
        ),
        (lambda d: d["model"].update(layout="LLM"), "layout has 3 layer letters but num_hidden_layers is 4"),
        (lambda d: d["model"].update(qk_rope_head_dim=7), "model.qk_rope_head_dim: must be even"),
        (lambda d: d["precision"].update(train="fp16"), "precision.train: unknown precision preset 'fp16'"),
        (lambda d: d["precision"].update(train={"body": "float16"}), "precision.train.body: Input should be"),
        (lambda d: d["storage"].update(root="/tmp/x"), "storage.root: must start with file:// or s3://"),
        (lambda d: d["storage"].update(root="s3:///x"), "storage.root: s3 URI needs a bucket name"),
        (
            lambda d: d.update(storage={"root": "s3://b", "s3": {"endpoint": "http://h:9000"}}),
            "storage.s3.endpoint: give host:port without a scheme",
        ),
        (lambda d: d["engines"].update(rollout={"kind": "sglang"}), "engines.rollout: endpoint is required"),
        (
            lambda d: d["task"].update(kind="sudoku"),
            "task: Input tag 'sudoku' found using 'kind' does not match",
        ),
        (lambda d: d["stages"][1].update(kind="grpo"), "stages[1]: Input tag 'grpo' found using 'kind'"),
        (lambda d: d["stages"][1].update(minibatches=3), "minibatches (3) must divide"),
        (
            lambda d: d["stages"][1].update(gate=["ratio/p99 <== 1"]),
            "stages[1].gate[0]: cannot parse 'ratio/p99 <== 1'",
        ),
        (lambda d: d["stages"][1].update(stepz=3), "stages[1].stepz: unknown key; did you mean 'steps'?"),
        (
            lambda d: d["stages"][1]["loss"].update(kind="dpo"),
            "stages[1].loss.kind: Input should be 'sg_clip_is' or",
        ),
        (
            lambda d: d["stages"][2].update(init="nowhere"),
            "stages[2].init: 'nowhere' is neither a URI nor an earlier",
        ),
        (
            lambda d: d["stages"].append(
                {"name": "e2", "kind": "eval", "compare": [d["stages"][-1]["name"]]}
            ),
            "compare[0]: stage 'eval' makes no checkpoint",
        ),
        (
            lambda d: d["stages"][3].update(name="stage1"),
            "stages[3].name: 'stage1' is used by an earlier stage",
        ),
        (lambda d: d["stages"][4]["tiers"][2].update(name="fast"), "tier names must be unique"),
        (
            lambda d: d["stages"][5].update(compare=["tier", "later"]),
            "stages[5].compare[1]: 'later' is neither",
        ),
        (lambda d: d.pop("run"), "run: required field is missing"),
        (lambda d: d.update(extra_section={}), "extra_section: unknown key"),
    ],
)
def test_each_mistake_gets_a_precise_message(mutate, expected):
    data = tiny_data()
    mutate(data)
    problems = problems_of(data)
    assert any(expected in p for p in problems), problems


def test_unknown_top_level_key_lists_allowed_sections():
    data = tiny_data()
    data["modle"] = {}
    (problem,) = problems_of(data)
    assert problem == "modle: unknown key; did you mean 'model'?"


def test_overrides_by_index_and_by_stage_name(tmp_path):
    cfg = load_config(
        TINY, ["stages.stage1.steps=7", "stages.0.batch_size=4", "model.tie_word_embeddings=true"]
    )
    assert cfg.stage("stage1").steps == 7
    assert cfg.stages[0].batch_size == 4
    assert cfg.model.tie_word_embeddings is True


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("stages.nope.steps=3", "stages has no item named 'nope'"),
        ("stages.9.steps=3", "stages has 6 items; index 9 is out of range"),
        ("run.name.x=1", "cannot descend into run.name"),
        ("novalue", "expected PATH=VALUE"),
    ],
)
def test_bad_overrides_are_named(override, expected):
    with pytest.raises(ConfigError) as info:
        load_config(TINY, [override])
    assert any(expected in p for p in info.value.problems), info.value.problems


def test_override_value_is_typed_then_validated():
    with pytest.raises(ConfigError) as info:
        load_config(TINY, ["stages.stage1.steps=many"])
    assert info.value.problems == [
        "stages[1].steps: Input should be a valid integer, unable to parse string as an integer (got 'many')"
    ]


def test_yaml_syntax_error_names_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("run:\n  name: x\n  seed: [1, 2\nmodel: {}\n")
    with pytest.raises(ConfigError) as info:
        load_config(bad)
    assert "YAML syntax at line" in str(info.value)


def test_duplicate_yaml_keys_are_refused(tmp_path):
    dup = tmp_path / "dup.yaml"
    dup.write_text("run:\n  name: a\n  name: b\n")
    with pytest.raises(ConfigError) as info:
        load_config(dup)
    assert "duplicate key 'name' (first on line 2)" in str(info.value)


def test_top_level_must_be_mapping(tmp_path):
    f = tmp_path / "list.yaml"
    f.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(f)


def test_missing_file():
    with pytest.raises(ConfigError, match="no such file"):
        load_config("does/not/exist.yaml")


def test_validation_never_rewrites_input():
    data = tiny_data()
    before = yaml.safe_dump(data)
    parse_config(data)
    assert yaml.safe_dump(data) == before


def test_config_hash_tracks_content():
    a = load_config(TINY)
    b = load_config(TINY, ["stages.stage1.steps=61"])
    assert config_hash(a) == config_hash(load_config(TINY))
    assert config_hash(a) != config_hash(b)


def test_precision_presets_and_explicit_policy_agree():
    data = tiny_data()
    data["precision"] = {
        "train": {"body": "bfloat16", "attention_softmax_fp32": True, "lm_head_fp32": True},
        "rollout": "bf16",
    }
    cfg = parse_config(data)
    assert cfg.precision.train.name() == "fp32-islands"
    assert cfg.precision.rollout.name() == "bf16"
    assert not cfg.precision.rollout.attention_softmax_fp32


def test_layer_types_follow_the_ling_pattern():
    data = tiny_data()
    data["model"].update(num_hidden_layers=16, layer_group_size=8)
    types = parse_config(data).model.layer_types()
    assert [i for i, t in enumerate(types) if t == "mla"] == [7, 15]


@pytest.mark.parametrize(
    ("text", "metrics", "ok"),
    [
        ("ratio/p99 <= 0.05", {"ratio/p99": 0.05}, True),
        ("ratio/p99 <= 0.05", {"ratio/p99": 0.0500001}, False),
        ("reward/mean >= 0.3", {"reward/mean": 0.29}, False),
        ("len/mean < 600", {"len/mean": 12.0}, True),
        ("ratio/max > 3", {}, False),
        ("ratio/max <= 3", {"ratio/max": float("nan")}, False),
    ],
)
def test_thresholds(text, metrics, ok):
    passed, reason = parse_threshold(text).check(metrics)
    assert passed is ok
    assert text.split()[0] in reason
