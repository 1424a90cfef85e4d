"""Answer extraction and numeric normalization for free-form responses."""

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ringzero.tasks.answers import answers_match, extract_answer, normalize_answer, parse_number


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("She sold 48/2 = 24 clips.\n#### 72", "72"),
        ("so the total is \\boxed{1,234} dollars", "1,234"),
        ("\\boxed{\\frac{1}{2}} and later \\boxed{7}", "7"),
        ("\\boxed{x^{2}}", "x^{2}"),
        ("work work\nA: 42", "42"),
        ("answer: -3.5\n", "-3.5"),
        ("Answer : 12 apples", "12 apples"),
        ("<think> 6*7 = 42 </think> 42", "42"),
        ("<think> \\boxed{1} </think> \\boxed{2}", "2"),
        ("42", "42"),
        ("  17  \n", "17"),
    ],
)
def test_extract(text, answer):
    assert extract_answer(text) == answer


@pytest.mark.parametrize(
    "text",
    [
        "<think> the answer is 42",  # unclosed trace
        "\\boxed{42",  # unbalanced
        "I think it is 42 but maybe 43, let me see how this goes on for a while",
        "first line\nsecond line",
        "",
    ],
)
def test_no_answer(text):
    assert extract_answer(text) is None


@pytest.mark.parametrize(
    ("raw", "canonical"),
    [
        ("1,234", "1234"),
        ("1,234,567.00", "1234567"),
        ("+7", "7"),
        ("-0", "0"),
        ("007", "7"),
        ("3.0", "3"),
        ("0.5", "1/2"),
        ("6/8", "3/4"),
        ("\\frac{3}{4}", "3/4"),
        ("\\dfrac{-3}{4}", "-3/4"),
        ("$12$", "12"),
        ("\\$5.", "5"),
        (".25", "1/4"),
        ("1/0", "1/0"),  # not a number: kept as text
        ("  Paris. ", "paris"),
        ("New   York", "new york"),
        ("12,34", "12,34"),  # not a thousands separator
    ],
)
def test_normalize(raw, canonical):
    assert normalize_answer(raw) == canonical


def test_match_compares_values_not_spellings():
    assert answers_match("1,000", "1000.0")
    assert answers_match("0.75", "3/4")
    assert not answers_match("0.333", "1/3")
    assert not answers_match(None, "1")
    assert not answers_match("-5", "5")


@given(st.integers(-(10**12), 10**12))
def test_integers_in_any_common_spelling_normalize_alike(n):
    spellings = [str(n), f"{n:,}", f"{n}.0", f"{n}.00"] + ([f"+{n}"] if n >= 0 else [])
    assert {normalize_answer(s) for s in spellings} == {str(n)}


@given(st.fractions(max_denominator=1000))
def test_fractions_round_trip(value):
    assert parse_number(f"{value.numerator}/{value.denominator}") == value
    assert normalize_answer(str(value)) == normalize_answer(
        f"\\frac{{{value.numerator}}}{{{value.denominator}}}"
    )
    assert parse_number(normalize_answer(str(value))) == Fraction(value)
