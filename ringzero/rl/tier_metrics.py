"""What each reasoning tier did, overall and per difficulty bucket: the measures tier RL is judged by.

For the responses whose prompt was asked at a tier (``problem.tier`` is its tag), with the tier's budget:
``<tiered>/<tier>/accuracy`` (the task's verdict, before any budget), ``len_mean`` (tokens),
``within_budget`` (share of responses of at most ``budget`` tokens), ``correct_within_budget``. When the
task has difficulty buckets (``Task.difficulty_bucket``: a mixed-length digitsum's easy, medium and
hard thirds) the same four measures again per bucket, ``<tiered>/<tier>/<bucket>/...``, and for the
untiered responses ``<untiered>/<bucket>/accuracy`` and ``len_mean``. A bucket or tier with no response
is left out, never reported as 0.

RL steps report them under ``tier/`` and ``difficulty/``; the eval stage under ``eval/`` for both.

Responses are grouped by the tag their prompt carries. The untagged tier (``tag: null``) claims the
responses asked as is, so they appear under ``<tiered>/<name>/`` (accuracy, length, per bucket; no
within-budget share without a budget) and, as untiered responses always do, under ``<untiered>/<bucket>/``:
``difficulty/`` stays the measure of prompts asked as is, comparable with the stages before tier RL.

``depth_contrast``: the tagged tier with the largest budget (no budget counts as the largest) against the
tagged one with the smallest, overall and per bucket, ``<tiered>/contrast/[<bucket>/]accuracy_gap`` (deep
minus fast) and ``len_ratio`` (deep over fast): what tier RL must earn is a large gap and ratio on hard
items and a ratio near 1 on easy ones. The untagged tier never enters it: no depth was asked for.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ringzero.rl.rollout_batch import RolloutBatch
from ringzero.tasks.base import DIFFICULTY_BUCKETS, TIER_CONTRAST, Task


def _measures(rows: list[int], batch: RolloutBatch, budget: int | None) -> dict[str, float]:
    n = len(rows)
    out = {
        "accuracy": sum(batch.correct[i] for i in rows) / n,
        "len_mean": sum(batch.lengths[i] for i in rows) / n,
    }
    if budget is not None:
        within = [batch.lengths[i] <= budget for i in rows]
        out["within_budget"] = sum(within) / n
        out["correct_within_budget"] = (
            sum(w and batch.correct[i] for w, i in zip(within, rows, strict=True)) / n
        )
    return out


def tier_metrics(
    task: Task,
    batch: RolloutBatch,
    tiers: Sequence,
    tiered: str = "tier",
    untiered: str = "difficulty",
    rows: Sequence[int] | None = None,
) -> dict[str, float]:
    """Tiered responses under ``<tiered>/<tier>/...``, untiered ones per bucket under
    ``<untiered>/<bucket>/``.

    ``rows``: only these responses (an RL step leaves out those a forced opening began)."""
    buckets = [task.difficulty_bucket(p) for p in batch.problems]
    groups: dict[str | None, list[int]] = {}
    for i in range(len(batch.problems)) if rows is None else rows:
        groups.setdefault(batch.problems[i].tier, []).append(i)
    out: dict[str, float] = {}
    heads = [(t.tag, f"{tiered}/{t.name}", t.budget, True) for t in tiers] + [(None, untiered, None, False)]
    for tag, head, budget, overall in heads:
        rows = groups.get(tag, [])
        if not rows:
            continue
        if overall:
            out.update({f"{head}/{k}": v for k, v in _measures(rows, batch, budget).items()})
        for bucket in DIFFICULTY_BUCKETS:
            mine = [i for i in rows if buckets[i] == bucket]
            if mine:
                out.update({f"{head}/{bucket}/{k}": v for k, v in _measures(mine, batch, budget).items()})
    return out


def _depth(tier) -> float:
    return math.inf if tier.budget is None else tier.budget


def contrast_tiers(tiers: Sequence):
    """``(fast, deep)``: the tagged tiers with the smallest and the largest budget (None budget: the largest);
    None without two tagged tiers of different budgets."""
    tagged = [t for t in tiers if t.tag is not None]
    if len(tagged) < 2:
        return None
    fast, deep = min(tagged, key=_depth), max(tagged, key=_depth)
    return None if fast is deep else (fast, deep)


def depth_contrast(values: dict[str, float], tiers: Sequence, tiered: str = "tier") -> dict[str, float]:
    """The deepest tier against the fastest (``contrast_tiers``) from ``tier_metrics`` values; {} without
    such a pair. A bucket either tier lacks is left out; a zero fast length gives no ratio."""
    pair = contrast_tiers(tiers)
    if pair is None:
        return {}
    fast, deep = pair
    out: dict[str, float] = {}
    for part in ["", *(f"{b}/" for b in DIFFICULTY_BUCKETS)]:
        acc = [values.get(f"{tiered}/{t.name}/{part}accuracy") for t in (fast, deep)]
        length = [values.get(f"{tiered}/{t.name}/{part}len_mean") for t in (fast, deep)]
        if None in acc or None in length:
            continue
        out[f"{tiered}/{TIER_CONTRAST}/{part}accuracy_gap"] = acc[1] - acc[0]
        if length[0] > 0:
            out[f"{tiered}/{TIER_CONTRAST}/{part}len_ratio"] = length[1] / length[0]
    return out
