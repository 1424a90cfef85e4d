"""Side-by-side arms of one stage from the same base and seeds: each arm is a set of ``--set`` overrides of
the run file, the stage made to run a fixed number of steps (no early stop, no gate), and ``measure``
reads what each arm did from its metrics and its held-out summary. The mismatch-correction arms
(``MISMATCH_ARMS``) are what ``bench/mismatch_ablation.py`` runs."""

from __future__ import annotations

import json
import math

CORRECTED = "ppo_clip"
MISMATCH_ARMS = {
    "sg_clip_is": ("sg_clip_is", []),
    "ppo_clip": ("ppo_clip", []),
    "tis": (CORRECTED, [{"kind": "tis", "cap": 2.0}]),
    "seq_is": (CORRECTED, [{"kind": "seq_is", "cap": 2.0, "form": "product"}]),
    "seq_is_geo": (CORRECTED, [{"kind": "seq_is", "cap": 2.0, "form": "geometric"}]),
    "masked_is": (CORRECTED, [{"kind": "masked_is", "lower": 0.5, "upper": 2.0}]),
    "icepop": (CORRECTED, [{"kind": "icepop", "lower": 0.5, "upper": 5.0}]),
}
"""Arm name -> (policy loss, corrections). Bounds are the peers' defaults (verl's TIS cap 2, IcePop [0.5,
5])."""
ROLLBACK_ARM = "rollback"


def arm_overrides(
    rl: str, arm: str, rollout: str, steps: int, prompts: int | None, limit: float
) -> list[str]:
    s = f"stages.{rl}"
    out = [
        "precision.train=fp32-islands",
        f"precision.rollout={rollout}",
        f"{s}.steps={steps}",
        f"{s}.min_steps={steps}",
        f"{s}.reward_plateau_steps=null",
        f"{s}.max_wall_minutes=null",
        f"{s}.stop_when=[]",
        f"{s}.gate=[]",
    ]
    if prompts:
        out.append(f"{s}.prompts_per_step={prompts}")
    if arm == ROLLBACK_ARM:
        return out + [
            f"{s}.loss.kind=sg_clip_is",
            f"{s}.loss.corrections=[]",
            f'{s}.rollback={{on: ["gap/ratio/max > {limit:g}"], remedy: raise_precision, max_rollbacks: 2}}',
        ]
    kind, corrections = MISMATCH_ARMS[arm]
    return out + [f"{s}.loss.kind={kind}", f"{s}.loss.corrections={json.dumps(corrections)}"]


def mean_finite(values) -> float:
    """The mean of the finite values (nan when there are none)."""
    values = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    return sum(values) / len(values) if values else float("nan")


def measure(records: list[dict], summary: dict, base_accuracy: float) -> dict:
    rewards = [r.get("reward/mean", float("nan")) for r in records]
    windows = [mean_finite(rewards[i : i + 5]) for i in range(max(1, len(rewards) - 4))]
    coverage = [
        r["grad/coverage"] * (1.0 - r.get("correction/token_masked_frac", 0.0))
        for r in records
        if r.get("grad/coverage") is not None
    ]
    nonfinite = any(r.get("loss/nonfinite", 0) > 0 for r in records)
    accuracy = summary.get("eval/accuracy", float("nan"))
    collapsed = nonfinite or (windows[-1] < 0.5 * max(windows)) or accuracy < base_accuracy
    rollbacks = [r for r in records if "rollback/reason" in r]
    return {
        "accuracy": accuracy,
        "trace_rate": summary.get("eval/trace_rate"),
        "len_mean": summary.get("eval/len_mean"),
        "gap_p99": mean_finite(r.get("gap/ratio/p99") for r in records),
        "gap_max": max((r.get("gap/ratio/max", 0.0) for r in records), default=float("nan")),
        "coverage": mean_finite(coverage),
        "adv_nonzero": mean_finite(r.get("grad/adv_nonzero") for r in records),
        "masked": mean_finite(r.get("correction/token_masked_frac", 0.0) for r in records),
        "reward_last5": windows[-1],
        "collapsed": bool(collapsed),
        "nonfinite": nonfinite,
        "rollbacks": [
            {"step": r["step"], "reason": r["rollback/reason"], "remedy": r.get("rollback/remedy")}
            for r in rollbacks
        ],
        "gap_p99_by_step": [r.get("gap/ratio/p99") for r in records],
    }
