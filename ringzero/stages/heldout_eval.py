"""What a policy does on the task's held-out prompts: the numbers that say whether it reasons.

- sampled (temperature 1, ``samples`` per prompt): ``eval/accuracy``, ``eval/trace_rate`` (share of
  responses that open a worked trace), accuracy of each route, ``eval/len_mean`` (tokens);
- greedy: ``eval/greedy_accuracy``, ``eval/greedy_trace_rate``, ``eval/greedy_len_mean``;
- forced trace (the prompt ends with ``<think>``, temperature 1): ``eval/forced_trace_accuracy``, how
  reliable the trace mode is whether or not the policy chooses it — the quantity that decides whether
  RL can find reward by reasoning;
- per tier (tier RL): ``eval/<tier>/accuracy`` and ``eval/<tier>/len_mean`` with the tier's tag; the
  untagged tier asks the prompts as is, which the sampled measures above are.

The held-out set is fixed (``task.prompts("eval", n)``), so every stage is measured on the same prompts.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ringzero.config.stages import SamplingSettings
from ringzero.rl.rewards import TaskReward
from ringzero.rl.rollout_batch import RolloutBatch, collect, sampling_params
from ringzero.rl.seeds import derive_seed
from ringzero.tasks.base import THINK_OPEN, Task
from ringzero.tokenizer.base import Tokenizer

EVAL_SEED = 7
"""Sampling seed of the held-out measurement: the same draws for every stage's policy."""


def _mean(values) -> float:
    arr = np.asarray(list(values), dtype=np.float64)
    return float(arr.mean()) if arr.size else float("nan")


def _route_accuracy(batch: RolloutBatch, traced: bool) -> float:
    return _mean(c for c, t in zip(batch.correct, batch.uses_trace, strict=True) if t == traced)


def evaluate_heldout(
    client,
    task: Task,
    tokenizer: Tokenizer,
    *,
    prompts: int,
    samples: int,
    max_new_tokens: int,
    tiers=(),
    forced_trace: bool = True,
    seeded: bool = True,
) -> dict[str, float]:
    """``seeded``: reproducible per-prompt sampling streams; turn off for a real SGLang server, which gives
    the n copies of a seeded request one stream (n identical samples)."""
    problems = task.prompts("eval", prompts)
    reward = TaskReward(task, tiers)  # tier-tagged prompts are scored against their tier's budget
    sampling = SamplingSettings(max_new_tokens=max_new_tokens, temperature=1.0)

    def run(probs, n, temperature, reward_fn=reward):
        params = sampling_params(sampling, task, tokenizer, n, seed=None, temperature=temperature)
        # One stream per prompt: a shared seed would give sample k of every prompt the same uniforms,
        # so rare choices (opening a trace) would happen for all prompts at once or for none.
        seeds = [derive_seed(EVAL_SEED, i) for i in range(len(probs))] if seeded else None
        return collect(
            client, task, tokenizer, probs, samples=n, params=params, reward=reward_fn, seeds=seeds
        )

    sampled, greedy = run(problems, samples, 1.0), run(problems, 1, 0.0)
    out = {
        "eval/accuracy": _mean(sampled.correct),
        "eval/trace_rate": _mean(sampled.uses_trace),
        "eval/trace_accuracy": _route_accuracy(sampled, True),
        "eval/direct_accuracy": _route_accuracy(sampled, False),
        "eval/len_mean": _mean(sampled.lengths),
        "eval/trunc_rate": _mean(sampled.truncated),
        "eval/greedy_accuracy": _mean(greedy.correct),
        "eval/greedy_trace_rate": _mean(greedy.uses_trace),
        "eval/greedy_len_mean": _mean(greedy.lengths),
    }
    if forced_trace:
        forced = [replace(p, prompt=p.prompt + THINK_OPEN) for p in problems]
        # The response continues after the forced opener; the task scores the whole worked response.
        batch = run(forced, 1, 1.0, lambda p, text, n, cut: task.reward(p, THINK_OPEN + text))
        out["eval/forced_trace_accuracy"] = _mean(r >= 1.0 for r in batch.rewards_N.tolist())
    for tier in [t for t in tiers if t.tag is not None]:
        batch = run([task.with_tier(p, tier.tag) for p in problems], samples, 1.0)
        out[f"eval/{tier.name}/accuracy"] = _mean(batch.correct)
        out[f"eval/{tier.name}/len_mean"] = _mean(batch.lengths)
    return out
