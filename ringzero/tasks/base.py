"""What every task offers the stages: problems with ground truth, a pure reward, and trace inspection.

A response is the text the policy generated after the prompt. A *worked* response opens a trace with
``<think>``, writes steps, closes it with ``</think>`` and then gives the answer; a *direct* response
is the answer alone. Rewards look only at the final answer; the step checker is a diagnostic.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, NamedTuple, Protocol

import numpy as np

from ringzero.errors import RingzeroError

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
PROMPT_TEMPLATE = "q: {question}\na: "
"""Identical in the pretraining corpus and in RL, so the base sees RL prompts as familiar text."""

ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789 \n<>/+=?:.,'-[]!"
"""Every character an arithmetic prompt, response or corpus document uses: it fits a 64-symbol char vocab."""

Split = Literal["train", "eval"]
RngLike = random.Random | np.random.Generator | int


@dataclass(frozen=True)
class Problem:
    """One prompt with its ground truth. ``meta`` holds what the step checker needs (operands)."""

    id: str
    prompt: str
    answer: str
    meta: Mapping[str, Any] = field(default_factory=dict)
    tier: str | None = None


class StepCheck(NamedTuple):
    """``steps``: trace steps found (unparseable fragments count as wrong steps); ``correct``: those that
    check."""

    steps: int
    correct: int


def as_random(rng: RngLike) -> random.Random:
    """One RNG type inside the tasks; numpy generators and integer seeds are accepted at the edge."""
    if isinstance(rng, random.Random):
        return rng
    if isinstance(rng, np.random.Generator):
        return random.Random(int(rng.integers(2**63)))
    if isinstance(rng, int | np.integer):
        return random.Random(int(rng))
    raise TypeError(f"rng must be random.Random, numpy Generator or int (got {type(rng).__name__})")


def first_line(response: str) -> str:
    """Arithmetic answers end at the first newline; anything the engine generated past it is ignored."""
    return response.split("\n", 1)[0]


def split_trace(text: str) -> tuple[str | None, str | None]:
    """``(trace_body, answer_text)``. A direct response has no body; an unclosed trace has no answer."""
    start = text.find(THINK_OPEN)
    if start < 0:
        return None, text
    end = text.rfind(THINK_CLOSE)
    if end < start:
        return text[start + len(THINK_OPEN) :], None
    return text[start + len(THINK_OPEN) : end], text[end + len(THINK_CLOSE) :]


def uses_trace(response: str) -> bool:
    return THINK_OPEN in response


DIFFICULTY_BUCKETS = ("easy", "medium", "hard")
"""A task's difficulty buckets, easiest first (a mixed-length digitsum: thirds of its digit range)."""
TIER_CONTRAST = "contrast"
"""The head of the deep-against-fast tier measures (``rl.tier_metrics.depth_contrast``), which no tier or
bucket may be named: their keys share the ``<head>/<tier>/`` space."""


class Corpus(Protocol):
    """A pretraining corpus: documents that each end with a newline, drawn from an RNG."""

    def document(self, rng: random.Random) -> str: ...

    def documents(self, n: int, rng: RngLike) -> list[str]: ...

    def stream(self, rng: RngLike) -> Iterator[str]: ...


class Task(ABC):
    """The interface stages use. Rewards are pure and deterministic: same inputs, same float."""

    stop: tuple[str, ...] = ("\n",)
    """Strings that end a response; the rollout engine stops generation at the first one."""

    @abstractmethod
    def prompts(self, split: Split, n: int, rng: RngLike) -> list[Problem]:
        """``n`` problems of ``split``; the eval split never overlaps the train split or the corpus."""

    @abstractmethod
    def reward(self, problem: Problem, response: str) -> float:
        """1.0 for a correct final answer, else 0.0."""

    def uses_trace(self, response: str) -> bool:
        return uses_trace(response)

    def step_check(self, response: str, problem: Problem | None = None) -> StepCheck:
        """Parse and check each trace step; with ``problem`` the steps must also use its inputs."""
        return StepCheck(0, 0)

    def verified(self, response: str, problem: Problem) -> bool:
        """The response's reasoning checks out against the problem: a worked trace whose steps all hold
        (a task with check passes may accept an earlier pass's slip that a later pass fixed)."""
        steps, correct = self.step_check(response, problem)
        return steps > 0 and correct == steps

    def answer_space(self) -> list[str] | None:
        """Every answer a problem can have, when they are few (a guess can be drawn from them); else None."""
        return None

    def difficulty_bucket(self, problem: Problem) -> str | None:
        """The problem's difficulty bucket (``easy`` | ``medium`` | ``hard``); None: the task has one
        level."""
        return None

    def buckets(self) -> tuple[str, ...]:
        """The difficulty buckets this task's problems fall in, easiest first; empty: one level."""
        return ()

    def baseline_answer(self, problem: Problem) -> str | None:
        """The answer a no-reasoning heuristic gives (the likely candidate, answered without a trace),
        computed from the problem, not from a policy: the floor a reasoned but budgeted answer must beat.
        None: the task has no such heuristic."""
        return None

    def behaviour_metrics(self, responses: Sequence[str], problems: Sequence[Problem]) -> dict[str, float]:
        """What the task's traces did over a batch (shares, namespaced by the task: ``search/give_up``);
        empty for a task without behaviours to read."""
        return {}

    def corpus(self) -> Corpus:
        """The web-like pretraining corpus of this task."""
        raise RingzeroError(f"task {type(self).__name__} has no pretraining corpus: start from a checkpoint")

    def with_tier(self, problem: Problem, tag: str) -> Problem:
        """The same problem asked at a reasoning tier: the tag opens the prompt (``[fast] q: ...``)."""
        if not tag:
            raise ValueError("tier tag must be non-empty")
        if problem.tier is not None:
            raise ValueError(f"problem {problem.id} is already asked at tier {problem.tier!r}")
        return replace(problem, prompt=f"{tag} {problem.prompt}", tier=tag)
