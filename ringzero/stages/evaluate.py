"""The eval stage: every compared checkpoint measured the same way on the task's held-out prompts.

Per checkpoint (the stage's input and each ``compare`` stage's output, in run order):

- greedy accuracy and length (temperature 0, one response per prompt);
- ``k`` sampled responses per prompt at the stage's sampling settings: ``eval/accuracy`` (= pass@1),
  ``eval/pass@k`` with the unbiased estimator, length statistics, trace usage and each route's accuracy;
- the chain-of-thought qualities of ``ringzero.stages.eval_metrics``: comprehensibility,
  reproducibility, efficiency;
- the ratio tail on those sampled responses: the training path (``score_sequences`` under the train
  precision) against the log-probs the rollout engine reported, as in an RL step;
- per tier of the run's tier-RL stages: the prompt asked with the tier's tag, accuracy, length and the
  share of responses within the tier's budget (a tier without one: no share). The untagged tier asks
  the prompt as is, which the untiered measures above already sample: it is not sampled again;
- with a task that has difficulty buckets (``Task.buckets``): accuracy and length per bucket, untiered
  and per tier (``rl.tier_metrics``), and ``eval/baseline/<bucket>/accuracy``, the task's no-reasoning
  heuristic (``Task.baseline_answer``: the likely candidate answered without a trace) on the same
  prompts; the report plots length and accuracy against difficulty.

Every checkpoint sees the same prompts and the same sampling seeds, so differences are the policies'.
The result is a comparison table in ``StageOutcome.extra['comparison']`` (the report and the console
print it); the summary holds the input checkpoint's numbers plus ``compare/<stage>/<metric>`` for the
others, so gates can use either. Each measured row is stored as it finishes: an interrupted eval
resumes with the checkpoints it has not measured yet.
"""

from __future__ import annotations

import time

import numpy as np
import structlog
import torch

from ringzero.config.stages import EvalStage, Tier
from ringzero.engines.builders import apply_threads, seeded, start_model, task_and_tokenizer
from ringzero.errors import RingzeroError
from ringzero.model.scoring import score_sequences
from ringzero.parallel.runtime import single
from ringzero.rl.rewards import TaskReward
from ringzero.rl.rollout_batch import RolloutBatch, collect, sampling_params
from ringzero.rl.seeds import derive_seed
from ringzero.rl.tier_metrics import contrast_tiers, depth_contrast, tier_metrics
from ringzero.rollout.deployment.connect import rollout_client
from ringzero.rollout.engine.gap import gap_stats
from ringzero.stages.base import StageContext, StageInputs, StageOutcome
from ringzero.stages.eval_gap import policy_gaps
from ringzero.stages.eval_metrics import (
    baseline_accuracy,
    comprehensibility,
    efficiency,
    final_answer,
    mean_pass_at_k,
    reproducibility,
)
from ringzero.stages.progress import step_progress
from ringzero.stages.summary_values import finite_only

log = structlog.get_logger(__name__)

INPUT_LABEL = "input"
"""Row name of the stage's input checkpoint when no compared stage produced it."""
ENGINE_BATCH = 256
SUMMARY_ALIASES = {
    "len/mean": "eval/len_mean",
    "trace/rate": "eval/trace_rate",
    "ratio/p99": "eval/ratio/p99",
    "ratio/max": "eval/ratio/max",
    "gap/ratio/p99": "eval/ratio/p99",
    "gap/ratio/max": "eval/ratio/max",
}
"""The stage table reads these keys for every stage; for eval they are the input checkpoint's. Eval scores
the very weights that sampled, so its ratio tail is the engine gap alone: it fills ``gap/*`` too."""


def run(ctx: StageContext, stage: EvalStage, inputs: StageInputs) -> StageOutcome:
    cfg, started = ctx.cfg, time.time()
    apply_threads(cfg)
    task, tokenizer = task_and_tokenizer(cfg)
    checkpoints = checkpoints_to_measure(inputs)
    tiers = run_tiers(cfg)
    problems = task.prompts("eval", stage.prompts)
    rows = []
    with step_progress("eval", len(checkpoints), metric="accuracy") as advance:
        for step, (label, uri) in enumerate(checkpoints):
            advance.phase = label
            key = f"{ctx.checkpoint_prefix}/rows/{label}.json"
            stored = None if ctx.fresh else ctx.store.get_json(key)
            if stored is not None and stored["uri"] == uri:
                values = stored["values"]
                log.info("eval.row_reused", checkpoint=label)
            else:
                values = measure_checkpoint(
                    cfg, ctx.store, uri, stage, task, tokenizer, problems, tiers, ctx.runtime
                )
                ctx.store.put_json(key, {"uri": uri, "values": values})
            ctx.metrics.log(step, values)
            rows.append({"checkpoint": label, "uri": uri, "values": values})
            log.info(
                "eval.row",
                checkpoint=label,
                accuracy=values.get("eval/accuracy"),
                len_mean=values.get("eval/len_mean"),
            )
            advance(values.get("eval/accuracy"))
    summary = dict(rows[-1]["values"])  # the input checkpoint is measured last
    summary.update({alias: summary[key] for alias, key in SUMMARY_ALIASES.items() if key in summary})
    for row in rows[:-1]:
        summary.update(
            {f"compare/{row['checkpoint']}/{k.removeprefix('eval/')}": v for k, v in row["values"].items()}
        )
    buckets = task.buckets()
    extra = {
        "comparison": {
            "columns": comparison_columns(stage.k, tiers, buckets),
            "rows": rows,
            "difficulty": {"buckets": list(buckets), "tiers": [t.name for t in tiers]},
            "notes": f"{stage.prompts} held-out prompts; {stage.k} samples each at temperature "
            f"{stage.sampling.temperature:g}; greedy = temperature 0",
        }
    }
    return StageOutcome(
        None, summary, stop_reason="done", steps=len(rows), wall_s=time.time() - started, extra=extra
    )


def checkpoints_to_measure(inputs: StageInputs) -> list[tuple[str, str]]:
    """``(label, uri)`` of every compared stage, then the input; the input is not measured twice."""
    if inputs.init_uri is None:
        raise RingzeroError(
            "eval: no input checkpoint (the stage needs an earlier stage's output or an init URI)"
        )
    rows = [(name, uri) for name, uri in inputs.compare.items() if uri != inputs.init_uri]
    input_label = next((name for name, uri in inputs.compare.items() if uri == inputs.init_uri), INPUT_LABEL)
    return [*rows, (input_label, inputs.init_uri)]


def run_tiers(cfg) -> list[Tier]:
    """The tagged tiers of the run's tier-RL stages, first definition of each name wins. The untagged tier
    (``tag: null``) is the eval's untiered measurement (``eval/accuracy``, ``eval/<bucket>/...``)."""
    tiers: dict[str, Tier] = {}
    for stage in cfg.stages:
        for tier in getattr(stage, "tiers", []):
            if tier.tag is not None:
                tiers.setdefault(tier.name, tier)
    return list(tiers.values())


def comparison_columns(k: int, tiers: list[Tier], buckets: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    """The comparison table's rows: overall measures, then per tier; with difficulty ``buckets``,
    accuracy and length per bucket, untiered and per tier."""
    columns = [
        ("eval/greedy_accuracy", "greedy acc"),
        ("eval/accuracy", "pass@1"),
        ("eval/pass@k", f"pass@{k}"),
        ("eval/trace_rate", "trace rate"),
        ("eval/len_mean", "len mean"),
        ("eval/len_p95", "len p95"),
        ("eval/comprehensibility", "comprehensible"),
        ("eval/reproducibility", "reproducible"),
        ("eval/efficiency", "correct / 1k tok"),
        ("eval/ratio/p99", "ratio p99"),
        ("eval/ratio/max", "ratio max"),
    ]
    for t in tiers:
        columns += [
            (f"eval/{t.name}/accuracy", f"{t.name} acc"),
            (f"eval/{t.name}/len_mean", f"{t.name} len"),
        ]
        if t.budget is not None:
            columns += [(f"eval/{t.name}/within_budget", f"{t.name} within {t.budget}")]
    for head, label in [("eval", ""), *((f"eval/{t.name}", f"{t.name} ") for t in tiers)]:
        for b in buckets:
            columns += [
                (f"{head}/{b}/accuracy", f"{label}{b} acc"),
                (f"{head}/{b}/len_mean", f"{label}{b} len"),
            ]
    if (pair := contrast_tiers(tiers)) is not None:
        fast, deep = (t.name for t in pair)
        for part in ["", *(f"{b}/" for b in buckets)]:
            where = part.rstrip("/") or "all"
            columns += [
                (f"eval/contrast/{part}accuracy_gap", f"{deep}-{fast} acc ({where})"),
                (f"eval/contrast/{part}len_ratio", f"{deep}/{fast} len ({where})"),
            ]
    return columns


def measure_checkpoint(
    cfg, store, uri: str, stage: EvalStage, task, tokenizer, problems, tiers, runtime=None
) -> dict[str, float]:
    """Sampling is spread over the job's ranks; every rank then holds every sample (and the same values)."""
    runtime = runtime or single()
    model = start_model(cfg, store, uri, cfg.precision.train).to(runtime.device).eval()
    engine = rollout_client(
        cfg,
        model,
        tokenizer,
        runtime,
        deterministic=cfg.precision.deterministic,
        max_batch=ENGINE_BATCH,
        seed=seeded(cfg.run.seed, "eval-engine"),
        serves=uri,
    )
    seed = seeded(cfg.run.seed, "eval-samples")
    reward = TaskReward(task, tiers)  # rewards are not read here; tiered prompts need their tier known

    def sample(probs, n: int, temperature: float | None = None) -> RolloutBatch:
        params = sampling_params(stage.sampling, task, tokenizer, n, seed, temperature=temperature)
        # One stream per prompt: with one shared seed, sample j of every prompt draws the same uniforms,
        # so a rare choice (opening a trace) happens for all prompts at once or for none.
        seeds = [derive_seed(seed, i) for i in range(len(probs))]
        return collect(engine, task, tokenizer, probs, samples=n, params=params, reward=reward, seeds=seeds)

    greedy, sampled = sample(problems, 1, temperature=0.0), sample(problems, stage.k)
    values = {"eval/greedy_accuracy": _mean(greedy.correct), "eval/greedy_len_mean": _mean(greedy.lengths)}
    values.update(sampled_qualities(sampled, task, stage.k))
    values.update(ratio_tail(model, sampled, stage.sampling.temperature, cfg.precision.deterministic))
    values.update(policy_gaps(model, sampled, stage))  # the same samples under bf16 / fp32-islands rollouts
    values.update(
        tier_metrics(task, sampled, [], untiered="eval")
    )  # per difficulty bucket, if the task has them
    for tier in [t for t in tiers if t.tag is not None]:  # the untagged tier is the untiered sample above
        batch = sample([task.with_tier(p, tier.tag) for p in problems], stage.k)
        values.update(tier_metrics(task, batch, [tier], tiered="eval"))
    values.update(depth_contrast(values, tiers, tiered="eval"))
    values.update(baseline_accuracy(task, problems))
    values.update(
        {f"eval/{k}": v for k, v in task.behaviour_metrics(sampled.responses, sampled.problems).items()}
    )
    return finite_only(values)


def sampled_qualities(batch: RolloutBatch, task, k: int) -> dict[str, float]:
    n = len(batch)
    by_prompt = [range(i, i + batch.group_size) for i in range(0, n, batch.group_size)]
    traced = [i for i in range(n) if batch.uses_trace[i]]
    checks = [tuple(task.step_check(batch.responses[i], batch.problems[i])) for i in traced]
    steps = sum(s for s, _ in checks)
    lengths = np.asarray(batch.lengths, dtype=np.float64)
    return {
        "eval/accuracy": _mean(batch.correct),
        "eval/pass@1": mean_pass_at_k([[batch.correct[i] for i in g] for g in by_prompt], 1),
        "eval/pass@k": mean_pass_at_k([[batch.correct[i] for i in g] for g in by_prompt], k),
        "eval/k": float(k),
        "eval/len_mean": float(lengths.mean()),
        "eval/len_p50": float(np.percentile(lengths, 50)),
        "eval/len_p95": float(np.percentile(lengths, 95)),
        "eval/len_max": float(lengths.max()),
        "eval/trunc_rate": _mean(batch.truncated),
        "eval/trace_rate": _mean(batch.uses_trace),
        "eval/trace_accuracy": _mean(batch.correct[i] for i in traced),
        "eval/direct_accuracy": _mean(batch.correct[i] for i in range(n) if not batch.uses_trace[i]),
        "eval/comprehensibility": comprehensibility(checks),
        "eval/step_accuracy": sum(c for _, c in checks) / steps if steps else float("nan"),
        "eval/reproducibility": reproducibility(
            [[final_answer(batch.responses[i]) for i in g] for g in by_prompt]
        ),
        "eval/efficiency": efficiency(batch.correct, batch.lengths),
    }


def ratio_tail(model, batch: RolloutBatch, temperature: float, deterministic: bool) -> dict[str, float]:
    """|r - 1| of the sampled tokens: training-path recompute over the rollout engine's log-probs."""
    rows = [i for i in range(len(batch)) if batch.lengths[i] > 0]
    if not rows:
        return {}
    sequences, prompt_lens = batch.sequences(rows)
    with torch.no_grad():
        logp_train = score_sequences(
            model, sequences, prompt_lens, temperature, batch_invariant=deterministic
        )
    logp_rollout = [batch.logp_rollout_NT[i, : batch.lengths[i]] for i in rows]
    tail = gap_stats(logp_train, logp_rollout)["all"]
    return {f"eval/{k}": float(tail[k]) for k in ("ratio/mean", "ratio/p99", "ratio/max", "logratio/p99")}


def _mean(values) -> float:
    arr = np.asarray(list(values), dtype=np.float64)
    return float(arr.mean()) if arr.size else float("nan")
