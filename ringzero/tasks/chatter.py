"""Web-like chatter the synthetic corpora put around and between their questions: the filler documents and
the lines that open and close a question document."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator

from ringzero.tasks.base import RngLike, as_random

DOC_SEPARATOR = "\n"
ITEMS_PER_DOCUMENT = (1, 3)
FILLER_SENTENCES = (1, 4)
CHATTER_AROUND_ITEMS = 0.4
"""Chance that a question document opens (and, separately, closes) with a line of chatter."""

SUBJECTS = ["we", "my friend", "the club", "our teacher", "a neighbour", "the team", "nobody", "everyone"]
VERBS = ["talked about", "looked at", "wrote down", "forgot", "liked", "checked", "posted", "asked about"]
OBJECTS = [
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
TAILS = ["today", "again", "last week", "after lunch", "for a while", "before the meeting", "at home", ""]
OPENERS = [
    "homework thread.",
    "notes from the math club.",
    "quick question from a forum:",
    "answers posted below.",
    "page 3 of the worksheet.",
    "copied from the board:",
]
CLOSERS = [
    "thanks!",
    "hope that helps.",
    "not sure about the last one.",
    "reply if you see a mistake.",
    "more next week.",
    "ok.",
]


def sentence(rng: random.Random) -> str:
    tail = rng.choice(TAILS)
    words = [rng.choice(SUBJECTS), rng.choice(VERBS), rng.choice(OBJECTS)] + ([tail] if tail else [])
    return " ".join(words) + rng.choice([".", ".", "!", "?"])


def filler_document(rng: random.Random) -> str:
    return " ".join(sentence(rng) for _ in range(rng.randint(*FILLER_SENTENCES))) + "\n"


def question_document(item: Callable[[random.Random], str], rng: random.Random) -> str:
    """One to three ``item(rng)`` texts (each ``q: ...\\na: ...``), sometimes opened and closed by a line of
    chatter."""
    lines = [rng.choice(OPENERS)] if rng.random() < CHATTER_AROUND_ITEMS else []
    lines += [item(rng) for _ in range(rng.randint(*ITEMS_PER_DOCUMENT))]
    if rng.random() < CHATTER_AROUND_ITEMS:
        lines.append(rng.choice(CLOSERS))
    return "\n".join(lines) + "\n"


class DocumentMix:
    """The document mix both synthetic corpora draw from: with the config's ``filler_fraction``,
    ``drill_fraction``, ``lookup_fraction`` and ``worked_fraction`` a document of that kind, else a
    question document of ``item``s. A corpus sets ``cfg`` and defines the four kinds' documents and
    ``item``."""

    def document(self, rng: random.Random) -> str:
        u = rng.random()
        for share, make in (
            (self.cfg.filler_fraction, filler_document),
            (self.cfg.drill_fraction, self.drill_document),
            (self.cfg.lookup_fraction, self.lookup_document),
            (self.cfg.worked_fraction, self.worked_document),
        ):
            if u < share:
                return make(rng)
            u -= share
        return question_document(self.item, rng)

    def documents(self, n: int, rng: RngLike) -> list[str]:
        r = as_random(rng)
        return [self.document(r) for _ in range(n)]

    def stream(self, rng: RngLike) -> Iterator[str]:
        """Documents without end, for a pretraining loader that packs them into windows."""
        r = as_random(rng)
        while True:
            yield self.document(r)
