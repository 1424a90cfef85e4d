"""Mismatch metrics on the raw ratio, against values worked out by hand."""

import math

import numpy as np
import pytest
import torch

from ringzero.metrics import MemoryMetricWriter
from ringzero.rl.mismatch_metrics import KEYS, mismatch_metrics

LN2 = math.log(2)


def batch():
    """Two responses: A has r = 0.5 then 2 (w = 1), B has r = 0.5 (w = 0.5), then a token whose training
    log-prob is -inf (left out) and padding with values that must not count."""
    rollout = torch.log(torch.tensor([[0.5, 0.25, 0.9], [0.5, 0.5, 0.3]], dtype=torch.float64))
    train = torch.log(torch.tensor([[0.25, 0.5, 0.01], [0.25, 0.0, 0.9]], dtype=torch.float64))
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]], dtype=torch.bool)
    return train, rollout, mask


def test_values_by_hand():
    out = mismatch_metrics(*batch())
    # log r over the kept tokens: -ln2, +ln2, -ln2
    assert out["mismatch/kl_k1"] == pytest.approx(LN2 / 3)
    # r - 1 - log r: (ln2 - 0.5) + (1 - ln2) + (ln2 - 0.5) = ln2
    assert out["mismatch/kl_k3"] == pytest.approx(LN2 / 3)
    assert out["mismatch/chi2_token"] == pytest.approx((0.25 + 1 + 0.25) / 3)
    assert out["mismatch/chi2_seq"] == pytest.approx((0.0 + 0.25) / 2)  # w = 1 and 0.5
    assert out["mismatch/log_ppl_diff"] == pytest.approx((0.0 - LN2) / 2)  # per-sequence mean log r: 0, -ln2
    assert out["mismatch/ess_seq"] == pytest.approx(1.5**2 / (2 * (1 + 0.25)))  # 0.9
    assert out["mismatch/prob_corr"] == pytest.approx(
        -1.0
    )  # p_train (.25, .5, .25) vs p_rollout (.5, .25, .5)
    assert set(out) == {f"mismatch/{k}" for k in KEYS}


def test_identical_engines():
    _, rollout, mask = batch()
    out = mismatch_metrics(rollout.clone(), rollout, mask, prefix="gap/mismatch")
    assert {
        k: out[f"gap/mismatch/{k}"] for k in ("kl_k1", "kl_k3", "chi2_token", "chi2_seq", "log_ppl_diff")
    } == {"kl_k1": 0.0, "kl_k3": 0.0, "chi2_token": 0.0, "chi2_seq": 0.0, "log_ppl_diff": 0.0}
    assert out["gap/mismatch/ess_seq"] == pytest.approx(1.0)
    assert out["gap/mismatch/prob_corr"] == pytest.approx(1.0)


def test_correlation_and_k1_against_numpy():
    gen = torch.Generator().manual_seed(0)
    rollout = torch.rand(4, 9, generator=gen, dtype=torch.float64).clamp(min=1e-3).log()
    train = rollout + 0.2 * torch.randn(4, 9, generator=gen, dtype=torch.float64)
    mask = torch.rand(4, 9, generator=gen) < 0.7
    out = mismatch_metrics(train, rollout, mask)
    m = mask.numpy()
    pt, pr = np.exp(train.numpy()[m]), np.exp(rollout.numpy()[m])
    assert out["mismatch/prob_corr"] == pytest.approx(np.corrcoef(pt, pr)[0, 1], rel=1e-12)
    assert out["mismatch/kl_k1"] == pytest.approx(np.mean(np.log(pr) - np.log(pt)), rel=1e-12)


def test_sequence_weights_that_overflow():
    """w = e^1000 overflows float64: chi-square says so (inf), the ESS stays exact (about 1/N)."""
    log_r = torch.zeros(2, 100, dtype=torch.float64)
    log_r[0] = 10.0
    out = mismatch_metrics(log_r, torch.zeros_like(log_r), torch.ones(2, 100, dtype=torch.bool))
    assert out["mismatch/chi2_seq"] == math.inf
    assert out["mismatch/ess_seq"] == pytest.approx(0.5)
    assert out["mismatch/log_ppl_diff"] == pytest.approx(5.0)


def test_empty_mask_and_rows_without_tokens():
    train, rollout, mask = batch()
    assert all(math.isnan(v) for v in mismatch_metrics(train, rollout, torch.zeros_like(mask)).values())
    mask[1] = False  # B has no token: it carries no weight, the sequence means are over A alone
    out = mismatch_metrics(train, rollout, mask)
    assert out["mismatch/chi2_seq"] == 0.0 and out["mismatch/ess_seq"] == pytest.approx(1.0)
    assert out["mismatch/log_ppl_diff"] == pytest.approx(0.0)


def test_keys_are_accepted_by_the_metric_writer():
    record = MemoryMetricWriter().log(0, mismatch_metrics(*batch()))
    assert "mismatch/kl_k3" in record
