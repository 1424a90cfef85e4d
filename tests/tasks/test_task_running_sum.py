"""digitsum and parity: hand examples, generated traces always check, corrupted ones do not."""

import random

from hypothesis import given
from hypothesis import strategies as st

from ringzero.tasks.base import StepCheck
from ringzero.tasks.running_sum import digitsum, parity

DIGITSUM = digitsum(4)


def test_digitsum_renders_question_answer_and_both_trace_forms():
    inst = (7, 3, 9, 1)
    assert DIGITSUM.question(inst) == "sum mod 10: a=7 b=3 c=9 d=1"
    assert DIGITSUM.answer(inst) == "0"
    assert DIGITSUM.trace_steps(inst, verbose=False) == ["a=7>7", "b=3>0", "c=9>9", "d=1>0"]
    assert DIGITSUM.trace_steps(inst, verbose=True) == [
        "a=7 0+7=7>7",
        "b=3 7+3=10>0",
        "c=9 0+9=9>9",
        "d=1 9+1=10>0",
    ]


def test_parity_takes_the_state_mod_two():
    op = parity(3)
    assert op.question((1, 1, 0)) == "parity: a=1 b=1 c=0"
    assert op.answer((1, 1, 0)) == "0"
    assert op.trace_steps((1, 1, 0), verbose=True) == ["a=1 0+1=1>1", "b=1 1+1=2>0", "c=0 0+0=0>0"]


def test_step_check_counts_each_wrong_step_once():
    # b claims state 1 (should be 0); c is checked against the claimed 1, so 1+9=10>0 holds.
    body = "a=7>7 b=3>1 c=9>0 d=1>1"
    assert DIGITSUM.check_steps(body, None) == StepCheck(4, 3)


def test_step_check_against_the_problem_catches_a_copied_wrong_digit():
    body = "a=7>7 b=4>1 c=9>0 d=1>1"  # consistent arithmetic, but the question says b=3
    assert DIGITSUM.check_steps(body, None) == StepCheck(4, 4)
    assert DIGITSUM.check_steps(body, (7, 3, 9, 1)) == StepCheck(4, 3)


def test_step_check_flags_skipped_labels_fragments_and_verbose_slips():
    assert DIGITSUM.check_steps("a=7>7 c=9>6 d=1>7", (7, 3, 9, 1)) == StepCheck(3, 1)
    assert DIGITSUM.check_steps("a=7>7 oops b=3>0", None) == StepCheck(3, 1)  # 'oops' is a wrong step
    assert DIGITSUM.check_steps("a=7 0+7=7>7 b=3 7+3=11>0", None) == StepCheck(2, 1)
    assert DIGITSUM.check_steps("a=7 0+7=7>7 b=3 7+4=11>1", None) == StepCheck(2, 1)  # restated digit differs
    assert DIGITSUM.check_steps("", None) == StepCheck(0, 0)


def test_parity_rejects_digits_that_are_not_bits():
    assert parity(2).check_steps("a=2>0 b=1>1", None) == StepCheck(2, 1)


instances = st.integers(2, 26).flatmap(
    lambda n: st.lists(st.integers(0, 9), min_size=n, max_size=n).map(tuple)
)


@given(inst=instances, verbose=st.booleans())
def test_generated_traces_always_check(inst, verbose):
    op = digitsum(len(inst))
    body = " ".join(op.trace_steps(inst, verbose))
    assert op.check_steps(body, inst) == StepCheck(len(inst), len(inst))
    final_state = body.rsplit(">", 1)[1]
    assert final_state == op.answer(inst) == str(sum(inst) % 10)


@given(inst=instances, verbose=st.booleans(), data=st.data())
def test_a_corrupted_state_fails_its_step(inst, verbose, data):
    op = digitsum(len(inst))
    steps = op.trace_steps(inst, verbose)
    k = data.draw(st.integers(0, len(steps) - 1))
    head, state = steps[k].rsplit(">", 1)
    wrong = data.draw(st.integers(0, 9).filter(lambda v: v != int(state)))
    steps[k] = f"{head}>{wrong}"
    checked = op.check_steps(" ".join(steps), inst)
    assert checked.steps == len(inst)
    assert checked.correct < len(inst)


@given(inst=instances, data=st.data())
def test_a_corrupted_digit_fails_against_the_problem(inst, data):
    op = digitsum(len(inst))
    k = data.draw(st.integers(0, len(inst) - 1))
    other = list(inst)
    other[k] = data.draw(st.integers(0, 9).filter(lambda v: v != inst[k]))
    body = " ".join(op.trace_steps(tuple(other), verbose=data.draw(st.booleans())))
    assert op.check_steps(body, inst).correct == len(inst) - 1


def test_wrong_answers_are_never_right_and_cover_the_other_values():
    rng = random.Random(0)
    inst = (7, 3, 9, 1)
    seen = {DIGITSUM.wrong_answer(inst, rng) for _ in range(500)}
    assert seen == {str(v) for v in range(1, 10)}


def test_drill_facts_are_correct_steps_in_the_trace_notation():
    rng = random.Random(0)
    for _ in range(200):
        fact = DIGITSUM.drill(rng)  # "s+d=t>u"
        s, d = fact.split("=")[0].split("+")
        body = f"a={s} 0+{s}={s}>{s} b={d} {fact}"  # a step that reaches state s, then the fact
        assert DIGITSUM.check_steps(body, None) == StepCheck(2, 2), fact
