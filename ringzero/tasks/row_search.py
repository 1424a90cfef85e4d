"""Row search with a fallible cue: the task on which searching longer pays.

Question (5 rows, target 3): ``find 3: a=529 b=164 c=382 d=907 e=615``; answer ``c``, the one row whose
digits sum to the target mod 10 (3 + 8 + 2 = 13).

A *try* copies one row by its label, then counts down from the target: it writes what is left of the
target as each digit is taken away, mod 10, and ``y`` when nothing is left, else ``n``. For target 3,
``d=907 3447 n`` (3, 3 - 9 = 4, 4 - 0 = 4, 4 - 7 = 7: the sum is not 3) and ``c=382 3020 y``. A worked
response is a list of tries and the answer: ``<think> d=907 3447 n c=382 3020 y </think> c``.

The countdown makes the verdict local: ``y`` is "the last remainder is 0", a comparison with the digit just
written. Running sums compared with the target (``d=907 996 n``) need the target at every verdict, a
lookup back to the question the tiny base had not learned after 1,200 pretraining steps.

Why it suits zero RL on a tiny model:

- *The failure cannot be trained away.* Without trying a row nobody knows its sum, and a try is easy
  (a lookup by label and one-digit subtractions), so every extra try raises the chance of success, most
  of all on hard items, whose search space is larger. A policy gets better only by searching longer.
- *The cue is a guess with a ceiling.* Exactly one row contains the target digit (``d=907`` above, for
  target 7); it is the answer with probability ``cue_rate`` (about 0.5). Answering it without a trace is
  the no-search baseline (``baseline_answer``); trying it first is the sensible order.
- *A shorter correct form exists.* Re-checking a missed row and confirming a hit add length without
  changing the answer, and trying the cue first finds the hit sooner half the time: shortest-of-N keeps
  the searches without them. Under a binding budget the shorter *reasoned* form is a few tries and then a
  guess among the untried rows, which costs accuracy on hard items only.

Problems of each bucket (``rows``: easy, medium, hard) are drawn with the answer row, the target and the
cue placed first, then each row drawn to fit: the answer's sum is the target and only the cue contains
the target digit. Train and eval problems are split by a hash of the problem, as in the arithmetic task.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

from ringzero.errors import RingzeroError
from ringzero.tasks.arithmetic import EVAL_SEED, MAX_DRAWS_PER_PROBLEM, in_eval_split
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
from ringzero.tasks.config import SearchTask
from ringzero.tasks.search_items import (
    HIT,
    LABELS,
    MISS,
    MODULUS,
    SearchItem,
    digit_sum,
    question,
    remainders,
    try_text,
)

MAX_ROW_DRAWS = 10_000
"""Rejection sampling of one row gives up after this many draws (the config validator rules out the
shapes where no row fits, so this is a guard, not a limit a valid config meets)."""


@dataclass(frozen=True)
class Try:
    """One parsed try of a trace: the row index its label names, the row it wrote, its sums and verdict."""

    row: int
    digits: str
    sums: str
    verdict: str


_TRY = re.compile(r"([a-z])=?(\d+)")
_SUMS = re.compile(r"\d+")


def parse_tries(body: str) -> tuple[list[Try], int]:
    """``(tries, fragments)``: the body's tries in order, and how many of its tokens belong to no try (a
    garbled try counts as a fragment, and as a wrong step in ``step_check``)."""
    tokens = body.split()
    tries: list[Try] = []
    fragments = i = 0
    while i < len(tokens):
        head = _TRY.fullmatch(tokens[i])
        if head and i + 2 < len(tokens) and _SUMS.fullmatch(tokens[i + 1]) and tokens[i + 2] in (HIT, MISS):
            tries.append(Try(LABELS.index(head[1]), head[2], tokens[i + 1], tokens[i + 2]))
            i += 3
        else:
            fragments += 1
            i += 1
    return tries, fragments


def try_holds(t: Try, item: SearchItem | None) -> bool:
    """The try copied its row, started from the target (both when the problem is known), took each digit
    away right and says ``y`` exactly when nothing is left."""
    if not t.sums or len(t.sums) != len(t.digits) + 1:
        return False
    start = int(t.sums[0])
    if item is not None and (t.row >= len(item.rows) or item.rows[t.row] != t.digits or start != item.target):
        return False
    return t.sums == remainders(start, t.digits) and t.verdict == (HIT if t.sums[-1] == "0" else MISS)


class RowSearch(Task):
    stop = ("\n",)

    def __init__(self, cfg: SearchTask):
        self.cfg = cfg

    # --- problems -------------------------------------------------------------------------------

    def sample_item(self, rng: random.Random, rows: Sequence[int] | None = None) -> SearchItem:
        """A problem with one of ``rows`` rows (the task's row counts by default)."""
        cfg = self.cfg
        rows = cfg.rows if rows is None else rows
        n = rows[0] if len(rows) == 1 else rng.choice(rows)
        target = rng.randrange(MODULUS)
        answer = rng.randrange(n)
        cue = answer if rng.random() < cfg.cue_rate else rng.choice([i for i in range(n) if i != answer])
        rows = tuple(self._row(rng, target, i == answer, i == cue) for i in range(n))
        return SearchItem(target, rows, answer, cue)

    def _row(self, rng: random.Random, target: int, is_answer: bool, is_cue: bool) -> str:
        t = str(target)
        for _ in range(MAX_ROW_DRAWS):
            digits = "".join(str(rng.randrange(MODULUS)) for _ in range(self.cfg.row_digits))
            if (digit_sum(digits) == target) == is_answer and (t in digits) == is_cue:
                return digits
        raise RingzeroError(
            f"task: no {self.cfg.row_digits}-digit row found with sum {'=' if is_answer else '!='} {target} "
            f"that {'contains' if is_cue else 'avoids'} the digit {target}"
        )

    def key(self, item: SearchItem) -> str:
        return f"search:{item.target}:{','.join(item.rows)}"

    def problem(self, item: SearchItem) -> Problem:
        return Problem(
            id=self.key(item),
            prompt=PROMPT_TEMPLATE.format(question=question(item)),
            answer=item.label,
            meta={"target": item.target, "rows": list(item.rows), "answer": item.answer, "cue": item.cue},
        )

    @staticmethod
    def item(problem: Problem) -> SearchItem:
        m = problem.meta
        return SearchItem(int(m["target"]), tuple(m["rows"]), int(m["answer"]), int(m["cue"]))

    def sample_instance(
        self, split: Split, rng: random.Random, rows: Sequence[int] | None = None
    ) -> SearchItem:
        want_eval = split == "eval"
        for _ in range(MAX_DRAWS_PER_PROBLEM):
            item = self.sample_item(rng, rows)
            if in_eval_split(self.key(item)) == want_eval:
                return item
        raise RingzeroError(f"task: no {split} problem found in {MAX_DRAWS_PER_PROBLEM} draws")

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

    def worked_response(self, problem: Problem, tries: Sequence[int], answer: int | None = None) -> str:
        """A trace that tries ``tries`` (row indices, in order, repeats allowed) and answers ``answer`` (the
        problem's answer when None)."""
        item = self.item(problem)
        body = " ".join(try_text(item, row) for row in tries)
        label = item.label if answer is None else LABELS[answer]
        return f"{THINK_OPEN} {body} {THINK_CLOSE} {label}"

    def reward(self, problem: Problem, response: str) -> float:
        _, answer = split_trace(first_line(response))
        return 1.0 if answer is not None and answer.strip() == problem.answer else 0.0

    def step_check(self, response: str, problem: Problem | None = None) -> StepCheck:
        """Each try is a step; a garbled fragment is a wrong step. Without the problem a try is judged on
        its own arithmetic (the verdict needs the target, so it is not judged)."""
        body, _ = split_trace(first_line(response))
        if body is None:
            return StepCheck(0, 0)
        tries, fragments = parse_tries(body)
        item = self.item(problem) if problem is not None else None
        return StepCheck(len(tries) + fragments, sum(try_holds(t, item) for t in tries))

    def verified(self, response: str, problem: Problem) -> bool:
        """A trace with no fragment whose every try holds, that found the hit, and that answers it: the
        reasoning decided the answer (a lucky guess after giving up is correct but not verified)."""
        body, answer = split_trace(first_line(response))
        if body is None or answer is None:
            return False
        tries, fragments = parse_tries(body)
        item = self.item(problem)
        return (
            fragments == 0
            and bool(tries)
            and all(try_holds(t, item) for t in tries)
            and any(t.row == item.answer for t in tries)
            and answer.strip() == item.label
        )

    # --- difficulty and baselines ---------------------------------------------------------------

    def answer_space(self) -> list[str] | None:
        return list(LABELS[: max(self.cfg.rows)])

    def difficulty_bucket(self, problem: Problem) -> str | None:
        if len(self.cfg.rows) == 1:
            return None
        n = len(problem.meta["rows"])
        return DIFFICULTY_BUCKETS[self.cfg.rows.index(n)] if n in self.cfg.rows else None

    def buckets(self) -> tuple[str, ...]:
        return DIFFICULTY_BUCKETS[: len(self.cfg.rows)] if len(self.cfg.rows) > 1 else ()

    def baseline_answer(self, problem: Problem) -> str | None:
        """The likely candidate answered without a trace: the cue row."""
        return LABELS[int(problem.meta["cue"])]

    def corpus(self):
        from ringzero.tasks.search_corpus import SearchCorpus

        return SearchCorpus(self)

    # --- behaviour ------------------------------------------------------------------------------

    def behaviour_metrics(self, responses: Sequence[str], problems: Sequence[Problem]) -> dict[str, float]:
        """What the traces did, as shares over the batch (``search/*``):

        ``tries`` per trace; ``first_try_hit`` traces whose first try is the answer (a policy that scores
        every row at once would push it far above 1/rows); ``likely_first`` traces that try the cue first;
        ``give_up`` traces that closed without a hit, per row they missed: the chance of stopping after a
        miss (the hazard RL must lower); ``recheck`` tries of a row already missed; ``confirm`` hits tried
        again; ``found`` traces that tried the answer; ``guessed`` traces that answered an untried row."""
        traces = tries = first_hit = likely = misses = gave_up = rechecks = hits = confirms = 0
        found = guessed = 0
        for response, problem in zip(responses, problems, strict=True):
            body, answer = split_trace(first_line(response))
            if body is None:
                continue
            item = self.item(problem)
            parsed, _ = parse_tries(body)
            traces += 1
            tries += len(parsed)
            if not parsed:
                continue
            first_hit += parsed[0].row == item.answer
            likely += parsed[0].row == item.cue
            seen: set[int] = set()
            hit_at = next((k for k, t in enumerate(parsed) if t.row == item.answer), None)
            for k, t in enumerate(parsed):
                if t.row in seen:
                    if t.row == item.answer:
                        confirms += 1
                    else:
                        rechecks += 1
                elif hit_at is None or k < hit_at:
                    misses += 1
                seen.add(t.row)
            gave_up += hit_at is None and any(t.row != item.answer for t in parsed)
            if hit_at is not None:
                found += 1
                hits += 1
            elif answer is not None and answer.strip() in LABELS[: len(item.rows)]:
                guessed += LABELS.index(answer.strip()) not in seen
        return {
            "search/traces": float(traces),
            "search/tries": tries / traces if traces else float("nan"),
            "search/first_try_hit": first_hit / traces if traces else float("nan"),
            "search/likely_first": likely / traces if traces else float("nan"),
            "search/give_up": gave_up / misses if misses else float("nan"),
            "search/recheck": rechecks / tries if tries else float("nan"),
            "search/confirm": confirms / hits if hits else float("nan"),
            "search/found": found / traces if traces else float("nan"),
            "search/guessed": guessed / traces if traces else float("nan"),
        }
