"""add: column traces with carries, hand examples and round trips."""

import random

from hypothesis import given
from hypothesis import strategies as st

from ringzero.tasks.base import StepCheck
from ringzero.tasks.long_add import LongAddition


def test_two_operand_trace_by_hand():
    op = LongAddition(4, 2)
    inst = (4821, 1657)
    assert op.question(inst) == "4821+1657"
    assert op.answer(inst) == "6478"
    assert op.trace_steps(inst, verbose=False) == ["1+7=8", "2+5=7", "8+6=14", "4+1+c1=6"]
    assert op.trace_steps(inst, verbose=True) == ["1+7=8 r8", "2+5=7 r78", "8+6=14 r478", "4+1+c1=6 r6478"]


def test_three_operands_carry_more_than_one():
    op = LongAddition(3, 3)
    inst = (999, 999, 999)
    assert op.answer(inst) == "2997"
    assert op.trace_steps(inst, verbose=False) == ["9+9+9=27", "9+9+9+c2=29", "9+9+9+c2=29"]


def test_step_check_catches_carry_sum_partial_and_column_slips():
    op = LongAddition(4, 2)
    inst = (4821, 1657)
    assert op.check_steps("1+7=8 2+5=7 8+6=14 4+1=5", inst) == StepCheck(4, 3)  # carry dropped
    assert op.check_steps("1+7=8 2+5=8 8+6=14 4+1+c1=6", inst) == StepCheck(4, 3)  # bad sum
    # r77 is wrong; later partials extend the claimed r77 consistently, so only that step fails
    assert op.check_steps("1+7=8 r8 2+5=7 r77 8+6=14 r477 4+1+c1=6 r6477", inst) == StepCheck(4, 3)
    assert op.check_steps("1+7=8 2+6=8 8+6=14 4+1+c1=6", None) == StepCheck(4, 4)
    assert op.check_steps("1+7=8 2+6=8 8+6=14 4+1+c1=6", inst) == StepCheck(4, 3)  # 6 is not in column 2
    assert op.check_steps("1+7=8 ?? 2+5=7", inst) == StepCheck(3, 1)


def test_wrong_answers_differ_and_keep_the_length():
    op = LongAddition(5, 2)
    rng = random.Random(1)
    for _ in range(300):
        inst = op.sample(rng)
        wrong = op.wrong_answer(inst, rng)
        assert wrong != op.answer(inst) and len(wrong) == len(op.answer(inst)) and wrong[0] != "0"


shapes = st.tuples(st.integers(1, 14), st.integers(2, 5))


@given(shape=shapes, verbose=st.booleans(), seed=st.integers(0, 2**32))
def test_generated_traces_always_check(shape, verbose, seed):
    digits, operands = shape
    op = LongAddition(digits, operands)
    inst = op.sample(random.Random(seed))
    assert all(len(str(x)) == digits for x in inst)
    assert op.check_steps(" ".join(op.trace_steps(inst, verbose)), inst) == StepCheck(digits, digits)


@given(shape=shapes, seed=st.integers(0, 2**32), data=st.data())
def test_a_corrupted_column_sum_fails(shape, seed, data):
    digits, operands = shape
    op = LongAddition(digits, operands)
    inst = op.sample(random.Random(seed))
    steps = op.trace_steps(inst, verbose=False)
    k = data.draw(st.integers(0, digits - 1))
    lhs, total = steps[k].split("=")
    steps[k] = f"{lhs}={int(total) + data.draw(st.sampled_from([-1, 1, 10]))}"
    assert op.check_steps(" ".join(steps), inst).correct < digits
