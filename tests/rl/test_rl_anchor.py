"""The accuracy anchor (AdaptThink's R - R_ref): anchored rows take the reference's mean reward on their
prompt as baseline, unscaled; the others keep GRPO's group advantages; the reference is asked the very
prompt (tier tag included) with seeds derived per step and prompt; its settings are checked by name."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from ringzero.config.stages import RLStage, Tier
from ringzero.pipeline.identity import stage_fields
from ringzero.rl.advantage import anchored_advantages, group_advantages
from ringzero.rl.anchor import Anchor
from ringzero.rl.rewards import TaskReward
from ringzero.rl.rollout_batch import RolloutBatch
from ringzero.rl.seeds import derive_seed
from ringzero.rollout.types import Completion, SamplingParams
from ringzero.tasks.base import Problem, Task
from ringzero.tokenizer.char import CharTokenizer

NAN = float("nan")


def test_anchored_rows_are_reward_minus_baseline_and_the_rest_group_normalized():
    rewards = [1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0]
    baseline = [0.75] * 4 + [NAN] * 4
    got = anchored_advantages(rewards, baseline, 4)
    torch.testing.assert_close(got[:4], torch.tensor([0.25, -0.75, -0.75, -0.75]))  # no std division
    torch.testing.assert_close(got[4:], group_advantages(rewards[4:], 4))
    # a group uniformly below the reference is pushed down: GRPO's group mean would give it nothing
    torch.testing.assert_close(anchored_advantages([0.0] * 4, [0.5] * 4, 4), torch.full((4,), -0.5))
    assert group_advantages([0.0] * 4, 4).abs().sum() == 0


def test_dropped_rows_get_no_advantage_and_leave_the_group_baseline():
    rewards, keep = [1.0, 0.0, 0.0, 1.0, 1.0, 0.0], torch.tensor([False, True, True, True, False, True])
    got = anchored_advantages(rewards, [0.5] * 3 + [NAN] * 3, 3, keep_N=keep)
    torch.testing.assert_close(got[:3], torch.tensor([0.0, -0.5, -0.5]))
    torch.testing.assert_close(got[3:], group_advantages(rewards, 3, keep_N=keep)[3:])
    with pytest.raises(ValueError, match="baseline_N shape"):
        anchored_advantages(rewards, [0.5], 3)


class SayDigit(Task):
    """Reward 1 when the response starts with 7."""

    stop = ("\n",)

    def prompts(self, split, n, rng=None):
        return [Problem(id=f"say:{i}", prompt=f"q: say {i}\na: ", answer="7") for i in range(n)]

    def reward(self, problem, response):
        return 1.0 if response.startswith("7") else 0.0


class KnownReference:
    """A reference whose answers are known: to ``say d`` it answers 7 in the first ``d % (n + 1)`` of its
    ``n`` samples. Records every request."""

    def __init__(self, tokenizer):
        self.tokenizer, self.requests = tokenizer, []

    def generate(self, requests):
        self.requests.extend(requests)
        out = []
        for r in requests:
            d = int(self.tokenizer.decode(r.input_ids).split("say ")[1][0])
            texts = ["7\n" if j < d % (r.params.n + 1) else "0\n" for j in range(r.params.n)]
            out.append(
                [
                    Completion(list(r.input_ids), self.tokenizer.encode(t), [0.0] * len(t), "stop")
                    for t in texts
                ]
            )
        return out


def policy_batch(task, tok, problems, texts, group):
    n = len(texts)
    return RolloutBatch(
        problems=[p for p in problems for _ in range(group)],
        prompt_ids=[[1]] * n,
        output_ids=[tok.encode(t) for t in texts],
        responses=texts,
        logp_rollout_NT=torch.zeros(n, 2, dtype=torch.float64),
        mask_NT=torch.ones(n, 2, dtype=torch.bool),
        rewards_N=torch.tensor([task.reward(None, t) for t in texts]),
        correct=[t.startswith("7") for t in texts],
        truncated=[False] * n,
        uses_trace=[False] * n,
        group_size=group,
        forced=[False, True] * (n // 2),
    )


def test_the_baseline_is_the_references_mean_reward_on_the_same_prompt():
    task, tok = SayDigit(), CharTokenizer()
    deep = Tier(name="deep", tag="[deep]", budget=None)
    prompts = task.prompts("train", 4)
    problems = [
        task.with_tier(prompts[0], "[deep]"),
        prompts[1],
        task.with_tier(prompts[2], "[fast]"),
        prompts[3],
    ]
    texts = ["7\n", "0\n", "0\n", "0\n", "7\n", "7\n", "7\n", "0\n"]  # two samples a prompt
    batch = policy_batch(task, tok, problems, texts, 2)
    ref = KnownReference(tok)
    params = SamplingParams(max_new_tokens=5, temperature=0.7, n=2)
    got = Anchor(ref, {"[deep]", None}, samples=4).measure(
        batch, task=task, tokenizer=tok, params=params, reward=TaskReward(task, [deep]), seed=9, step=3
    )
    # say 0: 0 of 4; say 1: 1 of 4; say 3 (prompt 3): 3 of 4; prompt 2 is [fast]: not anchored
    expected = torch.tensor([0.0, 0.0, 0.25, 0.25, NAN, NAN, 0.75, 0.75])
    torch.testing.assert_close(got.baseline_N, expected, equal_nan=True)
    assert [tok.decode(r.input_ids) for r in ref.requests] == [
        "[deep] q: say 0\na: ",
        "q: say 1\na: ",
        "q: say 3\na: ",
    ]  # the very prompts, tags included
    assert [r.params.seed for r in ref.requests] == [derive_seed(9, "rl-anchor", 3, k) for k in (0, 1, 3)]
    assert all(
        r.params.n == 4 and r.params.temperature == 0.7 and r.params.max_new_tokens == 5 for r in ref.requests
    )
    assert got.metrics["anchor/ref_accuracy"] == pytest.approx(4 / 12)
    assert got.metrics["anchor/ref_reward"] == pytest.approx(4 / 12)
    assert got.metrics["anchor/accuracy"] == pytest.approx(2 / 3)  # own samples 0, 2, 6 (odd rows forced)
    assert got.metrics["anchor/gap"] == pytest.approx(2 / 3 - 1 / 3)
    advantages = anchored_advantages(batch.rewards_N, got.baseline_N, 2)
    # by hand: R - R_ref on prompts 0, 1, 3; prompt 2's group (1, 1) is uniform, so GRPO gives it 0
    torch.testing.assert_close(advantages, torch.tensor([1.0, 0.0, -0.25, -0.25, 0.0, 0.0, 0.25, -0.75]))


def test_no_anchored_prompt_no_reference_samples():
    task, tok = SayDigit(), CharTokenizer()
    problems = [task.with_tier(p, "[fast]") for p in task.prompts("train", 2)]
    batch = policy_batch(task, tok, problems, ["7\n", "0\n"] * 2, 2)
    ref = KnownReference(tok)
    got = Anchor(ref, {None}, samples=2).measure(
        batch, task=task, tokenizer=tok, params=SamplingParams(n=2), reward=TaskReward(task), seed=0, step=0
    )
    assert ref.requests == [] and got.metrics == {} and torch.isnan(got.baseline_N).all()


TIERS = [
    {"name": "plain", "tag": None, "budget": None},
    {"name": "fast", "tag": "[fast]", "budget": 8},
    {"name": "deep", "tag": "[deep]", "budget": None},
]


def test_anchor_settings_name_their_fields_and_stay_out_of_the_identity_when_off():
    ok = RLStage.model_validate(dict(name="t", kind="rl", tiers=TIERS, anchor={"tiers": ["plain", "deep"]}))
    assert ok.model_dump()["anchor"] == {"tiers": ["plain", "deep"], "samples": 4}
    assert "anchor" not in stage_fields(RLStage.model_validate(dict(name="t", kind="rl", tiers=TIERS)))
    with pytest.raises(ValidationError, match=r"anchor.tiers: \['slow'\] name no tier of this stage"):
        RLStage.model_validate(dict(name="t", kind="rl", tiers=TIERS, anchor={"tiers": ["slow"]}))
    with pytest.raises(ValidationError, match="anchor.tiers"):
        RLStage.model_validate(
            dict(name="t", kind="rl", anchor={"tiers": ["plain"]})
        )  # the stage has no tiers
    with pytest.raises(ValidationError, match=r"anchor.samples"):
        RLStage.model_validate(
            dict(name="t", kind="rl", tiers=TIERS, anchor={"tiers": ["plain"], "samples": 0})
        )
    with pytest.raises(ValidationError, match=r"anchor.tiers"):
        RLStage.model_validate(dict(name="t", kind="rl", tiers=TIERS, anchor={"tiers": []}))
