"""One RL step: draw prompts, sample n responses each, reward, group advantages, minibatch updates,
push the new weights to the rollout engine; returns every metric of the step.

Per tier and difficulty bucket (``tier/<tier>/...``, ``difficulty/<bucket>/...``): ``rl.tier_metrics``.

Timings: ``time/generate`` (sampling, decoding and rewards), ``time/train`` (all minibatch updates,
numerator and reference log-probs included), ``time/sync`` (the weight push), ``time/step``; with an
accuracy anchor, ``time/anchor`` (the frozen reference's samples, ``rl.anchor``).

With ``anchor``, the prompts of its tiers take the reference's mean reward on them as their baseline
(``advantage.anchored_advantages``: ``R_i - R_ref(x)``) instead of their group's mean.

With mismatch corrections (``loss.corrections``), the trainer scores the batch once before the advantages
(``PolicyTrainer.correct``, counted in ``time/train``): the responses it drops stay out of their group's
baseline and out of the ``reward/*`` metrics, and ``correction/*`` reports what was dropped and weighted.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from ringzero.rl.advantage import anchored_advantages, group_advantages
from ringzero.rl.anchor import Anchor
from ringzero.rl.openings import Opening
from ringzero.rl.rewards import TaskReward
from ringzero.rl.rollout_batch import RolloutBatch, collect, sampling_params
from ringzero.rl.seeds import derive_seed
from ringzero.rl.tail_metrics import length_reward_summary, length_summary, reward_summary, trace_summary
from ringzero.rl.tier_metrics import depth_contrast, tier_metrics
from ringzero.rl.trainer import PolicyTrainer
from ringzero.rollout.types import RolloutClient
from ringzero.tasks.base import Task
from ringzero.tokenizer.base import Tokenizer


class Rollout(Protocol):
    """The engine a step samples from, and the push that serves it the trainer's weights after 0-based
    ``step``'s update."""

    client: RolloutClient

    def push(self, step: int) -> object: ...


@dataclass
class PushingRollout:
    """A ``Rollout`` over a fixed client and a push function."""

    client: RolloutClient
    push: Callable[[int], object]


@dataclass
class StepShape:
    prompts: int
    samples: int
    advantage_std: bool = True


class RLStep:
    """``run(step, seed) -> metrics``: ``seed`` (the run's unless a rollback reseeded the step) draws the
    prompts, sampling seeds and minibatch shuffle; after the update ``rollout.push(step)`` serves the new
    weights.

    ``seeded_sampling``: give each prompt its own sampling seed derived from (seed, step). Leave it off
    for a real SGLang server, which gives the n copies of a seeded request the same stream.
    """

    def __init__(
        self,
        *,
        rollout: Rollout,
        trainer: PolicyTrainer,
        task: Task,
        tokenizer: Tokenizer,
        reward: TaskReward,
        sampling,
        shape: StepShape,
        seed: int,
        seeded_sampling: bool = True,
        opening: Opening | None = None,
        anchor: Anchor | None = None,
    ):
        self.rollout, self.trainer, self.task, self.tokenizer = rollout, trainer, task, tokenizer
        self.reward, self.sampling, self.shape, self.seed = reward, sampling, shape, seed
        self.seeded_sampling, self.opening, self.anchor = seeded_sampling, opening, anchor
        self.last_batch: RolloutBatch | None = None

    def generate(self, step: int, seed: int | None = None) -> RolloutBatch:
        seed = self.seed if seed is None else seed
        rng = random.Random(derive_seed(seed, "rl-prompts", step))
        problems = self.reward.assign_tiers(self.task.prompts("train", self.shape.prompts, rng), rng)
        params = sampling_params(self.sampling, self.task, self.tokenizer, self.shape.samples, seed=None)
        seeds = (
            [derive_seed(seed, "rl-sample", step, i) for i in range(len(problems))]
            if self.seeded_sampling
            else None
        )
        return collect(
            self.rollout.client,
            self.task,
            self.tokenizer,
            problems,
            samples=self.shape.samples,
            params=params,
            reward=self.reward,
            seeds=seeds,
            device=self.trainer.device,
            routed_experts=self.trainer.routing_replay,
            opening=self.opening,
        )

    def run(self, step: int, seed: int | None = None) -> dict[str, float]:
        seed = self.seed if seed is None else seed  # a rollback's retry of a skipped batch: another
        t0 = time.perf_counter()
        batch = self.last_batch = self.generate(step, seed)
        t1 = time.perf_counter()
        anchored = (
            None
            if self.anchor is None
            else self.anchor.measure(
                batch,
                task=self.task,
                tokenizer=self.tokenizer,
                reward=self.reward,
                seed=seed,
                step=step,
                params=sampling_params(
                    self.sampling, self.task, self.tokenizer, self.anchor.samples, seed=None
                ),
            )
        )
        t_anchor = time.perf_counter()
        correction = self.trainer.correct(batch)
        keep_N = None if correction is None else correction.keep_N
        if anchored is None:
            advantages_N = group_advantages(
                batch.rewards_N, self.shape.samples, use_std=self.shape.advantage_std, keep_N=keep_N
            )
        else:
            advantages_N = anchored_advantages(
                batch.rewards_N,
                anchored.baseline_N,
                self.shape.samples,
                use_std=self.shape.advantage_std,
                keep_N=keep_N,
            )
        metrics = self.trainer.train(
            batch, advantages_N, seed=derive_seed(seed, "rl-minibatches", step), correction=correction
        )
        t2 = time.perf_counter()
        self.rollout.push(step)
        t3 = time.perf_counter()
        metrics.update(rollout_metrics(self.task, batch, keep_N))
        tiered = tier_metrics(self.task, batch, self.reward.tiers, rows=own_rows(batch))
        metrics.update(tiered)
        metrics.update(depth_contrast(tiered, self.reward.tiers))
        metrics.update(opening_metrics(batch))
        if anchored is not None:
            metrics.update({**anchored.metrics, "time/anchor": t_anchor - t1})
        if correction is not None:
            metrics.update(correction.metrics)
        if hasattr(self.rollout.client, "pop_metrics"):  # e.g. rollout/stale_samples of remote servers
            metrics.update(self.rollout.client.pop_metrics())
        metrics.update(
            {
                "time/generate": t1 - t0,
                "time/train": t2 - t_anchor,
                "time/sync": t3 - t2,
                "time/step": t3 - t0,
                "throughput/tokens_per_s": sum(batch.lengths) / (t3 - t0),
            }
        )
        return metrics


def own_rows(batch: RolloutBatch) -> list[int] | None:
    """The responses the policy wrote alone (None: all of them)."""
    return None if batch.forced is None else [i for i, f in enumerate(batch.forced) if not f]


def opening_metrics(batch: RolloutBatch) -> dict[str, float]:
    """``opening/*``: what the forced openings earned against the policy's own samples."""
    if batch.forced is None:
        return {}
    rewards = batch.rewards_N.tolist()
    forced = [r for r, f in zip(rewards, batch.forced, strict=True) if f]
    own = [r for r, f in zip(rewards, batch.forced, strict=True) if not f]
    # with forced_opening.tiers a batch may hold no prompt of those tiers: no forced mean then
    return {
        "opening/forced_frac": len(forced) / len(rewards),
        "opening/forced_reward_mean": sum(forced) / len(forced) if forced else float("nan"),
        "opening/own_reward_mean": sum(own) / len(own) if own else float("nan"),
    }


def rollout_metrics(task: Task, batch: RolloutBatch, keep_N: torch.Tensor | None = None) -> dict[str, float]:
    """What the policy did: rewards, accuracy, lengths, trace usage and step checks.

    ``keep_N``: the responses the mismatch corrections kept; the ``reward/*`` metrics count only those
    (lengths and traces describe every sampled response)."""
    correct = [float(c) for c in batch.correct]
    checks = [
        task.step_check(text, p) if traced else (0, 0)
        for text, p, traced in zip(batch.responses, batch.problems, batch.uses_trace, strict=True)
    ]
    keep = None if keep_N is None else keep_N.tolist()
    out = reward_summary(batch.rewards_N.tolist(), batch.group_size, keep)
    kept = [c for c, k in zip(correct, keep or [True] * len(correct), strict=True) if k]
    out["reward/accuracy"] = sum(kept) / len(kept) if kept else float("nan")
    out.update(length_summary(batch.lengths, batch.truncated))
    out.update(length_reward_summary(batch.lengths, correct, batch.group_size))
    out.update(trace_summary(batch.uses_trace, correct, checks))
    out.update(task.behaviour_metrics(batch.responses, batch.problems))
    return out
