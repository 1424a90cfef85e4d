"""token_sum and sample_mean: exact denominators, and what each does to long responses."""

import pytest
import torch

from ringzero.config.stages import LossSettings
from ringzero.rl.losses import Normalization, sg_clip_is_loss
from ringzero.rl.objective import make_normalization

PER_TOKEN = torch.tensor([[1.0, 2.0, 3.0, 4.0], [10.0, 20.0, 99.0, 99.0], [5.0, 5.0, 5.0, 5.0]])
MASK = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [0, 0, 0, 0]], dtype=torch.bool)


def test_token_sum_divides_the_masked_sum_by_the_constant():
    assert Normalization("token_sum", 12.0)(PER_TOKEN, MASK).item() == pytest.approx((10 + 30) / 12)
    assert Normalization("token_sum", 24.0)(PER_TOKEN, MASK).item() == pytest.approx((10 + 30) / 24)


def test_sample_mean_averages_each_sequence_then_the_sequences():
    # (10/4 + 30/2 + 0) / 3: the empty third sequence contributes zero and still counts.
    assert Normalization("sample_mean")(PER_TOKEN, MASK).item() == pytest.approx((2.5 + 15.0 + 0.0) / 3)


def test_padding_columns_change_neither():
    pad = torch.cat([PER_TOKEN, torch.full((3, 5), 7.0)], dim=1)
    pad_mask = torch.cat([MASK, torch.zeros(3, 5, dtype=torch.bool)], dim=1)
    for norm in (Normalization("token_sum", 12.0), Normalization("sample_mean")):
        assert norm(pad, pad_mask).item() == pytest.approx(norm(PER_TOKEN, MASK).item())


def test_token_sum_gives_long_responses_more_gradient_sample_mean_does_not():
    # Two responses with the same advantage, one 2 tokens long, one 6: gradient mass per response.
    lengths = [2, 6]
    mask = torch.tensor([[1] * 2 + [0] * 4, [1] * 6], dtype=torch.bool)
    adv = torch.tensor([1.0, 1.0])
    grads = {}
    for norm in (Normalization("token_sum", 12.0), Normalization("sample_mean")):
        lt = torch.full((2, 6), -1.0, requires_grad=True)
        sg_clip_is_loss(lt, lt.detach(), adv, mask, norm, eps_high=0.2).loss.backward()
        grads[norm.kind] = lt.grad.abs().sum(dim=1)
    assert grads["token_sum"][1] / grads["token_sum"][0] == pytest.approx(lengths[1] / lengths[0])
    assert grads["sample_mean"][1] == pytest.approx(grads["sample_mean"][0].item())
    assert grads["token_sum"][0].item() == pytest.approx(2 / 12)  # r = 1, A = 1: |grad| = 1/D per token
    assert grads["sample_mean"][0].item() == pytest.approx(1 / 2)  # 1/(length x N) per token, two tokens


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="denominator"):
        Normalization("token_sum")
    with pytest.raises(ValueError, match="denominator"):
        Normalization("token_sum", 0.0)
    with pytest.raises(ValueError, match="denominator must be None"):
        Normalization("sample_mean", 3.0)
    with pytest.raises(ValueError, match="token_sum or sample_mean"):
        Normalization("per_token")


def test_make_normalization_follows_loss_settings():
    lengths = torch.tensor([5, 0, 7] + [1] * 29)
    assert make_normalization(LossSettings(), lengths, 128) == Normalization("token_sum", 32 * 128.0)
    assert make_normalization(LossSettings(token_sum_denominator=1000), lengths, 128) == Normalization(
        "token_sum", 1000.0
    )
    norm = make_normalization(LossSettings(normalization="sample_mean"), lengths, 128)
    assert norm.kind == "sample_mean" and norm.num_sequences == 32 and torch.equal(norm.lengths_N, lengths)


def test_a_shard_of_rows_keeps_the_whole_batchs_denominator():
    lengths = MASK.sum(dim=1)
    for settings in (LossSettings(), LossSettings(normalization="sample_mean")):
        whole = make_normalization(settings, lengths, 6)
        parts = sum(whole.rows(torch.tensor([i]))(PER_TOKEN[i : i + 1], MASK[i : i + 1]) for i in range(3))
        assert parts.item() == pytest.approx(whole(PER_TOKEN, MASK).item())


def test_token_mean_divides_the_token_sum_by_the_minibatchs_loss_tokens():
    # verl's token-mean (agg_loss, loss_agg_mode="token-mean"): masked sum over masked count, by hand.
    settings = LossSettings(normalization="token_mean")
    norm = make_normalization(settings, MASK.sum(dim=1), 128)
    assert norm(PER_TOKEN, MASK).item() == pytest.approx((10 + 30) / 6)
    # every token weighs the same, as under token_sum: a 6-token response gets 3x a 2-token one's gradient
    mask = torch.tensor([[1] * 2 + [0] * 4, [1] * 6], dtype=torch.bool)
    lt = torch.full((2, 6), -1.0, requires_grad=True)
    sg_clip_is_loss(
        lt,
        lt.detach(),
        torch.tensor([1.0, 1.0]),
        mask,
        make_normalization(settings, mask.sum(dim=1), 6),
        eps_high=0.2,
    ).loss.backward()
    per_response = lt.grad.abs().sum(dim=1)
    assert per_response.tolist() == pytest.approx([2 / 8, 6 / 8])
