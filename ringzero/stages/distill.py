"""The self-distillation stage: reset a verbose policy onto its own shortest correct traces.

Stage-1 RL with the unnormalized token-level loss lets responses grow, and a long trajectory widens
the train/rollout gap. Distillation compresses before RL resumes:

1. the input policy samples ``samples_per_prompt`` responses to each of ``prompts`` training prompts;
2. per prompt, the shortest correct response that finished by itself (optionally only those within
   ``length_budget`` tokens) becomes the target, preferring worked traces whose steps all check over
   lucky guesses (``ringzero.stages.distill_data.shortest_correct``); prompts with none are dropped.
   ``select: random`` takes a random one of the same eligible samples instead, the control that shows
   how much of the compression the selection makes;
3. a model (the input policy, or the run's base with ``init_weights: base``) is fine-tuned on the
   targets: next-token loss on the response tokens only, ``epochs`` passes in a seeded order;
4. the held-out prompts are measured before and after (``ringzero.stages.heldout_eval``, temperature 1):
   the summary reports ``distill/len_before``, ``distill/len_after``, ``distill/compression`` (the share
   of the mean length removed) and ``distill/acc_before`` / ``distill/acc_after``.

Resumable: the chosen targets and the "before" measurement are stored once
(``<prefix>/distill-set.json``), and a resume point is committed after every epoch, so an interrupted
stage neither samples again nor repeats a finished epoch.
"""

from __future__ import annotations

import math
import time

import structlog
import torch

from ringzero.config.stages import DistillStage
from ringzero.engines.builders import apply_threads, seeded, start_model, task_and_tokenizer
from ringzero.errors import RingzeroError
from ringzero.rl.rewards import TaskReward
from ringzero.rl.rollout_batch import collect, sampling_params
from ringzero.rollout.deployment.connect import rollout_client
from ringzero.stages import preemption
from ringzero.stages.base import StageContext, StageInputs, StageOutcome
from ringzero.stages.distill_data import epoch_order, select_traces, sft_batch
from ringzero.stages.heldout_eval import evaluate_heldout
from ringzero.stages.lm_step import lm_step
from ringzero.stages.progress import step_progress
from ringzero.stages.summary_values import finite_only
from ringzero.stages.train_state import end_of_step, save_final, weights_to_write
from ringzero.stages.training_engine import start_training

log = structlog.get_logger(__name__)

ENGINE_BATCH = 256
EVAL_SAMPLES = 4
"""Samples per held-out prompt at temperature 1, before and after: length is a property of the sampled
policy."""
LOG_EVERY = 5
HELDOUT_KEYS = {
    "eval/accuracy": "eval/accuracy",
    "len/mean": "eval/len_mean",
    "trace/rate": "eval/trace_rate",
}
"""The run-wide keys the report plots, read from a held-out measurement."""


def run(ctx: StageContext, stage: DistillStage, inputs: StageInputs) -> StageOutcome:
    cfg, started = ctx.cfg, time.time()
    apply_threads(cfg)
    task, tokenizer = task_and_tokenizer(cfg)
    if inputs.init_uri is None:
        raise RingzeroError(f"distill stage {stage.name!r}: no input policy to sample from (init)")
    start_uri = inputs.init_uri if stage.init_weights == "input" else inputs.base_uri
    if start_uri is None:
        raise RingzeroError(
            f"distill stage {stage.name!r}: init_weights is 'base' but the run has no base checkpoint"
        )
    torch.manual_seed(cfg.run.seed)

    plan = distill_set(ctx, stage, inputs.init_uri, task, tokenizer)
    examples = [
        e for e in plan["examples"] if len(e["prompt_ids"]) + len(e["output_ids"]) <= stage.max_seq_len
    ]
    if not examples:
        raise RingzeroError(
            f"distill stage {stage.name!r}: no target to train on: {plan['stats']['distill/kept']:.0f} of "
            f"{stage.prompts} prompts had a correct finished sample, none of them within max_seq_len "
            f"{stage.max_seq_len}"
        )
    ctx.metrics.log(0, {k: plan["before"][v] for k, v in HELDOUT_KEYS.items() if v in plan["before"]})

    rt = ctx.runtime
    steps_per_epoch = math.ceil(len(examples) / stage.batch_size)
    total = stage.epochs * steps_per_epoch
    setup, resume = start_training(ctx, stage, start_uri, total_steps=total, schedule="cosine")
    model, optimizer, first = setup.model, setup.optimizer, 0 if resume is None else resume.step
    order_seed = seeded(cfg.run.seed, "distill-order")
    losses = []
    with step_progress("distill", total, first) as advance, preemption.preemptible():
        for step in range(first, total):
            epoch, index = divmod(step, steps_per_epoch)
            order = epoch_order(len(examples), order_seed, epoch)
            chosen = order[index * stage.batch_size : (index + 1) * stage.batch_size]
            ids_BS, mask_BS1 = sft_batch([examples[i] for i in chosen], tokenizer.pad_id)
            result = lm_step(
                model,
                ids_BS,
                rt,
                mask_BW=mask_BS1,
                optimizer=optimizer,
                sharding=cfg.parallel.sharding,
                micro_batch=stage.micro_batch,
            )
            report = result.report
            losses.append(value := result.loss)
            if (step + 1) % LOG_EVERY == 0 or step + 1 == total:
                ctx.metrics.log(
                    step + 1,
                    {
                        "distill/loss": sum(losses) / len(losses),
                        "train/lr": report.lr,
                        "grad/norm": report.grad_norm,
                        "distill/epoch": epoch,
                    },
                )
                losses = []
            advance(value, tokens=ids_BS[:, 1:].numel())
            end_of_step(
                ctx,
                stage.name,
                step + 1,
                model,
                optimizer,
                rt,
                checkpoint=(step + 1) % steps_per_epoch == 0 and step + 1 < total,
            )

    model.eval()
    uri = save_final(
        ctx.store,
        ctx.checkpoint_prefix,
        model,
        weights_to_write(ctx.store, optimizer),
        {"stage": stage.name, "steps": total, "examples": len(examples)},
        tokenizer=tokenizer,
    )
    with step_progress("distill", phase="heldout after"):
        after = heldout(cfg, setup.served(), task, tokenizer, stage, rt, serves=uri)
    ctx.metrics.log(total, {k: after[v] for k, v in HELDOUT_KEYS.items() if v in after})
    summary = finite_only(
        {
            **plan["stats"],
            **compression(plan["before"], after),
            **after,
            **{k: after[v] for k, v in HELDOUT_KEYS.items() if v in after},
            "distill/examples": float(len(examples)),
            "loss/skipped": float(optimizer.skipped),
        }
    )
    log.info(
        "distill.done",
        uri=uri,
        len_before=summary.get("distill/len_before"),
        len_after=summary.get("distill/len_after"),
        acc_before=summary.get("distill/acc_before"),
        acc_after=summary.get("distill/acc_after"),
    )
    return StageOutcome(uri, summary, stop_reason="epochs", steps=total, wall_s=time.time() - started)


def distill_set(ctx: StageContext, stage: DistillStage, policy_uri: str, task, tokenizer) -> dict:
    """The targets and the input policy's held-out numbers, sampled once and stored for resumes."""
    key = f"{ctx.checkpoint_prefix}/distill-set.json"
    if (plan := ctx.store.get_json(key)) is not None:
        log.info("distill.set_reused", examples=len(plan["examples"]))
        return plan
    cfg = ctx.cfg
    rt = ctx.runtime
    policy = start_model(cfg, ctx.store, policy_uri, cfg.precision.train).to(rt.device).eval()
    with step_progress("distill", phase="heldout before") as progress:
        before = heldout(cfg, policy, task, tokenizer, stage, rt, serves=policy_uri)
        progress.phase = "sample"
        engine = rollout_client(
            cfg,
            policy,
            tokenizer,
            rt,
            max_batch=ENGINE_BATCH,
            seed=seeded(cfg.run.seed, "distill-engine"),
            serves=policy_uri,
        )
        problems = task.prompts("train", stage.prompts, seeded(cfg.run.seed, "distill-prompts"))
        params = sampling_params(
            stage.sampling, task, tokenizer, stage.samples_per_prompt, seeded(cfg.run.seed, "distill-samples")
        )
        batch = collect(
            engine,
            task,
            tokenizer,
            problems,
            samples=stage.samples_per_prompt,
            params=params,
            reward=TaskReward(task),
        )
    examples = select_traces(
        batch, task, stage.length_budget, stage.select, seeded(cfg.run.seed, "distill-select")
    )
    kept_lengths = [len(e["output_ids"]) for e in examples]
    stats = finite_only(
        {
            "distill/sample_accuracy": sum(batch.correct) / len(batch),
            "distill/sample_len_mean": sum(batch.lengths) / len(batch),
            "distill/sample_trace_rate": sum(batch.uses_trace) / len(batch),
            "distill/kept": float(len(examples)),
            "distill/kept_frac": len(examples) / len(problems),
            "distill/kept_len_mean": sum(kept_lengths) / len(kept_lengths) if kept_lengths else float("nan"),
            "distill/kept_verified_frac": (
                sum(e["verified"] for e in examples) / len(examples) if examples else float("nan")
            ),
        }
    )
    plan = {"examples": examples, "before": finite_only(before), "stats": stats}
    ctx.store.put_json(key, plan)
    log.info(
        "distill.set", prompts=len(problems), kept=len(examples), **{k: round(v, 3) for k, v in stats.items()}
    )
    return plan


def heldout(
    cfg, model, task, tokenizer, stage: DistillStage, runtime=None, serves: str | None = None
) -> dict[str, float]:
    engine = rollout_client(
        cfg,
        model,
        tokenizer,
        runtime,
        max_batch=ENGINE_BATCH,
        seed=seeded(cfg.run.seed, "distill-heldout"),
        serves=serves,
    )
    return evaluate_heldout(
        engine,
        task,
        tokenizer,
        prompts=cfg.task.eval_prompts,
        samples=EVAL_SAMPLES,
        max_new_tokens=stage.sampling.max_new_tokens,
        forced_trace=False,
    )


def compression(before: dict, after: dict) -> dict[str, float]:
    len_before, len_after = before.get("eval/len_mean", math.nan), after.get("eval/len_mean", math.nan)
    acc_before, acc_after = before.get("eval/accuracy", math.nan), after.get("eval/accuracy", math.nan)
    return {
        "distill/len_before": len_before,
        "distill/len_after": len_after,
        "distill/compression": 1.0 - len_after / len_before if len_before else math.nan,
        "distill/acc_before": acc_before,
        "distill/acc_after": acc_after,
        "distill/acc_delta": acc_after - acc_before,
    }
