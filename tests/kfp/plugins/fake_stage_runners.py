"""Fast stand-ins for the stage runners, for pipeline tests: the wiring is real, the training is not.

Each fake checks that its input checkpoints load from the store, saves a tiny checkpoint of its own
(except eval) and returns a fixed summary, so gates decide pass or fail by their thresholds alone.
An RL stage with exactly ``FAIL_STEPS`` steps raises, to exercise a step that fails.
"""

from __future__ import annotations

import torch

from ringzero.stages.base import StageOutcome

FAIL_STEPS = 13
RL_SUMMARY = {
    "reward/mean": 0.5,
    "gap/ratio/p99": 0.01,
    "gap/ratio/max": 0.5,
    "ratio/p99": 0.02,
    "ratio/max": 1.5,
    "len/mean": 42.0,
}


def _check_inputs(ctx, inputs) -> None:
    for uri in [inputs.init_uri, inputs.reference_uri, inputs.base_uri, *inputs.compare.values()]:
        if uri:
            ctx.store.load(uri)  # raises if the upstream step did not commit it


def _finish(ctx, stage, inputs, summary: dict, save: bool) -> StageOutcome:
    _check_inputs(ctx, inputs)
    for step in range(3):
        ctx.metrics.log(step, {k: v + step for k, v in summary.items()})
    uri = None
    if save:
        tensors = {"w": torch.full((2,), float(len(stage.name)))}
        uri = ctx.store.save(f"{ctx.checkpoint_prefix}/final", tensors, {"stage": stage.name})
    return StageOutcome(output_uri=uri, summary=summary, stop_reason="max_steps", steps=3, wall_s=0.0)


def pretrain(ctx, stage, inputs):
    return _finish(ctx, stage, inputs, {"loss/final": 1.25}, save=True)


def rl(ctx, stage, inputs):
    if stage.steps == FAIL_STEPS:
        raise RuntimeError("fake RL runner failed on purpose")
    return _finish(ctx, stage, inputs, dict(RL_SUMMARY), save=True)


def distill(ctx, stage, inputs):
    return _finish(ctx, stage, inputs, {"len/mean": 30.0, "eval/accuracy": 0.75}, save=True)


def evaluate(ctx, stage, inputs):
    return _finish(
        ctx, stage, inputs, {"eval/accuracy": 0.8, "eval/compared": float(len(inputs.compare))}, save=False
    )


RUNNERS = {"pretrain": "pretrain", "rl": "rl", "distill": "distill", "eval": "evaluate"}
