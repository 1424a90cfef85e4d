"""SyntheticArithmetic: prompts and splits, the reward, the step checker on full responses, tiers."""

import random

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ringzero.errors import RingzeroError
from ringzero.tasks import make_task
from ringzero.tasks.arithmetic import SyntheticArithmetic, in_eval_split
from ringzero.tasks.base import ALPHABET, StepCheck
from ringzero.tasks.config import ArithmeticTask


@pytest.fixture(scope="module")
def task() -> SyntheticArithmetic:
    return make_task(ArithmeticTask(operation="digitsum", digits=4))


@pytest.fixture(scope="module")
def problem(task):
    return task.problem((7, 3, 9, 1))


def test_problem_prompt_answer_and_stop(task, problem):
    assert problem.prompt == "q: sum mod 10: a=7 b=3 c=9 d=1\na: "
    assert problem.answer == "0"
    assert task.stop == ("\n",)


@pytest.mark.parametrize(
    ("response", "reward"),
    [
        ("0", 1.0),
        (" 0 \n", 1.0),
        ("0\nq: something else", 1.0),  # only the first line is the response
        ("5", 0.0),
        ("00", 0.0),
        ("", 0.0),
        ("<think> a=7>7 b=3>0 c=9>9 d=1>0 </think> 0", 1.0),
        ("<think> a=7>7 b=3>0 c=9>9 d=1>0 </think> 0\n", 1.0),
        ("<think> a=7>1 </think> 0", 1.0),  # outcome reward: wrong steps, right answer
        ("<think> a=7>7 b=3>0 c=9>9 d=1>0 </think> 9", 0.0),
        ("<think> a=7>7 b=3>0 c=9>9 d=1>0 0", 0.0),  # unclosed trace: no answer
        ("<think> a=7>7\n</think> 0", 0.0),  # the trace must close on the response's line
    ],
)
def test_reward(task, problem, response, reward):
    assert task.reward(problem, response) == reward


def test_worked_and_direct_responses_earn_the_reward(task, problem):
    assert task.reward(problem, task.direct_response(problem)) == 1.0
    for verbose in (False, True):
        worked = task.worked_response(problem, verbose)
        assert task.uses_trace(worked) and task.reward(problem, worked) == 1.0
        assert task.step_check(worked, problem) == StepCheck(4, 4)
    assert not task.uses_trace("0")


def test_step_check_on_responses(task, problem):
    assert task.step_check("0", problem) == StepCheck(0, 0)
    assert task.step_check("<think> a=7>7 b=3>1 </think> 1", problem) == StepCheck(2, 1)
    assert task.step_check("<think> a=7>7 b=3>1", None) == StepCheck(2, 1)  # unclosed: steps still count


def test_train_and_eval_splits_are_disjoint_and_reproducible():
    task = make_task(ArithmeticTask(operation="digitsum", digits=3))
    train = task.prompts("train", 3000, random.Random(0))
    evals = task.prompts("eval", 300)
    assert {p.id for p in train}.isdisjoint({p.id for p in evals})
    assert all(in_eval_split(p.id) for p in evals) and not any(in_eval_split(p.id) for p in train)
    assert [p.id for p in task.prompts("eval", 50)] == [p.id for p in evals[:50]]
    # pinned, not compared with itself in one process: the same seed draws the same prompts on any machine
    assert [p.id for p in task.prompts("train", 5, 7)] == [
        "digitsum:526",
        "digitsum:018",
        "digitsum:159",
        "digitsum:083",
        "digitsum:016",
    ]
    numpy_draw = task.prompts("train", 20, np.random.default_rng(3))
    assert len({p.id for p in numpy_draw}) > 10


def test_eval_holds_out_about_a_tenth_of_the_space():
    keys = [f"digitsum:{i:03d}" for i in range(1000)]
    share = sum(map(in_eval_split, keys)) / len(keys)
    assert 0.07 < share < 0.13


def test_a_space_too_small_to_split_is_refused():
    task = make_task(ArithmeticTask(operation="parity", digits=2))  # none of 00, 01, 10, 11 hashes to eval
    with pytest.raises(RingzeroError, match="too small to split"):
        task.prompts("eval", 1)
    assert {p.answer for p in task.prompts("train", 40, 0)} == {"0", "1"}


def test_bad_split_and_missing_train_rng_are_errors(task):
    with pytest.raises(ValueError, match="split"):
        task.prompts("test", 1, 0)
    with pytest.raises(ValueError, match="rng"):
        task.prompts("train", 1)


def test_tier_tag_opens_the_prompt_and_keeps_the_answer(task, problem):
    tiered = task.with_tier(problem, "[fast]")
    assert tiered.prompt == "[fast] q: sum mod 10: a=7 b=3 c=9 d=1\na: "
    assert tiered.tier == "[fast]" and tiered.answer == problem.answer and tiered.id == problem.id
    assert task.reward(tiered, "0") == 1.0
    with pytest.raises(ValueError, match="already"):
        task.with_tier(tiered, "[deep]")


@pytest.mark.parametrize(("operation", "digits"), [("digitsum", 12), ("parity", 20), ("add", 10)])
def test_everything_a_task_writes_fits_the_alphabet(operation, digits):
    task = make_task(ArithmeticTask(operation=operation, digits=digits))
    for p in task.prompts("train", 50, 0) + task.prompts("eval", 10):
        text = (
            task.with_tier(p, "[deep]").prompt
            + task.worked_response(p, True)
            + task.worked_response(p, False)
        )
        assert set(text) <= set(ALPHABET)
    assert len(ALPHABET) == len(set(ALPHABET)) <= 60  # room for special tokens in a 64-symbol vocab


@given(seed=st.integers(0, 2**32), verbose=st.booleans(), op=st.sampled_from(["digitsum", "parity", "add"]))
def test_every_generated_worked_response_is_rewarded_and_checks(seed, verbose, op):
    task = make_task(ArithmeticTask(operation=op, digits=9))
    [p] = task.prompts("train", 1, seed)
    worked = task.worked_response(p, verbose)
    steps = task.step_check(worked, p)
    assert task.reward(p, worked) == 1.0 and steps.correct == steps.steps == 9


def test_default_lengths_match_the_documented_budget():
    task = make_task(ArithmeticTask())
    [p] = task.prompts("eval", 1)
    assert len(p.prompt) == 66 and len(task.direct_response(p)) == 1
    assert len(task.worked_response(p, verbose=False)) == 90
    assert 164 <= len(task.worked_response(p, verbose=True)) <= 170
