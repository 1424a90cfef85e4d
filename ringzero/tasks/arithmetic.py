"""Synthetic arithmetic: the task a tiny char-level base must learn to reason on.

Why ``digitsum`` (sum of 12 labelled digits mod 10) is the default
--------------------------------------------------------------------
Zero RL needs a base whose rare worked-trace mode is fairly reliable while its direct route stays
unreliable *even under RL*: otherwise RL sharpens the direct route and traces die out. A 0.8M-parameter
char model learned 3- and 5-digit addition directly; addition is learnable piece by piece because each
answer digit depends mostly on its own column, so every improvement to one digit is rewarded.

The sum mod 10 of n uniform digits has no pieces. It is uniform and independent of any n-1 of the
digits, so every predictor that misses even one digit is correct exactly 10% of the time: noisy
pretraining labels and a binary reward both give the direct route no gradient towards the answer
(parity is the same with a 50% floor, which leaves RL a weaker signal). Functions this sensitive to
every input are known to be hard for transformers to learn without intermediate steps.

The worked trace turns it into n easy steps. Each step finds its digit by matching its letter label in
the question (``b=`` occurs once there) and adds it to the previous state (a 100-entry table, also
drilled in the corpus). Lengths at n=12: prompt 66 chars, direct answer 1 char, terse trace 90 chars,
verbose trace 164-170 chars; prompt plus terse trace fits a 160-char window, prompt plus verbose a
256-char one. A terse-only policy (what self-distillation converges to) is about half as long as a
verbose one. ``add`` with column traces is kept as the familiar baseline; ``parity`` as the binary variant.

Train and eval problems are separated by a hash of the problem, so the held-out prompts never appear
in the corpus or in RL, however small the problem space.
"""

from __future__ import annotations

import hashlib
import random

from ringzero.errors import RingzeroError
from ringzero.tasks.base import (
    DIFFICULTY_BUCKETS,
    PROMPT_TEMPLATE,
    THINK_CLOSE,
    THINK_OPEN,
    Problem,
    RngLike,
    Split,
    StepCheck,
    Task,
    as_random,
    first_line,
    split_trace,
)
from ringzero.tasks.config import ArithmeticTask
from ringzero.tasks.long_add import LongAddition
from ringzero.tasks.operation import Instance, Operation
from ringzero.tasks.running_sum import WorkedPlan, digitsum, parity

EVAL_BUCKETS = 10
"""One problem in this many (by hash) is held out for evaluation."""
EVAL_SEED = 20260714
"""Fixed seed of the held-out set, so every stage evaluates the same prompts."""
MAX_DRAWS_PER_PROBLEM = 1000
"""Rejection sampling gives up after this many draws per wanted problem: the split is then too small."""


def make_operation(cfg: ArithmeticTask) -> Operation:
    if cfg.operation == "digitsum":
        return digitsum(cfg.digits, cfg.min_digits, cfg.check_order, cfg.terse_form)
    if cfg.operation == "parity":
        return parity(cfg.digits, cfg.min_digits, cfg.check_order, cfg.terse_form)
    return LongAddition(cfg.digits, cfg.operands)


def in_eval_split(key: str) -> bool:
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % EVAL_BUCKETS == 0


class SyntheticArithmetic(Task):
    stop = ("\n",)

    def __init__(self, cfg: ArithmeticTask):
        self.cfg = cfg
        self.op = make_operation(cfg)

    # --- problems -------------------------------------------------------------------------------

    def problem(self, instance: Instance) -> Problem:
        return Problem(
            id=self.op.key(instance),
            prompt=PROMPT_TEMPLATE.format(question=self.op.question(instance)),
            answer=self.op.answer(instance),
            meta=self.op.meta(instance),
        )

    def sample_instance(self, split: Split, rng: random.Random) -> Instance:
        want_eval = split == "eval"
        for _ in range(MAX_DRAWS_PER_PROBLEM):
            instance = self.op.sample(rng)
            if in_eval_split(self.op.key(instance)) == want_eval:
                return instance
        raise RingzeroError(
            f"task: no {split} problem found in {MAX_DRAWS_PER_PROBLEM} draws; "
            f"the problem space of {self.cfg.operation} with {self.cfg.digits} digits is too small to split"
        )

    def prompts(self, split: Split, n: int, rng: RngLike | None = None) -> list[Problem]:
        """``n`` problems. ``eval`` with ``rng=None`` is the fixed held-out set (the same on every call)."""
        if split not in ("train", "eval"):
            raise ValueError(f"split must be 'train' or 'eval' (got {split!r})")
        if rng is None:
            if split != "eval":
                raise ValueError("train prompts need an rng")
            rng = EVAL_SEED
        r = as_random(rng)
        return [self.problem(self.sample_instance(split, r)) for _ in range(n)]

    # --- responses ------------------------------------------------------------------------------

    def direct_response(self, problem: Problem) -> str:
        return problem.answer

    def worked_response(
        self, problem: Problem, verbose: bool = False, short: bool = False, plan: WorkedPlan | None = None
    ) -> str:
        """The worked trace: verbose or terse, or ``short`` (two digits a step), or written by ``plan``
        (verbosity per step, slips, check passes; its answer is the last pass's, wrong after an unchecked
        slip). ``short`` and ``plan``: digitsum and parity only."""
        instance = self.op.instance_from_meta(problem.meta)
        if plan is not None:
            body, answer = self.op.planned_body(instance, plan)
            return f"{THINK_OPEN} {body} {THINK_CLOSE} {answer}"
        steps = self.op.short_steps(instance) if short else self.op.trace_steps(instance, verbose)
        return f"{THINK_OPEN} {' '.join(steps)} {THINK_CLOSE} {problem.answer}"

    # --- difficulty -----------------------------------------------------------------------------

    def answer_space(self) -> list[str] | None:
        modulus = getattr(self.op, "modulus", None)  # digitsum and parity: an answer is one residue
        return None if modulus is None else [str(v) for v in range(modulus)]

    def difficulty(self, problem: Problem) -> int | None:
        """The problem's digit count when the task mixes lengths (``min_digits``), else None."""
        if self.cfg.min_digits is None or not hasattr(self.op, "difficulty"):
            return None
        return self.op.difficulty(self.op.instance_from_meta(problem.meta))

    def difficulty_bucket(self, problem: Problem) -> str | None:
        """``easy``, ``medium`` or ``hard``: the problem's third of the digit range (None: one length)."""
        n = self.difficulty(problem)
        if n is None:
            return None
        lo, hi = self.cfg.min_digits, self.cfg.digits
        third = (n - lo) * len(DIFFICULTY_BUCKETS) // (hi - lo + 1)
        return DIFFICULTY_BUCKETS[third]

    def buckets(self) -> tuple[str, ...]:
        return DIFFICULTY_BUCKETS if self.cfg.min_digits is not None else ()

    def corpus(self):
        from ringzero.tasks.corpus import CorpusGenerator

        return CorpusGenerator(self)

    def reward(self, problem: Problem, response: str) -> float:
        _, answer = split_trace(first_line(response))
        return 1.0 if answer is not None and answer.strip() == problem.answer else 0.0

    def verified(self, response: str, problem: Problem) -> bool:
        """digitsum and parity: the last pass (a check, or the only pass) covers every digit, each of its
        steps holds and the answer is its state, so a first-pass slip that a check fixed still verifies;
        other operations: every step holds."""
        if not hasattr(self.op, "final_pass_holds"):
            return super().verified(response, problem)
        body, answer = split_trace(first_line(response))
        return body is not None and self.op.final_pass_holds(
            body, self.op.instance_from_meta(problem.meta), answer
        )

    def step_check(self, response: str, problem: Problem | None = None) -> StepCheck:
        body, _ = split_trace(first_line(response))
        if body is None:
            return StepCheck(0, 0)
        instance = self.op.instance_from_meta(problem.meta) if problem is not None else None
        return self.op.check_steps(body, instance)
