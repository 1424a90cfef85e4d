"""The log-probs a request can ask for beyond its sampled tokens': top-k alternatives and prompt log-probs.

Conventions follow SGLang (``logprob_start_len``, ``top_logprobs_num``):

* output top-k: the k most likely tokens of the distribution the sampled token's log-prob is reported
  from, ``log_softmax(logits / T)`` before top-k/top-p (greedy: T = 1);
* prompt log-probs from position ``s``: one entry per prompt position ``s..L-1``, the first None (SGLang
  reports none for the first position of the range, whatever ``s``), then ``log p(prompt[j] | prompt[:j])``
  under the plain ``log_softmax(logits)``: SGLang does not temperature-scale prompt log-probs unless
  asked (``LogprobRequest.prompt_temperature_scaled``). Prompt top-k: the same distribution's k best.

Prompt log-probs are computed with ``score_tokens`` on the engine's own weights (the rollout policy):
right-padded micro-batches, or under ``deterministic`` each prompt alone (``batch_invariant``), the
fixed-width forward deterministic decoding samples from. Each prompt is scored once, whatever its ``n``.

Letter legend: B rows, T decoding steps, K top-k width.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ringzero.model.scoring import Scored, score_tokens
from ringzero.rollout.types import GenerateRequest

TopK = list[tuple[float, int]]


def top_pairs(values: torch.Tensor, ids: torch.Tensor, k: int) -> list[TopK]:
    """Per position, the first ``k`` (logprob, token_id) pairs of ``[n, K]`` tensors, on the host."""
    vals, idx = values[:, :k].double().tolist(), ids[:, :k].tolist()
    return [list(zip(v, i, strict=True)) for v, i in zip(vals, idx, strict=True)]


class TopKTrack:
    """Top-k alternatives of a decoding group, kept on the device by original row and step.

    ``record`` takes the live rows' values at step ``t``; ``select`` follows the rows the engine keeps
    (the same device index it gives the cache), so nothing is read back until ``pairs``.
    """

    def __init__(self, rows: int, steps: int, k: int, device: torch.device):
        self.k = k
        self.values_BTK = torch.zeros((rows, steps, k), dtype=torch.float64, device=device)
        self.ids_BTK = torch.zeros((rows, steps, k), dtype=torch.long, device=device)
        self._alive_B = torch.arange(rows, device=device)

    def record(self, t: int, values_Bk: torch.Tensor, ids_Bk: torch.Tensor) -> None:
        self.values_BTK[self._alive_B, t] = values_Bk.to(torch.float64)
        self.ids_BTK[self._alive_B, t] = ids_Bk

    def select(self, keep_B: torch.Tensor) -> None:
        self._alive_B = self._alive_B[keep_B]

    def pairs(self, row: int, length: int, k: int) -> list[TopK]:
        return top_pairs(self.values_BTK[row, :length], self.ids_BTK[row, :length], k)


@dataclass
class PromptLogprobs:
    values: list[float | None]
    top: list[TopK | None] | None


def prompt_logprobs(
    model, requests: Sequence[GenerateRequest], wanted: Sequence[int], *, deterministic: bool, pad_id: int
) -> dict[int, PromptLogprobs]:
    """Prompt log-probs of ``requests[i]`` for each ``i`` in ``wanted`` (its ``logprobs.prompt_from`` set)."""
    out: dict[int, PromptLogprobs] = {}
    to_score: dict[tuple[int, float], list[int]] = {}  # (top_k, temperature) -> requests scored together
    for i in wanted:
        req = requests[i]
        start, k = req.logprobs.prompt_from, req.logprobs.top_k
        if start >= len(req.input_ids) - 1:  # at most the range's first position: nothing to score
            empty = len(req.input_ids) - start
            out[i] = PromptLogprobs([None] * empty, [None] * empty if k else None)
            continue
        t = req.params.temperature if req.logprobs.prompt_temperature_scaled else 1.0
        to_score.setdefault((k, t), []).append(i)
    for (k, t), group in to_score.items():
        scored = score_tokens(
            model,
            [list(requests[i].input_ids) for i in group],
            [requests[i].logprobs.prompt_from + 1 for i in group],
            t,
            batch_invariant=deterministic,
            top_k=k,
            pad_id=pad_id,
        )
        for i, s in zip(group, scored, strict=True):
            out[i] = _entries(s, k)
    return out


def _entries(s: Scored, k: int) -> PromptLogprobs:
    values: list[float | None] = [None, *s.logprobs.double().tolist()]
    top = [None, *top_pairs(s.top_values, s.top_ids, k)] if k else None
    return PromptLogprobs(values, top)
