"""A short seeded RL run on a trivially learnable reward: the reward goes up, under each loss form."""

import pytest
from stage_kit import rl_parts

from ringzero.config.stages import LossSettings

STEPS = 20


@pytest.mark.parametrize(
    "loss",
    [
        LossSettings(kind="sg_clip_is", normalization="token_sum"),
        LossSettings(kind="ppo_clip", normalization="token_sum"),
        LossSettings(kind="sg_clip_is", normalization="sample_mean", kl_coef=0.01),
    ],
    ids=["sg_clip_is-token_sum", "ppo_clip-token_sum", "sg_clip_is-sample_mean-kl"],
)
def test_reward_goes_up(loss):
    parts = rl_parts(prompts=8, samples=8, minibatches=2, lr=1e-2, max_new_tokens=4, loss=loss)
    rewards = [parts.step.run(step)["reward/mean"] for step in range(STEPS)]
    first, last = sum(rewards[:3]) / 3, sum(rewards[-5:]) / 5
    assert first < 0.15, rewards  # a random micro model says "7" first about 1 time in 64
    assert last > 0.7, rewards
    assert last > first + 0.5, rewards
