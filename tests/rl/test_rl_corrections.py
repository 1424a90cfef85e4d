"""Mismatch corrections against values worked by hand on small tensors, their composition, their wiring into
the objective, and dropped responses staying out of the group baselines and the reward metrics."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from ringzero.config.corrections import (
    IcePopCorrection,
    MaskedISCorrection,
    SeqISCorrection,
    TISCorrection,
    VetoCorrection,
)
from ringzero.config.stages import LossSettings, OptimSettings
from ringzero.engines.optimizer import TrainOptimizer
from ringzero.model.config import ModelConfig, PrecisionPolicy
from ringzero.model.decode_check import random_weights_
from ringzero.model.hybrid import HybridLM
from ringzero.rl.advantage import group_advantages
from ringzero.rl.corrections.compose import apply_corrections
from ringzero.rl.losses import Normalization
from ringzero.rl.objective import objective
from ringzero.rl.rollout_batch import RolloutBatch
from ringzero.rl.tail_metrics import reward_summary
from ringzero.rl.trainer import PolicyTrainer

# Ratios r = old / rollout: three responses, the second one two tokens long (its third column is padding,
# whose NaN must never matter).
R = [[2.0, 0.6, 1.0], [4.0, 1.0, math.nan], [1e-5, 1.0, 1.0]]
MASK = torch.tensor([[True, True, True], [True, True, False], [True, True, True]])


def _apply(*settings):
    logp_old = torch.tensor(R, dtype=torch.float64).log()
    return apply_corrections(list(settings), logp_old, torch.zeros(3, 3, dtype=torch.float64), MASK)


def _weights(out):
    return out.weight_NT[MASK].tolist()


def test_tis_truncates_each_token_at_the_cap():
    out = _apply(TISCorrection(cap=3.0))
    assert _weights(out) == pytest.approx([2.0, 0.6, 1.0, 3.0, 1.0, 1e-5, 1.0, 1.0])
    assert out.keep_NT.tolist() == MASK.tolist()
    m = out.metrics
    assert m["correction/tis/clipped_frac"] == pytest.approx(1 / 8)  # only r = 4
    assert m["correction/tis/token_masked_frac"] == 0.0 and m["correction/tis/seq_masked_frac"] == 0.0
    assert m["correction/tis/weight_mean"] == pytest.approx((2 + 0.6 + 1 + 3 + 1 + 1e-5 + 1 + 1) / 8)
    assert m["correction/sequences_dropped"] == 0.0


def test_sequence_is_product_and_geometric_mean():
    prod = _apply(SeqISCorrection(cap=2.0))
    # products: 1.2, 4 -> 2 (truncated), 1e-5
    assert _weights(prod) == pytest.approx([1.2] * 3 + [2.0] * 2 + [1e-5] * 3)
    assert prod.metrics["correction/seq_is/clipped_frac"] == pytest.approx(1 / 3)
    geo = _apply(SeqISCorrection(cap=1.5, form="geometric"))
    # geometric means: 1.2^(1/3), 4^(1/2) = 2 -> 1.5 (truncated), 1e-5^(1/3)
    want = [1.2 ** (1 / 3)] * 3 + [1.5] * 2 + [1e-5 ** (1 / 3)] * 3
    assert _weights(geo) == pytest.approx(want)
    assert geo.metrics["correction/seq_is/clipped_frac"] == pytest.approx(1 / 3)
    assert geo.metrics["correction/seq_is/weight_mean"] == pytest.approx(sum(want) / 8)


def test_masked_is_drops_tokens_or_whole_sequences_outside_the_bounds():
    tok = _apply(MaskedISCorrection(lower=0.4, upper=3.0))
    assert tok.keep_NT.tolist() == [[True, True, True], [False, True, False], [False, True, True]]
    assert _weights(tok) == pytest.approx([1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0, 1.0])  # dropped tokens weigh 0
    assert tok.metrics["correction/masked_is/token_masked_frac"] == pytest.approx(2 / 8)
    assert tok.metrics["correction/masked_is/seq_masked_frac"] == 0.0
    assert tok.keep_N.tolist() == [True, True, True]

    seq = _apply(MaskedISCorrection(lower=0.4, upper=3.0, level="sequence"))  # products 1.2, 4, 1e-5
    assert seq.keep_N.tolist() == [True, False, False]
    assert seq.metrics["correction/masked_is/token_masked_frac"] == pytest.approx(5 / 8)
    assert seq.metrics["correction/masked_is/seq_masked_frac"] == pytest.approx(2 / 3)
    assert seq.metrics["correction/sequences_dropped"] == 2.0

    geo = _apply(
        MaskedISCorrection(lower=0.4, upper=3.0, level="sequence", form="geometric")
    )  # 1.06, 2, 0.02
    assert geo.keep_N.tolist() == [True, True, False]
    assert geo.metrics["correction/masked_is/weight_mean"] == 1.0


def test_icepop_masks_both_tails_and_weighs_the_kept_tokens_by_their_ratio():
    out = _apply(IcePopCorrection())  # 0.5 .. 5.0
    assert out.keep_NT.tolist() == [[True, True, True], [True, True, False], [False, True, True]]
    assert _weights(out) == pytest.approx([2.0, 0.6, 1.0, 4.0, 1.0, 0.0, 1.0, 1.0])
    assert out.metrics["correction/icepop/token_masked_frac"] == pytest.approx(1 / 8)
    assert out.metrics["correction/icepop/weight_mean"] == pytest.approx(10.6 / 7)
    high = _apply(IcePopCorrection(lower=0.5, upper=3.0))
    assert high.keep_NT[1].tolist() == [False, True, False]


def test_veto_drops_the_whole_sequence_of_a_token_below_the_floor():
    out = _apply(VetoCorrection(floor=1e-4))
    assert out.keep_N.tolist() == [True, True, False]
    assert out.keep_NT[2].tolist() == [False, False, False]
    assert out.metrics["correction/veto/token_masked_frac"] == pytest.approx(3 / 8)
    assert out.metrics["correction/veto/seq_masked_frac"] == pytest.approx(1 / 3)
    assert _apply(VetoCorrection(floor=1e-6)).keep_N.all()


def test_composition_multiplies_weights_ands_masks_and_reads_the_raw_ratio_in_any_order():
    a = _apply(TISCorrection(cap=3.0), IcePopCorrection(lower=0.5, upper=3.5), VetoCorrection())
    b = _apply(VetoCorrection(), IcePopCorrection(lower=0.5, upper=3.5), TISCorrection(cap=3.0))
    # tis x icepop: (2*2, .6*.6, 1); row 1: r = 4 is out of icepop's band; row 2 vetoed
    assert _weights(a) == pytest.approx([4.0, 0.36, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0])
    assert torch.equal(a.weight_NT, b.weight_NT) and torch.equal(a.keep_NT, b.keep_NT)
    assert a.keep_N.tolist() == [True, True, False]
    m = a.metrics
    assert m["correction/sequences_dropped"] == 1.0
    assert m["correction/token_masked_frac"] == pytest.approx(4 / 8)
    assert m["correction/weight_mean"] == pytest.approx((4 + 0.36 + 1 + 1) / 4)
    assert m["correction/tis/clipped_frac"] == pytest.approx(1 / 8)  # each reports on the raw ratio
    assert {k.split("/")[1] for k in m if k.count("/") == 2} == {"tis", "icepop", "veto"}


def test_settings_are_typed_and_validated():
    loss = LossSettings.model_validate(
        {
            "corrections": [
                {"kind": "tis", "cap": 2.0},
                {
                    "kind": "masked_is",
                    "level": "sequence",
                    "form": "geometric",
                    "lower": 0.999,
                    "upper": 1.001,
                },
                {"kind": "icepop"},
                {"kind": "veto", "floor": 1e-4},
            ]
        }
    )
    assert [c.kind for c in loss.corrections] == ["tis", "masked_is", "icepop", "veto"]
    assert (loss.corrections[2].lower, loss.corrections[2].upper) == (0.5, 5.0)
    for bad in (
        {"kind": "tis", "cap": 1.0},
        {"kind": "seq_is", "form": "mean"},
        {"kind": "masked_is", "lower": 1.2},
        {"kind": "icepop", "upper": 0.9},
        {"kind": "masked_is", "form": "geometric"},
        {"kind": "veto", "floor": 1.0},
        {"kind": "nope"},
    ):
        with pytest.raises(ValidationError):
            LossSettings.model_validate({"corrections": [bad]})
    with pytest.raises(ValidationError, match="listed once"):
        LossSettings.model_validate({"corrections": [{"kind": "tis"}, {"kind": "tis", "cap": 3.0}]})


@pytest.mark.parametrize("kind", ["sg_clip_is", "ppo_clip"])
def test_objective_takes_the_old_policy_as_denominator_weighs_and_drops(kind):
    settings = LossSettings(kind=kind, corrections=[TISCorrection(cap=3.0), VetoCorrection()])
    corr = _apply(*settings.corrections)
    logp_rollout = torch.zeros(3, 3, dtype=torch.float64)
    # First minibatch: the trainer's log-probs are logp_old, so the policy ratio is exactly 1.
    logp_train = corr.logp_old_NT.clone().float().nan_to_num(0.0).requires_grad_(True)
    adv = torch.tensor([1.0, -2.0, 3.0])
    out = objective(
        settings,
        logp_train,
        logp_rollout.float(),
        adv,
        MASK,
        Normalization("token_sum", 10.0),
        correction=corr.rows(torch.arange(3)),
    )
    out.loss.backward()
    w = torch.tensor([[2.0, 0.6, 1.0], [3.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    if kind == "sg_clip_is":  # - sum w * min(1, 1.28) * A * logp / D
        want = -(w * adv[:, None] * logp_train.detach()).sum() / 10
    else:  # - sum w * r * A / D with r = 1
        want = -(w * adv[:, None]).sum() / 10
    assert float(out.loss.detach()) == pytest.approx(float(want), rel=1e-5)
    torch.testing.assert_close(logp_train.grad, -(w * adv[:, None]) / 10)  # the vetoed row gets none
    assert out.metrics["clip/high_frac"] == 0.0  # the policy ratio no longer carries the mismatch (r = 4)


def test_dropped_tokens_leave_the_kl_term_too():
    settings = LossSettings(kl_coef=0.5, corrections=[VetoCorrection()])
    corr = _apply(*settings.corrections)
    logp_train = corr.logp_old_NT.float().nan_to_num(0.0)
    logp_ref = torch.zeros(3, 3)
    logp_ref[2] = 5.0  # a large KL on the vetoed row only
    out = objective(
        settings,
        logp_train,
        torch.zeros(3, 3),
        torch.zeros(3),
        MASK,
        Normalization("token_sum", 10.0),
        logp_ref,
        correction=corr.rows(torch.arange(3)),
    )
    kept = MASK.clone()
    kept[2] = False
    delta = (logp_ref - logp_train)[kept]
    assert out.metrics["kl/token_mean"] == pytest.approx(float((delta.exp() - delta - 1).mean()), rel=1e-5)


def test_sample_mean_averages_each_sequence_over_its_kept_tokens():
    settings = LossSettings(
        kind="sg_clip_is", normalization="sample_mean", corrections=[MaskedISCorrection(lower=0.4, upper=3.0)]
    )
    corr = _apply(*settings.corrections)
    logp_train = corr.logp_old_NT.float().nan_to_num(0.0)
    adv = torch.tensor([1.0, 1.0, 1.0])
    out = objective(
        settings,
        logp_train,
        torch.zeros(3, 3),
        adv,
        MASK,
        Normalization("sample_mean"),
        correction=corr.rows(torch.arange(3)),
    )
    lp = logp_train
    want = -((lp[0].sum() / 3) + (lp[1, 1] / 1) + (lp[2, 1:].sum() / 2)) / 3
    assert float(out.loss) == pytest.approx(float(want), abs=1e-6)


def test_a_dropped_sequence_changes_neither_its_groups_baseline_nor_the_reward_statistics():
    keep = torch.tensor([True, True, True, False, True, True, True, True])
    for dropped_reward in (0.0, 1.0, 7.0):
        rewards = torch.tensor([1.0, 0.0, 0.0, dropped_reward, 1.0, 1.0, 0.0, 0.0])
        adv = group_advantages(rewards, 4, keep_N=keep)
        torch.testing.assert_close(adv[:3], group_advantages([1.0, 0.0, 0.0], 3))
        assert adv[3] == 0.0
        torch.testing.assert_close(adv[4:], group_advantages([1.0, 1.0, 0.0, 0.0], 4))
        stats = reward_summary(rewards.tolist(), 4, keep.tolist())
        kept = [1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0]
        assert stats["reward/mean"] == pytest.approx(sum(kept) / 7)
        assert stats["reward/std"] == pytest.approx(float(torch.tensor(kept).std(unbiased=False)))
        assert stats["reward/zero_std_groups"] == 0.0 and stats["reward/solved_groups"] == 1.0
    # With centering only, and a group left with one member (its own baseline: zero advantage).
    adv = group_advantages(
        [3.0, 1.0, 5.0, 2.0], 2, use_std=False, keep_N=torch.tensor([True, True, False, True])
    )
    assert adv.tolist() == [1.0, -1.0, 0.0, 0.0]
    # Keeping everything is the plain computation.
    r = torch.tensor([1.0, 0.0, 0.5, 0.0, 1.0, 1.0])
    torch.testing.assert_close(
        group_advantages(r, 3, keep_N=torch.ones(6, dtype=torch.bool)), group_advantages(r, 3)
    )


DENSE = ModelConfig(
    vocab_size=32,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    layer_group_size=2,
    head_dim=8,
    qk_rope_head_dim=4,
    qk_nope_head_dim=8,
    v_head_dim=6,
    kv_lora_rank=8,
    intermediate_size=40,
    group_norm_size=2,
)


def _trainer_and_batch(corrections, advantage_of_dropped: float = 0.0):
    model = random_weights_(HybridLM(DENSE, PrecisionPolicy.preset("fp64")), torch.Generator().manual_seed(0))
    loss = LossSettings(normalization="sample_mean", corrections=corrections)
    trainer = PolicyTrainer(
        model,
        TrainOptimizer(model, OptimSettings(lr=1e-2), total_steps=10, schedule="constant"),
        loss,
        minibatches=2,
        max_new_tokens=5,
        temperature=1.0,
        micro_batch=1,
    )
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 32, (n,), generator=g).tolist() for n in (3, 5, 4, 2)]
    outputs = [torch.randint(3, 32, (n,), generator=g).tolist() for n in (4, 2, 5, 3)]
    mask = torch.tensor([[j < len(o) for j in range(5)] for o in outputs])
    batch = RolloutBatch(
        problems=[None] * 4,
        prompt_ids=prompts,
        output_ids=outputs,
        responses=[""] * 4,
        logp_rollout_NT=torch.zeros(4, 5, dtype=torch.float64),
        mask_NT=mask,
        rewards_N=torch.tensor([1.0, 0.0, 1.0, 0.0]),
        correct=[False] * 4,
        truncated=[False] * 4,
        uses_trace=[False] * 4,
        group_size=2,
    )
    with torch.no_grad():
        score = trainer.score(model, batch, [0, 1, 2, 3], 5)[0].double()
    batch.logp_rollout_NT = torch.where(mask, score, torch.zeros_like(score))
    batch.logp_rollout_NT[3, 0] += 10.0  # the engine found this token e^10 times likelier: r = e^-10
    batch.logp_rollout_NT[0, 1] -= math.log(3.0)  # r = 3 on one token of row 0
    return model, trainer, batch


def test_the_trainer_scores_logp_old_once_and_a_dropped_response_never_reaches_the_weights():
    model, trainer, batch = _trainer_and_batch([TISCorrection(cap=2.0), VetoCorrection(floor=1e-3)])
    corr = trainer.correct(batch)
    assert corr.keep_N.tolist() == [True, True, True, False]
    shift = torch.zeros(4, 5, dtype=torch.float64)
    shift[0, 1], shift[3, 0] = math.log(3.0), -10.0
    torch.testing.assert_close(
        corr.logp_old_NT.double()[batch.mask_NT],
        (batch.logp_rollout_NT + shift)[batch.mask_NT],
        rtol=1e-6,
        atol=1e-6,
    )
    assert corr.weight_NT[0, 1] == pytest.approx(2.0)  # r = 3 truncated at the cap
    assert corr.metrics["correction/sequences_dropped"] == 1.0
    with pytest.raises(ValueError, match="pass correction=trainer.correct"):
        trainer.train(batch, torch.zeros(4), seed=0)

    after = []
    for dropped_advantage in (5.0, -5.0):  # what a dropped response carries must change nothing
        model, trainer, batch = _trainer_and_batch([TISCorrection(cap=2.0), VetoCorrection(floor=1e-3)])
        before = {k: v.clone() for k, v in model.state_dict().items()}
        corr = trainer.correct(batch)
        adv = group_advantages(batch.rewards_N, 2, keep_N=corr.keep_N)
        assert adv.tolist() == pytest.approx([0.5**0.5, -(0.5**0.5), 0.0, 0.0], abs=1e-5)  # group 1: one kept
        adv[3] = dropped_advantage
        metrics = trainer.train(batch, adv, seed=0, correction=corr)
        assert metrics["loss/skipped"] == 0 and math.isfinite(metrics["loss/total"])
        after.append({k: v.clone() for k, v in model.state_dict().items()})
        # the kept responses did train: equal weights below then mean the dropped one had no say, not that
        # nothing moved
        moved = max(float((after[-1][k] - before[k]).abs().max()) for k in before)
        assert moved > 1e-4, f"training changed no weight (largest change {moved:.3g})"
    assert all(torch.equal(after[0][k], after[1][k]) for k in after[0])


def test_without_corrections_the_trainer_adds_no_forward():
    _, trainer, batch = _trainer_and_batch([])
    assert trainer.correct(batch) is None
