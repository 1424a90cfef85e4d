"""RL step mechanics on a micro model: where the ratio is exactly 1, where it moves, what never reaches
the weights, what every step reports, and that the rollout engine serves the updated weights."""

import math

import pytest
import torch
from stage_kit import rl_parts, state_equal

from ringzero.rl.advantage import group_advantages


def test_deterministic_mode_ratio_is_exactly_one_on_the_first_minibatch_then_moves():
    parts = rl_parts(deterministic=True, minibatches=2, lr=1e-2)
    batch = parts.step.generate(0)
    assert batch.mask_NT.any()
    # Force non-zero advantages so the first update certainly changes the weights.
    advantages = torch.linspace(-1, 1, len(batch))
    metrics = parts.trainer.train(batch, advantages, seed=0)
    assert metrics["ratio/first_minibatch_max"] == 0.0  # same weights, same function, same numerics
    assert metrics["ratio/max"] > 0.0  # the second minibatch is scored after the first update: staleness
    assert metrics["loss/skipped"] == 0


def test_without_deterministic_mode_the_engine_gap_shows_but_stays_small():
    parts = rl_parts(deterministic=False, minibatches=1)
    batch = parts.step.generate(0)
    metrics = parts.trainer.train(batch, torch.zeros(len(batch)), seed=0)
    # One minibatch and zero advantages: no update, so the ratio is the decode-vs-parallel gap alone.
    assert 0.0 <= metrics["ratio/first_minibatch_max"] < 1e-3
    assert metrics["ratio/max"] == pytest.approx(metrics["ratio/first_minibatch_max"])


def test_numerator_comes_from_the_training_model_not_the_engine():
    parts = rl_parts(deterministic=True, minibatches=1)
    batch = parts.step.generate(0)
    with torch.no_grad():
        parts.model.word_embeddings.weight.mul_(
            1.5
        )  # the trainer's weights drift away from what the engine sampled
    metrics = parts.trainer.train(batch, torch.zeros(len(batch)), seed=0)
    assert metrics["ratio/first_minibatch_max"] > 1e-3


@pytest.mark.parametrize("poison", ["advantages", "rollout_logprobs"])
def test_non_finite_loss_is_skipped_and_never_reaches_the_weights(poison):
    parts = rl_parts(minibatches=2)
    batch = parts.step.generate(0)
    advantages = group_advantages(batch.rewards_N, 4) + 1.0
    if poison == "advantages":
        advantages[:] = math.nan
    else:
        batch.logp_rollout_NT[batch.mask_NT] = math.nan
    before = {k: v.clone() for k, v in parts.model.state_dict().items()}
    metrics = parts.trainer.train(batch, advantages, seed=0)
    assert metrics["loss/skipped"] == 2
    assert state_equal(before, parts.model.state_dict())


def test_a_step_reports_every_metric_family_and_pushes_its_weights():
    parts = rl_parts(kl_coef=0.01, lr=1e-2)
    metrics = parts.step.run(0)
    for key in (
        "reward/mean",
        "reward/accuracy",
        "reward/zero_std_groups",
        "len/mean",
        "len/p95",
        "len/max",
        "len/trunc_rate",
        "trace/rate",
        "ratio/mean",
        "ratio/p50",
        "ratio/p90",
        "ratio/p99",
        "ratio/p99.9",
        "ratio/max",
        "logratio/p99",
        "ratio/above_clip_frac",
        "drift/pos_0-63/mean",
        "grad/coverage",
        "grad/ppo_coverage",
        "entropy/mean",
        "kl/mean",
        "kl/token_mean",
        "loss/policy",
        "loss/kl",
        "loss/skipped",
        "grad/norm",
        "optim/lr",
        "time/generate",
        "time/train",
        "time/sync",
        "time/step",
    ):
        assert key in metrics, key
    assert metrics["grad/coverage"] >= metrics["grad/ppo_coverage"]
    assert parts.engine.weight_version == "step-1"
    served = parts.engine.model.state_dict()
    assert state_equal(served, parts.optimizer.master_state_dict())  # fp32 rollout: an exact copy


def test_same_seed_same_step():
    a, b = rl_parts(seed=3), rl_parts(seed=3)
    ma, mb = a.step.run(0), b.step.run(0)
    assert a.step.last_batch.output_ids == b.step.last_batch.output_ids
    assert state_equal(a.model.state_dict(), b.model.state_dict())
    assert ma["loss/policy"] == mb["loss/policy"]
