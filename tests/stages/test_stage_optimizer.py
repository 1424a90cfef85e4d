"""The shared training optimizer: schedule, fp32 master weights under a bf16 body, resume state, skips."""

import math

import pytest
import torch
from stage_kit import MICRO_MODEL

from ringzero.config.stages import OptimSettings
from ringzero.engines.optimizer import MIN_LR_FRACTION, TrainOptimizer, lr_at
from ringzero.model.config import ModelConfig, PrecisionPolicy
from ringzero.model.hybrid import HybridLM


def model(body="fp32", seed=0):
    torch.manual_seed(seed)
    return HybridLM(ModelConfig.model_validate(MICRO_MODEL), PrecisionPolicy.preset(body))


def loss_of(m, seed=0):
    ids = torch.randint(3, 64, (2, 12), generator=torch.Generator().manual_seed(seed))
    return m(ids).float().logsumexp(-1).mean()


def test_schedule_warms_up_linearly_then_decays_by_cosine_to_the_floor():
    lrs = [lr_at(s, 1.0, 4, 20, "cosine") for s in range(25)]
    assert lrs[:4] == [0.25, 0.5, 0.75, 1.0]
    assert all(a >= b for a, b in zip(lrs[4:], lrs[5:], strict=False))
    assert lrs[12] == pytest.approx(MIN_LR_FRACTION + (1 - MIN_LR_FRACTION) * 0.5)  # half way down
    assert lrs[20] == lrs[24] == pytest.approx(MIN_LR_FRACTION)
    assert [lr_at(s, 2.0, 2, 20, "constant") for s in (0, 1, 2, 19)] == [1.0, 2.0, 2.0, 2.0]


def test_bf16_body_trains_fp32_masters_and_keeps_updates_bf16_would_round_away():
    m = model("fp32-islands")
    opt = TrainOptimizer(m, OptimSettings(lr=1e-5, warmup_steps=0), total_steps=10, schedule="constant")
    assert opt.needs_master and all(p.dtype == torch.float32 for p in opt.master)
    before = {k: v.float().clone() for k, v in opt.master_state_dict().items()}
    for _ in range(3):
        loss_of(m).backward()
        assert not opt.step().skipped
    after = opt.master_state_dict()
    moved = [k for k in before if not torch.equal(before[k], after[k])]
    assert moved, "the fp32 masters must move"
    # Adam steps of ~lr = 1e-5 are far below bf16's resolution near 1 (2^-8): a norm gain equal to 1.0
    # stays exactly 1.0 in the bf16 model, while its master has moved.
    gain = "layers.0.input_layernorm.weight"
    assert torch.all(m.state_dict()[gain] == 1.0) and not torch.equal(after[gain], before[gain])
    assert all(p.dtype == torch.bfloat16 for p in m.parameters())


def test_fp32_model_is_its_own_master():
    m = model()
    opt = TrainOptimizer(m, OptimSettings(), total_steps=1)
    assert not opt.needs_master and opt.master[0] is next(m.parameters())


@pytest.mark.parametrize("body", ["fp32", "fp32-islands"])
def test_state_round_trip_continues_exactly(body):
    settings = OptimSettings(lr=1e-3, warmup_steps=2, weight_decay=0.1)
    a = model(body)
    opt_a = TrainOptimizer(a, settings, total_steps=10)
    for s in range(3):
        loss_of(a, s).backward()
        opt_a.step()
    tensors, meta = opt_a.state()
    b = model(body, seed=1)  # different weights: the state must restore them (masters) or the caller does
    b.load_state_dict(a.state_dict())
    opt_b = TrainOptimizer(b, settings, total_steps=10)
    opt_b.load_state(tensors, meta)
    assert opt_b.steps_taken == 3
    for opt, m in ((opt_a, a), (opt_b, b)):
        loss_of(m, 9).backward()
        opt.step()
    sa, sb = opt_a.master_state_dict(), opt_b.master_state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)


def test_non_finite_gradient_never_reaches_weights_or_moments():
    m = model()
    opt = TrainOptimizer(m, OptimSettings(lr=1e-2), total_steps=10)
    loss_of(m).backward()
    opt.step()
    weights = {k: v.clone() for k, v in m.state_dict().items()}
    moments, _ = opt.state()
    loss_of(m).backward()
    next(m.parameters()).grad[0, 0] = math.inf
    report = opt.step()
    assert report.skipped and not math.isfinite(report.grad_norm) and opt.skipped == 1
    assert all(torch.equal(weights[k], v) for k, v in m.state_dict().items())
    after, _ = opt.state()
    assert all(torch.equal(moments[k], after[k]) for k in moments)
    assert all(p.grad is None for p in m.parameters())
