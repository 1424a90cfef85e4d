"""The depth dial of the digitsum task: mixed lengths (``min_digits``), difficulty buckets, and the short
trace form (two digits a step) that the corpus can teach and the step checker verifies."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from ringzero.config import parse_config
from ringzero.errors import ConfigError
from ringzero.tasks.arithmetic import SyntheticArithmetic
from ringzero.tasks.base import split_trace
from ringzero.tasks.config import ArithmeticTask
from ringzero.tasks.corpus import CorpusGenerator


def task(**kw) -> SyntheticArithmetic:
    return SyntheticArithmetic(ArithmeticTask(operation="digitsum", digits=16, min_digits=4, **kw))


def test_problems_mix_every_length_of_the_range_and_bucket_by_thirds():
    t = task()
    problems = t.prompts("train", 2000, 0)
    lengths = Counter(t.difficulty(p) for p in problems)
    assert set(lengths) == set(range(4, 17))
    assert min(lengths.values()) > 2000 / 13 / 2  # uniform, roughly
    buckets = {t.difficulty(p): t.difficulty_bucket(p) for p in problems}
    assert [buckets[n] for n in (4, 8, 9, 12, 13, 16)] == ["easy", "easy", "medium", "medium", "hard", "hard"]
    for p in problems[:50]:
        assert p.prompt.count("=") == t.difficulty(p)  # the question lists that many labelled digits


def test_a_single_length_task_has_no_difficulty():
    t = SyntheticArithmetic(ArithmeticTask(operation="digitsum", digits=8))
    p = t.prompts("train", 1, 0)[0]
    assert t.difficulty(p) is None and t.difficulty_bucket(p) is None


@pytest.mark.parametrize("n", [4, 5, 15, 16])
def test_the_short_trace_is_correct_checked_and_shorter(n):
    t = task()
    rng = random.Random(n)
    instance = tuple(rng.randrange(10) for _ in range(n))
    p = t.problem(instance)
    short, terse = t.worked_response(p, verbose=False, short=True), t.worked_response(p, verbose=False)
    assert t.reward(p, short) == 1.0
    check = t.step_check(short, p)
    assert (check.steps, check.correct) == ((n + 1) // 2, (n + 1) // 2)
    body, _ = split_trace(short)
    assert len(body.split()) == (n + 1) // 2 and len(body) < 0.8 * len(split_trace(terse)[0])
    state = 0
    for i, step in enumerate(body.split()):  # each step adds its digits to the running state
        digits = instance[2 * i : 2 * i + 2]
        state = (state + sum(digits)) % 10
        assert step.endswith(f">{state}") and step.startswith("abcdefghijklmnop"[2 * i : 2 * i + len(digits)])


def test_a_wrong_short_step_is_caught_and_the_next_is_judged_from_its_claim():
    t = task()
    p = t.problem((7, 3, 9, 1, 2, 2))
    good = t.step_check("<think> ab=73>0 cd=91>0 ef=22>4 </think> 4", p)
    bad = t.step_check(
        "<think> ab=73>1 cd=91>1 ef=22>5 </think> 5", p
    )  # first step off by one, the rest follow it
    assert (good.steps, good.correct) == (3, 3)
    assert (bad.steps, bad.correct) == (3, 2)
    wrong_digits = t.step_check("<think> ab=74>1 cd=91>1 ef=22>5 </think> 5", p)
    assert wrong_digits.correct == 2  # the pair must be the question's digits


def test_the_corpus_writes_short_traces_at_their_share():
    t = task(trace_fraction=1.0, short_fraction=0.5, filler_fraction=0.0, drill_fraction=0.0)
    gen = CorpusGenerator(t)
    rng = random.Random(0)
    answers = [gen.answer_text(p, rng) for p in t.prompts("train", 400, 1)]
    short = [
        a
        for a in answers
        if "=" in a
        and split_trace(a)[0].split()[0].count("=") == 1
        and len(split_trace(a)[0].split()[0].split("=")[0]) == 2
    ]
    assert 0.4 < len(short) / len(answers) < 0.6


@pytest.mark.parametrize(
    "task_cfg, expected",
    [
        ({"operation": "digitsum", "digits": 8, "min_digits": 9}, "min_digits: must be at most digits (8)"),
        ({"operation": "add", "digits": 4, "min_digits": 2}, "'add' has neither a mixed length"),
        ({"operation": "add", "digits": 4, "short_fraction": 0.2}, "'add' has neither a mixed length"),
    ],
)
def test_knobs_that_cannot_apply_are_refused_by_name(task_cfg, expected):
    data = {
        "run": {"name": "t"},
        "model": {
            "vocab_size": 64,
            "hidden_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "layout": "LM",
        },
        "task": {"kind": "arithmetic", **task_cfg},
        "stages": [{"name": "base", "kind": "pretrain", "steps": 1}],
    }
    with pytest.raises(ConfigError) as info:
        parse_config(data, "t.yaml")
    assert any(expected in problem for problem in info.value.problems), info.value.problems
