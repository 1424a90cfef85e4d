"""Every arm of bench/mismatch_ablation.py (``ringzero.pipeline.ablation``) is a valid stage config that runs
the objective it is named for."""

from __future__ import annotations

from pathlib import Path

import pytest

from ringzero.config.loader import load_config
from ringzero.pipeline import ablation

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("arm", [*ablation.MISMATCH_ARMS, ablation.ROLLBACK_ARM])
def test_each_arm_loads_with_its_objective_and_no_early_stop(arm):
    cfg = load_config(
        ROOT / "configs" / "tiny-cpu.yaml",
        ablation.arm_overrides("stage1", arm, "bf16", steps=7, prompts=4, limit=0.02),
    )
    stage = cfg.stage("stage1")
    assert (cfg.precision.train.name(), cfg.precision.rollout.name()) == ("fp32-islands", "bf16")
    assert stage.steps == stage.min_steps == 7 and stage.prompts_per_step == 4
    assert stage.stop_when == [] and stage.gate == [] and stage.reward_plateau_steps is None
    if arm == ablation.ROLLBACK_ARM:
        assert stage.rollback.remedy == "raise_precision" and stage.rollback.on[0].metric == "gap/ratio/max"
        assert stage.loss.kind == "sg_clip_is" and stage.loss.corrections == []
        return
    kind, corrections = ablation.MISMATCH_ARMS[arm]
    assert stage.loss.kind == kind
    assert len(stage.loss.corrections) == len(corrections)
    for got, want in zip(stage.loss.corrections, corrections, strict=True):
        assert {k: got.model_dump()[k] for k in want} == want


def test_collapse_is_flagged_by_reward_loss_or_heldout_accuracy():
    steady = [{"step": i, "reward/mean": 0.5, "grad/coverage": 0.8} for i in range(10)]
    row = ablation.measure(steady, {"eval/accuracy": 0.6}, base_accuracy=0.2)
    assert not row["collapsed"] and row["coverage"] == pytest.approx(0.8)
    fell = [{"step": i, "reward/mean": 0.8 if i < 5 else 0.1} for i in range(10)]
    assert ablation.measure(fell, {"eval/accuracy": 0.6}, base_accuracy=0.2)["collapsed"]
    assert ablation.measure(steady, {"eval/accuracy": 0.1}, base_accuracy=0.2)["collapsed"]
    nan = [*steady, {"step": 10, "reward/mean": 0.5, "loss/nonfinite": 1.0}]
    assert ablation.measure(nan, {"eval/accuracy": 0.6}, base_accuracy=0.2)["collapsed"]
    masked = [{"step": 0, "reward/mean": 0.5, "grad/coverage": 0.5, "correction/token_masked_frac": 0.2}]
    assert ablation.measure(masked, {"eval/accuracy": 0.6}, 0.2)["coverage"] == pytest.approx(0.4)
