"""The accuracy anchor: the frozen reference's accuracy on a prompt as that prompt's advantage baseline.

AdaptThink (Zhang et al., 2025) lets the policy prefer the short mode only under the constraint that its
accuracy stays at least the reference model's; the constraint's Lagrangian gives the advantage
``R(x, y) - R_ref(x)``, ``R_ref(x)`` the reference's mean accuracy on prompt x. Without it tier RL centers
every group on its own mean, so nothing holds the deep or untagged tier where stage 2 left it: a group that
is uniformly worse than the reference has zero advantages and teaches nothing.

With ``anchor`` set, each step the frozen reference (an embedded engine over its weights) answers every
anchored prompt ``samples`` times: the same prompt (tier tag included), sampling settings and reward as
the policy's, seeds derived per step and prompt. Their mean reward is the baseline of that prompt's rows
(``advantage.anchored_advantages``), so a response below the reference is pushed down even when its whole
group is. The reference never trains, so ``R_ref`` only moves with the prompts drawn.

Metrics, over the anchored prompts: ``anchor/ref_accuracy`` (the reference's task verdicts),
``anchor/accuracy`` (the policy's own samples, forced openings left out), ``anchor/gap`` (policy minus
reference: below 0 when the policy fell behind), ``anchor/ref_reward`` (the mean baseline).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, replace

import torch

from ringzero.rl.rollout_batch import RewardFn, RolloutBatch, collect
from ringzero.rl.seeds import derive_seed
from ringzero.rollout.types import RolloutClient, SamplingParams
from ringzero.tasks.base import Problem, Task
from ringzero.tokenizer.base import Tokenizer


@dataclass
class AnchorResult:
    baseline_N: (
        torch.Tensor
    )  # float32 [N]: R_ref of the row's prompt; NaN where the group mean stays the baseline
    metrics: dict[str, float]


class Anchor:
    """``measure(batch, ...)`` -> the batch's per-row baselines; ``client`` samples the frozen reference."""

    def __init__(self, client: RolloutClient, tags: Collection[str | None], samples: int):
        if samples < 1:
            raise ValueError(f"anchor.samples must be >= 1 (got {samples})")
        self.client, self.tags, self.samples = client, frozenset(tags), samples

    def applies(self, problem: Problem) -> bool:
        """Asked at an anchored tier (``problem.tier`` is its tag; None: the untagged tier)."""
        return problem.tier in self.tags

    def measure(
        self,
        batch: RolloutBatch,
        *,
        task: Task,
        tokenizer: Tokenizer,
        params: SamplingParams,
        reward: RewardFn,
        seed: int,
        step: int,
    ) -> AnchorResult:
        """``params``: the policy's sampling settings (``n`` is replaced by ``samples``)."""
        G = batch.group_size
        prompts = batch.problems[::G]
        anchored = [k for k, p in enumerate(prompts) if self.applies(p)]
        baseline_N = torch.full(
            (len(batch),), float("nan"), dtype=torch.float32, device=batch.rewards_N.device
        )
        if not anchored:
            return AnchorResult(baseline_N, {})
        ref = collect(
            self.client,
            task,
            tokenizer,
            [prompts[k] for k in anchored],
            samples=self.samples,
            params=replace(params, n=self.samples),
            reward=reward,
            seeds=[derive_seed(seed, "rl-anchor", step, k) for k in anchored],
        )
        ref_A = ref.rewards_N.view(len(anchored), self.samples).mean(dim=1)
        for a, k in enumerate(anchored):
            baseline_N[k * G : (k + 1) * G] = ref_A[a]
        forced = batch.forced or [False] * len(batch)
        own = [i for k in anchored for i in range(k * G, (k + 1) * G) if not forced[i]]
        ref_accuracy = sum(ref.correct) / len(ref.correct)
        metrics = {"anchor/ref_accuracy": ref_accuracy, "anchor/ref_reward": float(ref_A.mean())}
        if own:
            accuracy = sum(batch.correct[i] for i in own) / len(own)
            metrics.update({"anchor/accuracy": accuracy, "anchor/gap": accuracy - ref_accuracy})
        return AnchorResult(baseline_N, metrics)
