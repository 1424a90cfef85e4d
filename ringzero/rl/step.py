"""One RL step: draw prompts, sample n responses each, reward, group advantages, minibatch updates,
push the new weights to the rollout engine; returns every metric of the step.

Timings: ``time/generate`` (sampling, decoding and rewards), ``time/train`` (all minibatch updates,
numerator and reference log-probs included), ``time/sync`` (the weight push), ``time/step``.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from ringzero.rl.advantage import group_advantages
from ringzero.rl.rewards import TaskReward
from ringzero.rl.rollout_batch import RolloutBatch, collect, sampling_params
from ringzero.rl.seeds import derive_seed
from ringzero.rl.tail_metrics import length_summary, reward_summary, trace_summary
from ringzero.rl.trainer import PolicyTrainer
from ringzero.tasks.base import Task
from ringzero.tokenizer.base import Tokenizer


@dataclass
class StepShape:
    prompts: int
    samples: int
    advantage_std: bool = True


class RLStep:
    """``run(step) -> metrics``. ``push(step)`` sends the trainer's weights to ``client`` after the update.

    ``seeded_sampling``: give each prompt its own sampling seed derived from (seed, step). Leave it off
    for a real SGLang server, which gives the n copies of a seeded request the same stream.
    """

    def __init__(self, *, client, trainer: PolicyTrainer, task: Task, tokenizer: Tokenizer, reward: TaskReward,
                 sampling, shape: StepShape, seed: int, push: Callable[[int], object],
                 seeded_sampling: bool = True):
        self.client, self.trainer, self.task, self.tokenizer = client, trainer, task, tokenizer
        self.reward, self.sampling, self.shape, self.seed = reward, sampling, shape, seed
        self.push, self.seeded_sampling = push, seeded_sampling
        self.last_batch: RolloutBatch | None = None

    def generate(self, step: int) -> RolloutBatch:
        rng = random.Random(derive_seed(self.seed, "rl-prompts", step))
        problems = self.reward.assign_tiers(self.task.prompts("train", self.shape.prompts, rng), rng)
        params = sampling_params(self.sampling, self.task, self.tokenizer, self.shape.samples, seed=None)
        seeds = ([derive_seed(self.seed, "rl-sample", step, i) for i in range(len(problems))]
                 if self.seeded_sampling else None)
        return collect(self.client, self.task, self.tokenizer, problems, samples=self.shape.samples,
                       params=params, reward=self.reward, seeds=seeds, device=self.trainer.device,
                       routed_experts=self.trainer.routing_replay)

    def run(self, step: int) -> dict[str, float]:
        t0 = time.perf_counter()
        batch = self.last_batch = self.generate(step)
        t1 = time.perf_counter()
        advantages_N = group_advantages(batch.rewards_N, self.shape.samples, use_std=self.shape.advantage_std)
        metrics = self.trainer.train(batch, advantages_N, seed=derive_seed(self.seed, "rl-minibatches", step))
        t2 = time.perf_counter()
        self.push(step)
        t3 = time.perf_counter()
        metrics.update(rollout_metrics(self.task, batch))
        if hasattr(self.client, "pop_metrics"):  # e.g. rollout/stale_samples of remote servers (every rank calls it)
            metrics.update(self.client.pop_metrics())
        metrics.update({"time/generate": t1 - t0, "time/train": t2 - t1, "time/sync": t3 - t2, "time/step": t3 - t0,
                        "throughput/tokens_per_s": sum(batch.lengths) / (t3 - t0)})
        return metrics


def rollout_metrics(task: Task, batch: RolloutBatch) -> dict[str, float]:
    """What the policy did: rewards, accuracy, lengths, trace usage and step checks."""
    correct = [float(c) for c in batch.correct]
    checks = [task.step_check(text, p) if traced else (0, 0)
              for text, p, traced in zip(batch.responses, batch.problems, batch.uses_trace, strict=True)]
    out = reward_summary(batch.rewards_N.tolist(), batch.group_size)
    out["reward/accuracy"] = sum(correct) / len(correct) if correct else float("nan")
    out.update(length_summary(batch.lengths, batch.truncated))
    out.update(trace_summary(batch.uses_trace, correct, checks))
    return out
