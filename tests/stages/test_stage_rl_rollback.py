"""Automatic rollback of the RL stage on a micro config: a bad step is undone bit for bit, recorded, remedied
and retried; a bad step that persists fails the stage with every trigger; no trigger changes nothing."""

import math

import pytest
import torch
import yaml
from stage_kit import SayDigit, context, run_config, state_equal

from ringzero.config.stages import RLStage
from ringzero.errors import RingzeroError
from ringzero.model.checkpoint import load_model
from ringzero.model.config import PrecisionPolicy
from ringzero.rl.step import RLStep
from ringzero.stages import rl as rl_stage
from ringzero.stages import rl_session
from ringzero.stages.base import StageInputs
from ringzero.stages.rollback import RollbackSettings, triggers
from ringzero.store import open_store

FP32_POLICY = PrecisionPolicy.preset("fp32")
RL = {
    "name": "stage1",
    "kind": "rl",
    "steps": 4,
    "prompts_per_step": 4,
    "samples_per_prompt": 8,
    "minibatches": 2,
    "checkpoint_every": 2,
    "min_steps": 0,
    "sampling": {"max_new_tokens": 8},
    "optim": {"lr": 1e-3, "warmup_steps": 1},
}
# fp32 train and rollout: |r - 1| stays ~1e-6 on a healthy step, noise on the engine's weights makes it > 1.
TAIL = "ratio/max > 0.5"


@pytest.fixture(autouse=True)
def learnable_task(monkeypatch):
    """A reward the micro model finds in a few samples (the digit sum it never does): steps really train."""
    original = rl_session.task_and_tokenizer
    monkeypatch.setattr(rl_session, "task_and_tokenizer", lambda cfg: (SayDigit(), original(cfg)[1]))


def run_stage(tmp_path, precision=None, **overrides):
    sections = {} if precision is None else {"precision": precision}
    cfg = run_config(tmp_path, [{**RL, **overrides}], **sections)
    ctx = context(cfg, "b" * 16)
    return ctx, rl_stage.run(ctx, cfg.stages[0], StageInputs())


def final_weights(outcome):
    return load_model(outcome.output_uri, FP32_POLICY).model.state_dict()


class Spy:
    """Wraps ``RLStep.run``: keeps the trainer's state on entry to and exit from every call, its metrics and
    batch, and perturbs the chosen calls (``noise``: the engine's weights before the step; ``nan``: a NaN loss
    reported after the step, whose update also goes astray: noise on the trainer's weights)."""

    def __init__(self, monkeypatch, noise=(), nan=()):
        self.calls, self.noise, self.nan = [], set(noise), set(nan)
        original = RLStep.run

        def run(step_self, step, seed=None):
            n = len(self.calls)
            opt = step_self.trainer.optimizer
            entry = {k: v.clone() for k, v in opt.master_state_dict().items()}
            optim = {k: v.clone() for k, v in opt.state()[0].items()}
            if n in self.noise:
                g = torch.Generator().manual_seed(n)
                with torch.no_grad():
                    for p in step_self.rollout.client.model.parameters():
                        p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.5)
            metrics = original(step_self, step, seed)
            if n in self.nan:
                metrics["loss/total"] = float("nan")
                with torch.no_grad():
                    for m in opt.master:
                        m.add_(torch.randn(m.shape, generator=torch.Generator().manual_seed(n)) * 0.1)
                step_self.rollout.push(step)
            self.calls.append(
                {
                    "step": step,
                    "weights": entry,
                    "optim": optim,
                    "metrics": dict(metrics),
                    "exit": {k: v.clone() for k, v in opt.master_state_dict().items()},
                    "prompts": [p.prompt for p in step_self.last_batch.problems],
                    "policy": step_self.rollout.client.policy.name(),
                    "seed": step_self.seed if seed is None else seed,
                }
            )
            return metrics

        monkeypatch.setattr(RLStep, "run", run)

    def steps(self):
        return [c["step"] for c in self.calls]


def rollback_records(ctx):
    return [r for r in ctx.metrics.records if "rollback/count" in r]


def test_no_trigger_changes_nothing(tmp_path, monkeypatch):
    _, plain = run_stage(tmp_path / "plain")
    spy = Spy(monkeypatch)
    ctx, guarded = run_stage(tmp_path / "guarded", rollback={"on": [TAIL, "loss/total > 1e6"], "every": 1})
    assert spy.steps() == [0, 1, 2, 3]
    assert not state_equal(spy.calls[0]["weights"], spy.calls[-1]["exit"])  # the stage did train
    assert state_equal(final_weights(plain), final_weights(guarded))
    assert guarded.summary["rollback/count"] == 0 and guarded.extra == {"rollbacks": []}
    assert not rollback_records(ctx)
    assert guarded.summary["reward/mean"] == plain.summary["reward/mean"]


def test_nonfinite_once_restores_bit_for_bit_lowers_lr_and_finishes(tmp_path, monkeypatch):
    spy = Spy(monkeypatch, nan={1})  # the 2nd step reports a NaN loss once (after it updated the weights)
    ctx, outcome = run_stage(tmp_path, rollback={"nonfinite": True, "remedy": "lower_lr", "lr_factor": 0.5})
    assert spy.steps() == [0, 1, 1, 2, 3]
    first, retry = spy.calls[1], spy.calls[2]
    assert state_equal(
        first["weights"], retry["weights"]
    )  # the restored weights are the snapshot's, bit for bit
    assert state_equal(first["optim"], retry["optim"])  # Adam moments and master copies too
    assert not state_equal(first["exit"], first["weights"])  # ...which the bad step had left
    assert first["metrics"]["optim/lr"] == pytest.approx(1e-3)
    assert retry["metrics"]["optim/lr"] == pytest.approx(5e-4)  # lower_lr: the peak lr halved from then on
    assert spy.calls[4]["metrics"]["optim/lr"] == pytest.approx(5e-4)
    (record,) = rollback_records(ctx)
    assert record["step"] == 2 and record["rollback/count"] == 1 and record["rollback/to_step"] == 1
    assert (
        "nonfinite: loss/total = nan" in record["rollback/reason"] and record["rollback/remedy"] == "lower_lr"
    )
    (event,) = outcome.extra["rollbacks"]
    assert event["step"] == 2 and event["remedy"] == "lower_lr" and "x0.5" in event["detail"]
    assert outcome.stop_reason == "steps" and outcome.steps == 4 and outcome.summary["rollback/count"] == 1
    assert load_model(outcome.output_uri, store=open_store(ctx.cfg.storage.root)).meta["rollback/count"] == 1


def test_engine_noise_once_skip_batch_resamples_and_the_engine_gets_the_good_weights(tmp_path, monkeypatch):
    spy = Spy(monkeypatch, noise={2})  # the 3rd step samples from an engine whose weights were disturbed
    ctx, outcome = run_stage(tmp_path, rollback={"on": [TAIL], "remedy": "skip_batch"})
    assert spy.steps() == [0, 1, 2, 2, 3]
    bad, retry = spy.calls[2], spy.calls[3]
    assert bad["metrics"]["ratio/max"] > 0.5
    assert state_equal(bad["weights"], retry["weights"])
    assert retry["metrics"]["ratio/max"] < 1e-3  # the engine serves the restored trainer weights again
    assert retry["seed"] != bad["seed"] and retry["prompts"] != bad["prompts"]  # another batch for that step
    assert spy.calls[4]["seed"] == bad["seed"]  # only the retried step is re-seeded
    (record,) = rollback_records(ctx)
    assert record["step"] == 3 and record["rollback/reason"].startswith("on: ratio/max = ")
    assert outcome.steps == 4 and outcome.summary["rollback/count"] == 1


def test_raise_precision_rebuilds_the_rollout_engine(tmp_path, monkeypatch):
    spy = Spy(monkeypatch, nan={0})
    _, outcome = run_stage(
        tmp_path, precision={"train": "fp32", "rollout": "bf16"}, rollback={"remedy": "raise_precision"}
    )
    assert spy.steps() == [0, 0, 1, 2, 3]
    assert [c["policy"] for c in spy.calls] == ["bf16"] + ["fp32-islands"] * 4
    assert state_equal(spy.calls[0]["weights"], spy.calls[1]["weights"])  # rolled back to the start
    assert outcome.extra["rollbacks"][0]["detail"] == "rollout precision bf16 -> fp32-islands"


def test_raise_precision_stops_at_the_trainers_policy(tmp_path, monkeypatch):
    Spy(monkeypatch, nan={0})
    with pytest.raises(RingzeroError, match="the rollout already runs 'fp32', the trainer runs 'fp32'"):
        run_stage(
            tmp_path, precision={"train": "fp32", "rollout": "fp32"}, rollback={"remedy": "raise_precision"}
        )


def test_a_persisting_perturbation_exhausts_max_rollbacks_and_names_every_trigger(tmp_path, monkeypatch):
    spy = Spy(monkeypatch, noise=range(1, 100))
    with pytest.raises(RingzeroError) as err:
        run_stage(tmp_path, rollback={"on": [TAIL], "max_rollbacks": 2})
    assert spy.steps() == [0, 1, 1, 1]
    text = str(err.value)
    assert "2 rollback(s) spent (max_rollbacks 2)" in text
    assert text.count("on: ratio/max = ") == 3 and text.count("step 2:") == 3


def test_snapshot_every_k_replays_the_good_steps_after_it(tmp_path, monkeypatch):
    spy = Spy(monkeypatch, nan={1})
    _, outcome = run_stage(tmp_path, rollback={"every": 2, "remedy": "skip_batch"})
    assert spy.steps() == [0, 1, 0, 1, 2, 3]  # snapshots before steps 1 and 3: step 2 fails, back to 0
    assert state_equal(spy.calls[0]["weights"], spy.calls[2]["weights"])
    assert state_equal(spy.calls[0]["exit"], spy.calls[2]["exit"])  # a good step replays bit for bit
    assert spy.calls[3]["seed"] != spy.calls[1]["seed"] == spy.calls[2]["seed"]
    assert outcome.extra["rollbacks"][0]["to_step"] == 0 and outcome.steps == 4


def test_rollback_state_rides_in_the_resume_point(tmp_path, monkeypatch):
    spy = Spy(monkeypatch, nan={0})
    run_stage(tmp_path, rollback={"remedy": "lower_lr"})
    store = open_store(run_config(tmp_path, [RL]).storage.root)
    (uri,) = store.list("stages/" + "b" * 16 + "/step-")
    meta = store.load(uri).meta["rollback"]
    assert meta["count"] == 1 and meta["lr_scale"] == 0.5 and meta["events"][0]["step"] == 1
    assert len(spy.calls) == 5


def test_config_shape_yaml_on_key_and_triggers():
    text = """
    rollback:
      on: ["gap/max > 2", "loss/total > 10"]
      nonfinite: true
      remedy: lower_lr
      lr_factor: 0.25
      max_rollbacks: 5
      every: 1
    """
    stage = RLStage.model_validate({"name": "s", **yaml.safe_load(text)})  # YAML 1.1 reads `on` as true
    r = stage.rollback
    assert [str(t) for t in r.on] == ["gap/max > 2", "loss/total > 10"] and r.lr_factor == 0.25
    assert RLStage.model_validate({"name": "s"}).rollback is None
    assert RLStage.model_validate(stage.model_dump()).rollback == r
    with pytest.raises(ValueError, match="cannot parse"):
        RollbackSettings.model_validate({"on": ["gap/max >> 2"]})
    with pytest.raises(ValueError):
        RollbackSettings.model_validate({"remedy": "pray"})
    healthy = {"loss/total": 1.0, "gap/max": 0.1, "trace/accuracy": math.nan, "loss/nonfinite": 0.0}
    assert triggers(r, healthy) == []  # a metric NaN by definition (no trace in the batch) never triggers
    assert triggers(r, {**healthy, "gap/max": 3.0}) == ["on: gap/max = 3 satisfies gap/max > 2"]
    assert triggers(r, {**healthy, "grad/norm": math.inf}) == ["nonfinite: grad/norm = inf"]
    assert triggers(r, {**healthy, "loss/nonfinite": 1.0}) == ["nonfinite: loss/nonfinite = 1 > 0"]


def test_the_run_report_lists_the_rollbacks():
    from types import SimpleNamespace

    from ringzero.pipeline.report import _rollbacks

    event = {
        "step": 3,
        "to_step": 2,
        "reasons": ["on: ratio/max = 5.8 satisfies ratio/max > 0.5"],
        "remedy": "skip_batch",
        "detail": "step 3 resampled with seed 7",
    }
    stages = [
        SimpleNamespace(name="stage1", outcome=SimpleNamespace(extra={"rollbacks": [event]})),
        SimpleNamespace(name="eval", outcome=SimpleNamespace(extra={})),
    ]
    html = "".join(_rollbacks(SimpleNamespace(stages=stages)))
    assert "<h2>Rollbacks</h2>" in html and "ratio/max = 5.8 satisfies ratio/max &gt; 0.5" in html
    assert "skip_batch" in html and "resampled with seed 7" in html
    assert _rollbacks(SimpleNamespace(stages=stages[1:])) == []
