"""GRPO group-normalized advantages by hand."""

import math

import pytest
import torch

from ringzero.rl.advantage import group_advantages


def test_centered_and_scaled_by_the_sample_std():
    adv = group_advantages([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0], group_size=4)
    std1 = math.sqrt((0.75**2 + 3 * 0.25**2) / 3)  # Bessel: divide by n - 1
    std2 = math.sqrt(4 * 0.5**2 / 3)
    expected = [0.75 / std1] + [-0.25 / std1] * 3 + [0.5 / std2] * 2 + [-0.5 / std2] * 2
    torch.testing.assert_close(adv, torch.tensor(expected), atol=1e-5, rtol=1e-5)


def test_without_std_only_centered():
    adv = group_advantages(torch.tensor([3.0, 1.0, 2.0, 2.0]), group_size=2, use_std=False)
    assert adv.tolist() == [1.0, -1.0, 0.0, 0.0]


def test_equal_rewards_in_a_group_give_zero_advantage():
    assert group_advantages([1.0, 1.0, 1.0, 0.0, 0.0, 0.0], group_size=3).tolist() == [0.0] * 6
    assert group_advantages([0.3, 0.9], group_size=1).tolist() == [0.0, 0.0]


def test_group_size_must_divide():
    with pytest.raises(ValueError, match="divide"):
        group_advantages([1.0, 0.0, 1.0], group_size=2)
    with pytest.raises(ValueError, match=r"\[N\]"):
        group_advantages(torch.ones(2, 2), group_size=2)
