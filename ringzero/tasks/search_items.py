"""The row-search problem and its written forms, shared by the task (``ringzero.tasks.row_search``) and its
corpus (``ringzero.tasks.search_corpus``): a problem, its question line and a correct try of one row.

``question``: ``find 3: a=52 b=16 c=38``. ``try_text``: ``b=16 326 n``, the row copied by its label, then
what is left of the target as each digit is taken away mod 10 (``remainders``), then ``y`` when nothing
is left, else ``n``.
"""

from __future__ import annotations

import string
from dataclasses import dataclass

LABELS = string.ascii_lowercase
SEP = "="
MODULUS = 10
HIT, MISS = "y", "n"


@dataclass(frozen=True)
class SearchItem:
    """One problem: the target digit, the rows (digit strings, in label order), the answer row and the cue
    row (the one row that contains the target digit)."""

    target: int
    rows: tuple[str, ...]
    answer: int
    cue: int

    @property
    def label(self) -> str:
        return LABELS[self.answer]


def remainders(target: int, digits: str) -> str:
    """``(3, "16")`` -> ``326``: what is left of the target as each digit is taken away, mod 10, starting
    from the target itself. The row's digits sum to the target exactly when the last one is 0."""
    out, left = [str(target)], target
    for d in digits:
        left = (left - int(d)) % MODULUS
        out.append(str(left))
    return "".join(out)


def digit_sum(digits: str) -> int:
    return sum(map(int, digits)) % MODULUS


def try_text(item: SearchItem, row: int) -> str:
    """A correct try of ``row``: ``b=16 326 n`` for target 3."""
    digits = item.rows[row]
    return (
        f"{LABELS[row]}{SEP}{digits} {remainders(item.target, digits)} {HIT if row == item.answer else MISS}"
    )


def question(item: SearchItem) -> str:
    rows = " ".join(f"{LABELS[i]}{SEP}{r}" for i, r in enumerate(item.rows))
    return f"find {item.target}: {rows}"
