"""Rewards through the Task interface: plain correctness, tier budgets (cutoff and linear), tier assignment,
and how a task's stop strings reach the rollout engine."""

import random

import pytest

from ringzero.config.stages import SamplingSettings, Tier
from ringzero.pipeline.identity import stage_fields
from ringzero.rl.rewards import TaskReward, budget_factor
from ringzero.rl.rollout_batch import sampling_params, stop_settings
from ringzero.tasks import make_task
from ringzero.tasks.config import ArithmeticTask
from ringzero.tokenizer import CharTokenizer

TIERS = [Tier(name="fast", tag="[fast]", budget=10, weight=3.0), Tier(name="deep", tag="[deep]", budget=100)]


@pytest.fixture
def task():
    return make_task(ArithmeticTask(digits=3))


def test_budget_factor():
    assert [budget_factor(n, 10, "cutoff") for n in (5, 10, 11)] == [1.0, 1.0, 0.0]
    assert [budget_factor(n, 10, "linear") for n in (10, 15, 20, 30)] == [1.0, 0.5, 0.0, 0.0]


def test_untiered_prompts_get_the_task_verdict(task):
    problem = task.prompts("train", 1, 0)[0]
    reward = TaskReward(task, TIERS)
    assert reward(problem, problem.answer + "\n", 500, False) == 1.0
    assert reward(problem, "x\n", 2, False) == 0.0


@pytest.mark.parametrize(
    "mode, tokens, expected", [("cutoff", 10, 1.0), ("cutoff", 11, 0.0), ("linear", 15, 0.5)]
)
def test_a_tiered_prompt_pays_only_within_its_budget(task, mode, tokens, expected):
    problem = task.with_tier(task.prompts("train", 1, 0)[0], "[fast]")
    assert TaskReward(task, TIERS, mode)(problem, problem.answer + "\n", tokens, False) == expected
    assert TaskReward(task, TIERS, mode)(problem, "wrong\n", 1, False) == 0.0


def test_under_penalty_going_over_the_budget_scores_below_any_answer_within_it(task):
    problem = task.with_tier(task.prompts("train", 1, 0)[0], "[fast]")
    reward = TaskReward(task, TIERS, "penalty", 0.5)
    assert reward(problem, problem.answer + "\n", 10, False) == 1.0
    assert reward(problem, "wrong\n", 10, False) == 0.0
    assert reward(problem, problem.answer + "\n", 11, False) == -0.5  # right, but over
    assert (
        reward(task.prompts("train", 1, 0)[0], problem.answer + "\n", 500, False) == 1.0
    )  # untiered: verdict


@pytest.mark.parametrize("mode, penalty", [("penalty", None), ("cutoff", 0.5)])
def test_the_penalty_goes_with_its_mode(task, mode, penalty):
    from pydantic import ValidationError

    from ringzero.config.stages import RLStage

    with pytest.raises(ValueError, match="tier_penalty"):
        TaskReward(task, TIERS, mode, penalty)
    with pytest.raises(ValidationError, match="tier_penalty"):
        RLStage.model_validate(dict(name="t", kind="rl", tier_reward=mode, tier_penalty=penalty))
    assert "tier_penalty" not in stage_fields(RLStage.model_validate(dict(name="t", kind="rl")))


def test_tiers_are_assigned_by_weight_and_tagged_in_the_prompt(task):
    problems = task.prompts("train", 400, 0)
    tiered = TaskReward(task, TIERS).assign_tiers(problems, random.Random(0))
    fast = sum(p.tier == "[fast]" for p in tiered) / len(tiered)
    assert 0.68 < fast < 0.82  # weight 3 : 1
    assert all(p.prompt.startswith(p.tier + " q: ") for p in tiered)
    assert TaskReward(task).assign_tiers(problems, random.Random(0)) == problems


def test_one_token_stop_strings_become_stop_ids(task):
    tok = CharTokenizer()
    assert stop_settings(task, tok) == ((), (tok.encode("\n")[0],))
    params = sampling_params(
        SamplingSettings(max_new_tokens=9, temperature=0.5), task, tok, n=3, seed=None, temperature=0.0
    )
    assert params.stop_token_ids == (tok.encode("\n")[0],) and params.temperature == 0.0 and params.n == 3
