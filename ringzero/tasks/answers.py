"""Final-answer extraction and normalization for free-form (GSM8K-style) responses.

Extraction looks, in order, for the last ``\\boxed{...}``, the last ``#### x`` line, the last ``A:``
or ``answer:`` line, and finally a response that is nothing but the answer. There is deliberately no
"last number anywhere" fallback: it would reward responses that spray numbers. Text after a closing
``</think>`` is the answer part; an unclosed trace has no answer.

Numbers compare by value: ``1,234`` = ``1234.0`` = ``+1234``; ``0.5`` = ``1/2`` = ``\\frac{1}{2}``.
"""

from __future__ import annotations

import re
from fractions import Fraction

from ringzero.tasks.base import split_trace

_HASHES = re.compile(r"####\s*(.+)")
_ANSWER_LINE = re.compile(r"^\s*(?:a|answer)\s*:\s*(.+?)\s*$", re.IGNORECASE | re.MULTILINE)
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_FRAC = re.compile(r"^\\d?frac\{([^{}]+)\}\{([^{}]+)\}$")
_NUMBER = re.compile(r"^[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:/[+-]?\d+)?$")
_WRAPPERS = ("\\$", "$", "\\(", "\\)")  # "\\$" before "$", or "\\$5" leaves a stray backslash
_MAX_BARE_ANSWER = 40
"""A response without any marker counts as an answer only if it is this short (a number, a word)."""


def _last_boxed(text: str) -> str | None:
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    i = start + len("\\boxed{")
    depth = 1
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j]
    return None  # unbalanced braces: not a usable answer


def extract_answer(text: str) -> str | None:
    """The final answer in ``text``, unnormalized, or None when there is none."""
    body, after = split_trace(text)
    if after is None:
        return None
    if "\\boxed{" in after:
        return _last_boxed(after)  # an unbalanced box is no answer, not a bare one
    if hashes := _HASHES.findall(after):
        return hashes[-1].strip()
    if lines := _ANSWER_LINE.findall(after):
        return lines[-1]
    bare = after.strip()
    if bare and len(bare) <= _MAX_BARE_ANSWER and "\n" not in bare:
        return bare
    return None


def parse_number(text: str) -> Fraction | None:
    s = text.strip()
    for w in _WRAPPERS:
        s = s.replace(w, "")
    s = _THOUSANDS.sub("", s.strip().rstrip("."))
    if m := _FRAC.match(s):
        s = f"{m[1].strip()}/{m[2].strip()}"
    if not _NUMBER.match(s):
        return None
    try:
        return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None


def normalize_answer(text: str) -> str:
    """A canonical string: numbers as ``-12`` or ``3/4``; other text lowercased with single spaces."""
    value = parse_number(text)
    if value is not None:
        return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"
    return " ".join(text.strip().rstrip(".").lower().split())


def answers_match(response_answer: str | None, truth: str) -> bool:
    return response_answer is not None and normalize_answer(response_answer) == normalize_answer(truth)
