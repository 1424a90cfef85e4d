"""Policy losses against hand-computed values, gradients included (autograd vs the formula)."""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from ringzero.rl.losses import Normalization, ppo_clip_loss, sg_clip_is_loss

EPS = 0.2
# Ratios chosen away from the clip edges: r in {e^0.5, e^-1, e^0.1, e^-0.05}; the last column is padding.
LOGP_ROLLOUT = torch.tensor([[-1.0, -1.0, -2.0, 9.9], [-0.5, -3.0, -1.0, 9.9]], dtype=torch.float64)
LOG_R = torch.tensor([[0.5, -1.0, 0.1, 0.0], [-1.0, 0.5, -0.05, 0.0]], dtype=torch.float64)
MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 0]], dtype=torch.bool)
ADV = torch.tensor([1.5, -2.0], dtype=torch.float64)
D = 8.0


def logp_train():
    return (LOGP_ROLLOUT + LOG_R).clone().requires_grad_(True)


def test_sg_clip_is_value_and_gradient_by_hand():
    lt = logp_train()
    out = sg_clip_is_loss(lt, LOGP_ROLLOUT, ADV, MASK, Normalization("token_sum", D), eps_high=EPS)
    out.loss.backward()
    expected_loss, expected_grad = 0.0, torch.zeros_like(lt)
    for i in range(2):
        for t in range(3):
            w = min(math.exp(LOG_R[i, t]), 1 + EPS)
            expected_loss += -w * ADV[i].item() * lt[i, t].item() / D
            expected_grad[i, t] = -w * ADV[i].item() / D
    assert out.loss.item() == pytest.approx(expected_loss, abs=1e-12)
    torch.testing.assert_close(lt.grad, expected_grad, atol=1e-12, rtol=0)
    assert out.finite and out.metrics["loss/policy"] == pytest.approx(expected_loss, abs=1e-12)


def test_sg_clip_is_keeps_a_gradient_on_every_token_ppo_clip_does_not():
    norm = Normalization("token_sum", D)
    lt_sg, lt_ppo = logp_train(), logp_train()
    sg = sg_clip_is_loss(lt_sg, LOGP_ROLLOUT, ADV, MASK, norm, eps_high=EPS)
    ppo = ppo_clip_loss(lt_ppo, LOGP_ROLLOUT, ADV, MASK, norm, eps_high=EPS)
    sg.loss.backward()
    ppo.loss.backward()
    assert (lt_sg.grad[MASK] != 0).all()
    # PPO: A > 0 with r = e^0.5 > 1.2 (row 0, t=0) and A < 0 with r = e^-1 < 0.8 (row 1, t=0) are flat.
    ppo_zero = torch.tensor([[True, False, False], [True, False, False]])
    assert (lt_ppo.grad[:, :3][ppo_zero] == 0).all() and (lt_ppo.grad[:, :3][~ppo_zero] != 0).all()
    assert (lt_sg.grad[~MASK] == 0).all() and (lt_ppo.grad[~MASK] == 0).all()
    # The coverage metrics say exactly what autograd did, and what PPO would have kept.
    assert sg.metrics["grad/coverage"] == 1.0
    assert ppo.metrics["grad/coverage"] == pytest.approx(4 / 6)
    assert sg.metrics["grad/ppo_coverage"] == ppo.metrics["grad/ppo_coverage"] == pytest.approx(4 / 6)
    assert sg.metrics["clip/high_frac"] == pytest.approx(2 / 6)  # e^0.5 twice


def test_ppo_clip_value_and_gradient_by_hand():
    lt = logp_train()
    out = ppo_clip_loss(lt, LOGP_ROLLOUT, ADV, MASK, Normalization("token_sum", D), eps_high=EPS)
    out.loss.backward()
    expected_loss, expected_grad = 0.0, torch.zeros_like(lt)
    for i in range(2):
        a = ADV[i].item()
        for t in range(3):
            r = math.exp(LOG_R[i, t])
            unclipped, clipped = r * a, min(max(r, 1 - EPS), 1 + EPS) * a
            expected_loss += -min(unclipped, clipped) / D
            expected_grad[i, t] = -r * a / D if unclipped <= clipped else 0.0  # d(r)/d(logp) = r
    assert out.loss.item() == pytest.approx(expected_loss, abs=1e-12)
    torch.testing.assert_close(lt.grad, expected_grad, atol=1e-12, rtol=0)


def test_ppo_clip_eps_low_defaults_to_symmetric_and_can_differ():
    norm = Normalization("token_sum", D)
    sym = ppo_clip_loss(logp_train(), LOGP_ROLLOUT, ADV, MASK, norm, eps_high=EPS)
    wide = ppo_clip_loss(logp_train(), LOGP_ROLLOUT, ADV, MASK, norm, eps_high=EPS, eps_low=0.7)
    assert sym.metrics["clip/low_frac"] == pytest.approx(2 / 6)  # e^-1 = 0.37 < 0.8, twice
    assert wide.metrics["clip/low_frac"] == 0.0  # nothing below 0.3
    assert wide.metrics["grad/coverage"] == pytest.approx(5 / 6)


def test_sg_clip_is_eps_low_raises_low_weights_and_zeroes_nothing():
    lt = logp_train()
    out = sg_clip_is_loss(
        lt, LOGP_ROLLOUT, ADV, MASK, Normalization("token_sum", D), eps_high=EPS, eps_low=0.5
    )
    out.loss.backward()
    # r = e^-1 = 0.37 sits below 1 - 0.5: its weight is 0.5, not 0.37.
    assert lt.grad[0, 1].item() == pytest.approx(-0.5 * 1.5 / D)
    assert lt.grad[1, 0].item() == pytest.approx(-0.5 * -2.0 / D)
    assert out.metrics["grad/coverage"] == 1.0 and out.metrics["clip/low_frac"] == pytest.approx(2 / 6)


def test_zero_advantages_give_no_gradient_and_say_so():
    lt = logp_train()
    out = sg_clip_is_loss(
        lt,
        LOGP_ROLLOUT,
        torch.zeros(2, dtype=torch.float64),
        MASK,
        Normalization("sample_mean"),
        eps_high=EPS,
    )
    out.loss.backward()
    assert (lt.grad == 0).all()
    assert out.metrics["grad/coverage"] == 0.0 and out.metrics["grad/adv_nonzero"] == 0.0


def test_extreme_ratios_stay_finite():
    lt = torch.tensor([[0.0, -50.0]], dtype=torch.float32, requires_grad=True)
    rollout = torch.tensor([[-200.0, 0.0]])  # log r = +200 (clamped) and -50
    mask = torch.ones(1, 2, dtype=torch.bool)
    for loss in (sg_clip_is_loss, ppo_clip_loss):
        out = loss(lt, rollout, torch.tensor([-1.0]), mask, Normalization("token_sum", 2.0), eps_high=EPS)
        assert out.finite and math.isfinite(out.loss.item())


@pytest.mark.parametrize("loss", [sg_clip_is_loss, ppo_clip_loss])
def test_padding_may_hold_nan(loss):
    clean = loss(logp_train(), LOGP_ROLLOUT, ADV, MASK, Normalization("token_sum", D), eps_high=EPS)
    lt, lr = logp_train().detach().clone(), LOGP_ROLLOUT.clone()
    lt[:, 3], lr[:, 3] = float("nan"), float("-inf")
    lt.requires_grad_(True)
    dirty = loss(lt, lr, ADV, MASK, Normalization("token_sum", D), eps_high=EPS)
    dirty.loss.backward()
    assert dirty.finite and dirty.loss.item() == pytest.approx(clean.loss.item(), abs=1e-12)
    assert torch.isfinite(lt.grad).all()


@pytest.mark.parametrize("loss", [sg_clip_is_loss, ppo_clip_loss])
def test_non_finite_inside_the_mask_is_flagged_and_cannot_be_backpropagated(loss):
    lt = logp_train().detach().clone()
    lt[0, 1] = float("nan")
    lt.requires_grad_(True)
    out = loss(lt, LOGP_ROLLOUT, ADV, MASK, Normalization("token_sum", D), eps_high=EPS)
    assert not out.finite and out.metrics["loss/nonfinite"] == 1.0
    assert out.loss.item() == 0.0 and not out.loss.requires_grad
    with pytest.raises(RuntimeError):
        out.loss.backward()


def test_shapes_are_checked():
    lt = logp_train()
    norm = Normalization("sample_mean")
    with pytest.raises(ValueError, match="advantages"):
        sg_clip_is_loss(lt, LOGP_ROLLOUT, torch.ones(3), MASK, norm, eps_high=EPS)
    with pytest.raises(ValueError, match="mask"):
        sg_clip_is_loss(lt, LOGP_ROLLOUT, ADV, MASK[:, :2], norm, eps_high=EPS)
    with pytest.raises(ValueError, match=r"\[N, T\]"):
        ppo_clip_loss(lt[0], LOGP_ROLLOUT[0], ADV, MASK[0], norm, eps_high=EPS)


@given(
    log_r=st.lists(
        st.floats(-3, 3).filter(lambda x: abs(math.exp(x) - 1.2) > 1e-6 and abs(math.exp(x) - 0.8) > 1e-6),
        min_size=1,
        max_size=12,
    ),
    adv=st.floats(0.01, 3) | st.floats(-3, -0.01),
)
def test_gradient_support_of_both_losses(log_r, adv):
    rollout = torch.full((1, len(log_r)), -1.0, dtype=torch.float64)
    ratio_log = torch.tensor([log_r], dtype=torch.float64)
    mask = torch.ones_like(rollout, dtype=torch.bool)
    grads = {}
    for loss in (sg_clip_is_loss, ppo_clip_loss):
        lt = (rollout + ratio_log).requires_grad_(True)
        out = loss(
            lt,
            rollout,
            torch.tensor([adv], dtype=torch.float64),
            mask,
            Normalization("sample_mean"),
            eps_high=EPS,
        )
        out.loss.backward()
        grads[loss] = lt.grad[0]
        assert out.metrics["grad/coverage"] == pytest.approx(float((lt.grad != 0).double().mean()))
    r = ratio_log[0].exp()
    outside = (r > 1 + EPS) if adv > 0 else (r < 1 - EPS)
    assert (grads[sg_clip_is_loss] != 0).all()
    assert ((grads[ppo_clip_loss] == 0) == outside).all()


def test_bf16_log_probs_get_an_fp32_ratio():
    lt = torch.tensor([[-1.0, -2.0]], dtype=torch.bfloat16, requires_grad=True)
    rollout = torch.tensor([[-1.0078125, -2.0]], dtype=torch.bfloat16)  # a gap bf16 can hold exactly
    out = sg_clip_is_loss(
        lt,
        rollout,
        torch.tensor([1.0]),
        torch.ones(1, 2, dtype=torch.bool),
        Normalization("token_sum", 2.0),
        eps_high=EPS,
    )
    out.loss.backward()
    assert lt.grad.dtype == torch.bfloat16
    # token 0: w = e^0.0078125 computed in fp32, then the grad -w/2 rounds once to bf16 (exactly that value).
    w = math.exp(0.0078125)
    assert lt.grad[0, 0].item() == torch.tensor(-w / 2, dtype=torch.float32).to(torch.bfloat16).item()
    assert out.loss.dtype == torch.float32
    # The loss keeps w in fp32: (w * 1 + 1 * 2) / 2. A ratio taken in bf16 rounds w to 1.0078125, 1.5e-5
    # relative below, which the bf16 grad above cannot show (both round to the same bf16 number).
    assert out.loss.item() == pytest.approx((w + 2.0) / 2, rel=1e-6)
    assert out.loss.item() != pytest.approx((1.0078125 + 2.0) / 2, rel=1e-6)
