"""Checked traces: per-step verbosity, first-pass slips and the check passes that find and fix them.

The tiny task's depth is built from these: an unchecked slip gives a wrong answer, a check gives the
right one at about twice the length, and verbose steps never slip."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ringzero.config import parse_config
from ringzero.errors import ConfigError
from ringzero.tasks.arithmetic import SyntheticArithmetic
from ringzero.tasks.base import StepCheck
from ringzero.tasks.config import ArithmeticTask
from ringzero.tasks.corpus import CorpusGenerator
from ringzero.tasks.running_sum import WorkedPlan, digitsum

OP = digitsum(4)
INST = (7, 3, 9, 1)


def task(**kw) -> SyntheticArithmetic:
    base = dict(
        operation="digitsum",
        digits=8,
        min_digits=2,
        verbosity="step",
        verbose_fraction=0.4,
        check_weights=[0.5, 0.3, 0.2],
        slip_rate=0.3,
        slip_from=3,
    )
    return SyntheticArithmetic(ArithmeticTask(**{**base, **kw}))


def assert_slip_fixed_by_the_check(op, want_body: str) -> str:
    """A first pass that slips at b, then a check pass: the trace ``want_body``, its slip one wrong step
    (later steps hold against the state it claimed), and the check's right answer. Returns the trace."""
    plan = WorkedPlan(passes=((False,) * 4, (False, True, False, False)), slips={1: 2})
    body, answer = op.planned_body(INST, plan)
    assert body == want_body
    assert answer == "0" == op.answer(INST)
    assert op.check_steps(body, INST) == StepCheck(8, 7)
    assert op.final_pass_holds(body, INST, answer)
    assert [r[2] for r in op.pass_results(body, INST)] == [2, 0]
    return body


def test_a_slip_carries_on_and_a_check_fixes_it():
    assert_slip_fixed_by_the_check(OP, "a=7>7 b=3>2 c=9>1 d=1>2 check a=7>7 b=3 7+3=10>0 c=9>9 d=1>0")


def test_an_unchecked_slip_answers_wrong_and_does_not_verify():
    t = task()
    p = t.problem(INST)
    text = t.worked_response(p, plan=WorkedPlan(passes=((False,) * 4,), slips={2: 5}))
    assert t.reward(p, text) == 0.0
    assert not t.verified(text, p)
    fixed = t.worked_response(p, plan=WorkedPlan(passes=((False,) * 4, (False,) * 4), slips={2: 5}))
    assert t.reward(p, fixed) == 1.0 and t.verified(fixed, p)


def test_verified_needs_the_last_pass_complete_and_the_answer_its_state():
    t = task()
    p = t.problem(INST)
    good = t.worked_response(p, plan=WorkedPlan(passes=((False,) * 4,)))
    assert t.verified(good, p)
    assert not t.verified(good.replace("</think> 0", "</think> 3"), p)  # answer is not the pass's state
    assert not t.verified("<think> a=7>7 b=3>0 c=9>9 </think> 9", p)  # a digit left out
    assert not t.verified("<think> a=7>7 b=3>0 c=9>9 d=1>0 check </think> 0", p)  # an empty check
    assert not t.verified("0", p)  # no trace at all


def test_only_terse_first_pass_steps_may_slip():
    with pytest.raises(ValueError, match="only terse steps"):
        WorkedPlan(passes=((True, False),), slips={0: 1})
    with pytest.raises(ValueError, match="only terse steps"):
        WorkedPlan(passes=((False, False),), slips={2: 1})


def corpus_traces(t: SyntheticArithmetic, n: int, seed: int = 0):
    gen, rng = CorpusGenerator(t), random.Random(seed)
    for p in t.prompts("train", n, seed):
        yield p, gen.worked(p, rng)


def test_corpus_plans_draw_verbosity_per_step_checks_by_weight_and_slips_from_slip_from():
    t = task()
    gen, rng = CorpusGenerator(t), random.Random(0)
    plans = [gen.plan(8, rng) for _ in range(4000)]
    checks = Counter(p.checks for p in plans)
    assert abs(checks[0] / 4000 - 0.5) < 0.03 and abs(checks[2] / 4000 - 0.2) < 0.03
    assert sum(len(set(p.passes[0])) == 2 for p in plans) > 0.8 * 4000  # both forms inside one pass
    verbose = [v for p in plans for v in p.passes[0]]
    assert abs(sum(verbose) / len(verbose) - 0.4) < 0.02
    slips = Counter(i for p in plans for i in p.slips)
    assert min(slips) == 2 and set(slips) == set(range(2, 8))  # slip_from 3 (1-based): steps 0 and 1 never
    terse_late = sum(not v for p in plans for v in p.passes[0][2:])
    assert abs(sum(slips.values()) / terse_late - 0.3) < 0.02  # slip_rate per terse step


def test_per_trace_verbosity_keeps_one_form_per_pass():
    t = task(verbosity="trace")
    gen, rng = CorpusGenerator(t), random.Random(0)
    assert all(len(set(ps)) == 1 for p in (gen.plan(6, rng) for _ in range(500)) for ps in p.passes)


def test_check_passes_always_hold_so_checked_corpus_traces_are_right():
    t = task()
    for p, text in list(corpus_traces(t, 1500, seed=1)):
        if " check " in text:
            assert t.reward(p, text) == 1.0 and t.verified(text, p)


def test_without_the_new_knobs_the_corpus_stream_is_unchanged():
    old = SyntheticArithmetic(ArithmeticTask(operation="digitsum", digits=8, min_digits=2))
    explicit = SyntheticArithmetic(
        ArithmeticTask(
            operation="digitsum", digits=8, min_digits=2, verbosity="trace", check_weights=None, slip_rate=0.0
        )
    )
    a = CorpusGenerator(old).documents(200, 3)
    b = CorpusGenerator(explicit).documents(200, 3)
    assert a == b
    assert not any(" check " in d for d in a)


@given(inst=st.lists(st.integers(0, 9), min_size=2, max_size=12).map(tuple), data=st.data())
def test_any_plan_renders_a_trace_the_checker_accounts_for(inst, data):
    op = digitsum(len(inst))
    n = len(inst)
    passes = tuple(
        tuple(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)))
        for _ in range(data.draw(st.integers(1, 3)))
    )
    terse = [i for i in range(n) if not passes[0][i]]
    slips = {i: data.draw(st.integers(1, 9)) for i in terse if data.draw(st.booleans())}
    body, answer = op.planned_body(inst, WorkedPlan(passes, slips))
    checked = op.check_steps(body, inst)
    assert checked.steps == n * len(passes)
    assert checked.correct == checked.steps - len(slips)
    # unchecked slips are wrong unless their offsets happen to cancel mod 10
    assert (answer == op.answer(inst)) == (len(passes) > 1 or sum(slips.values()) % 10 == 0)
    assert op.final_pass_holds(body, inst, answer) == (len(passes) > 1 or not slips)


def test_a_reverse_check_reads_the_digits_backwards_and_fixes_a_slip():
    body = assert_slip_fixed_by_the_check(
        digitsum(4, check_order="reverse"), "a=7>7 b=3>2 c=9>1 d=1>2 check d=1>1 c=9 1+9=10>0 b=3>3 a=7>0"
    )
    # no state of the check is the first pass's state at the same label: it cannot be copied
    first = dict(step.split(">") for step in body.split(" check ")[0].split())
    assert all(first.get(step.split(">")[0]) != step.split(">")[1] for step in ["d=1>1", "b=3>3"])


def test_a_reverse_check_must_start_at_the_last_digit_and_cover_every_one():
    op = digitsum(4, check_order="reverse")
    first = "a=7>7 b=3>0 c=9>9 d=1>0"
    assert op.final_pass_holds(f"{first} check d=1>1 c=9>0 b=3>3 a=7>0", INST, "0")
    assert not op.final_pass_holds(f"{first} check c=9>9 b=3>2 a=7>9", INST, "9")  # d left out
    assert not op.final_pass_holds(f"{first} check d=1>1 c=9>0 b=3>3", INST, "3")  # a left out
    assert not op.final_pass_holds(f"{first} check d=1>1 c=9>0 b=3>4 a=7>1", INST, "1")  # a wrong state
    assert not op.final_pass_holds(f"{first} check d=1>1 b=3>4 c=9>3 a=7>0", INST, "0")  # labels out of order


@given(inst=st.lists(st.integers(0, 9), min_size=2, max_size=12).map(tuple), data=st.data())
def test_any_plan_with_reverse_checks_renders_a_trace_the_checker_accounts_for(inst, data):
    op = digitsum(len(inst), check_order="reverse")
    n = len(inst)
    passes = tuple(
        tuple(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)))
        for _ in range(data.draw(st.integers(1, 3)))
    )
    slips = {
        i: data.draw(st.integers(1, 9)) for i in range(n) if not passes[0][i] and data.draw(st.booleans())
    }
    body, answer = op.planned_body(inst, WorkedPlan(passes, slips))
    checked = op.check_steps(body, inst)
    assert checked.steps == n * len(passes) and checked.correct == checked.steps - len(slips)
    assert op.final_pass_holds(body, inst, answer) == (len(passes) > 1 or not slips)
    if len(passes) > 1:
        assert answer == op.answer(inst)


def test_reverse_checked_corpus_traces_are_right_and_the_order_enters_the_identity_only_when_set():
    from ringzero.pipeline.identity import said

    t = task(check_order="reverse")
    checked = [(p, text) for p, text in corpus_traces(t, 1500, seed=2) if " check " in text]
    assert checked and all(t.reward(p, text) == 1.0 and t.verified(text, p) for p, text in checked)
    assert any(text.split(" check ")[1].split()[0] != "a=" + text.split("a=")[1][0] for _, text in checked)
    base = {"run": {"name": "r"}, "stages": [{"name": "base", "kind": "pretrain", "steps": 1}]}
    fields = said(
        parse_config({**base, "task": {"kind": "arithmetic", "check_order": "forward"}}).task.model_dump(),
        "task",
    )
    assert "check_order" not in fields
    fields = said(
        parse_config({**base, "task": {"kind": "arithmetic", "check_order": "reverse"}}).task.model_dump(),
        "task",
    )
    assert fields["check_order"] == "reverse"


def test_an_implicit_terse_step_reads_its_digit_without_writing_it_and_is_judged_against_the_problem():
    op = digitsum(4, terse_form="implicit")
    assert op.trace_steps(INST, verbose=False) == ["a>7", "b>0", "c>9", "d>0"]
    assert op.trace_steps(INST, verbose=True) == digitsum(4).trace_steps(
        INST, verbose=True
    )  # verbose unchanged
    plan = WorkedPlan(passes=((False, True, False, False),), slips={2: 3})
    body, answer = op.planned_body(INST, plan)
    assert body == "a>7 b=3 7+3=10>0 c>2 d>3"
    assert op.check_steps(body, INST) == StepCheck(4, 3)  # c>2: 0 + 9 is 9, not 2
    assert not op.final_pass_holds(body, INST, answer)
    assert op.final_pass_holds("a>7 b>0 c>9 d>0", INST, "0")
    assert not op.final_pass_holds("a>7 b>0 c>9 d>1", INST, "1")
    assert not op.final_pass_holds("a>7 c>0 b>9 d>0", INST, "0")  # labels out of order
    assert op.check_steps("a>7 b>0 c>9 d>0", None) == StepCheck(4, 4)  # without the problem: labels only


def test_verbose_checks_write_every_step_out_and_leave_the_first_pass_stream_alone():
    t = task(check_verbosity="verbose", check_order="reverse", terse_form="implicit")
    gen, rng = CorpusGenerator(t), random.Random(0)
    plans = [gen.plan(6, rng) for _ in range(2000)]
    assert any(p.checks for p in plans)
    assert all(all(all(step) for step in p.passes[1:]) for p in plans)
    assert sum(v for p in plans for v in p.passes[0]) < 0.5 * 6 * 2000  # first passes keep their draw
    drawn = [
        g.plan(6, r)
        for g, r in [(CorpusGenerator(task(check_order="reverse")), random.Random(0))]
        for _ in range(1)
    ]
    assert drawn[0].passes[0] == plans[0].passes[0] and drawn[0].slips == plans[0].slips
    for p, text in corpus_traces(t, 800, seed=4):
        assert t.reward(p, text) == 1.0 or " check " not in text
        if " check " in text:
            assert t.verified(text, p) and all(
                "+" in step for step in text.split(" check ")[1].split("</think>")[0].split(">")[:-1]
            )


@pytest.mark.parametrize(
    "bad,field",
    [
        ({"check_weights": [0.5, 0.4]}, "check_weights"),
        ({"check_weights": [1.2, -0.2]}, "check_weights"),
        ({"slip_rate": 0.1, "slip_from": 9}, "slip_from"),
        ({"operation": "add", "min_digits": None, "verbosity": "step"}, "verbosity"),
        ({"operation": "add", "min_digits": None, "check_order": "reverse"}, "verbosity"),
        ({"check_order": "backwards"}, "check_order"),
        ({"operation": "add", "min_digits": None, "terse_form": "implicit"}, "verbosity"),
        ({"terse_form": "hidden"}, "terse_form"),
        ({"check_verbosity": "loud"}, "check_verbosity"),
    ],
)
def test_bad_knobs_are_refused_naming_the_field(bad, field):
    cfg = {"kind": "arithmetic", "operation": "digitsum", "digits": 8, **bad}
    with pytest.raises(ConfigError, match=field):
        parse_config(
            {"run": {"name": "t"}, "model": {}, "task": cfg, "stages": [{"name": "b", "kind": "pretrain"}]}
        )
