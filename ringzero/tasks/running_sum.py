"""digitsum and parity: the sum of n labelled digits mod 10 (or of n bits mod 2), traced as a running sum.

Question (digitsum, n=4): ``sum mod 10: a=7 b=3 c=9 d=1``; answer ``0``.
Terse trace:   ``a=7>7 b=3>0 c=9>9 d=1>0`` (each step: label=digit>new state).
Verbose trace: ``a=7 0+7=7>7 b=3 7+3=10>0 ...`` (adds the step's arithmetic: previous state + digit).
Implicit terse trace (``terse_form: implicit``): ``a>7 b>0 c>9 d>0`` (each step reads its digit by its
label without writing it: the lookup and the addition in one token, the harder step).
Short trace:   ``ab=73>0 cd=91>0`` (two digits per step: half the steps of the terse form, each adding two
digits to the state at once, the harder step; an odd last digit is a terse step).

Checked trace: ``a=7>7 b=3>2 c=9>1 d=1>2 check a=7>7 b=3>0 c=9>9 d=1>0`` (a first pass, then a check
pass that works the sum again from the start; the answer is the last pass's). With ``check_order:
reverse`` a check reads the digits from the last to the first, ``check d=1>1 c=9>0 b=3>3 a=7>0``: its
running states are not the first pass's, so a model cannot copy them (slip included) from the pass it
checks and has to work them out, and its final state is the same sum. A first pass may *slip*:
a terse step writes a wrong state (``b=3>2``) and the pass carries on from it, so an unchecked slip gives
a wrong answer and a check finds and fixes it. Verbose steps, which write the arithmetic out, never
slip. The corpus decides per step (``WorkedPlan``): verbose or terse, slip or not; and per trace how
many check passes follow.

With ``min_digits`` the problems mix lengths (``min_digits`` to ``digits`` digits, uniform): the
difficulty dial of tier RL, since the trace's length grows with it and the short form's error chance too.

The letter labels are there for the trace: a step finds its digit by matching ``label=`` in the
question, the one lookup a small transformer learns most reliably (an induction head), instead of
counting positions. The direct route gets no such help: see ``ringzero.tasks.arithmetic``.
"""

from __future__ import annotations

import random
import re
import string
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ringzero.tasks.base import StepCheck
from ringzero.tasks.operation import Instance, Operation

LABELS = string.ascii_lowercase
_TERSE = re.compile(r"([a-z])=(\d)>(\d)")
_PAIR = re.compile(r"([a-z])([a-z])=(\d)(\d)>(\d)")
_HEAD = re.compile(r"([a-z])=(\d)")
_IMPLICIT = re.compile(r"([a-z])>(\d)")
_LABEL_START = re.compile(r"([a-z])[=>]")
_ARITH = re.compile(r"(\d)\+(\d)=(\d+)>(\d)")
DRILL_FACTS_PER_LINE = (6, 14)
CHECK = "check"
"""The word that opens a check pass inside a trace body."""
CHECK_ORDERS = ("forward", "reverse")
TERSE_FORMS = ("restated", "implicit")


@dataclass(frozen=True)
class WorkedPlan:
    """How one worked trace is written: ``passes[0]`` is the first pass, each later entry a check pass,
    each a per-step tuple of verbose flags; ``slips`` maps a first-pass step index to the offset (1 to
    modulus - 1) its written state is off by. Only terse first-pass steps slip: a verbose step writes the
    arithmetic out, and a check pass is the careful one."""

    passes: tuple[tuple[bool, ...], ...]
    slips: Mapping[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.passes:
            raise ValueError("a worked plan has at least one pass")
        for index in self.slips:
            if not 0 <= index < len(self.passes[0]) or self.passes[0][index]:
                raise ValueError(f"slip at step {index}: only terse steps of the first pass slip")

    @property
    def checks(self) -> int:
        return len(self.passes) - 1


class RunningSum(Operation):
    """Sum of ``digits`` base-``modulus`` digits mod ``modulus``: digitsum (10) or parity (2)."""

    def __init__(
        self,
        name: str,
        digits: int,
        modulus: int,
        header: str,
        min_digits: int | None = None,
        check_order: str = "forward",
        terse_form: str = "restated",
    ):
        if digits > len(LABELS):
            raise ValueError(f"digits: at most {len(LABELS)} labelled digits (got {digits})")
        if check_order not in CHECK_ORDERS:
            raise ValueError(f"check_order: one of {', '.join(CHECK_ORDERS)} (got {check_order!r})")
        if terse_form not in TERSE_FORMS:
            raise ValueError(f"terse_form: one of {', '.join(TERSE_FORMS)} (got {terse_form!r})")
        self.terse_form = terse_form
        self.name, self.digits, self.modulus, self.header = name, digits, modulus, header
        self.check_order = check_order
        self.min_digits = digits if min_digits is None else min_digits
        if not 1 <= self.min_digits <= digits:
            raise ValueError(f"min_digits: between 1 and digits ({digits}), got {self.min_digits}")

    def sample(self, rng: random.Random) -> Instance:
        # one extra draw only with mixed lengths: a fixed-length task keeps its problem (and corpus) stream
        n = self.digits if self.min_digits == self.digits else rng.randint(self.min_digits, self.digits)
        return tuple(rng.randrange(self.modulus) for _ in range(n))

    def key(self, instance: Instance) -> str:
        return f"{self.name}:{''.join(map(str, instance))}"

    def question(self, instance: Instance) -> str:
        items = " ".join(f"{LABELS[i]}={d}" for i, d in enumerate(instance))
        return f"{self.header}: {items}"

    def answer(self, instance: Instance) -> str:
        return str(sum(instance) % self.modulus)

    def trace_steps(self, instance: Instance, verbose: bool) -> list[str]:
        return self.pass_steps(instance, (verbose,) * len(instance))[0]

    def _step(self, i: int, d: int, state: int, new: int, verbose: bool) -> str:
        if verbose:
            return f"{LABELS[i]}={d} {state}+{d}={state + d}>{new}"
        return f"{LABELS[i]}>{new}" if self.terse_form == "implicit" else f"{LABELS[i]}={d}>{new}"

    def pass_steps(
        self,
        instance: Instance,
        verbose: tuple[bool, ...],
        slips: Mapping[int, int] | None = None,
        reverse: bool = False,
    ) -> tuple[list[str], int]:
        """One pass over the digits (last to first if ``reverse``), ``verbose`` per step, with ``slips``
        (step -> offset of the written state); the pass carries on from whatever state it wrote. Returns
        the steps and the final state."""
        steps, state = [], 0
        order = range(len(instance) - 1, -1, -1) if reverse else range(len(instance))
        for k, i in enumerate(order):
            d = instance[i]
            new = (state + d) % self.modulus
            if slips and k in slips:
                new = (new + slips[k]) % self.modulus
            steps.append(self._step(i, d, state, new, verbose[k]))
            state = new
        return steps, state

    def planned_body(self, instance: Instance, plan: WorkedPlan) -> tuple[str, str]:
        """``(trace body, answer)`` of a trace written by ``plan``: the answer is the last pass's state."""
        parts, state = [], 0
        for k, verbose in enumerate(plan.passes):
            steps, state = self.pass_steps(
                instance,
                verbose,
                plan.slips if k == 0 else None,
                reverse=k > 0 and self.check_order == "reverse",
            )
            parts.append(" ".join(steps) if k == 0 else f"{CHECK} {' '.join(steps)}")
        return " ".join(parts), str(state)

    def short_steps(self, instance: Instance) -> list[str]:
        """The short form: two digits per step (``ab=73>0``), an odd last digit as a terse step."""
        steps, state = [], 0
        for i in range(0, len(instance), 2):
            pair = instance[i : i + 2]
            state = (state + sum(pair)) % self.modulus
            labels, digits = "".join(LABELS[i : i + len(pair)]), "".join(map(str, pair))
            steps.append(f"{labels}={digits}>{state}")
        return steps

    def difficulty(self, instance: Instance) -> int:
        return len(instance)

    def wrong_answer(self, instance: Instance, rng: random.Random) -> str:
        right = sum(instance) % self.modulus
        return str(rng.choice([v for v in range(self.modulus) if v != right]))

    def drill(self, rng: random.Random) -> str:
        s, d = rng.randrange(self.modulus), rng.randrange(self.modulus)
        return f"{s}+{d}={s + d}>{(s + d) % self.modulus}"

    def lookup_drill(self, instance: Instance, rng: random.Random) -> str:
        order = list(range(len(instance)))
        if rng.random() < 0.5:  # in trace order half the time; shuffled, only the label can find the digit
            rng.shuffle(order)
        items = " ".join(f"{LABELS[i]}={instance[i]}" for i in order)
        text = f"{self.question(instance)}\nread back: {items}"
        if self.check_order == "reverse":
            # then backwards, the lookups a reverse check makes, as far from the question as a check is
            back = " ".join(f"{LABELS[i]}={instance[i]}" for i in reversed(range(len(instance))))
            text += f"\nand back: {back}"
        return text

    def meta(self, instance: Instance) -> Mapping[str, Any]:
        return {"operation": self.name, "inputs": instance}

    def instance_from_meta(self, meta: Mapping[str, Any]) -> Instance:
        return tuple(int(d) for d in meta["inputs"])

    def check_steps(self, body: str, instance: Instance | None) -> StepCheck:
        """Every step of every pass; a check pass starts again from state 0 and the first label."""
        steps = correct = 0
        for tokens in self._passes(body):
            s, c, _ = self._check_pass(tokens, instance)
            steps, correct = steps + s, correct + c
        return StepCheck(steps, correct)

    def final_pass_holds(self, body: str, instance: Instance, answer: str | None) -> bool:
        """The trace's last pass covers every digit, each step holds, and the answer is its final state: the
        reasoning that decided the answer checks out, whatever an earlier pass slipped on."""
        passes = self._passes(body)
        if not passes or answer is None:
            return False
        steps, correct, state = self._check_pass(passes[-1], instance)
        return steps == correct == len(instance) and answer.strip() == str(state)

    def pass_results(self, body: str, instance: Instance | None) -> list[tuple[int, int, int | None]]:
        """``(steps, correct steps, claimed final state)`` of each pass, first pass first."""
        return [self._check_pass(tokens, instance) for tokens in self._passes(body)]

    @staticmethod
    def _passes(body: str) -> list[list[str]]:
        passes: list[list[str]] = [[]]
        for token in body.split():
            if token == CHECK:
                passes.append([])
            else:
                passes[-1].append(token)
        return passes if any(passes) else []

    def _check_pass(self, tokens: list[str], instance: Instance | None) -> tuple[int, int, int | None]:
        """``(steps, correct steps, claimed final state)`` of one pass. A pass that opens on a label other
        than ``a`` reads the digits backwards from it (a reverse check: ``d=1>1 c=9>0 b=3>3 a=7>0``); with
        the problem given, it must open on the last digit's label."""
        first = _LABEL_START.match(tokens[0]) if tokens else None
        reverse = first is not None and first[1] != LABELS[0] and not _PAIR.fullmatch(tokens[0])
        top = LABELS.index(first[1]) if reverse else 0
        whole = not reverse or instance is None or top == len(instance) - 1
        direction = -1 if reverse else 1
        steps = correct = 0
        pos = top  # the next input digit a step should read (a short step reads two)
        state = (
            0  # each step is checked against the state the previous step claimed, so errors do not cascade
        )
        i = 0
        while i < len(tokens):
            if not reverse and (m := _PAIR.fullmatch(tokens[i])):
                labels, pair, claimed = m[1] + m[2], (int(m[3]), int(m[4])), int(m[5])
                ok = labels == LABELS[pos : pos + 2] and all(d < self.modulus for d in pair)
                if instance is not None:
                    ok = ok and tuple(instance[pos : pos + 2]) == pair
                ok = ok and claimed == (state + sum(pair)) % self.modulus
                steps, pos, i, state = steps + 1, pos + 2, i + 1, claimed
                correct += ok
                continue
            parsed, i = self._parse_step(tokens, i)
            steps += 1
            if parsed is not None:
                correct += whole and self._step_holds(parsed, pos, state, instance)
                state = parsed[3]
            pos += direction
        return steps, correct, state

    def _step_holds(self, parsed, pos: int, state: int, instance: Instance | None) -> bool:
        """Whether one step reads the digit at ``pos`` (by its label) and adds it to ``state`` rightly."""
        label, digit, arith, claimed = parsed
        if not 0 <= pos < len(LABELS) or label != LABELS[pos]:
            return False
        if instance is not None:
            if pos >= len(instance) or digit not in (None, instance[pos]):
                return False
            digit = instance[pos]  # an implicit terse step reads its digit without writing it
        elif digit is None:
            return True  # without the problem an implicit step's digit is unknown: only its label is judged
        if arith is not None:
            prev, d2, total = arith
            if not (
                prev == state and d2 == digit and total == prev + digit and claimed == total % self.modulus
            ):
                return False
        return digit < self.modulus and claimed == (state + digit) % self.modulus

    @staticmethod
    def _parse_step(tokens: list[str], i: int):
        """``((label, digit|None, arith|None, state), next_i)``, or ``(None, i + 1)`` for a fragment that is
        no step; an implicit terse step (``c>9``) has no written digit."""
        if m := _TERSE.fullmatch(tokens[i]):
            return (m[1], int(m[2]), None, int(m[3])), i + 1
        if m := _IMPLICIT.fullmatch(tokens[i]):
            return (m[1], None, None, int(m[2])), i + 1
        head = _HEAD.fullmatch(tokens[i])
        arith = _ARITH.fullmatch(tokens[i + 1]) if head and i + 1 < len(tokens) else None
        if head and arith:
            return (
                head[1],
                int(head[2]),
                (int(arith[1]), int(arith[2]), int(arith[3])),
                int(arith[4]),
            ), i + 2
        return None, i + 1


def digitsum(
    digits: int, min_digits: int | None = None, check_order: str = "forward", terse_form: str = "restated"
) -> RunningSum:
    return RunningSum(
        "digitsum",
        digits,
        modulus=10,
        header="sum mod 10",
        min_digits=min_digits,
        check_order=check_order,
        terse_form=terse_form,
    )


def parity(
    digits: int, min_digits: int | None = None, check_order: str = "forward", terse_form: str = "restated"
) -> RunningSum:
    return RunningSum(
        "parity",
        digits,
        modulus=2,
        header="parity",
        min_digits=min_digits,
        check_order=check_order,
        terse_form=terse_form,
    )
