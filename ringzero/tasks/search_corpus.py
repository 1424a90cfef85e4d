"""The pretraining corpus of row search: mostly direct guesses, rare traces that mostly give up early.

Five kinds of documents, in the shares the task config sets (``SearchTask``):

- question documents: one to three ``q: find t: ...\\na: ...`` items. An answer is a search trace with
  probability ``trace_fraction``, else a direct answer: the cue with probability ``direct_cue``, else a
  random row. A direct answer is never computed, so the base's direct route is a guess.
- worked examples: a question and a full search in textbook form (``example:`` / ``solution:``), which
  teach the try and how a search to the hit ends without touching how often ``a:`` answers open a trace
  or search on.
- drill documents: tries without labels for one target (``find 3: 907 3447 n 382 3020 y``), the
  countdown and the verdict every try writes.
- lookup documents: a question's rows read back by label in a shuffled order, the copy every try makes
  (questions of ``lookup_rows`` rows: the lookup forms sooner among few rows, then carries over).
- filler documents: chatter with no questions.

A trace is written by a ``SearchPlan`` drawn per trace, each behaviour at its own low rate: the first try
is the cue (``cue_first``) or a random row; a *searcher* (``search_fraction``) tries untried rows until
the hit, any other trace tries another row after a miss only with probability ``persist`` and otherwise
gives up and answers a random untried row; before a new try a trace may re-check a row it missed
(``recheck_rate``); a hit may be tried again before the answer (``confirm_rate``). Every try is written
correctly: what varies is how long the search goes on, not whether its steps hold.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from ringzero.tasks.base import Problem
from ringzero.tasks.chatter import DocumentMix
from ringzero.tasks.search_items import LABELS, SEP, SearchItem, question, remainders

DRILL_TRIES = (4, 10)


@dataclass(frozen=True)
class SearchPlan:
    """The rows a trace tries, in order (repeats are re-checks and confirmations), and the row it answers."""

    tries: tuple[int, ...]
    answer: int


class SearchCorpus(DocumentMix):
    def __init__(self, task):
        # task: the RowSearch this corpus writes for (it builds its corpus, so this module cannot import it)
        self.task = task
        self.cfg = task.cfg

    def plan(self, item: SearchItem, rng: random.Random, searcher: bool | None = None) -> SearchPlan:
        """How one trace searches ``item``; ``searcher`` forces the full search (a textbook solution)."""
        cfg, n = self.cfg, len(item.rows)
        order = list(range(n))
        rng.shuffle(order)
        if rng.random() < cfg.cue_first:
            order.remove(item.cue)
            order.insert(0, item.cue)
        if searcher is None:
            searcher = rng.random() < cfg.search_fraction
        tries: list[int] = []
        missed: list[int] = []
        for row in order:
            if missed and rng.random() < cfg.recheck_rate:
                tries.append(rng.choice(missed))
            tries.append(row)
            if row == item.answer:
                if rng.random() < cfg.confirm_rate:
                    tries.append(row)
                return SearchPlan(tuple(tries), row)
            missed.append(row)
            if not searcher and rng.random() >= cfg.persist:
                untried = [r for r in order if r not in missed]
                return SearchPlan(tuple(tries), rng.choice(untried))
        raise AssertionError("a search over every row finds the answer")

    def trace(self, problem: Problem, rng: random.Random, searcher: bool | None = None) -> str:
        plan = self.plan(self.task.item(problem), rng, searcher)
        return self.task.worked_response(problem, plan.tries, plan.answer)

    def answer_text(self, problem: Problem, rng: random.Random) -> str:
        if rng.random() < self.cfg.trace_fraction:
            return self.trace(problem, rng)
        item = self.task.item(problem)
        row = item.cue if rng.random() < self.cfg.direct_cue else rng.randrange(len(item.rows))
        return LABELS[row]

    def item(self, rng: random.Random) -> str:
        problem = self.task.problem(self.task.sample_instance("train", rng))
        return problem.prompt + self.answer_text(problem, rng)

    def worked_document(self, rng: random.Random) -> str:
        item = self.task.sample_instance("train", rng)
        solution = self.trace(self.task.problem(item), rng, searcher=True)
        return f"example: {question(item)}\nsolution: {solution}\n"

    def drill_document(self, rng: random.Random) -> str:
        target = rng.randrange(10)
        tries = []
        for _ in range(rng.randint(*DRILL_TRIES)):
            digits = "".join(str(rng.randrange(10)) for _ in range(self.cfg.row_digits))
            left = remainders(target, digits)
            tries.append(f"{digits} {left} {'y' if left[-1] == '0' else 'n'}")
        return f"find {target}: " + " ".join(tries) + "\n"

    def lookup_document(self, rng: random.Random) -> str:
        item = self.task.sample_instance("train", rng, self.cfg.lookup_rows)
        order = list(range(len(item.rows)))
        rng.shuffle(order)
        back = " ".join(f"{LABELS[i]}{SEP}{item.rows[i]}" for i in order)
        return f"{question(item)}\nread back: {back}\n"
