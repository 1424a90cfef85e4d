"""Tier and difficulty measures over a hand-made batch of a mixed-length digitsum: every number is
counted from the responses by hand."""

from __future__ import annotations

import pytest
import torch

from ringzero.config.stages import Tier
from ringzero.rl.rollout_batch import RolloutBatch
from ringzero.rl.tier_metrics import depth_contrast, tier_metrics
from ringzero.tasks.arithmetic import SyntheticArithmetic
from ringzero.tasks.config import ArithmeticTask

FAST, DEEP = Tier(name="fast", tag="[fast]", budget=10), Tier(name="deep", tag="[deep]", budget=40)


def batch_of(rows: list[tuple[tuple[int, ...], str | None, int, bool]]):
    """(digits, tier tag or None, response length, correct) per response."""
    task = SyntheticArithmetic(ArithmeticTask(operation="digitsum", digits=16, min_digits=4))
    problems = []
    for digits, tag, _, _ in rows:
        p = task.problem(digits)
        problems.append(task.with_tier(p, tag) if tag else p)
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


EASY, HARD = (1, 2, 3, 4), tuple(range(16))  # 4 digits: easy; 16: hard


def test_each_tier_and_bucket_counts_its_own_responses():
    task, batch = batch_of(
        [
            (EASY, "[fast]", 8, True),
            (EASY, "[fast]", 12, True),
            (HARD, "[fast]", 9, False),
            (HARD, "[deep]", 30, True),
            (HARD, "[deep]", 50, True),
            (EASY, "[deep]", 10, True),
            (EASY, None, 7, False),
        ]
    )
    got = tier_metrics(task, batch, [FAST, DEEP])
    assert got["tier/fast/accuracy"] == pytest.approx(2 / 3) and got["tier/fast/len_mean"] == pytest.approx(
        29 / 3
    )
    assert got["tier/fast/within_budget"] == pytest.approx(2 / 3)  # 8 and 9 of 10; 12 is over
    assert got["tier/fast/correct_within_budget"] == pytest.approx(1 / 3)
    assert got["tier/fast/easy/accuracy"] == 1.0 and got["tier/fast/easy/within_budget"] == 0.5
    assert got["tier/fast/hard/accuracy"] == 0.0 and got["tier/fast/hard/len_mean"] == 9.0
    assert got["tier/deep/hard/len_mean"] == 40.0 and got["tier/deep/hard/within_budget"] == 0.5
    assert got["tier/deep/easy/len_mean"] == 10.0
    assert "tier/fast/medium/accuracy" not in got  # no response there: left out, not 0
    assert got["difficulty/easy/accuracy"] == 0.0 and got["difficulty/easy/len_mean"] == 7.0
    assert not any(k.startswith("difficulty/hard") for k in got)


def test_a_single_length_task_reports_tiers_without_buckets():
    task, batch = batch_of([(EASY, "[fast]", 8, True)])
    task.cfg = task.cfg.model_copy(update={"min_digits": None})
    assert tier_metrics(task, batch, [FAST]) == {
        "tier/fast/accuracy": 1.0,
        "tier/fast/len_mean": 8.0,
        "tier/fast/within_budget": 1.0,
        "tier/fast/correct_within_budget": 1.0,
    }


def test_a_tier_may_not_be_named_like_a_bucket():
    with pytest.raises(ValueError, match="names a difficulty bucket"):
        Tier(name="hard", tag="[hard]", budget=10)


def test_depth_contrast_sets_the_largest_budget_against_the_smallest_per_bucket():
    task, batch = batch_of(
        [
            (EASY, "[fast]", 8, True),
            (HARD, "[fast]", 10, False),
            (HARD, "[fast]", 10, True),
            (EASY, "[deep]", 12, True),
            (HARD, "[deep]", 30, True),
            (HARD, "[deep]", 50, True),
        ]
    )
    mid = Tier(name="mid", tag="[mid]", budget=20)  # neither the fastest nor the deepest: not contrasted
    values = tier_metrics(task, batch, [DEEP, mid, FAST])
    got = depth_contrast(values, [DEEP, mid, FAST])
    assert got["tier/contrast/hard/accuracy_gap"] == pytest.approx(1.0 - 0.5)
    assert got["tier/contrast/hard/len_ratio"] == pytest.approx(40 / 10)
    assert got["tier/contrast/easy/accuracy_gap"] == 0.0 and got["tier/contrast/easy/len_ratio"] == 1.5
    assert got["tier/contrast/len_ratio"] == pytest.approx((92 / 3) / (28 / 3))
    assert not any("medium" in k for k in got)  # neither tier answered a medium item
    assert depth_contrast(values, [FAST]) == {}


def test_a_tier_may_not_take_the_contrasts_name():
    with pytest.raises(ValueError, match="heads the deep-against-fast"):
        Tier(name="contrast", tag="[c]", budget=10)
