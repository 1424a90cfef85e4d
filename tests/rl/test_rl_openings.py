"""Forced openings (AdaptThink's cold start): the forced samples start with the prefix, sit last in their
prompt's group, count it in their length and budget, and carry the engine's own log-probs of it, which a
fresh score of the whole sequence reproduces; the policy's samples are untouched."""

from __future__ import annotations

import random

import pytest
import torch
from pydantic import ValidationError

from ringzero.config.stages import RLStage, Tier
from ringzero.model.config import ModelConfig, PrecisionPolicy
from ringzero.model.hybrid import HybridLM
from ringzero.model.scoring import score_tokens
from ringzero.rl.openings import Opening
from ringzero.rl.rewards import TaskReward
from ringzero.rl.rollout_batch import collect
from ringzero.rl.step import opening_metrics, own_rows
from ringzero.rollout.engine.embedded import EmbeddedEngine
from ringzero.rollout.types import SamplingParams
from ringzero.tasks.arithmetic import SyntheticArithmetic
from ringzero.tasks.config import ArithmeticTask
from ringzero.tokenizer.char import CharTokenizer

FAST = Tier(name="fast", tag="[fast]", budget=20)


def _setup(seed: int = 0):
    tok = CharTokenizer()
    cfg = ModelConfig.model_validate(
        dict(
            vocab_size=64,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            layout="LM",
            intermediate_size=48,
            max_position_embeddings=128,
            kv_lora_rank=8,
            qk_nope_head_dim=8,
            qk_rope_head_dim=4,
            v_head_dim=6,
            head_dim=8,
            lightning_block_size=8,
        )
    )
    model = HybridLM(cfg, PrecisionPolicy(body="float64", attention_softmax_fp32=True, lm_head_fp32=True))
    model.reset_parameters(torch.Generator().manual_seed(seed))
    task = SyntheticArithmetic(ArithmeticTask(operation="digitsum", digits=6, min_digits=2))
    return tok, model.eval(), task


def _collect(opening, samples=4, max_new=24, seed=3):
    tok, model, task = _setup()
    problems = [task.with_tier(p, FAST.tag) for p in task.prompts("train", 3, random.Random(seed))]
    params = SamplingParams(max_new_tokens=max_new, temperature=1.0, n=samples)
    batch = collect(
        EmbeddedEngine(model, tok),
        task,
        tok,
        problems,
        samples=samples,
        params=params,
        reward=TaskReward(task, [FAST]),
        seeds=[11, 12, 13],
        opening=opening,
    )
    return tok, model, batch


def test_forced_samples_open_with_the_prefix_and_sit_last_in_their_group():
    tok = CharTokenizer()
    opening = Opening(tuple(tok.encode("<think> </think>")), samples=1)
    _, _, batch = _collect(opening)
    assert batch.forced == [False, False, False, True] * 3
    for i, forced in enumerate(batch.forced):
        starts = batch.output_ids[i][: len(opening.ids)] == list(opening.ids)
        assert starts if forced else True
        assert batch.responses[i].startswith("<think> </think>") == starts
        assert batch.lengths[i] <= 24  # the opening counts against max_new_tokens
        assert batch.problems[i] is batch.problems[i - i % 4]
    assert own_rows(batch) == [0, 1, 2, 4, 5, 6, 8, 9, 10]


def test_the_openings_log_probs_are_the_engines_own_and_a_fresh_score_reproduces_them():
    tok = CharTokenizer()
    opening = Opening(tuple(tok.encode("<think> </think>")), samples=2)
    _, model, batch = _collect(opening)
    rows = [i for i, f in enumerate(batch.forced) if f]
    seqs, plens = batch.sequences(rows)
    scored = score_tokens(model, seqs, plens)
    for row, s in zip(rows, scored, strict=True):
        n = batch.lengths[row]
        got = batch.logp_rollout_NT[row, :n]
        assert batch.mask_NT[row, :n].all()
        torch.testing.assert_close(got, s.logprobs.double(), atol=1e-9, rtol=0)  # float64 body: same numbers
        assert (got[: len(opening.ids)] < 0).all()  # scored, not a placeholder 0


def test_without_an_opening_the_batch_is_what_it_was():
    _, _, plain = _collect(None)
    assert plain.forced is None and own_rows(plain) is None and opening_metrics(plain) == {}
    tok = CharTokenizer()
    _, _, opened = _collect(Opening(tuple(tok.encode("<think> </think>")), samples=1))
    # the policy's own samples are drawn from the same seeds: the first n-1 of each group agree
    for k in range(3):
        for j in range(3):
            assert opened.output_ids[4 * k + j] == plain.output_ids[4 * k + j]


def test_opening_metrics_split_rewards_by_who_opened():
    tok = CharTokenizer()
    _, _, batch = _collect(Opening(tuple(tok.encode("<think> </think>")), samples=1))
    batch.rewards_N = torch.tensor([1.0, 0, 0, 0] * 2 + [0, 0, 0, 1.0])
    m = opening_metrics(batch)
    assert m["opening/forced_frac"] == pytest.approx(0.25)
    assert m["opening/forced_reward_mean"] == pytest.approx(1 / 3)
    assert m["opening/own_reward_mean"] == pytest.approx(2 / 9)


def test_an_opening_that_leaves_no_room_is_refused():
    tok = CharTokenizer()
    with pytest.raises(Exception, match="no room under max_new_tokens"):
        _collect(Opening(tuple(tok.encode("<think> </think>")), samples=1), max_new=16)


@pytest.mark.parametrize(
    "fraction, samples, ok", [(0.25, 8, True), (0.5, 2, True), (0.05, 8, False), (0.95, 8, False)]
)
def test_the_forced_share_must_leave_both_kinds_of_sample(fraction, samples, ok):
    stage = dict(
        name="tier",
        kind="rl",
        samples_per_prompt=samples,
        prompts_per_step=4,
        minibatches=1,
        forced_opening={"fraction": fraction},
    )
    if ok:
        assert RLStage.model_validate(stage).forced_opening.samples(samples) >= 1
    else:
        with pytest.raises(ValidationError, match="forced_opening.fraction"):
            RLStage.model_validate(stage)


def test_an_opening_said_without_settings_takes_the_defaults():
    opened = RLStage.model_validate(dict(name="s", kind="rl", forced_opening={}))
    assert opened.forced_opening.text == "<think> </think>" and opened.forced_opening.fraction == 0.25


def test_guessed_samples_are_whole_answers_scored_by_the_engine_and_never_truncated():
    tok, model, task = _setup()
    guesses = tuple(tuple(tok.encode(a + "\n")) for a in task.answer_space())
    opening = Opening(tuple(tok.encode("<think> </think> ")), samples=3, guesses=guesses)
    problems = [task.with_tier(p, FAST.tag) for p in task.prompts("train", 4, random.Random(1))]
    params = SamplingParams(max_new_tokens=24, temperature=1.0, n=4)
    batch = collect(
        EmbeddedEngine(model, tok),
        task,
        tok,
        problems,
        samples=4,
        params=params,
        reward=TaskReward(task, [FAST]),
        seeds=[1, 2, 3, 4],
        opening=opening,
    )
    forced = [i for i, f in enumerate(batch.forced) if f]
    assert len(forced) == 12
    drawn = set()
    for i in forced:
        text = batch.responses[i]
        assert (
            text.startswith("<think> </think> ")
            and text.endswith("\n")
            and len(text) == len("<think> </think> 0\n")
        )
        drawn.add(text[-2])
        assert not batch.truncated[i]
        assert batch.correct[i] == (text[-2] == batch.problems[i].answer)
        assert batch.rewards_N[i] == float(batch.correct[i])  # 19 tokens, within the budget of 20
    assert len(drawn) > 3  # drawn across the answers, not one fixed guess
    seqs, plens = batch.sequences(forced)
    for row, s in zip(forced, score_tokens(model, seqs, plens), strict=True):
        torch.testing.assert_close(
            batch.logp_rollout_NT[row, : batch.lengths[row]], s.logprobs.double(), atol=1e-9, rtol=0
        )


def test_a_task_without_an_answer_space_cannot_guess():
    from ringzero.tasks.config import ArithmeticTask as A

    assert SyntheticArithmetic(A(operation="digitsum", digits=3)).answer_space() == [
        str(d) for d in range(10)
    ]
    assert SyntheticArithmetic(A(operation="parity", digits=3)).answer_space() == ["0", "1"]
    assert SyntheticArithmetic(A(operation="add", digits=3)).answer_space() is None
    with pytest.raises(Exception, match="no answers to guess from"):
        Opening((1,), samples=1, guesses=())
