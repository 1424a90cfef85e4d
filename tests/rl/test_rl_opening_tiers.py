"""Forced openings limited to some tiers (``forced_opening.tiers``): only prompts asked at those tiers get
forced samples, last in their group; every other prompt's group is all the policy's; groups keep their
size; names are checked against the stage's tiers; a stage that leaves ``tiers`` unset dumps as before."""

from __future__ import annotations

import random

import pytest
from pydantic import ValidationError
from test_rl_openings import _setup

from ringzero.config.stages import RLStage, Tier
from ringzero.pipeline.identity import stage_fields
from ringzero.rl.openings import Opening
from ringzero.rl.rewards import TaskReward
from ringzero.rl.rollout_batch import collect
from ringzero.rl.step import opening_metrics, own_rows
from ringzero.rollout.engine.embedded import EmbeddedEngine
from ringzero.rollout.types import SamplingParams
from ringzero.stages.rl_session import _opening
from ringzero.tokenizer.char import CharTokenizer

FAST = Tier(name="fast", tag="[fast]", budget=20)
DEEP = Tier(name="deep", tag="[deep]", budget=None)
PLAIN = Tier(name="plain", tag=None, budget=None)
TIERS = [FAST, DEEP, PLAIN]


def _batch(opening: Opening | None, tags=("[fast]", None, "[deep]", "[fast]"), samples=4):
    tok, model, task = _setup()
    base = task.prompts("train", len(tags), random.Random(5))
    problems = [p if tag is None else task.with_tier(p, tag) for p, tag in zip(base, tags, strict=True)]
    params = SamplingParams(max_new_tokens=24, temperature=1.0, n=samples)
    return collect(
        EmbeddedEngine(model, tok),
        task,
        tok,
        problems,
        samples=samples,
        params=params,
        reward=TaskReward(task, TIERS),
        seeds=[21, 22, 23, 24][: len(tags)],
        opening=opening,
    )


def test_only_prompts_of_the_listed_tiers_get_forced_samples_last_in_their_group():
    tok = CharTokenizer()
    ids = tuple(tok.encode("<think> </think>"))
    batch = _batch(Opening(ids, samples=2, tags=frozenset({"[fast]"})))
    assert len(batch) == 16 and batch.group_size == 4
    assert batch.forced == [False, False, True, True] + [False] * 8 + [False, False, True, True]
    for g in range(4):
        assert len({id(batch.problems[i]) for i in range(4 * g, 4 * g + 4)}) == 1  # one problem per group
    for i, forced in enumerate(batch.forced):
        assert (batch.output_ids[i][: len(ids)] == list(ids)) or not forced
    assert own_rows(batch) == [0, 1, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]
    assert opening_metrics(batch)["opening/forced_frac"] == pytest.approx(4 / 16)


def test_a_prompt_outside_the_listed_tiers_samples_as_with_no_opening():
    tok = CharTokenizer()
    plain = _batch(None)
    limited = _batch(Opening(tuple(tok.encode("<think> </think>")), samples=2, tags=frozenset({None})))
    assert limited.forced == [False] * 4 + [False, False, True, True] + [False] * 8
    for g in (0, 2, 3):  # not listed: all four samples are the policy's own, the same draws as without
        assert limited.output_ids[4 * g : 4 * g + 4] == plain.output_ids[4 * g : 4 * g + 4]


def test_a_batch_without_a_listed_prompt_has_no_forced_mean():
    tok = CharTokenizer()
    batch = _batch(
        Opening(tuple(tok.encode("<think> </think>")), samples=1, tags=frozenset({"[deep]"})),
        tags=("[fast]", None),
    )
    assert batch.forced == [False] * 8
    m = opening_metrics(batch)
    assert (
        m["opening/forced_frac"] == 0.0 and m["opening/forced_reward_mean"] != m["opening/forced_reward_mean"]
    )


def stage(**opening):
    return RLStage.model_validate(
        dict(
            name="tier",
            kind="rl",
            samples_per_prompt=4,
            prompts_per_step=4,
            minibatches=1,
            tiers=[t.model_dump() for t in TIERS],
            forced_opening=opening,
        )
    )


def test_the_stage_maps_tier_names_to_their_tags_the_untagged_one_included():
    tok, _, task = _setup()
    assert _opening(stage(tiers=["fast", "plain"]), task, tok).tags == frozenset({"[fast]", None})
    assert _opening(stage(), task, tok).tags is None  # every prompt, as before


def test_listed_names_must_be_tiers_of_the_stage():
    with pytest.raises(ValidationError, match=r"forced_opening.tiers: \['slow'\] name no tier"):
        stage(tiers=["fast", "slow"])
    with pytest.raises(ValidationError, match="forced_opening.tiers"):
        stage(tiers=[])


def test_unset_tiers_keep_the_identity():
    assert "tiers" not in stage_fields(stage())["forced_opening"]
    assert "tiers" not in stage_fields(stage(tiers=None))["forced_opening"]
    assert stage_fields(stage(tiers=["fast"]))["forced_opening"]["tiers"] == ["fast"]
    assert "anchor" not in stage_fields(stage())
