"""add: long addition of ``operands`` numbers of ``digits`` digits, traced column by column from the right.

Question: ``4821+1657``; answer ``6478``.
Terse trace:   ``1+7=8 2+5=7 8+6=14 4+1+c1=6`` (column digits in operand order, ``+cK`` the carry in).
Verbose trace: ``1+7=8 r8 2+5=7 r78 8+6=14 r478 4+1+c1=6 r6478`` (adds the result digits so far).

Kept as the familiar baseline. Its direct route is learnable piece by piece (each answer digit depends
mostly on its own column and a short carry chain), which is why it is not the default.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from typing import Any

from ringzero.tasks.base import StepCheck
from ringzero.tasks.operation import Instance, Operation

BASE = 10
_COLUMN = re.compile(r"(\d(?:\+\d)*)(?:\+c(\d))?=(\d+)")
_PARTIAL = re.compile(r"r(\d+)")
MAX_WRONG_DIGITS = 2


class LongAddition(Operation):
    name = "add"

    def __init__(self, digits: int, operands: int):
        self.digits, self.operands = digits, operands

    def sample(self, rng: random.Random) -> Instance:
        low, high = BASE ** (self.digits - 1), BASE**self.digits - 1
        return tuple(rng.randint(low, high) for _ in range(self.operands))

    def key(self, instance: Instance) -> str:
        return f"add:{'+'.join(map(str, instance))}"

    def question(self, instance: Instance) -> str:
        return "+".join(map(str, instance))

    def answer(self, instance: Instance) -> str:
        return str(sum(instance))

    def _column(self, instance: Instance, k: int) -> list[int]:
        """Digits of column ``k`` counted from the right, in operand order."""
        return [int(str(x)[-1 - k]) for x in instance]

    def trace_steps(self, instance: Instance, verbose: bool) -> list[str]:
        steps, carry, partial = [], 0, ""
        for k in range(self.digits):
            column = self._column(instance, k)
            total = sum(column) + carry
            partial = f"{total % BASE}{partial}"
            step = "+".join(map(str, column)) + (f"+c{carry}" if carry else "") + f"={total}"
            steps.append(f"{step} r{partial}" if verbose else step)
            carry = total // BASE
        return steps

    def wrong_answer(self, instance: Instance, rng: random.Random) -> str:
        right = list(self.answer(instance))
        wrong = right[:]
        while wrong == right:
            for _ in range(rng.randint(1, MAX_WRONG_DIGITS)):
                pos = rng.randrange(len(wrong))
                wrong[pos] = str(rng.randrange(1 if pos == 0 else 0, BASE))
        return "".join(wrong)

    def drill(self, rng: random.Random) -> str:
        column = [rng.randrange(BASE) for _ in range(self.operands)]
        carry = rng.randrange(self.operands)  # a column of k digits carries at most k-1
        return "+".join(map(str, column)) + (f"+c{carry}" if carry else "") + f"={sum(column) + carry}"

    def meta(self, instance: Instance) -> Mapping[str, Any]:
        return {"operation": self.name, "operands": instance}

    def instance_from_meta(self, meta: Mapping[str, Any]) -> Instance:
        return tuple(int(x) for x in meta["operands"])

    def check_steps(self, body: str, instance: Instance | None) -> StepCheck:
        tokens = body.split()
        steps = correct = 0
        carry, partial = 0, ""  # what the previous step claimed: errors are counted once, not cascaded
        i = 0
        while i < len(tokens):
            m = _COLUMN.fullmatch(tokens[i])
            i += 1
            if m is None:
                steps += 1
                continue
            column = [int(d) for d in m[1].split("+")]
            carry_in, total = int(m[2] or 0), int(m[3])
            ok = len(column) == self.operands and carry_in == carry and total == sum(column) + carry_in
            if instance is not None:
                ok = ok and steps < self.digits and column == self._column(instance, steps)
            if i < len(tokens) and (p := _PARTIAL.fullmatch(tokens[i])):
                i += 1
                ok = ok and p[1] == f"{total % BASE}{partial}"
                partial = p[1]
            else:
                partial = f"{total % BASE}{partial}"
            steps += 1
            correct += ok
            carry = total // BASE
        return StepCheck(steps, correct)
