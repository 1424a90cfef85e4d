"""Pure functions behind the eval stage's numbers: pass@k and the three chain-of-thought qualities.

- ``pass_at_k``: the unbiased estimator of Chen et al. (2021): with ``n`` samples of which ``c`` are
  correct, ``1 - C(n - c, k) / C(n, k)`` is the chance that ``k`` samples drawn without replacement
  contain a correct one. Averaging ``1[any correct]`` over prompts instead is biased low for k < n.
- comprehensibility: the share of worked traces whose every step parses and checks (``Task.step_check``);
  a trace with no recognisable step is not comprehensible.
- reproducibility: the chance that two different samples of one prompt reach the same final answer
  (pairwise agreement), averaged over prompts. A sample without a final answer agrees with nothing.
  Pairwise rather than "share of the majority answer", which can never fall below 1/k.
- baseline: the task's no-reasoning heuristic (``Task.baseline_answer``, the likely candidate answered
  without a trace) scored on the eval prompts, overall and per difficulty bucket: what a budgeted answer
  has to beat to count as reasoned. It reads the problems only, so every checkpoint's row holds the same.
- efficiency: correct answers per 1,000 generated tokens (accuracy divided by mean length / 1000), so a
  policy that is as accurate in half the tokens scores twice as high.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

from ringzero.tasks.answers import extract_answer, normalize_answer
from ringzero.tasks.base import Problem, Task

NAN = float("nan")


def pass_at_k(n: int, c: int, k: int) -> float:
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n (got n={n}, c={c}, k={k})")
    if n - c < k:  # every draw of k samples contains a correct one
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def mean_pass_at_k(correct_per_prompt: Sequence[Sequence[bool]], k: int) -> float:
    """pass@k averaged over prompts; each prompt's list holds its samples' verdicts."""
    if not correct_per_prompt:
        return NAN
    return sum(pass_at_k(len(s), sum(map(bool, s)), k) for s in correct_per_prompt) / len(correct_per_prompt)


def final_answer(response: str) -> str | None:
    """The normalised final answer of a response, or None when it gives none (e.g. an unclosed trace)."""
    answer = extract_answer(response)
    return None if answer is None else normalize_answer(answer)


def pairwise_agreement(answers: Sequence[str | None]) -> float:
    """Share of ordered pairs of distinct samples whose answers are equal (None never matches); NaN for <
    2."""
    n = len(answers)
    if n < 2:
        return NAN
    counts = Counter(a for a in answers if a is not None)
    return sum(m * (m - 1) for m in counts.values()) / (n * (n - 1))


def reproducibility(answers_per_prompt: Sequence[Sequence[str | None]]) -> float:
    values = [pairwise_agreement(a) for a in answers_per_prompt if len(a) >= 2]
    return sum(values) / len(values) if values else NAN


def comprehensibility(step_checks: Sequence[tuple[int, int]]) -> float:
    """Share of traces, given as ``(steps, correct steps)``, with at least one step and every step correct."""
    if not step_checks:
        return NAN
    return sum(1 for steps, ok in step_checks if steps > 0 and ok == steps) / len(step_checks)


def efficiency(correct: Sequence[bool], lengths: Sequence[int]) -> float:
    """Correct answers per 1,000 generated tokens."""
    tokens = sum(lengths)
    return 1000.0 * sum(map(bool, correct)) / tokens if tokens else NAN


def baseline_accuracy(task: Task, problems: Sequence[Problem]) -> dict[str, float]:
    """``eval/baseline/accuracy`` and ``eval/baseline/<bucket>/accuracy``; empty when the task has no
    baseline heuristic."""
    hits: dict[str, list[bool]] = {}
    for problem in problems:
        guess = task.baseline_answer(problem)
        if guess is None:
            return {}
        correct = task.reward(problem, guess) > 0
        hits.setdefault("eval/baseline/accuracy", []).append(correct)
        if (bucket := task.difficulty_bucket(problem)) is not None:
            hits.setdefault(f"eval/baseline/{bucket}/accuracy", []).append(correct)
    return {key: sum(v) / len(v) for key, v in hits.items()}
