"""A web-like pretraining corpus for the synthetic task: mostly answers, rarely worked, often wrong.

Five kinds of documents, in the shares the task config sets:

- question documents: one to three ``q: ...\\na: ...`` items, formatted exactly like RL prompts, sometimes
  with a line of chatter around them. An answer is a worked trace with probability ``trace_fraction``
  (``short_fraction`` of them in the short form, ``verbose_fraction`` of the rest verbose, per trace or
  per step by ``verbosity``; with ``check_weights`` followed by check passes, and with ``slip_rate`` a
  first pass that may slip, so an unchecked trace can be wrong) and otherwise direct, wrong with probability
  ``direct_noise``, as answers on the web often are.
- drill documents: lines of the one-step facts the trace uses (``7+3=10>0``), so the rare trace mode
  is reliable without making it common.
- lookup documents: a question's labelled digits read back by label, the lookup each trace step makes
  (web pages quote their inputs back far more often than they work a problem through).
- worked examples: a question and its worked trace in textbook form (``example:`` / ``solution:``),
  which teach the trace without touching how often ``a:`` answers open one, so the base knows how to
  reason but seldom does when asked.
- filler documents: chatter with no questions at all.

Only train-split problems appear. Each document ends with a newline; join them with ``DOC_SEPARATOR``.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from ringzero.tasks.arithmetic import SyntheticArithmetic
from ringzero.tasks.base import Problem, RngLike, as_random
from ringzero.tasks.running_sum import WorkedPlan

DOC_SEPARATOR = "\n"
ITEMS_PER_DOCUMENT = (1, 3)
DRILL_FACTS = (6, 14)
FILLER_SENTENCES = (1, 4)
CHATTER_AROUND_ITEMS = 0.4
"""Chance that a question document opens (and, separately, closes) with a line of chatter."""

_SUBJECTS = ["we", "my friend", "the club", "our teacher", "a neighbour", "the team", "nobody", "everyone"]
_VERBS = ["talked about", "looked at", "wrote down", "forgot", "liked", "checked", "posted", "asked about"]
_OBJECTS = [
    "the weather",
    "the homework",
    "an old map",
    "the numbers",
    "a long list",
    "the train times",
    "the garden",
    "a new game",
    "the notes",
    "the results",
]
_TAILS = ["today", "again", "last week", "after lunch", "for a while", "before the meeting", "at home", ""]
_OPENERS = [
    "homework thread.",
    "notes from the math club.",
    "quick question from a forum:",
    "answers posted below.",
    "page 3 of the worksheet.",
    "copied from the board:",
]
_CLOSERS = [
    "thanks!",
    "hope that helps.",
    "not sure about the last one.",
    "reply if you see a mistake.",
    "more next week.",
    "ok.",
]


def _sentence(rng: random.Random) -> str:
    tail = rng.choice(_TAILS)
    words = [rng.choice(_SUBJECTS), rng.choice(_VERBS), rng.choice(_OBJECTS)] + ([tail] if tail else [])
    return " ".join(words) + rng.choice([".", ".", "!", "?"])


class CorpusGenerator:
    def __init__(self, task: SyntheticArithmetic):
        self.task = task
        self.cfg = task.cfg

    def answer_text(self, problem: Problem, rng: random.Random) -> str:
        """One corpus answer to ``problem``: worked (reliable) or direct (noisy)."""
        if rng.random() < self.cfg.trace_fraction:
            return self.worked(problem, rng)
        if rng.random() < self.cfg.direct_noise:
            return self.task.op.wrong_answer(self.task.op.instance_from_meta(problem.meta), rng)
        return self.task.direct_response(problem)

    def worked(self, problem: Problem, rng: random.Random) -> str:
        """A worked trace in one of its forms, by the config's shares (no draw for a form that is off, so a
        corpus without short traces is the same document stream it always was)."""
        if self.cfg.short_fraction > 0 and rng.random() < self.cfg.short_fraction:
            return self.task.worked_response(problem, verbose=False, short=True)
        if self.cfg.verbosity == "trace" and self.cfg.check_weights is None and self.cfg.slip_rate == 0:
            return self.task.worked_response(problem, verbose=rng.random() < self.cfg.verbose_fraction)
        return self.task.worked_response(
            problem, plan=self.plan(len(self.task.op.instance_from_meta(problem.meta)), rng)
        )

    def plan(self, steps: int, rng: random.Random) -> WorkedPlan:
        """How one corpus trace of ``steps`` digits is written: verbosity per step or per trace, check passes
        by ``check_weights``, and slips of the first pass's terse steps from ``slip_from`` on."""
        cfg = self.cfg

        def verbosity() -> tuple[bool, ...]:
            if cfg.verbosity == "step":
                return tuple(rng.random() < cfg.verbose_fraction for _ in range(steps))
            return (rng.random() < cfg.verbose_fraction,) * steps

        first = verbosity()
        slips = (
            {
                i: rng.randrange(1, self.task.op.modulus)
                for i in range(cfg.slip_from - 1, steps)
                if not first[i] and rng.random() < cfg.slip_rate
            }
            if cfg.slip_rate > 0
            else {}
        )
        checks = rng.choices(range(len(cfg.check_weights)), cfg.check_weights)[0] if cfg.check_weights else 0
        if cfg.check_verbosity == "verbose":  # the careful pass: no draw, so the first pass's stream is kept
            return WorkedPlan((first, *((True,) * steps for _ in range(checks))), slips)
        return WorkedPlan((first, *(verbosity() for _ in range(checks))), slips)

    def question_document(self, rng: random.Random) -> str:
        lines = [rng.choice(_OPENERS)] if rng.random() < CHATTER_AROUND_ITEMS else []
        for _ in range(rng.randint(*ITEMS_PER_DOCUMENT)):
            problem = self.task.problem(self.task.sample_instance("train", rng))
            lines.append(problem.prompt + self.answer_text(problem, rng))
        if rng.random() < CHATTER_AROUND_ITEMS:
            lines.append(rng.choice(_CLOSERS))
        return "\n".join(lines) + "\n"

    def drill_document(self, rng: random.Random) -> str:
        facts = [self.task.op.drill(rng) for _ in range(rng.randint(*DRILL_FACTS))]
        return "facts: " + " ".join(facts) + "\n"

    def lookup_document(self, rng: random.Random) -> str:
        return self.task.op.lookup_drill(self.task.sample_instance("train", rng), rng) + "\n"

    def worked_document(self, rng: random.Random) -> str:
        instance = self.task.sample_instance("train", rng)
        solution = self.worked(self.task.problem(instance), rng)
        return f"example: {self.task.op.question(instance)}\nsolution: {solution}\n"

    def filler_document(self, rng: random.Random) -> str:
        return " ".join(_sentence(rng) for _ in range(rng.randint(*FILLER_SENTENCES))) + "\n"

    def document(self, rng: random.Random) -> str:
        u = rng.random()
        for share, make in (
            (self.cfg.filler_fraction, self.filler_document),
            (self.cfg.drill_fraction, self.drill_document),
            (self.cfg.lookup_fraction, self.lookup_document),
            (self.cfg.worked_fraction, self.worked_document),
        ):
            if u < share:
                return make(rng)
            u -= share
        return self.question_document(rng)

    def documents(self, n: int, rng: RngLike) -> list[str]:
        r = as_random(rng)
        return [self.document(r) for _ in range(n)]

    def stream(self, rng: RngLike) -> Iterator[str]:
        """Documents without end, for a pretraining loader that packs them into windows."""
        r = as_random(rng)
        while True:
            yield self.document(r)
