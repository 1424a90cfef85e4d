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

A tier with no budget (``budget: null``, e.g. a deep tier) and the untagged tier (``tag: null``, the prompt
asked as is) pay the task's plain verdict: the default mode stays in the training mix at the reward the
earlier stages trained it with (Thinkless trains both modes in every batch).
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
    """``reward(problem, text, tokens, truncated)`` over ``task``; ``tiers`` (``Tier`` settings) may be
    empty."""

    def __init__(
        self, task: Task, tiers: Sequence = (), mode: TierRewardMode = "cutoff", penalty: float | None = None
    ):
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
        if budget is None:
            return correct
        if self.mode == "penalty":
            return correct if tokens <= budget else -self.penalty
        return correct * budget_factor(tokens, budget, self.mode)

    def assign_tiers(self, problems: Sequence[Problem], rng: random.Random) -> list[Problem]:
        """Each problem asked at a tier drawn by the tiers' weights (unchanged when there are no tiers); a
        draw of the untagged tier leaves the problem as it is (``problem.tier`` None)."""
        if not self.tiers:
            return list(problems)
        weights = [t.weight for t in self.tiers]
        tags = [rng.choices(self.tiers, weights)[0].tag for _ in problems]
        return [
            p if tag is None else self.task.with_tier(p, tag) for p, tag in zip(problems, tags, strict=True)
        ]
