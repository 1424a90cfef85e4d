"""Fast stand-ins for the stage runners: the pipeline wiring is real, the training is not.

Every fake checks that its input checkpoints load, logs one metric record per step, commits a
checkpoint after every step under ``ctx.checkpoint_prefix`` and resumes after the latest one, as the
real runners do. Each start is appended to ``<run_dir>/fake_calls.jsonl`` (stage, first step) so tests
can tell what ran and where it resumed. With ``RINGZERO_TEST_HOLD_AT=STAGE:STEP`` the fake stops
after committing that step and waits to be killed: the test then kills the run at a known point
instead of racing a timer.
"""

from __future__ import annotations

import json
import os
import time

import torch

from ringzero.stages.base import StageOutcome

HOLD_ENV = "RINGZERO_TEST_HOLD_AT"


def _check_inputs(ctx, inputs) -> None:
    for uri in [inputs.init_uri, inputs.reference_uri, inputs.base_uri, *inputs.compare.values()]:
        if uri:
            ctx.store.load(uri)  # raises if the upstream stage did not commit it


def _record_call(ctx, stage, first_step: int) -> None:
    with (ctx.stage_dir.parent / "fake_calls.jsonl").open("a") as fh:
        fh.write(json.dumps({"stage": stage.name, "kind": stage.kind, "first_step": first_step}) + "\n")


def _hold_if_asked(stage, step: int) -> None:
    if os.environ.get(HOLD_ENV) == f"{stage.name}:{step}":
        while True:  # the test kills this process now that the checkpoint is committed
            time.sleep(0.05)


def _stepper(ctx, stage, inputs, steps: int, metrics_at, save: bool = True) -> StageOutcome:
    _check_inputs(ctx, inputs)
    resume = ctx.resume_uri()
    first = ctx.store.load(resume).meta["step"] + 1 if resume else 0
    _record_call(ctx, stage, first)
    last = {}
    for step in range(first, steps):
        last = ctx.metrics.log(step, metrics_at(step))
        tensors = {"w": torch.full((2,), float(step))}
        ctx.store.save(
            f"{ctx.checkpoint_prefix}/step-{step:06d}", tensors, {"stage": stage.name}, {"step": step}
        )
        _hold_if_asked(stage, step)
    uri = None
    if save:
        uri = ctx.store.save(f"{ctx.checkpoint_prefix}/final", {"w": torch.zeros(2)}, {"stage": stage.name})
    summary = {k: v for k, v in (last or metrics_at(steps - 1)).items() if k not in ("step", "time")}
    return StageOutcome(output_uri=uri, summary=summary, stop_reason="max_steps", steps=steps, wall_s=0.0)


def pretrain(ctx, stage, inputs):
    return _stepper(ctx, stage, inputs, stage.steps, lambda s: {"loss/train": 3.0 / (s + 1)})


def rl(ctx, stage, inputs):
    # Stage 1 grows length and the ratio tail; later stages (sample_mean) shrink both. The engine gap
    # (gap/*, the first minibatch) is the smaller part of the tail: staleness adds the rest.
    grow = 1.0 if stage.loss.normalization == "token_sum" else -0.1

    def at(step):
        return {
            "reward/mean": 0.3 + 0.05 * step,
            "trace/rate": min(1.0, 0.1 + 0.2 * step),
            "len/mean": 40.0 + grow * 10 * step,
            "ratio/p99": 0.01 + grow * 0.002 * step + 0.01,
            "ratio/max": 1.0 + grow * 0.3 * step + 1.0,
            "gap/ratio/p99": 0.005 + grow * 0.001 * step,
            "gap/ratio/max": 0.5 + grow * 0.05 * step,
        }

    return _stepper(ctx, stage, inputs, stage.steps, at)


def distill(ctx, stage, inputs):
    return _stepper(
        ctx,
        stage,
        inputs,
        stage.epochs,
        lambda s: {"distill/loss": 1.0 / (s + 1), "len/mean": 30.0, "eval/accuracy": 0.75},
    )


def evaluate(ctx, stage, inputs):
    _check_inputs(ctx, inputs)
    _record_call(ctx, stage, 0)
    names = [*inputs.compare, "input"]
    rows = [
        {
            "checkpoint": n,
            "uri": inputs.compare.get(n, inputs.init_uri),
            "values": {"eval/accuracy": 0.5 + 0.1 * i, "eval/pass@k": 0.6 + 0.1 * i},
        }
        for i, n in enumerate(names)
    ]
    extra = {
        "comparison": {
            "columns": [["eval/accuracy", "greedy accuracy"], ["eval/pass@k", "pass@4"]],
            "rows": rows,
        }
    }
    return StageOutcome(
        output_uri=None,
        summary={"eval/accuracy": rows[-1]["values"]["eval/accuracy"]},
        stop_reason="done",
        steps=0,
        wall_s=0.0,
        extra=extra,
    )


RUNNERS = {"pretrain": "pretrain", "rl": "rl", "distill": "distill", "eval": "evaluate"}
