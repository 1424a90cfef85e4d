"""gap/*: the first minibatch's tail and mismatch (engines only), apart from the whole batch's (staleness
too)."""

import pytest
import torch
from stage_kit import rl_parts

from ringzero.rl.mismatch_metrics import KEYS


def test_deterministic_mode_has_no_engine_gap_while_staleness_shows_in_the_whole_batch():
    parts = rl_parts(deterministic=True, minibatches=2, lr=1e-2)
    batch = parts.step.generate(0)
    metrics = parts.trainer.train(batch, torch.linspace(-1, 1, len(batch)), seed=0)
    for key in (
        "gap/ratio/mean",
        "gap/ratio/p99",
        "gap/ratio/p99.9",
        "gap/ratio/max",
        "gap/logratio/max",
        "gap/drift/pos_0-63/p99",
        "gap/mismatch/kl_k3",
        "gap/mismatch/chi2_token",
        "gap/mismatch/chi2_seq",
    ):
        assert metrics[key] == 0.0, key  # same weights, same function, same numerics
    assert metrics["gap/mismatch/ess_seq"] == pytest.approx(1.0)
    assert metrics["gap/ratio/max"] == metrics["ratio/first_minibatch_max"]
    assert metrics["ratio/max"] > 0.0 and metrics["mismatch/chi2_token"] > 0.0  # the second minibatch moved


def test_one_minibatch_without_update_gap_equals_the_whole_batch():
    parts = rl_parts(deterministic=False, minibatches=1)
    batch = parts.step.generate(0)
    metrics = parts.trainer.train(batch, torch.zeros(len(batch)), seed=0)
    assert 0.0 <= metrics["gap/ratio/p99"] <= metrics["gap/ratio/max"] < 1e-3
    for stat in ("mean", "p50", "p90", "p99", "p99.9", "max"):
        assert metrics[f"gap/ratio/{stat}"] == pytest.approx(metrics[f"ratio/{stat}"], rel=1e-12, abs=1e-15)
    for key in KEYS:
        assert metrics[f"gap/mismatch/{key}"] == pytest.approx(
            metrics[f"mismatch/{key}"], rel=1e-9, abs=1e-15
        )
    assert metrics["gap/mismatch/prob_corr"] > 0.999


def test_a_step_reports_gap_and_mismatch():
    metrics = rl_parts().step.run(0)
    assert {
        "gap/ratio/p99",
        "gap/logratio/p99",
        "gap/ratio/above_clip_frac",
        "gap/ratio/nonfinite_frac",
        "gap/mismatch/kl_k3",
        "mismatch/kl_k3",
        "mismatch/ess_seq",
    } <= set(metrics)
