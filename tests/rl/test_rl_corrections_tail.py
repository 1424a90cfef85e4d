"""The corrections on tail inputs, against weights and decisions worked by hand: per-token log-ratios of
+-25 and +-1e4, and non-finite rollout or training log-probs.

A response's sequence ratio is the sum (or mean) of its raw per-token log r, bounded only as a total; a
clamp of each token before the sum gets every case below wrong, which the last test checks by putting one
back."""

from __future__ import annotations

import math
from unittest import mock

import pytest
import torch

from ringzero.config.corrections import (
    IcePopCorrection,
    MaskedISCorrection,
    SeqISCorrection,
    TISCorrection,
    VetoCorrection,
)
from ringzero.config.stages import LossSettings
from ringzero.rl.advantage import group_advantages
from ringzero.rl.corrections import base as corrections_base
from ringzero.rl.corrections.compose import NONFINITE_RULE, apply_corrections
from ringzero.rl.losses import Normalization
from ringzero.rl.objective import objective

E20 = math.exp(20.0)


def _batch(log_r_rows: list[list[float]], dtype=torch.float64):
    """Rows of per-token log r (ragged: each row padded with NaN to the longest), as a trainer/rollout pair:
    the trainer's log-probs are a fixed -1.0 and the rollout's are -1.0 - log r."""
    width = max(len(r) for r in log_r_rows)
    mask = torch.tensor([[j < len(r) for j in range(width)] for r in log_r_rows])
    log_r = torch.tensor([r + [math.nan] * (width - len(r)) for r in log_r_rows], dtype=torch.float64)
    logp_old = torch.where(mask, torch.full_like(log_r, -1.0), torch.full_like(log_r, math.nan))
    return logp_old.to(dtype), (logp_old - log_r).to(dtype), mask


def _apply(settings, log_r_rows, dtype=torch.float64):
    logp_old, logp_rollout, mask = _batch(log_r_rows, dtype)
    return apply_corrections(list(settings), logp_old, logp_rollout, mask)


def _row_weight(out, row: int) -> float:
    w = out.weight_NT[row][out.keep_NT[row]]
    assert torch.all(w == w[0]), f"a sequence weight differs within row {row}: {w.tolist()}"
    return float(w[0])


# --- seq_is: the product of the raw ratios, then the bound and the cap ---------------------------------


def test_seq_is_product_of_a_plus_25_and_a_minus_24_is_e_then_the_cap():
    rows = [[25.0, -24.0], [0.1, 0.2, -0.05]]
    capped = _apply([SeqISCorrection(cap=2.0)], rows)
    assert _row_weight(capped, 0) == pytest.approx(2.0)  # min(e^1, 2)
    assert _row_weight(capped, 1) == pytest.approx(math.exp(0.25))
    assert capped.metrics["correction/seq_is/clipped_frac"] == pytest.approx(0.5)
    wide = _apply([SeqISCorrection(cap=5.0)], rows)
    assert _row_weight(wide, 0) == pytest.approx(math.e, rel=1e-12)  # e^1, under the cap


def test_seq_is_plus_and_minus_1e4_cancel_before_the_bound():
    out = _apply([SeqISCorrection(cap=2.0)], [[1e4, -1e4 + 0.5], [1e4, 1.0], [-1e4, 3.0]])
    assert _row_weight(out, 0) == pytest.approx(math.exp(0.5), rel=1e-12)
    assert _row_weight(out, 1) == pytest.approx(2.0)  # e^10001, bounded at e^20, capped at 2
    assert _row_weight(out, 2) == pytest.approx(math.exp(-20.0), rel=1e-12)  # the lower bound, as the peers'
    assert out.metrics["correction/seq_is/clipped_frac"] == pytest.approx(1 / 3)


def test_seq_is_geometric_mean_of_the_raw_ratios():
    out = _apply([SeqISCorrection(cap=2.0, form="geometric")], [[25.0, -24.0, 0.0, 0.0], [-25.0, -25.0]])
    assert _row_weight(out, 0) == pytest.approx(math.exp(0.25), rel=1e-12)
    assert _row_weight(out, 1) == pytest.approx(math.exp(-20.0), rel=1e-12)  # mean -25, bounded at -20


def test_seq_is_in_float32_inputs_sums_in_float64():
    # 1e4 and -(1e4 - 0.5) are exact in float32; so is their float64 sum, 0.5. The weight comes back in the
    # inputs' precision.
    out = _apply([SeqISCorrection(cap=2.0)], [[1e4, -1e4 + 0.5]], dtype=torch.float32)
    assert out.weight_NT.dtype == torch.float32
    assert _row_weight(out, 0) == pytest.approx(math.exp(0.5), rel=1e-6)


# --- masked_is at sequence level: the decision on the raw total ------------------------------------------


def _one_bad_token_of_200(value: float) -> list[float]:
    return [value] + [0.0] * 199


@pytest.mark.parametrize("form", ["product", "geometric"])
def test_masked_is_rejects_a_response_with_one_token_the_engine_put_at_minus_1e4(form):
    # trainer log-prob -1, rollout -1e4 on one token of 200: log r = 9999, mean 49.995, far above log 2
    rows = [_one_bad_token_of_200(9999.0), [0.1] * 200]
    out = _apply([MaskedISCorrection(lower=0.5, upper=2.0, level="sequence", form=form)], rows)
    assert out.keep_N.tolist() == [False, form == "geometric"]  # the product of 200 x e^0.1 is e^20 > 2
    assert not out.keep_NT[0].any()


@pytest.mark.parametrize(
    ("row", "kept"),
    [
        ([25.0, -24.0], False),  # product e^1 > 2
        ([25.0, -24.5], True),  # product e^0.5 in [0.5, 2]
        ([-1e4, 1e4 - 0.3], True),  # e^-0.3 = 0.74
        ([-25.0] + [0.0] * 9, False),  # product e^-25 < 0.5
    ],
)
def test_masked_is_sequence_product_decisions_on_tail_tokens(row, kept):
    out = _apply([MaskedISCorrection(lower=0.5, upper=2.0, level="sequence")], [row])
    assert out.keep_N.tolist() == [kept]


def test_masked_is_geometric_mean_decisions_on_tail_tokens():
    bounds = {"lower": 0.5, "upper": 2.0, "level": "sequence", "form": "geometric"}
    rows = [
        [25.0] + [0.0] * 49,  # mean 0.5: e^0.5 = 1.65, kept
        [25.0] + [0.0] * 24,  # mean 1.0: e > 2, dropped
        [-25.0] + [0.0] * 49,  # mean -0.5: 0.61, kept
        [-1e4] + [0.0] * 199,
    ]  # mean -50, dropped
    out = _apply([MaskedISCorrection(**bounds)], rows)
    assert out.keep_N.tolist() == [True, False, True, False]


# --- the token-level pieces are unchanged on the same tails ------------------------------------------------


def test_token_level_corrections_keep_their_results_on_tail_tokens():
    rows = [[25.0, -25.0, 1e4, -1e4, 0.3]]
    r = [math.exp(25.0), math.exp(-25.0), math.inf, 0.0, math.exp(0.3)]
    tis = _apply([TISCorrection(cap=2.0)], rows)
    assert tis.weight_NT[0].tolist() == pytest.approx([2.0, r[1], 2.0, 0.0, r[4]], rel=1e-12, abs=0)
    assert tis.metrics["correction/tis/clipped_frac"] == pytest.approx(2 / 5)
    ice = _apply([IcePopCorrection()], rows)
    assert ice.keep_NT[0].tolist() == [False, False, False, False, True]
    assert float(ice.weight_NT[0, 4]) == pytest.approx(r[4])
    tok = _apply([MaskedISCorrection(lower=0.5, upper=2.0)], rows)
    assert tok.keep_NT[0].tolist() == [False, False, False, False, True]
    veto = _apply([VetoCorrection(floor=1e-4)], rows)
    assert veto.keep_N.tolist() == [False]
    assert _apply([VetoCorrection(floor=1e-4)], [[25.0, 1e4, 0.3]]).keep_N.tolist() == [True]


# --- non-finite log-probs: the named rule drops the response ------------------------------------------------

NONFINITE = [
    ("rollout -inf (SGLang's null)", {"rollout": -math.inf}),
    ("rollout +inf", {"rollout": math.inf}),
    ("rollout NaN", {"rollout": math.nan}),
    ("trainer -inf", {"old": -math.inf}),
]
EVERY_CORRECTION = [
    [TISCorrection(cap=2.0)],
    [SeqISCorrection(cap=2.0)],
    [SeqISCorrection(cap=2.0, form="geometric")],
    [MaskedISCorrection(lower=0.5, upper=2.0)],
    [MaskedISCorrection(lower=0.5, upper=2.0, level="sequence", form="geometric")],
    [IcePopCorrection()],
    [VetoCorrection()],
]


@pytest.mark.parametrize(
    "settings",
    EVERY_CORRECTION,
    ids=lambda s: s[0].kind + getattr(s[0], "level", "") + (getattr(s[0], "form", None) or ""),
)
@pytest.mark.parametrize(("case", "where"), NONFINITE, ids=[c for c, _ in NONFINITE])
def test_a_non_finite_log_prob_drops_its_response_under_every_correction(settings, case, where):
    assert NONFINITE_RULE == "drop_response"
    logp_old, logp_rollout, mask = _batch([[0.1, 0.2, -0.1], [0.05, 0.0, 0.1], [0.2, -0.2]])
    if "rollout" in where:
        logp_rollout[0, 1] = where["rollout"]
    else:
        logp_old[0, 1] = where["old"]
    out = apply_corrections(settings, logp_old, logp_rollout, mask)
    clean = apply_corrections(settings, *_batch([[0.05, 0.0, 0.1], [0.2, -0.2]]))
    assert out.keep_N.tolist() == [False, True, True], case
    assert not out.keep_NT[0].any() and torch.all(out.weight_NT[0] == 0)
    assert torch.isfinite(out.weight_NT).all()
    # the other responses get exactly what they get without the bad one
    assert torch.equal(out.weight_NT[1:], clean.weight_NT) and torch.equal(out.keep_NT[1:], clean.keep_NT)
    assert out.metrics["correction/nonfinite_tokens"] == 1.0
    assert out.metrics["correction/nonfinite_sequences"] == 1.0
    assert out.metrics["correction/sequences_dropped"] == 1.0
    kind = settings[0].kind
    assert out.metrics[f"correction/{kind}/weight_mean"] == pytest.approx(
        clean.metrics[f"correction/{kind}/weight_mean"]
    )


def test_finite_batches_report_no_non_finite_tokens():
    out = _apply([TISCorrection()], [[25.0, -1e4], [0.0]])
    assert out.metrics["correction/nonfinite_tokens"] == 0.0
    assert out.metrics["correction/nonfinite_sequences"] == 0.0


def test_a_dropped_non_finite_response_leaves_the_loss_finite_and_its_group_baseline():
    settings = LossSettings(normalization="sample_mean", corrections=[SeqISCorrection(cap=2.0)])
    logp_old, logp_rollout, mask = _batch([[0.1, 0.0], [0.0, -0.1], [0.2, 0.0], [0.0, 0.0]])
    logp_rollout[1, 0] = -math.inf
    corr = apply_corrections(settings.corrections, logp_old, logp_rollout, mask)
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0])
    adv = group_advantages(rewards, 2, keep_N=corr.keep_N)
    assert adv[:2].tolist() == [0.0, 0.0]  # the group's one kept member is its own baseline
    logp_train = logp_old.nan_to_num(0.0).float().requires_grad_(True)
    out = objective(
        settings,
        logp_train,
        logp_rollout.float(),
        adv,
        mask,
        Normalization("sample_mean"),
        correction=corr.rows(torch.arange(4)),
    )
    out.loss.backward()
    assert math.isfinite(out.metrics["loss/total"]) and out.metrics["loss/nonfinite"] == 0.0
    assert torch.isfinite(logp_train.grad).all() and torch.all(logp_train.grad[1] == 0)


# --- negative control: a per-token clamp put back gets the tails wrong
# ---------------------------------------


def _clamped_per_token(logp_old_NT, logp_rollout_NT, mask_NT):
    raw = torch.where(
        mask_NT, logp_old_NT.double() - logp_rollout_NT.double(), torch.zeros_like(logp_old_NT.double())
    )
    return raw.clamp(max=20.0)


def test_a_per_token_clamp_put_back_fails_these_cases():
    import ringzero.rl.corrections.compose as compose

    with mock.patch.object(compose, "raw_log_ratio", _clamped_per_token):
        assert _row_weight(_apply([SeqISCorrection(cap=2.0)], [[25.0, -24.0]]), 0) == pytest.approx(
            math.exp(-4.0)
        )
        geo = MaskedISCorrection(lower=0.5, upper=2.0, level="sequence", form="geometric")
        assert _apply([geo], [_one_bad_token_of_200(9999.0)]).keep_N.tolist() == [True]  # mean 0.1: kept
        logp_old, logp_rollout, mask = _batch([[0.1, 0.2]])
        logp_rollout[0, 0] = -math.inf
        assert apply_corrections(
            [SeqISCorrection(cap=2.0)], logp_old, logp_rollout, mask
        ).keep_N.tolist() == [True]
    assert corrections_base.raw_log_ratio is compose.raw_log_ratio  # the patch is gone again
