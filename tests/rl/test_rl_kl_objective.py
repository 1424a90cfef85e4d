"""k3 KL as a loss term, and the objective assembled from LossSettings."""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from ringzero.config.stages import LossSettings
from ringzero.rl.losses import Normalization, kl_k3_loss, ppo_clip_loss, sg_clip_is_loss
from ringzero.rl.objective import objective

CUR = torch.tensor([[-1.0, -2.0, -0.3]], dtype=torch.float64)
REF = torch.tensor([[-1.5, -1.0, -0.3]], dtype=torch.float64)
MASK = torch.ones(1, 3, dtype=torch.bool)


def test_k3_value_and_gradient_by_hand():
    cur = CUR.clone().requires_grad_(True)
    out = kl_k3_loss(cur, REF, MASK, Normalization("token_sum", 3.0))
    out.loss.backward()
    deltas = [(REF[0, t] - CUR[0, t]).item() for t in range(3)]
    expected = sum(math.exp(d) - d - 1 for d in deltas) / 3.0
    assert out.loss.item() == pytest.approx(expected, abs=1e-12)
    assert out.metrics["kl/token_mean"] == pytest.approx(expected, abs=1e-12)
    torch.testing.assert_close(
        cur.grad[0],
        torch.tensor([(1 - math.exp(d)) / 3.0 for d in deltas], dtype=torch.float64),
        atol=1e-12,
        rtol=0,
    )
    assert cur.grad[0, 2].item() == 0.0  # identical to the reference: no pull


@given(st.lists(st.tuples(st.floats(-30, 0), st.floats(-30, 0)), min_size=1, max_size=20))
def test_k3_is_never_negative(pairs):
    cur = torch.tensor([[c for c, _ in pairs]], dtype=torch.float64)
    ref = torch.tensor([[r for _, r in pairs]], dtype=torch.float64)
    out = kl_k3_loss(cur, ref, torch.ones_like(cur, dtype=torch.bool), Normalization("sample_mean"))
    assert out.finite and out.loss.item() >= -1e-12


LOGP_ROLLOUT = torch.tensor([[-1.0, -1.2, -0.4], [-2.0, -0.1, -0.7]], dtype=torch.float64)
LOGP_TRAIN = LOGP_ROLLOUT + torch.tensor([[0.3, -0.4, 0.0], [0.1, 0.02, -0.6]], dtype=torch.float64)
LOGP_REF = LOGP_ROLLOUT - 0.25
ADV = torch.tensor([1.0, -0.5], dtype=torch.float64)
MASK2 = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)


@pytest.mark.parametrize(("kind", "loss"), [("sg_clip_is", sg_clip_is_loss), ("ppo_clip", ppo_clip_loss)])
def test_objective_is_policy_plus_coef_times_kl(kind, loss):
    settings = LossSettings(kind=kind, eps_high=0.28, kl_coef=0.1, normalization="sample_mean")
    norm = Normalization("sample_mean")
    lt = LOGP_TRAIN.clone().requires_grad_(True)
    out = objective(settings, lt, LOGP_ROLLOUT, ADV, MASK2, norm, logp_ref_NT=LOGP_REF)
    policy = loss(LOGP_TRAIN, LOGP_ROLLOUT, ADV, MASK2, norm, eps_high=0.28).loss.item()
    kl = kl_k3_loss(LOGP_TRAIN, LOGP_REF, MASK2, norm).loss.item()
    assert out.loss.item() == pytest.approx(policy + 0.1 * kl, abs=1e-12)
    assert out.metrics["loss/total"] == pytest.approx(policy + 0.1 * kl, abs=1e-12)
    assert out.metrics["loss/policy"] == pytest.approx(policy) and out.metrics["loss/kl"] == pytest.approx(kl)
    out.loss.backward()
    assert torch.isfinite(lt.grad).all()


def test_objective_without_kl_needs_no_reference_and_with_kl_demands_one():
    settings = LossSettings()
    out = objective(settings, LOGP_TRAIN, LOGP_ROLLOUT, ADV, MASK2, Normalization("token_sum", 6.0))
    assert "loss/kl" not in out.metrics and out.metrics["loss/total"] == out.metrics["loss/policy"]
    with pytest.raises(ValueError, match="reference"):
        objective(
            LossSettings(kl_coef=0.01), LOGP_TRAIN, LOGP_ROLLOUT, ADV, MASK2, Normalization("token_sum", 6.0)
        )


def test_objective_flags_a_non_finite_kl():
    ref = LOGP_REF.clone()
    ref[0, 0] = float("nan")
    out = objective(
        LossSettings(kl_coef=0.01),
        LOGP_TRAIN.clone().requires_grad_(True),
        LOGP_ROLLOUT,
        ADV,
        MASK2,
        Normalization("token_sum", 6.0),
        logp_ref_NT=ref,
    )
    assert not out.finite and not out.loss.requires_grad and math.isnan(out.metrics["loss/total"])
