"""Web-like chatter the synthetic corpora put around and between their questions: the filler documents and
the lines that open and close a question document."""

from __future__ import annotations

import random
from collections.abc import Callable

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
