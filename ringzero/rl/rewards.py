"""The RL reward: the task's verdict, and for prompts asked at a tier, that verdict within the tier's budget.

Tier RL (stage 3) asks each prompt at a reasoning tier (``task.with_tier`` puts the tier's tag in the
prompt) and pays for a correct answer only as far as the response kept to the tier's token budget:

- ``cutoff``: full reward within the budget, none beyond it;
- ``linear``: full reward within the budget, then falling linearly to 0 at twice the budget;
- ``penalty``: the verdict within the budget, ``-penalty`` beyond it, right or wrong. Under ``cutoff`` a
  response over the budget scores what a wrong one within it does, so on an item the policy can only
  answer at length every sample scores 0 and the group teaches nothing; the penalty makes any
  within-budget answer, even a guess, better than going over.

A truncated response has no final answer, so the task already scores it 0 (and ``penalty`` below that
when it is over the budget).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Literal

from ringzero.tasks.base import Problem, Task

TierRewardMode = Literal["cutoff", "linear", "penalty"]


def budget_factor(tokens: int, budget: int, mode: Literal["cutoff", "linear"]) -> float:
    if tokens <= budget:
        return 1.0
    if mode == "cutoff":
        return 0.0
    return max(0.0, 1.0 - (tokens - budget) / budget)


class TaskReward:
    """``reward(problem, text, tokens, truncated)`` over ``task``; ``tiers`` (``Tier`` settings) may be empty."""

    def __init__(self, task: Task, tiers: Sequence = (), mode: TierRewardMode = "cutoff", penalty: float | None = None):
        if (mode == "penalty") != (penalty is not None):
            raise ValueError("tier_penalty: set it exactly when tier_reward is penalty")
        self.task, self.mode, self.penalty = task, mode, penalty
        self.tiers = list(tiers)
        self._by_tag = {t.tag: t for t in self.tiers}

    def __call__(self, problem: Problem, text: str, tokens: int, truncated: bool) -> float:
        correct = self.task.reward(problem, text)
        if problem.tier is None:
            return correct
        budget = self._by_tag[problem.tier].budget
        if self.mode == "penalty":
            return correct if tokens <= budget else -self.penalty
        return correct * budget_factor(tokens, budget, self.mode)

    def assign_tiers(self, problems: Sequence[Problem], rng: random.Random) -> list[Problem]:
        """Each problem asked at a tier drawn by the tiers' weights (unchanged when there are no tiers)."""
        if not self.tiers:
            return list(problems)
        weights = [t.weight for t in self.tiers]
        return [self.task.with_tier(p, rng.choices(self.tiers, weights)[0].tag) for p in problems]
