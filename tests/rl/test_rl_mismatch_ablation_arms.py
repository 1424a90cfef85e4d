"""Every arm of the ``mismatch`` study (``ringzero.pipeline.studies``) is a valid stage config that runs
the objective it is named for, and its readout flags a collapse by reward, non-finite loss or held-out
accuracy."""

from __future__ import annotations

from pathlib import Path

import pytest

from ringzero.config.loader import load_config, read_yaml
from ringzero.pipeline.ablate import ArmRun, cast
from ringzero.pipeline.studies import MISMATCH, MISMATCH_ARMS, mismatch_readout

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "configs" / "tiny-cpu.yaml"


@pytest.mark.parametrize("arm", list(MISMATCH.arms))
def test_each_arm_loads_with_its_objective_and_no_early_stop(arm):
    study, _ = cast(MISMATCH, read_yaml(TINY.read_text(), str(TINY)))
    cfg = load_config(TINY, [*study.common, *study.arms[arm]])
    stage = cfg.stage("stage1")
    name, rollout = arm.split(" | ")
    assert (stage.precision.train.name(), stage.precision.rollout.name()) == ("fp32-islands", rollout)
    assert stage.steps == stage.min_steps == 10 and stage.prompts_per_step == 8
    assert stage.stop_when == [] and stage.reward_plateau_steps is None
    assert cfg.stage("base") == load_config(TINY).stage("base")  # the base stays make run's
    if name == "rollback":
        assert stage.rollback.remedy == "raise_precision" and stage.rollback.on[0].metric == "gap/ratio/max"
        assert stage.loss.kind == "sg_clip_is" and stage.loss.corrections == []
        return
    kind, corrections = MISMATCH_ARMS[name]
    assert stage.loss.kind == kind
    assert len(stage.loss.corrections) == len(corrections)
    for got, want in zip(stage.loss.corrections, corrections, strict=True):
        assert {k: got.model_dump()[k] for k in want} == want


def _run(records, accuracy=0.6, base=0.2):
    summaries = {"stage1": {"eval/accuracy": accuracy}, "base": {"eval/accuracy": base}}
    return ArmRun("a", 0, {"stage1": records}, summaries, {"stage1": 60.0})


def test_collapse_is_flagged_by_reward_loss_or_heldout_accuracy():
    steady = [{"step": i, "reward/mean": 0.5, "grad/coverage": 0.8} for i in range(10)]
    row = mismatch_readout(_run(steady))
    assert not row["collapsed"] and row["coverage"] == pytest.approx(0.8) and row["stage1_minutes"] == 1.0
    fell = [{"step": i, "reward/mean": 0.8 if i < 5 else 0.1} for i in range(10)]
    assert mismatch_readout(_run(fell))["collapsed"]
    assert mismatch_readout(_run(steady, accuracy=0.1))["collapsed"]
    nan = [*steady, {"step": 10, "reward/mean": 0.5, "loss/nonfinite": 1.0}]
    assert mismatch_readout(_run(nan))["collapsed"]
    masked = [{"step": 0, "reward/mean": 0.5, "grad/coverage": 0.5, "correction/token_masked_frac": 0.2}]
    assert mismatch_readout(_run(masked))["coverage"] == pytest.approx(0.4)


def test_an_arm_holds_only_when_no_seed_collapsed():
    ok = {"collapsed": 0.0, "accuracy": 0.6, "reward_last5": 0.5, "nonfinite": 0.0}
    bad = {**ok, "collapsed": 1.0}
    arm = "sg_clip_is | bf16"
    verdict = {v["claim"]: v["verdict"] for v in MISMATCH.verdicts({(arm, 0): ok, (arm, 1): ok}, [0, 1])}
    assert verdict[f"{arm}: no collapse"] == "held"
    verdict = {v["claim"]: v["verdict"] for v in MISMATCH.verdicts({(arm, 0): ok, (arm, 1): bad}, [0, 1])}
    assert verdict[f"{arm}: no collapse"] == "inconclusive"
