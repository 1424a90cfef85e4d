"""The untagged tier and tiers without a budget: drawn by weight among the tiers, rewarded with the task's
plain verdict, reported under their tier's name (and the untagged one under ``difficulty/`` too), kept out
of the depth contrast, and not sampled again by the eval stage."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch
from pydantic import ValidationError

from ringzero.config.stages import RLStage, Tier
from ringzero.rl.rewards import TaskReward
from ringzero.rl.rollout_batch import RolloutBatch
from ringzero.rl.tier_metrics import contrast_tiers, depth_contrast, tier_metrics
from ringzero.stages.evaluate import comparison_columns, run_tiers
from ringzero.tasks import make_task
from ringzero.tasks.arithmetic import SyntheticArithmetic
from ringzero.tasks.config import ArithmeticTask

FAST = Tier(name="fast", tag="[fast]", budget=10)
DEEP = Tier(name="deep", tag="[deep]", budget=None)  # no budget penalty: plain correctness
PLAIN = Tier(name="plain", tag=None, budget=None, weight=2.0)  # the prompt asked as is


@pytest.fixture
def task():
    return make_task(ArithmeticTask(digits=3))


def test_an_untagged_draw_leaves_the_problem_as_is_and_the_draw_follows_the_weights(task):
    problems = task.prompts("train", 800, 0)
    tiered = TaskReward(task, [FAST, DEEP, PLAIN]).assign_tiers(problems, random.Random(0))
    shares = {tag: sum(p.tier == tag for p in tiered) / len(tiered) for tag in ("[fast]", "[deep]", None)}
    assert shares[None] == pytest.approx(0.5, abs=0.06) and shares["[fast]"] == pytest.approx(0.25, abs=0.05)
    for before, after in zip(problems, tiered, strict=True):
        if after.tier is None:
            assert after == before  # untouched: same prompt text, no tag
        else:
            assert after.prompt == f"{after.tier} {before.prompt}"


def test_the_draws_of_tagged_tiers_are_the_ones_they_were(task):
    """A stage without an untagged tier draws with the same random stream as before it existed."""
    problems = task.prompts("train", 50, 0)
    rng, ref = random.Random(3), random.Random(3)
    tiered = TaskReward(task, [FAST, DEEP]).assign_tiers(problems, rng)
    expected = [task.with_tier(p, ref.choices([FAST, DEEP], [1.0, 1.0])[0].tag) for p in problems]
    assert tiered == expected


@pytest.mark.parametrize("mode, penalty", [("cutoff", None), ("linear", None), ("penalty", 0.5)])
def test_untagged_and_unbudgeted_prompts_get_the_plain_verdict(task, mode, penalty):
    reward = TaskReward(task, [FAST, DEEP, PLAIN], mode, penalty)
    plain = task.prompts("train", 1, 0)[0]
    deep = task.with_tier(plain, "[deep]")
    for problem in (plain, deep):
        assert reward(problem, plain.answer + "\n", 500, False) == 1.0  # far beyond any budget: still paid
        assert reward(problem, "wrong\n", 500, False) == 0.0  # never the penalty
    fast = task.with_tier(plain, "[fast]")
    assert reward(fast, plain.answer + "\n", 500, False) == (-0.5 if mode == "penalty" else 0.0)


def test_at_most_one_untagged_tier_and_tags_are_said_explicitly():
    tiers = [PLAIN.model_dump(), {"name": "other", "tag": None, "budget": None}]
    with pytest.raises(ValidationError, match=r"tiers.tag: at most one tier may be untagged"):
        RLStage.model_validate(dict(name="t", kind="rl", tiers=tiers))
    with pytest.raises(ValidationError, match="tag"):
        Tier.model_validate({"name": "x", "budget": 10})  # a forgotten tag is an error, not the untagged mode
    with pytest.raises(ValidationError, match="budget"):
        Tier.model_validate({"name": "x", "tag": "[x]"})
    assert RLStage.model_validate(dict(name="t", kind="rl", tiers=[PLAIN.model_dump(), FAST.model_dump()]))


def batch_of(rows):
    """(digits, tier tag or None, response length, correct) per response."""
    task = SyntheticArithmetic(ArithmeticTask(operation="digitsum", digits=16, min_digits=4))
    problems = [task.with_tier(task.problem(d), tag) if tag else task.problem(d) for d, tag, _, _ in rows]
    n = len(rows)
    batch = RolloutBatch(
        problems=problems,
        prompt_ids=[[1]] * n,
        output_ids=[[2] * length for _, _, length, _ in rows],
        responses=["x"] * n,
        logp_rollout_NT=torch.zeros(n, 1, dtype=torch.float64),
        mask_NT=torch.ones(n, 1, dtype=torch.bool),
        rewards_N=torch.zeros(n),
        correct=[c for *_, c in rows],
        truncated=[False] * n,
        uses_trace=[False] * n,
        group_size=1,
    )
    return task, batch


EASY, HARD = (1, 2, 3, 4), tuple(range(16))


def test_the_untagged_tier_is_reported_under_its_name_and_under_difficulty():
    task, batch = batch_of(
        [
            (EASY, None, 7, False),
            (HARD, None, 30, True),
            (HARD, None, 50, True),
            (HARD, "[deep]", 40, True),
            (EASY, "[fast]", 8, True),
        ]
    )
    got = tier_metrics(task, batch, [FAST, DEEP, PLAIN])
    assert got["tier/plain/accuracy"] == pytest.approx(2 / 3) and got["tier/plain/len_mean"] == pytest.approx(
        29
    )
    assert got["tier/plain/hard/accuracy"] == 1.0 and got["tier/plain/hard/len_mean"] == 40.0
    assert got["tier/plain/easy/accuracy"] == 0.0
    assert got["difficulty/hard/accuracy"] == 1.0 and got["difficulty/easy/len_mean"] == 7.0  # as before
    assert "tier/plain/within_budget" not in got and "tier/deep/within_budget" not in got  # no budget
    assert "tier/deep/hard/correct_within_budget" not in got
    assert got["tier/fast/within_budget"] == 1.0 and got["tier/fast/easy/correct_within_budget"] == 1.0
    without = tier_metrics(task, batch, [FAST, DEEP])  # no untagged tier: as-is responses are untiered only
    assert not any(k.startswith("tier/plain") for k in without) and without["difficulty/hard/accuracy"] == 1.0


def test_the_contrast_takes_tagged_tiers_only_and_no_budget_is_the_deepest():
    mid = Tier(name="mid", tag="[mid]", budget=500)
    assert contrast_tiers([PLAIN, mid, DEEP, FAST]) == (FAST, DEEP)
    assert contrast_tiers([PLAIN, FAST]) is None  # one tagged tier: nothing to contrast
    task, batch = batch_of([(HARD, "[fast]", 10, False), (HARD, "[deep]", 40, True), (HARD, None, 90, True)])
    values = tier_metrics(task, batch, [FAST, DEEP, PLAIN])
    got = depth_contrast(values, [PLAIN, FAST, DEEP])
    assert got == {
        "tier/contrast/accuracy_gap": 1.0,
        "tier/contrast/len_ratio": 4.0,
        "tier/contrast/hard/accuracy_gap": 1.0,
        "tier/contrast/hard/len_ratio": 4.0,
    }
    assert depth_contrast(values, [PLAIN, FAST]) == {}


def test_the_eval_measures_tagged_tiers_only_and_keeps_its_keys():
    cfg = SimpleNamespace(stages=[SimpleNamespace(tiers=[PLAIN, FAST, DEEP]), SimpleNamespace()])
    tiers = run_tiers(cfg)
    assert tiers == [FAST, DEEP]  # the untagged tier is the eval's untiered measurement
    columns = dict(comparison_columns(4, tiers, ("hard",)))
    assert columns["eval/fast/within_budget"] == "fast within 10" and "eval/deep/within_budget" not in columns
    assert columns["eval/contrast/hard/accuracy_gap"] == "deep-fast acc (hard)"
    assert "eval/hard/accuracy" in columns and "eval/deep/hard/accuracy" in columns
    assert not any(k.startswith("eval/plain") for k in columns)


def test_the_heldout_eval_samples_the_untagged_tier_once_as_the_untiered_prompts():
    from ringzero.model.config import ModelConfig, PrecisionPolicy
    from ringzero.model.hybrid import HybridLM
    from ringzero.rollout.engine.embedded import EmbeddedEngine
    from ringzero.stages.heldout_eval import evaluate_heldout
    from ringzero.tokenizer.char import CharTokenizer

    cfg = ModelConfig.model_validate(
        dict(
            vocab_size=64,
            hidden_size=16,
            num_hidden_layers=2,
            num_attention_heads=2,
            layout="LM",
            intermediate_size=24,
            max_position_embeddings=64,
            kv_lora_rank=8,
            qk_nope_head_dim=8,
            qk_rope_head_dim=4,
            v_head_dim=6,
            head_dim=8,
            lightning_block_size=8,
        )
    )
    model = HybridLM(cfg, PrecisionPolicy.preset("fp32"))
    model.reset_parameters(torch.Generator().manual_seed(0))
    task = make_task(ArithmeticTask(digits=2))
    got = evaluate_heldout(
        EmbeddedEngine(model.eval(), CharTokenizer()),
        task,
        CharTokenizer(),
        prompts=2,
        samples=1,
        max_new_tokens=4,
        tiers=[PLAIN, FAST],
        forced_trace=False,
    )
    assert "eval/fast/accuracy" in got and "eval/accuracy" in got
    assert not any(k.startswith("eval/plain") for k in got)
