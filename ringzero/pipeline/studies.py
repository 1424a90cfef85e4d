"""The seed's four claims as controlled comparisons (``ringzero ablate CONFIG --study NAME``).

Each study names the stage it runs through, the checkpoints its eval measures, its arms (``--set``
overrides), how a run becomes numbers (``readout``) and how the numbers become verdicts. A verdict is
computed per seed, on that seed's arms (they share the base and every sampling seed), and reported as
held (every seed), did not hold (no seed) or inconclusive: the rule is fixed here, before any run.

Studies speak of stages by role (``ringzero.pipeline.ablate.stage_roles``: ``base``, ``stage1``,
``distill``, ``stage2``, ``tier``), and overrides name them as ``{stage1}``: a config names its stages as it
likes. Readouts see each run's stages under their roles.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass

from ringzero.pipeline.ablate import ArmRun, verdict_over_seeds
from ringzero.stages.summary_values import median_of

GROWTH_MARGIN = 0.05
"""How much more token_sum's length must grow (last five steps over step 5) than another arm's to count."""
SELECTION_MARGIN = 0.10
"""How much shorter (as a share of stage 1's length) shortest-of-N must leave the policy than the random
control of the same prompts for the compression to count as the selection's doing."""
BUCKETS = ("easy", "medium", "hard")
BEHAVIOUR_CURVES = (
    "search/give_up",
    "search/recheck",
    "search/likely_first",
    "search/first_try_hit",
    "len/reward_corr",
    "len/correct_mean",
    "len/wrong_mean",
)
"""Why lengths move in stage 1, per step (the row-search task's behaviours, and length against reward): a
task without ``search/*`` metrics leaves those curves empty."""


@dataclass(frozen=True)
class Study:
    name: str
    claim: str
    through: str
    measure: tuple[str, ...]
    arms: dict[str, tuple[str, ...]]
    readout: Callable[[ArmRun], dict]
    verdicts: Callable[[dict, list[int]], list[dict]]
    columns: tuple[tuple[str, str], ...]
    common: tuple[str, ...] = ()
    curves: tuple[str, ...] = ()
    """Per-step metrics of the ``through`` stage the report plots, one line per arm (``curve/<key>``)."""
    plots: tuple[tuple[str, tuple[str, ...], tuple[str, ...], str], ...] = ()
    """``(title, categories, readout keys, axis)``: one line per arm through the categories' values."""


def _finite(v) -> float:
    return float(v) if isinstance(v, int | float) and math.isfinite(v) else float("nan")


def _last(records: list[dict], key: str, n: int = 5) -> float:
    vals = [_finite(r.get(key)) for r in records if key in r]
    vals = [v for v in vals if math.isfinite(v)][-n:]
    return sum(vals) / len(vals) if vals else float("nan")


def _at(records: list[dict], key: str, step: int) -> float:
    return next((_finite(r.get(key)) for r in records if r.get("step") == step and key in r), float("nan"))


def _checkpoint(values: dict, label: str) -> dict:
    """One measured checkpoint's numbers, prefixed by its label."""
    keys = {
        "pass1": "eval/accuracy",
        "trace": "eval/trace_rate",
        "len": "eval/len_mean",
        "bf16_p99": "eval/gap/bf16/ratio/p99",
        "islands_p99": "eval/gap/fp32-islands/ratio/p99",
        "bf16_max": "eval/gap/bf16/ratio/max",
        "islands_max": "eval/gap/fp32-islands/ratio/max",
        "bf16_drift": "eval/gap/bf16/seq_abs_log_ratio",
        "islands_drift": "eval/gap/fp32-islands/seq_abs_log_ratio",
    }
    out = {f"{label}/{k}": _finite(values.get(v)) for k, v in keys.items()}
    for third in ("short", "mid", "long"):
        for policy in ("bf16", "fp32-islands"):
            short = "islands" if policy != "bf16" else "bf16"
            out[f"{label}/{short}_p99_{third}"] = _finite(values.get(f"eval/gap/{policy}/{third}/ratio/p99"))
    return out


# --- 1. token-level against sample-level loss --------------------------------------------------------------


def loss_readout(run: ArmRun) -> dict:
    rec = run.records["stage1"]
    out = {
        "len_step5": _at(rec, "len/mean", 5),
        "len_last5": _last(rec, "len/mean"),
        "steps": float(max((r.get("step", 0) for r in rec), default=0)),
        "stage1_wall_s": run.wall_s.get("stage1", float("nan")),
    }
    out["len_growth"] = out["len_last5"] / out["len_step5"] if out["len_step5"] else float("nan")
    for key in BEHAVIOUR_CURVES:  # the behaviours at the start and over the last five steps
        out[f"{key}@5"] = _at(rec, key, 5)
        out[f"{key}@last5"] = _last(rec, key)
    out.update(_checkpoint(run.rows["stage1"], "stage1"))
    return out


def loss_verdicts(readouts: dict, seeds: list[int]) -> list[dict]:
    out = []
    for other in ("sample_mean", "token_mean"):
        pairs = [(s, readouts.get(("token_sum", s)), readouts.get((other, s))) for s in seeds]
        pairs = [(s, a, b) for s, a, b in pairs if a and b]  # a seed either arm lacks is left out, named
        grows = [a["len_growth"] > b["len_growth"] + GROWTH_MARGIN for _, a, b in pairs]
        drifts = [a["stage1/bf16_drift"] > b["stage1/bf16_drift"] for _, a, b in pairs]
        both = [g and d for g, d in zip(grows, drifts, strict=True)]
        detail = "; ".join(
            f"seed {s}: growth {a['len_growth']:.2f} vs {b['len_growth']:.2f}, bf16 drift "
            f"{a['stage1/bf16_drift']:.4f} vs {b['stage1/bf16_drift']:.4f}"
            for s, a, b in pairs
        )
        out.append(
            {
                "claim": f"token_sum grows length more than {other} and drifts more under bf16",
                "verdict": verdict_over_seeds(both),
                "detail": detail,
            }
        )
    return out


LOSS = Study(
    name="loss",
    claim="token-level loss elicits longer reasoning than sample-level",
    through="stage1",
    measure=("stage1",),
    arms={
        "token_sum": (),
        "sample_mean": ("stages.{stage1}.loss.normalization=sample_mean",),
        "token_mean": ("stages.{stage1}.loss.normalization=token_mean",),
    },
    readout=loss_readout,
    verdicts=loss_verdicts,
    # Every arm runs the same 25 steps, the length gate off: the gate would end each arm near the same
    # length, and growth is compared at one horizon. The shipped stage 1 reaches its gate at about step 20;
    # 25 steps show where each arm goes past it, and three arms x two seeds fit the study's 15 minutes.
    common=("stages.{stage1}.stop_when=[]", "stages.{stage1}.steps=25"),
    columns=(
        ("len_step5", "len @5"),
        ("len_last5", "len last 5"),
        ("len_growth", "growth"),
        ("stage1/pass1", "pass@1"),
        ("stage1/trace", "trace rate"),
        ("stage1/len", "eval len"),
        ("stage1/bf16_drift", "bf16 drift"),
        ("stage1/bf16_p99", "bf16 p99"),
        ("search/give_up@last5", "give up after a miss"),
        ("search/recheck@last5", "re-check"),
        ("search/likely_first@last5", "likely first"),
        ("search/first_try_hit@last5", "first-try hit"),
        ("len/reward_corr@last5", "corr(len, reward)"),
        ("len/correct_mean@last5", "len correct"),
        ("len/wrong_mean@last5", "len wrong"),
    ),
    curves=("len/mean", "reward/mean", *BEHAVIOUR_CURVES),
    plots=(
        ("stage 1 checkpoint", ("pass@1", "trace rate"), ("stage1/pass1", "stage1/trace"), "measure"),
        (
            "bf16 token p99 by response-length third",
            ("short", "mid", "long"),
            tuple(f"stage1/bf16_p99_{t}" for t in ("short", "mid", "long")),
            "third",
        ),
    ),
)


# --- 2. distillation resets --------------------------------------------------------------------------------


def distill_readout(run: ArmRun) -> dict:
    out = {**_checkpoint(run.rows["stage1"], "stage1"), **_checkpoint(run.rows["distill"], "distill")}
    for k in ("len", "bf16_drift", "bf16_p99", "islands_p99"):
        a, b = out[f"distill/{k}"], out[f"stage1/{k}"]
        out[f"ratio/{k}"] = a / b if b else float("nan")
    out["delta/pass1"] = out["distill/pass1"] - out["stage1/pass1"]
    return out


def distill_verdicts(readouts: dict, seeds: list[int]) -> list[dict]:
    out = []
    for arm in DISTILL.arms:
        mine = [(s, readouts[(arm, s)]) for s in seeds if (arm, s) in readouts]
        resets = [
            r["ratio/len"] < 1.0 and r["ratio/bf16_drift"] < 1.0 and r["delta/pass1"] >= -0.03
            for _, r in mine
        ]
        detail = "; ".join(
            f"seed {s}: length x{r['ratio/len']:.2f}, bf16 drift x{r['ratio/bf16_drift']:.2f}, "
            f"pass@1 {r['delta/pass1']:+.3f}"
            for s, r in mine
        )
        out.append(
            {
                "claim": f"{arm}: shorter than stage 1, less bf16 drift, pass@1 within 0.03",
                "verdict": verdict_over_seeds(resets),
                "detail": detail,
            }
        )
    pairs = [(s, readouts.get(("shortest", s)), readouts.get(("random", s))) for s in seeds]
    pairs = [(s, a, b) for s, a, b in pairs if a and b]
    out.append(
        {
            "claim": f"the selection compresses: shortest-of-N leaves the policy at least "
            f"{SELECTION_MARGIN:.2f} of stage 1's length shorter than a random verified sample of the same "
            "prompts",
            "verdict": verdict_over_seeds(
                [a["ratio/len"] <= b["ratio/len"] - SELECTION_MARGIN for _, a, b in pairs]
            ),
            "detail": "; ".join(
                f"seed {s}: length x{a['ratio/len']:.2f} (shortest) vs x{b['ratio/len']:.2f} (random)"
                for s, a, b in pairs
            ),
        }
    )
    return out


DISTILL = Study(
    name="distill",
    claim="distillation resets length and drift and keeps pass@1",
    through="distill",
    measure=("stage1", "distill"),
    arms={
        "shortest": (),
        # the control: the same prompts kept, a random verified sample of each instead of the shortest
        "random": ("stages.{distill}.select=random",),
    },
    readout=distill_readout,
    verdicts=distill_verdicts,
    columns=(
        ("stage1/len", "stage1 len"),
        ("distill/len", "distill len"),
        ("ratio/len", "len ratio"),
        ("stage1/pass1", "stage1 pass@1"),
        ("distill/pass1", "distill pass@1"),
        ("stage1/bf16_drift", "stage1 bf16 drift"),
        ("distill/bf16_drift", "distill bf16 drift"),
        ("stage1/bf16_p99", "stage1 bf16 p99"),
        ("distill/bf16_p99", "distill bf16 p99"),
        ("stage1/islands_p99", "stage1 islands p99"),
        ("distill/islands_p99", "distill islands p99"),
    ),
    plots=(
        ("mean length", ("stage1", "distill"), ("stage1/len", "distill/len"), "checkpoint"),
        (
            "bf16 sequence drift",
            ("stage1", "distill"),
            ("stage1/bf16_drift", "distill/bf16_drift"),
            "checkpoint",
        ),
        ("pass@1", ("stage1", "distill"), ("stage1/pass1", "distill/pass1"), "checkpoint"),
    ),
)


# --- 3. depth pays where the budget binds ------------------------------------------------------------------


CONTROL_MARGIN = 0.10
"""How far tier RL must beat stage 2's checkpoint on hard correct-within-the-fast-budget: stage 2 under the
fast tag already answers some hard items within the budget by chance (a short search that hits early)."""


def depth_readout(run: ArmRun) -> dict:
    out = {}
    for label in ("stage2", "tier"):
        v = run.rows[label]
        for b in BUCKETS:
            for tier in ("fast", "deep"):
                for m in ("accuracy", "len_mean", "within_budget", "correct_within_budget"):
                    out[f"{label}/{tier}/{b}/{m}"] = _finite(v.get(f"eval/{tier}/{b}/{m}"))
            out[f"{label}/gap/{b}"] = out[f"{label}/deep/{b}/accuracy"] - out[f"{label}/fast/{b}/accuracy"]
            fast_len = out[f"{label}/fast/{b}/len_mean"]
            out[f"{label}/len_ratio/{b}"] = (
                out[f"{label}/deep/{b}/len_mean"] / fast_len if fast_len else math.nan
            )
            # the task's no-search heuristic on the same prompts (the same in every row)
            out[f"baseline/{b}"] = _finite(v.get(f"eval/baseline/{b}/accuracy"))
        out[f"{label}/pass1"] = _finite(v.get("eval/accuracy"))
    return out


def depth_verdicts(readouts: dict, seeds: list[int]) -> list[dict]:
    mine = [(s, readouts[("tiers", s)]) for s in seeds if ("tiers", s) in readouts]
    guesses = [
        (s, [b for b in BUCKETS if not r[f"tier/fast/{b}/accuracy"] > r[f"baseline/{b}"]]) for s, r in mine
    ]  # a fast tier no better than answering the likely candidate without a trace is a failure
    pays = [r["tier/gap/hard"] >= 0.10 and r["tier/gap/easy"] <= 0.05 for _, r in mine]
    beats = [
        r["tier/fast/hard/correct_within_budget"]
        >= r["stage2/fast/hard/correct_within_budget"] + CONTROL_MARGIN
        for _, r in mine
    ]
    fmt = "; ".join(
        f"seed {s}: hard deep-fast {r['tier/gap/hard']:+.2f} (stage 2 {r['stage2/gap/hard']:+.2f}), easy "
        f"{r['tier/gap/easy']:+.2f}; hard fast correct within budget: "
        f"{r['tier/fast/hard/correct_within_budget']:.2f} vs stage 2 "
        f"{r['stage2/fast/hard/correct_within_budget']:.2f}"
        for s, r in mine
    )
    guessed = [f"seed {s}: {g}" for s, g in guesses if g]
    return [
        {
            "claim": "no fast tier guesses (pass@1 above the task's no-search baseline in every bucket)",
            "verdict": verdict_over_seeds([not g for _, g in guesses]),
            "detail": "; ".join(guessed) or "fast pass@1 above the baseline in every bucket on every seed",
        },
        {
            "claim": "depth pays where the budget binds: deep - fast pass@1 >= 0.10 on hard items, "
            "<= 0.05 on easy",
            "verdict": verdict_over_seeds(pays),
            "detail": fmt,
        },
        {
            "claim": f"tier RL beats the no-tier-RL control: hard items correct within the fast budget at "
            f"least {CONTROL_MARGIN:.2f} above stage 2's checkpoint under the same budget",
            "verdict": verdict_over_seeds(beats),
            "detail": fmt,
        },
    ]


DEPTH = Study(
    name="depth",
    claim="depth pays only where the budget binds",
    through="tier",
    measure=("stage2", "tier"),
    arms={"tiers": ()},  # the config's own tiers: stage 2's checkpoint under them is the control
    readout=depth_readout,
    verdicts=depth_verdicts,
    columns=tuple(
        (f"{label}/{tier}/{b}/{m}", f"{label} {tier} {b} {short}")
        for label in ("stage2", "tier")
        for b in BUCKETS
        for tier in ("fast", "deep")
        for m, short in (("accuracy", "pass@1"), ("len_mean", "len"))
    )
    + tuple((f"baseline/{b}", f"no-search {b} pass@1") for b in BUCKETS)
    + tuple(
        (f"{label}/fast/hard/correct_within_budget", f"{label} fast hard ok<=B")
        for label in ("stage2", "tier")
    ),
    plots=tuple(
        (
            f"{label} {tier} pass@1",
            BUCKETS,
            tuple(f"{label}/{tier}/{b}/accuracy" for b in BUCKETS),
            "difficulty",
        )
        for tier in ("fast", "deep")
        for label in ("stage2", "tier")
    )
    + tuple(
        (
            f"{label} {tier} length",
            BUCKETS,
            tuple(f"{label}/{tier}/{b}/len_mean" for b in BUCKETS),
            "difficulty",
        )
        for tier in ("fast", "deep")
        for label in ("stage2", "tier")
    ),
)


# --- 4. islands where they pay -----------------------------------------------------------------------------

PAPER_PAIR = ("stages.{stage1}.precision={train: fp32-islands, rollout: bf16}",)


def islands_readout(run: ArmRun) -> dict:
    rec = run.records["stage1"]
    out = {
        # the same median as a stage summary's ratio/p99_median: the mean of the middle two of an even count
        "train/gap_p99_median": median_of([r.get("gap/ratio/p99") for r in rec], "m").get("m", math.nan),
        "train/gap_max": max((_finite(r.get("gap/ratio/max")) for r in rec), default=float("nan")),
        "stage1_wall_s": run.wall_s.get("stage1", float("nan")),
        "stage1_s_per_step": run.wall_s.get("stage1", float("nan")) / max(1, len(rec)),
    }
    for label in ("base", "stage1"):
        out.update(_checkpoint(run.rows[label], label))
        b, i = out[f"{label}/bf16_p99"], out[f"{label}/islands_p99"]
        out[f"{label}/islands_over_bf16"] = i / b if b else float("nan")
    return out


def islands_verdicts(readouts: dict, seeds: list[int]) -> list[dict]:
    out = []
    for arm in ISLANDS.arms:
        mine = [(s, readouts[(arm, s)]) for s in seeds if (arm, s) in readouts]
        for label in ("base", "stage1"):
            held = [r[f"{label}/islands_over_bf16"] <= 1 / 3 for _, r in mine]
            out.append(
                {
                    "claim": f"{arm}: islands' token p99 <= 1/3 of bf16's on the {label} checkpoint",
                    "verdict": verdict_over_seeds(held),
                    "detail": "; ".join(f"seed {s}: x{r[f'{label}/islands_over_bf16']:.2f}" for s, r in mine),
                }
            )
    return out


ISLANDS = Study(
    name="islands",
    claim="fp32 islands cut the bf16 ratio tail; the paper's engine pair trains on its real tail",
    through="stage1",
    measure=("base", "stage1"),
    arms={"fp32": (), "islands-train-bf16-rollout": PAPER_PAIR},
    readout=islands_readout,
    verdicts=islands_verdicts,
    columns=(
        ("train/gap_p99_median", "train gap p99 (median)"),
        ("train/gap_max", "train gap max"),
        ("stage1_s_per_step", "s / step"),
        ("stage1/pass1", "pass@1"),
        *(
            (f"{label}/{k}", f"{label} {k.replace('_', ' ')}")
            for label in ("base", "stage1")
            for k in ("bf16_p99", "islands_p99", "islands_over_bf16", "bf16_max", "islands_max")
        ),
        *(
            (f"stage1/{p}_p99_{t}", f"stage1 {p} p99 {t}")
            for p in ("bf16", "islands")
            for t in ("short", "mid", "long")
        ),
    ),
    # Ten steps: a bf16 trainer body's forward + backward runs ~8x fp32's time on a CPU without bf16 units
    # (bench/bf16_cost.py), and the study must fit 15 minutes on two cores.
    common=("stages.{stage1}.steps=10",),
    curves=("gap/ratio/p99",),
    plots=tuple(
        (
            f"stage 1 {p} token p99 by length third",
            ("short", "mid", "long"),
            tuple(f"stage1/{p}_p99_{t}" for t in ("short", "mid", "long")),
            "third",
        )
        for p in ("bf16", "islands")
    )
    + (
        (
            "islands / bf16 token p99",
            ("base", "stage1"),
            ("base/islands_over_bf16", "stage1/islands_over_bf16"),
            "checkpoint",
        ),
    ),
)


# --- 5. train/rollout mismatch corrections -----------------------------------------------------------------

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
"""Arm -> (policy loss, corrections). Bounds are the peers' defaults (verl's TIS cap 2, IcePop [0.5, 5])."""
ROLLBACK_LIMIT = 0.02
"""``gap/ratio/max`` that triggers the rollback arm's raise_precision remedy."""


def _mismatch_arms() -> dict[str, tuple[str, ...]]:
    """Each objective under a bf16 rollout (a real engine gap: the islands differ) and an fp32-islands one
    (the gap left is kernel order), the trainer under fp32-islands; then the automatic rollback in a real
    run: bf16 rollout, ``sg_clip_is``, the first step over ``ROLLBACK_LIMIT`` retried on fp32 islands."""
    arms = {}
    for rollout in ("bf16", "fp32-islands"):
        for arm, (kind, corrections) in MISMATCH_ARMS.items():
            arms[f"{arm} | {rollout}"] = (
                f"stages.{{stage1}}.precision={{train: fp32-islands, rollout: {rollout}}}",
                f"stages.{{stage1}}.loss.kind={kind}",
                f"stages.{{stage1}}.loss.corrections={json.dumps(corrections)}",
            )
    arms["rollback | bf16"] = (
        "stages.{stage1}.precision={train: fp32-islands, rollout: bf16}",
        "stages.{stage1}.loss.kind=sg_clip_is",
        "stages.{stage1}.loss.corrections=[]",
        f'stages.{{stage1}}.rollback={{on: ["gap/ratio/max > {ROLLBACK_LIMIT:g}"], remedy: raise_precision, '
        "max_rollbacks: 2}",
    )
    return arms


def mismatch_readout(run: ArmRun) -> dict:
    """What an arm did in stage 1 (its metrics and its held-out summary, under its own rollout engine) and
    whether it collapsed: a non-finite loss, the last five steps' reward below half its best five-step
    mean, or held-out accuracy below the base's."""
    records, summary = run.records["stage1"], run.summaries["stage1"]
    rewards = [_finite(r.get("reward/mean")) for r in records]
    windows = [_mean_finite(rewards[i : i + 5]) for i in range(max(1, len(rewards) - 4))]
    coverage = [
        r["grad/coverage"] * (1.0 - r.get("correction/token_masked_frac", 0.0))
        for r in records
        if r.get("grad/coverage") is not None
    ]
    nonfinite = any(r.get("loss/nonfinite", 0) > 0 for r in records)
    accuracy = _finite(summary.get("eval/accuracy"))
    base = _finite(run.summaries.get("base", {}).get("eval/accuracy"))
    return {
        "accuracy": accuracy,
        "trace_rate": _finite(summary.get("eval/trace_rate")),
        "len_mean": _finite(summary.get("eval/len_mean")),
        "gap_p99": _mean_finite(r.get("gap/ratio/p99") for r in records),
        "gap_max": max((_finite(r.get("gap/ratio/max")) for r in records), default=math.nan),
        "coverage": _mean_finite(coverage),
        "adv_nonzero": _mean_finite(r.get("grad/adv_nonzero") for r in records),
        "masked": _mean_finite(r.get("correction/token_masked_frac", 0.0) for r in records),
        "reward_last5": windows[-1],
        "collapsed": float(nonfinite or windows[-1] < 0.5 * max(windows) or accuracy < base),
        "nonfinite": float(nonfinite),
        "rollbacks": float(sum("rollback/reason" in r for r in records)),
        "stage1_minutes": run.wall_s.get("stage1", math.nan) / 60,
    }


def mismatch_verdicts(readouts: dict, seeds: list[int]) -> list[dict]:
    out = []
    for arm in MISMATCH.arms:
        mine = [(s, readouts[(arm, s)]) for s in seeds if (arm, s) in readouts]
        out.append(
            {
                "claim": f"{arm}: no collapse",
                "verdict": verdict_over_seeds([not r["collapsed"] for _, r in mine]),
                "detail": "; ".join(
                    f"seed {s}: pass@1 {r['accuracy']:.3f}, last-5 reward {r['reward_last5']:.3f}"
                    + (", non-finite loss" if r["nonfinite"] else "")
                    for s, r in mine
                ),
            }
        )
    return out


def _mean_finite(values) -> float:
    vals = [_finite(v) for v in values]
    vals = [v for v in vals if math.isfinite(v)]
    return sum(vals) / len(vals) if vals else math.nan


MISMATCH = Study(
    name="mismatch",
    claim="the paper's stop-gradient clipped loss trains through a bf16 engine gap without a correction",
    through="stage1",
    measure=("stage1",),
    arms=_mismatch_arms(),
    readout=mismatch_readout,
    verdicts=mismatch_verdicts,
    common=(
        "stages.{stage1}.steps=10",
        "stages.{stage1}.min_steps=10",
        "stages.{stage1}.reward_plateau_steps=null",
        "stages.{stage1}.max_wall_minutes=null",
        "stages.{stage1}.stop_when=[]",
        "stages.{stage1}.prompts_per_step=8",
    ),
    columns=(
        ("accuracy", "held-out acc"),
        ("trace_rate", "trace rate"),
        ("len_mean", "len"),
        ("gap_p99", "gap p99 (mean)"),
        ("gap_max", "gap max"),
        ("coverage", "grad coverage"),
        ("adv_nonzero", "adv != 0"),
        ("masked", "dropped"),
        ("collapsed", "collapsed"),
        ("rollbacks", "rollbacks"),
        ("stage1_minutes", "minutes"),
    ),
    curves=("gap/ratio/p99", "reward/mean"),
)

STUDIES = {s.name: s for s in (LOSS, DISTILL, DEPTH, ISLANDS, MISMATCH)}


def generic_readout(measure: tuple[str, ...]) -> Callable[[ArmRun], dict]:
    def readout(run: ArmRun) -> dict:
        out = {}
        for label in measure:
            out.update(_checkpoint(run.rows[label], label))
        return out

    return readout


def varied(key: str, values: list[str], through: str, measure: tuple[str, ...]) -> Study:
    """``--vary KEY=A,B``: one arm per value, the measured checkpoints' numbers, no verdict."""
    return Study(
        name=f"vary-{key.replace('.', '-')}",
        claim=f"{key} in {values}",
        through=through,
        measure=measure,
        arms={v: (f"{key}={v}",) for v in values},
        readout=generic_readout(measure),
        verdicts=lambda readouts, seeds: [],
        columns=tuple(
            (f"{label}/{k}", f"{label} {k}")
            for label in measure
            for k in ("pass1", "trace", "len", "bf16_p99", "islands_p99", "bf16_drift")
        ),
    )
