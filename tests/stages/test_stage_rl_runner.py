"""The RL stage runner end to end on a micro config: outcome, stop reasons, checkpoints, resume."""

import pytest
from stage_kit import context, run_config, state_equal

from ringzero.model.checkpoint import load_model
from ringzero.model.config import PrecisionPolicy
from ringzero.rl.step import RLStep
from ringzero.stages import rl as rl_stage
from ringzero.stages.base import StageInputs
from ringzero.store import open_store

FP32_POLICY = PrecisionPolicy.preset("fp32")  # compare resumed weights exactly, not after a bf16 cast
RL = {
    "name": "stage1",
    "kind": "rl",
    "steps": 4,
    "prompts_per_step": 2,
    "samples_per_prompt": 4,
    "minibatches": 2,
    "checkpoint_every": 2,
    "min_steps": 0,
    "sampling": {"max_new_tokens": 8},
    "optim": {"lr": 1e-3, "warmup_steps": 1},
    "loss": {"kl_coef": 0.01},
}


def run_stage(tmp_path, stage_hash="a" * 16, **overrides):
    cfg = run_config(tmp_path, [{**RL, **overrides}])
    ctx = context(cfg, stage_hash)
    return ctx, rl_stage.run(ctx, cfg.stages[0], StageInputs())


def test_outcome_summary_metrics_and_checkpoints(tmp_path):
    ctx, outcome = run_stage(tmp_path)
    assert outcome.stop_reason == "steps" and outcome.steps == 4
    assert outcome.summary["stop/stop_when"] == 0.0  # ended on its step count, not a stop_when
    assert [r["step"] for r in ctx.metrics.records] == [1, 2, 3, 4]
    for key in (
        "reward/mean",
        "len/mean",
        "ratio/p99",
        "grad/coverage",
        "kl/mean",
        "eval/accuracy",
        "eval/greedy_accuracy",
        "eval/trace_rate",
        "eval/len_mean",
        "eval/forced_trace_accuracy",
    ):
        assert key in outcome.summary, key
    store = open_store(ctx.cfg.storage.root)
    assert [u.rsplit("/", 1)[1] for u in store.list(ctx.checkpoint_prefix + "/step-")] == ["step-000002"]
    final = load_model(outcome.output_uri, store=store)
    assert final.meta["stop_reason"] == "steps"


def test_stop_when_ends_the_stage_after_min_steps_with_the_reason(tmp_path):
    _, outcome = run_stage(tmp_path, min_steps=2, stop_when=["len/mean >= 1"], steps=50)
    assert outcome.steps == 2
    assert (
        outcome.stop_reason.startswith("stop_when: len/mean = ")
        and "satisfies len/mean >= 1" in outcome.stop_reason
    )
    assert outcome.summary["stop/stop_when"] == 1.0  # what a target on the length gate reads


def test_resume_after_interruption_equals_an_uninterrupted_run(tmp_path, monkeypatch):
    _, whole = run_stage(tmp_path / "whole")
    original = RLStep.run

    def dies_at_step_3(self, step, seed=None):
        if step == 2:  # 0-based: the third step, after the resume point of step 2 was committed
            raise KeyboardInterrupt("preempted")
        return original(self, step, seed)

    monkeypatch.setattr(RLStep, "run", dies_at_step_3)
    with pytest.raises(KeyboardInterrupt):
        run_stage(tmp_path / "cut")
    monkeypatch.setattr(RLStep, "run", original)
    ctx, resumed = run_stage(tmp_path / "cut")
    assert [r["step"] for r in ctx.metrics.records] == [3, 4]  # continued from the saved step
    assert resumed.steps == 4
    a = load_model(whole.output_uri, FP32_POLICY).model.state_dict()
    b = load_model(resumed.output_uri, FP32_POLICY).model.state_dict()
    assert state_equal(a, b)
    assert (
        resumed.summary["reward/mean"] == whole.summary["reward/mean"]
    )  # history came back with the resume point
