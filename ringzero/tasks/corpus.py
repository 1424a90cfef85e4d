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

Only train-split problems appear. Each document ends with a newline; join them with
``chatter.DOC_SEPARATOR``.
"""

from __future__ import annotations

import random

from ringzero.tasks.base import Problem
from ringzero.tasks.chatter import DocumentMix
from ringzero.tasks.running_sum import WorkedPlan

DRILL_FACTS = (6, 14)


class CorpusGenerator(DocumentMix):
    def __init__(self, task):
        # task: the SyntheticArithmetic this corpus writes for (it builds its corpus, so this module cannot
        # import it)
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

    def item(self, rng: random.Random) -> str:
        problem = self.task.problem(self.task.sample_instance("train", rng))
        return problem.prompt + self.answer_text(problem, rng)

    def drill_document(self, rng: random.Random) -> str:
        facts = [self.task.op.drill(rng) for _ in range(rng.randint(*DRILL_FACTS))]
        return "facts: " + " ".join(facts) + "\n"

    def lookup_document(self, rng: random.Random) -> str:
        return self.task.op.lookup_drill(self.task.sample_instance("train", rng), rng) + "\n"

    def worked_document(self, rng: random.Random) -> str:
        instance = self.task.sample_instance("train", rng)
        solution = self.worked(self.task.problem(instance), rng)
        return f"example: {self.task.op.question(instance)}\nsolution: {solution}\n"
