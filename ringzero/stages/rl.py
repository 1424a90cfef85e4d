"""The RL stage runner: stage 1 (token_sum), stage 2 (sample_mean) and tier RL share this loop.

Each step samples, rewards, updates and pushes weights (``ringzero.rl.step``); its metrics go to the
stage's JSONL and a live console table. A resume point is committed every ``checkpoint_every``
steps. After ``min_steps`` the stop conditions are checked (``ringzero.stages.stop_conditions``);
the reason the stage ended is its ``stop_reason``. The summary, which gates read, is the mean of the
last ``SUMMARY_STEPS`` steps' key metrics plus the held-out evaluation of the final policy,
``stop/stop_when`` (1 when a ``stop_when`` threshold ended the stage), and
``ratio/p99_median``, the median over all the stage's steps of the step's ``ratio/p99`` (how far the policy
moves within a step, comparable across stages; the list of values travels in the resume points, whose
history holds only the last steps).

With ``rollback`` set, a step whose metrics trip it is undone: the last good state comes back from an
in-memory snapshot, the remedy is applied and the step runs again (``ringzero.stages.rollback``); the
events reach the metrics, the summary (``rollback/count``) and the outcome's ``extra["rollbacks"]``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import structlog

from ringzero.config.stages import RLStage
from ringzero.stages import preemption
from ringzero.stages.base import StageContext, StageInputs, StageOutcome
from ringzero.stages.heldout_eval import evaluate_heldout
from ringzero.stages.live_table import LiveTable
from ringzero.stages.progress import step_progress
from ringzero.stages.rl_session import build_session
from ringzero.stages.rollback import guard_for
from ringzero.stages.stop_conditions import StopConditions
from ringzero.stages.summary_values import finite_only, mean_of_last, median_of
from ringzero.stages.train_state import end_of_step, save_final, weights_to_write

log = structlog.get_logger(__name__)

SUMMARY_STEPS = 5
SUMMARY_KEYS = (
    "reward/mean",
    "reward/accuracy",
    "len/mean",
    "len/p95",
    "len/max",
    "len/trunc_rate",
    "len/correct_mean",
    "len/wrong_mean",
    "len/reward_corr",
    "trace/rate",
    "trace/accuracy",
    "trace/step_accuracy",
    "ratio/mean",
    "ratio/p99",
    "ratio/p99.9",
    "ratio/max",
    "logratio/p99",
    "ratio/above_clip_frac",
    "gap/ratio/mean",
    "gap/ratio/p99",
    "gap/ratio/p99.9",
    "gap/ratio/max",
    "gap/logratio/p99",
    "gap/mismatch/kl_k3",
    "mismatch/kl_k3",
    "grad/coverage",
    "grad/ppo_coverage",
    "entropy/mean",
    "kl/mean",
    "loss/skipped",
    "time/generate",
    "time/train",
    "time/sync",
    "time/step",
    "anchor/ref_accuracy",
    "anchor/accuracy",
    "anchor/gap",
    "time/anchor",
)
EVAL_SAMPLES = 4


@dataclass
class LoopState:
    """What the loop carries from step to step and what a resume point or a rollback snapshot keeps of it."""

    step: int
    stop: StopConditions
    history: list[dict[str, float]] = field(default_factory=list)  # the last SUMMARY_STEPS steps' keys
    p99s: list[float] = field(default_factory=list)  # every step's ratio/p99, for ratio/p99_median
    wall_before: float = 0.0  # seconds spent in earlier attempts of the stage

    @classmethod
    def resumed(cls, stage: RLStage, step: int, meta: dict) -> LoopState:
        return cls(
            step,
            StopConditions(stage, meta.get("stop")),
            list(meta.get("history", [])),
            list(meta.get("ratio_p99", [])),  # a resume point of before: none
            float(meta.get("wall_s", 0.0)),
        )

    def copy(self) -> LoopState:
        return LoopState.resumed(self.stop.stage, self.step, self.meta(self.wall_before))

    def meta(self, wall_s: float) -> dict:
        return {"stop": self.stop.state(), "history": self.history, "wall_s": wall_s, "ratio_p99": self.p99s}

    def record(self, metrics: dict[str, float]) -> None:
        self.step += 1
        self.history = (self.history + [finite_only({k: metrics[k] for k in SUMMARY_KEYS if k in metrics})])[
            -SUMMARY_STEPS:
        ]
        self.p99s += list(finite_only({"ratio/p99": metrics.get("ratio/p99")}).values())


def run(ctx: StageContext, stage: RLStage, inputs: StageInputs) -> StageOutcome:
    started = time.time()
    rl = build_session(ctx, stage, inputs)
    guard = guard_for(stage.rollback, rl)  # None: rollback off
    loop = LoopState.resumed(stage, rl.first_step, rl.resumed)
    table, reason = LiveTable(f"rl {stage.name}"), "steps"
    with (
        step_progress(f"rl {stage.name}", stage.steps, loop.step, metric="reward") as advance,
        preemption.preemptible(),
    ):
        while loop.step < stage.steps:
            if guard is not None and guard.due(loop.step, stage.checkpoint_every):
                guard.snapshot(loop.step, rl.optimizer, loop.copy())
            seed = ctx.cfg.run.seed if guard is None else guard.step_seed(loop.step)
            metrics = rl.stepper.run(loop.step, seed)
            if guard is not None and (triggered := guard.check(loop.step, metrics, rl.runtime)):
                snap = guard.roll_back(loop.step, triggered, rl)
                ctx.metrics.log(loop.step + 1, guard.metrics())
                loop = snap.loop.copy()  # the undone steps leave the history and the p99 median
                continue
            loop.record(metrics)
            ctx.metrics.log(loop.step, metrics)
            table.add(loop.step - 1, metrics)
            advance(metrics["reward/mean"], tokens=sum(rl.stepper.last_batch.lengths))
            wall_s = loop.wall_before + time.time() - started
            if (why := loop.stop.check(loop.step, metrics, wall_s / 60)) is not None:
                reason = why
                break
            meta = {**loop.meta(wall_s), **({} if guard is None else {"rollback": guard.state()})}
            checkpoint = loop.step % stage.checkpoint_every == 0 and loop.step < stage.steps
            end_of_step(
                ctx,
                stage.name,
                loop.step,
                rl.model,
                rl.optimizer,
                rl.runtime,
                checkpoint=checkpoint,
                meta=meta,
            )
    rolled = {} if guard is None else {"rollback/count": float(guard.count)}
    uri = save_final(
        ctx.store,
        ctx.checkpoint_prefix,
        rl.model,
        weights_to_write(ctx.store, rl.optimizer),
        {"stage": stage.name, "steps": loop.step, "stop_reason": reason, **rolled},
        tokenizer=rl.tokenizer,
    )
    summary = {
        **mean_of_last(loop.history, SUMMARY_KEYS, SUMMARY_STEPS),
        **median_of(loop.p99s, "ratio/p99_median"),
        # 1 when a stop_when threshold ended the stage (the seed's length gate handing over), else 0:
        # targets read the stop reason through it
        "stop/stop_when": float(reason.startswith("stop_when")),
        **heldout(ctx.cfg, rl, stage),
        **rolled,
    }
    extra = {} if guard is None else {"rollbacks": guard.events}
    return StageOutcome(
        uri, finite_only(summary), reason, loop.step, wall_s=time.time() - started, extra=extra
    )


def heldout(cfg, rl, stage: RLStage) -> dict[str, float]:
    """The final policy, as the rollout engine serves it, on the task's held-out prompts (per tier too)."""
    with step_progress(f"rl {stage.name}", phase="heldout"):
        return evaluate_heldout(
            rl.rollout.client,
            rl.task,
            rl.tokenizer,
            prompts=cfg.task.eval_prompts,
            samples=EVAL_SAMPLES,
            max_new_tokens=stage.sampling.max_new_tokens,
            tiers=stage.tiers,
            seeded=cfg.engines.rollout.kind == "embedded",
        )
