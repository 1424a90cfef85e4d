"""The pretrain stage: next-token training of the base model on the task's web-like synthetic corpus.

The corpus makes worked traces rare and direct answers unreliable, so the base it produces rarely
reasons, although its rare trace mode works: the starting point zero RL needs. The stage ends by
measuring exactly that on held-out prompts (``ringzero.stages.heldout_eval``): accuracy at
temperature 1 and greedy, the share of responses that use a trace (``trace/rate``), mean length.

Resumable: a resume point every ``checkpoint_every`` steps holds the weights and the optimizer state,
and batches depend only on (seed, step), so a resumed run continues exactly where it stopped.
"""

from __future__ import annotations

import time

import structlog
import torch

from ringzero.config.stages import PretrainStage
from ringzero.engines.builders import apply_threads, task_and_tokenizer
from ringzero.rollout.deployment.connect import rollout_client
from ringzero.stages import preemption
from ringzero.stages.base import StageContext, StageInputs, StageOutcome
from ringzero.stages.corpus_windows import CorpusWindows
from ringzero.stages.heldout_eval import evaluate_heldout
from ringzero.stages.lm_step import lm_step
from ringzero.stages.progress import step_progress
from ringzero.stages.summary_values import finite_only
from ringzero.stages.train_state import end_of_step, save_final, weights_to_write
from ringzero.stages.training_engine import start_training

log = structlog.get_logger(__name__)

LOG_EVERY = 10
"""Steps per metrics record (losses are averaged over them)."""
EVAL_SAMPLES = 4
"""Samples per held-out prompt at temperature 1: a base that traces ~5% of the time needs several to
measure its trace mode at all."""
EVAL_MAX_NEW_TOKENS = 256
"""Room for the longest worked trace of the default task (verbose, ~170 characters) and then some."""


def run(ctx: StageContext, stage: PretrainStage, inputs: StageInputs) -> StageOutcome:
    cfg, started = ctx.cfg, time.time()
    apply_threads(cfg)
    task, tokenizer = task_and_tokenizer(cfg)
    torch.manual_seed(cfg.run.seed)
    rt = ctx.runtime
    setup, resume = start_training(ctx, stage, inputs.init_uri, total_steps=stage.steps, schedule="cosine")
    model, optimizer, first = setup.model, setup.optimizer, 0 if resume is None else resume.step
    windows = CorpusWindows(task, tokenizer, stage.seq_len, cfg.run.seed)

    losses, tokens, window_start = [], 0, time.time()
    with step_progress("pretrain", stage.steps, first) as advance, preemption.preemptible():
        for step in range(first, stage.steps):
            batch_BS = windows.batch(step, stage.batch_size)
            result = lm_step(
                model,
                batch_BS,
                rt,
                optimizer=optimizer,
                sharding=cfg.parallel.sharding,
                micro_batch=stage.micro_batch,
            )
            report = result.report
            losses.append(result.loss)
            tokens += batch_BS[:, 1:].numel()
            if (step + 1) % LOG_EVERY == 0 or step + 1 == stage.steps:
                elapsed = time.time() - window_start
                ctx.metrics.log(
                    step + 1,
                    {
                        "train/loss": sum(losses) / len(losses),
                        "train/lr": report.lr,
                        "train/tokens_per_s": tokens / elapsed if elapsed > 0 else 0.0,
                        "grad/norm": report.grad_norm,
                        "loss/skipped": optimizer.skipped,
                    },
                )
                losses, tokens, window_start = [], 0, time.time()
            advance(result.loss, tokens=batch_BS[:, 1:].numel())
            end_of_step(
                ctx,
                stage.name,
                step + 1,
                model,
                optimizer,
                rt,
                checkpoint=(step + 1) % stage.checkpoint_every == 0 and step + 1 < stage.steps,
            )

    model.eval()
    final_loss = lm_step(
        model,
        windows.batch(stage.steps, stage.batch_size),
        rt,  # an unseen batch
        sharding=cfg.parallel.sharding,
        micro_batch=stage.micro_batch,
    ).loss
    uri = save_final(
        ctx.store,
        ctx.checkpoint_prefix,
        model,
        weights_to_write(ctx.store, optimizer),
        {"stage": stage.name, "steps": stage.steps},
        tokenizer=tokenizer,
    )
    summary = {"train/loss": final_loss, "loss/skipped": float(optimizer.skipped)}
    with step_progress("pretrain", phase="heldout"):
        summary.update(measure_base(cfg, setup.served(), task, tokenizer, rt))
    summary = finite_only(summary)
    log.info("pretrain.done", uri=uri, **{k: round(v, 4) for k, v in summary.items()})
    return StageOutcome(uri, summary, stop_reason="steps", steps=stage.steps, wall_s=time.time() - started)


def measure_base(cfg, model, task, tokenizer, runtime=None) -> dict[str, float]:
    """Held-out behaviour of the base under the rollout engine's precision (what RL will sample)."""
    # Pretrain jobs get no rollout servers (ringzero.cluster.step.SAMPLING_KINDS): always the embedded engine.
    engine = rollout_client(cfg, model, tokenizer, runtime, max_batch=256, seed=cfg.run.seed, local=True)
    prompts = cfg.task.eval_prompts
    max_new = min(EVAL_MAX_NEW_TOKENS, cfg.model.max_position_embeddings // 2)
    out = evaluate_heldout(
        engine, task, tokenizer, prompts=prompts, samples=EVAL_SAMPLES, max_new_tokens=max_new
    )
    # The base is measured on held-out prompts only, so its sampled behaviour doubles as the stage's
    # trace/rate and len/mean (the keys RL stages report for their own samples).
    out["trace/rate"], out["len/mean"] = out["eval/trace_rate"], out["eval/len_mean"]
    return out
