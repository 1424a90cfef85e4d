"""The rows of one decoding group: their settings, outputs so far, which are still running and why rows stop.

``DecodingRows.advance`` takes one sampled token per live row, writes it into preallocated output
buffers, decides which rows finished (stop id, stop string, length cap) and returns the rows to keep,
so the engine can drop the others from its cache in the same order. Everything per row lives in
tensors indexed by the live rows; Python loops touch only finishing rows and rows with stop strings.

Letter legend: B live rows, T decoding steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ringzero.rollout.sampling import RowSettings, UniformStream
from ringzero.rollout.stopping import LENGTH, STOP, StopStrings, StopTable
from ringzero.rollout.types import SamplingParams
from ringzero.tokenizer.base import Tokenizer


@dataclass
class RowSpec:
    """One sample to generate: its request, prompt, settings, generator seed, cap and stop ids."""

    request: int
    prompt: list[int]
    params: SamplingParams
    seed: int
    max_new: int
    stop_ids: tuple[int, ...]
    rid: str | None = None


@dataclass
class Finished:
    output_ids: list[int]
    logprobs: list[float]
    reason: str
    matched: int | str | None


class DecodingRows:
    def __init__(self, specs: list[RowSpec], tokenizer: Tokenizer | None):
        params = [s.params for s in specs]
        self.steps = max(s.max_new for s in specs)
        self.settings = RowSettings.build([p.temperature for p in params], [p.top_k for p in params],
                                          [p.top_p for p in params], [s.seed for s in specs])
        self.uniforms = UniformStream(self.settings)
        self._table = StopTable([s.stop_ids for s in specs], [s.max_new for s in specs])
        self._strings = {row: StopStrings(p.stop, tokenizer) for row, p in enumerate(params) if p.stop}
        self._ids_BT = torch.zeros((len(specs), self.steps), dtype=torch.long)
        self._logp_BT = torch.zeros((len(specs), self.steps), dtype=torch.float64)
        self._alive_B = torch.arange(len(specs))  # the original row of each live row
        self.results: list[Finished | None] = [None] * len(specs)

    def advance(self, t: int, tokens_B: torch.Tensor, logp_B: torch.Tensor) -> torch.Tensor | None:
        """Record step ``t``; ``None`` if every row goes on, else the (possibly empty) live rows to keep."""
        tokens_B = tokens_B.cpu()
        self._ids_BT[self._alive_B, t] = tokens_B
        self._logp_BT[self._alive_B, t] = logp_B.to(device="cpu", dtype=torch.float64)
        by_id_B = self._table.hit_stop_id(tokens_B)
        done_B = by_id_B | self._table.at_length(t + 1)
        matched_string = self._match_strings(t, by_id_B)
        for b in matched_string:
            done_B[b] = True
        if not bool(done_B.any()):
            return None
        for b in done_B.nonzero()[:, 0].tolist():
            if by_id_B[b]:
                reason, matched = STOP, int(tokens_B[b])
            elif b in matched_string:
                reason, matched = STOP, matched_string[b]
            else:
                reason, matched = LENGTH, None
            self._finish(int(self._alive_B[b]), t + 1, reason, matched)
        keep_B = (~done_B).nonzero()[:, 0]
        self._select(keep_B)
        return keep_B

    def _match_strings(self, t: int, by_id_B: torch.Tensor) -> dict[int, str]:
        """Live rows whose output now contains one of their stop strings (stop ids take precedence)."""
        if not self._strings:
            return {}
        found = {}
        for b, row in enumerate(self._alive_B.tolist()):
            if row in self._strings and not by_id_B[b]:
                s = self._strings[row].match(self._ids_BT[row, : t + 1].tolist())
                if s is not None:
                    found[b] = s
        return found

    def _finish(self, row: int, length: int, reason: str, matched) -> None:
        self.results[row] = Finished(self._ids_BT[row, :length].tolist(), self._logp_BT[row, :length].tolist(),
                                     reason, matched)

    def _select(self, keep_B: torch.Tensor) -> None:
        self.settings = self.settings.select(keep_B)
        self.uniforms.select(keep_B, self.settings)
        self._table.select(keep_B)
        self._alive_B = self._alive_B[keep_B]
