"""The train/rollout gap: sample with the rollout engine, rescore with the training path, report the tail.

Per generated token, ``log r = logp_train - logp_rollout``: the numerator from ``score_sequences`` (the
parallel, teacher-forced forward under the *train* policy), the denominator as the rollout engine
reported it under the *rollout* policy. The report gives the distribution (mean, p50, p90, p99, p99.9,
max) of ``|r - 1|`` and ``|log r|`` over all tokens and per trajectory-length bucket, since the gap
compounds along a trajectory. ``ringzero check gap`` and ``bench/ratio_tail.py`` print it; the RL step
can call ``gap_stats`` on its own log-probs.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ringzero.errors import RingzeroError
from ringzero.metrics import distribution
from ringzero.model.config import PrecisionPolicy
from ringzero.model.hybrid import HybridLM
from ringzero.model.scoring import score_sequences
from ringzero.model.weights import copy_under_policy
from ringzero.rollout.engine.embedded import EmbeddedEngine
from ringzero.rollout.types import Completion, GenerateRequest, SamplingParams
from ringzero.tokenizer.base import Tokenizer

DEFAULT_LENGTH_EDGES = (256, 1024, 4096)


def length_buckets(edges: Sequence[int]) -> list[tuple[str, int, int | None]]:
    """``[(label, lo, hi)]`` with ``lo <= length <= hi`` (``hi`` None = open): ``1-256``, ``257-1024``,
    ``>4096``."""
    edges = list(edges)
    if any(e < 1 for e in edges) or any(b <= a for a, b in zip(edges, edges[1:], strict=False)):
        raise RingzeroError(f"length bucket edges must be positive and increasing (got {edges})")
    lows = [1] + [e + 1 for e in edges]
    out = [(f"{lo}-{hi}", lo, hi) for lo, hi in zip(lows, edges, strict=False)]
    return out + [(f">{edges[-1]}" if edges else "all", lows[-1], None)]


def _tail(log_r: np.ndarray) -> dict[str, float]:
    return {**distribution("ratio", np.abs(np.expm1(log_r))), **distribution("logratio", np.abs(log_r))}


def gap_stats(
    logp_train: Sequence[torch.Tensor],
    logp_rollout: Sequence[torch.Tensor],
    length_edges: Sequence[int] = DEFAULT_LENGTH_EDGES,
) -> dict:
    """Tail statistics of ``r = exp(train - rollout)`` per token, one tensor pair per trajectory.

    Returns ``{"all": {...}, "by_length": {label: {...}}, "by_position": {label: {...}}}``: overall, per
    bucket of trajectory length, and per bucket of token position inside the responses (same edges).
    Each entry holds ``ratio/*`` (``|r - 1|``), ``logratio/*`` (``|log r|``), ``trajectories``,
    ``tokens``, ``nonfinite`` (tokens left out of the distributions because a log-prob was not finite)
    and ``train_nll/mean`` (mean ``-logp_train``).
    Buckets no trajectory reached are omitted; ``trajectories`` of a position bucket counts the
    responses that reach it.
    """
    if len(logp_train) != len(logp_rollout):
        raise RingzeroError(f"{len(logp_train)} train trajectories but {len(logp_rollout)} rollout ones")
    pairs = []
    for i, (a, b) in enumerate(zip(logp_train, logp_rollout, strict=True)):
        a, b = torch.as_tensor(a).detach().double().cpu(), torch.as_tensor(b).detach().double().cpu()
        if a.shape != b.shape:
            raise RingzeroError(f"trajectory {i}: {a.numel()} train log-probs but {b.numel()} rollout ones")
        pairs.append(((a - b).numpy(), a.numpy()))

    def summary(members: list[tuple[np.ndarray, np.ndarray]]) -> dict:
        log_r = np.concatenate([m[0] for m in members]) if members else np.zeros(0)
        train = np.concatenate([m[1] for m in members]) if members else np.zeros(0)
        finite = np.isfinite(log_r)
        return {
            **_tail(log_r[finite]),
            "trajectories": len(members),
            "tokens": int(log_r.size),
            "nonfinite": int((~finite).sum()),
            # How peaked the policy is where it sampled: the gap matters most on confident tokens.
            "train_nll/mean": float(-train[np.isfinite(train)].mean()) if train.size else float("nan"),
        }

    by_length, by_position = {}, {}
    for label, lo, hi in length_buckets(length_edges):
        members = [m for m in pairs if m[0].size >= lo and (hi is None or m[0].size <= hi)]
        if members:
            by_length[label] = summary(members)
        # The same edges over positions inside each response (1-based): the gap compounds along it.
        segments = [(m[0][lo - 1 : hi], m[1][lo - 1 : hi]) for m in pairs if m[0].size >= lo]
        if segments:
            by_position[label] = summary(segments)
    return {"all": summary(pairs), "by_length": by_length, "by_position": by_position}


def measure_gap(
    model: HybridLM,
    prompts: Sequence[Sequence[int]],
    params: SamplingParams,
    *,
    train_policy: PrecisionPolicy,
    rollout_policy: PrecisionPolicy,
    deterministic: bool = False,
    tokenizer: Tokenizer | None = None,
    length_edges: Sequence[int] = DEFAULT_LENGTH_EDGES,
    max_batch: int = 64,
    seed: int = 0,
    micro_batch: int = 16,
) -> dict:
    """Sample ``params.n`` completions per prompt with an engine under ``rollout_policy``, rescore them
    under ``train_policy`` and return ``gap_stats`` plus the settings and the completions' lengths.

    Requests without a ``params.seed`` draw theirs from ``seed``, so one call is reproducible;
    ``micro_batch`` bounds the trainer's scoring batch (long sequences need small ones).
    ``model`` only supplies weights: each side takes its own copy cast to its own policy. With
    ``deterministic`` both sides must run the same policy; the trainer then scores batch-invariantly.
    """
    if deterministic and train_policy != rollout_policy:
        raise RingzeroError(
            f"deterministic mode needs one policy on both sides (train {train_policy.name()}, "
            f"rollout {rollout_policy.name()})"
        )
    engine = EmbeddedEngine(
        model, tokenizer, rollout_policy, deterministic=deterministic, max_batch=max_batch, seed=seed
    )
    completions: list[Completion] = [
        c for group in engine.generate([GenerateRequest(list(p), params) for p in prompts]) for c in group
    ]
    trainer = copy_under_policy(model, train_policy).eval()
    with torch.no_grad():
        logp_train = score_sequences(
            trainer,
            [c.prompt_ids + c.output_ids for c in completions],
            [len(c.prompt_ids) for c in completions],
            params.temperature,
            batch_invariant=deterministic,
            micro_batch=micro_batch,
        )
    logp_rollout = [torch.tensor(c.output_logprobs, dtype=torch.float64) for c in completions]
    lengths = [len(c.output_ids) for c in completions]
    return {
        "train_policy": train_policy.name(),
        "rollout_policy": rollout_policy.name(),
        "deterministic": deterministic,
        "temperature": params.temperature,
        "samples": len(completions),
        "tokens": sum(lengths),
        "length": {"mean": float(np.mean(lengths)), "max": int(max(lengths))},
        **gap_stats(logp_train, logp_rollout, length_edges),
    }
