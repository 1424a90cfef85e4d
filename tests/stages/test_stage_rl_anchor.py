"""The accuracy anchor in the RL stage, and the stage summary's ``ratio/p99_median``.

The anchor samples the frozen reference's weights (the stage's ``reference``, not its init), whether or not
the KL term already holds them; a step with it trains anchored prompts on ``R - R_ref`` and the others on
their group. ``ratio/p99_median`` is the median of every step's ``ratio/p99``, through resumes and
rollbacks."""

from __future__ import annotations

import pytest
import torch
from stage_kit import SayDigit, context, micro_model, rl_parts, run_config, state_equal

from ringzero.config.stages import Tier
from ringzero.model.checkpoint import save_model
from ringzero.rl.advantage import group_advantages
from ringzero.rl.anchor import Anchor
from ringzero.rl.rewards import TaskReward
from ringzero.rl.step import RLStep
from ringzero.rollout.engine.embedded import EmbeddedEngine
from ringzero.rollout.types import Completion, GenerateRequest, SamplingParams
from ringzero.stages import rl as rl_stage
from ringzero.stages import rl_session
from ringzero.stages.base import StageInputs
from ringzero.stages.summary_values import median_of
from ringzero.store import open_store

TIERS = [{"name": "plain", "tag": None, "budget": None}, {"name": "fast", "tag": "[fast]", "budget": 4}]
RL = {
    "name": "tier",
    "kind": "rl",
    "steps": 1,
    "prompts_per_step": 4,
    "samples_per_prompt": 2,
    "minibatches": 1,
    "min_steps": 0,
    "sampling": {"max_new_tokens": 4},
    "tiers": TIERS,
    "anchor": {"tiers": ["plain"], "samples": 2},
}


@pytest.fixture(autouse=True)
def learnable_task(monkeypatch):
    original = rl_session.task_and_tokenizer
    monkeypatch.setattr(rl_session, "task_and_tokenizer", lambda cfg: (SayDigit(), original(cfg)[1]))


@pytest.mark.parametrize("kl_coef", [0.0, 0.01])  # the reference loaded for the anchor alone, or the KL's
def test_the_anchor_samples_the_reference_weights_not_the_policys(tmp_path, kl_coef):
    cfg = run_config(tmp_path, [{**RL, "loss": {"kl_coef": kl_coef}}])
    store = open_store(cfg.storage.root)
    policy, reference = micro_model(seed=0), micro_model(seed=1)
    inputs = StageInputs(
        init_uri=save_model(store, "policy", policy), reference_uri=save_model(store, "ref", reference)
    )
    session = rl_session.build_session(context(cfg), cfg.stages[0], inputs)
    anchor = session.stepper.anchor
    assert anchor.tags == {None} and anchor.samples == 2
    engine = getattr(anchor.client, "client", anchor.client)  # inside a rank spread, if any
    assert state_equal(engine.model.state_dict(), reference.state_dict())
    assert not state_equal(engine.model.state_dict(), policy.state_dict())
    tok = session.tokenizer
    req = [
        GenerateRequest(
            tok.encode("q: say 3\na: ", add_bos=True), SamplingParams(max_new_tokens=4, n=4, seed=5)
        )
    ]
    assert (
        anchor.client.generate(req)[0][0].output_ids
        == EmbeddedEngine(reference, tok).generate(req)[0][0].output_ids
    )
    metrics = session.stepper.run(0)
    assert {"anchor/ref_accuracy", "time/anchor"} <= metrics.keys()


class Says:
    """A stub reference that answers 7 to the first ``k`` of its samples of every prompt."""

    def __init__(self, tokenizer, k: int):
        self.tokenizer, self.k = tokenizer, k

    def generate(self, requests):
        return [
            [
                Completion(list(r.input_ids), self.tokenizer.encode(t), [0.0] * 2, "stop")
                for t in ["7\n" if j < self.k else "0\n" for j in range(r.params.n)]
            ]
            for r in requests
        ]


def test_a_step_trains_anchored_prompts_on_reward_minus_the_references_and_the_rest_on_their_group(
    monkeypatch,
):
    parts = rl_parts(prompts=8, samples=4, minibatches=1)
    step = parts.step
    step.reward = TaskReward(
        parts.task, [Tier(name="plain", tag=None, budget=None), Tier(name="fast", tag="[fast]", budget=4)]
    )
    step.anchor = Anchor(Says(parts.tokenizer, k=3), {None}, samples=4)  # R_ref = 3 / 4 on every prompt
    seen = {}
    train = parts.trainer.train

    def spy(batch, advantages_N, seed, correction=None):
        seen["batch"], seen["advantages"] = batch, advantages_N.clone()
        return train(batch, advantages_N, seed, correction=correction)

    monkeypatch.setattr(parts.trainer, "train", spy)
    metrics = step.run(0)
    batch, got = seen["batch"], seen["advantages"]
    groups = [batch.problems[g * 4].tier for g in range(8)]
    assert None in groups and "[fast]" in groups  # both kinds drawn
    rewards = batch.rewards_N.view(8, 4)
    for g, tier in enumerate(groups):
        want = rewards[g] - 0.75 if tier is None else group_advantages(rewards[g], 4)
        torch.testing.assert_close(got.view(8, 4)[g], want)
    plain = [i for i in range(32) if groups[i // 4] is None]
    assert metrics["anchor/ref_accuracy"] == 0.75
    assert metrics["anchor/accuracy"] == pytest.approx(sum(batch.correct[i] for i in plain) / len(plain))
    assert "tier/plain/accuracy" in metrics and "tier/fast/within_budget" in metrics


def test_median_of_known_values():
    assert median_of([5, 1, 9, 3, 7, 2, 8], "m") == {"m": 5.0}
    assert median_of([4, float("nan"), 1, 3, 2], "m") == {"m": 2.5}
    assert median_of([float("nan")], "m") == {}


SEQ = [
    4.0,
    1.0,
    9.0,
    3.0,
    7.0,
    2.0,
    8.0,
]  # median 4; the last five's mean 5.8, their median 7; the last four's 5


def known_p99(monkeypatch, spike_at=None):
    """Every step reports ``ratio/p99`` = SEQ[step]; the first try of ``spike_at`` reports 1000."""
    original, tries = RLStep.run, {}

    def run(self, step, seed=None):
        metrics = original(self, step, seed)
        tries[step] = tries.get(step, 0) + 1
        metrics["ratio/p99"] = 1000.0 if step == spike_at and tries[step] == 1 else SEQ[step]
        return metrics

    monkeypatch.setattr(RLStep, "run", run)
    return original


PLAIN_RL = {
    "name": "stage1",
    "kind": "rl",
    "steps": 7,
    "prompts_per_step": 2,
    "samples_per_prompt": 2,
    "minibatches": 1,
    "checkpoint_every": 3,
    "min_steps": 0,
    "sampling": {"max_new_tokens": 4},
}


def run_stage(root, **overrides):
    cfg = run_config(root, [{**PLAIN_RL, **overrides}])
    ctx = context(cfg, "c" * 16)
    return rl_stage.run(ctx, cfg.stages[0], StageInputs())


def test_the_summary_holds_the_median_of_every_steps_ratio_tail_through_a_resume(tmp_path, monkeypatch):
    original = known_p99(monkeypatch)
    whole = run_stage(tmp_path / "whole")
    assert whole.summary["ratio/p99_median"] == 4.0
    assert whole.summary["ratio/p99"] == pytest.approx(5.8)  # the last five steps' mean, as before

    def dies(self, step, seed=None):
        if step == 4:  # after the resume point of step 3
            raise KeyboardInterrupt("preempted")
        metrics = original(self, step, seed)
        metrics["ratio/p99"] = SEQ[step]
        return metrics

    monkeypatch.setattr(RLStep, "run", dies)
    with pytest.raises(KeyboardInterrupt):
        run_stage(tmp_path / "cut")
    monkeypatch.setattr(RLStep, "run", original)
    known_p99(monkeypatch)
    assert (
        run_stage(tmp_path / "cut").summary["ratio/p99_median"] == 4.0
    )  # steps 1-3 came back with the resume


def test_a_rolled_back_step_leaves_the_median(tmp_path, monkeypatch):
    known_p99(monkeypatch, spike_at=3)
    outcome = run_stage(
        tmp_path,
        checkpoint_every=10,  # snapshots after steps 0, 2, 4, 6 only
        rollback={"on": ["ratio/p99 >= 100"], "every": 2, "remedy": "skip_batch"},
    )
    assert outcome.summary["rollback/count"] == 1.0
    # rolled back to after step 2: step 3 (index 2) ran twice, but counts once, and the spike not at all
    assert outcome.summary["ratio/p99_median"] == 4.0  # counted twice it would be 5.5


def test_a_tier_stage_with_every_new_piece_runs_end_to_end(tmp_path):
    tiers = [*TIERS, {"name": "deep", "tag": "[deep]", "budget": None}]
    stage = {
        **RL,
        "steps": 2,
        "samples_per_prompt": 4,
        "tiers": tiers,
        "loss": {"kl_coef": 0.01},
        "sampling": {"max_new_tokens": 6},
        "anchor": {"tiers": ["plain", "deep"], "samples": 2},
        "forced_opening": {"text": "0", "fraction": 0.25, "tiers": ["fast"]},
    }
    cfg = run_config(tmp_path, [stage])
    ctx = context(cfg)
    outcome = rl_stage.run(ctx, cfg.stages[0], StageInputs())
    keys = set().union(*(r.keys() for r in ctx.metrics.records))
    assert {"anchor/ref_accuracy", "anchor/gap", "time/anchor", "opening/forced_frac"} <= keys
    assert {
        "anchor/gap",
        "ratio/p99_median",
        "eval/fast/accuracy",
        "eval/deep/accuracy",
    } <= outcome.summary.keys()
    assert not any(k.startswith("eval/plain") for k in outcome.summary)
