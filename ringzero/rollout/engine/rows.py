"""The rows of one decoding group: their settings, outputs so far, which are still running and why rows stop.

``DecodingRows.advance`` takes one sampled token per live row, writes it into preallocated output
buffers, decides which rows finished (stop id, stop string, length cap) and returns the rows to keep,
so the engine can drop the others from its cache in the same order.

Everything per row lives on the engine's device, in tensors indexed by the live rows: settings,
generators, stop ids, the output buffers. The host keeps what it needs to decide without asking the
device: which original row each live row is, length caps (the host counts the steps), and a short
tail of output ids for rows with stop strings. Per step at most one small tensor comes back (see
``advance``); the outputs come back once, in ``results``, after the last step.

Letter legend: B live rows, T decoding steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ringzero.rollout.engine.sampling import RowSettings, UniformStream
from ringzero.rollout.engine.stopping import LENGTH, STOP, StopStrings, StopTable
from ringzero.rollout.types import SamplingParams
from ringzero.tokenizer.base import Tokenizer


@dataclass
class RowSpec:
    """One sample to generate: its request, prompt, settings, generator seed, cap and stop ids, and what its
    request asks back beyond the tokens: ``top_k`` alternatives per step (0 = none) and, for MoE models,
    the ``routed`` experts of every fed token."""

    request: int
    prompt: list[int]
    params: SamplingParams
    seed: int
    max_new: int
    stop_ids: tuple[int, ...]
    rid: str | None = None
    top_k: int = 0
    routed: bool = False


@dataclass
class Finished:
    output_ids: list[int]
    logprobs: list[float]
    reason: str
    matched: int | str | None


def read_stops(rows, tokens_B: torch.Tensor) -> tuple[list[int] | None, list[int] | None]:
    """The step's one device-to-host copy, and only when a live row can stop on what it sampled.

    ``rows``: a ``DecodingRows`` or ``SlotRows`` (``_alive``, ``_has_stop_ids``, ``_strings``, ``_table``).
    Per live row: 1 + the stop id it just sampled (0 = none), stacked with the sampled tokens while
    some live row has stop strings (their text is matched on the host). Rows without stop ids or
    strings end at their length cap, which the host knows: then nothing is read at all.
    """
    watch_ids = any(row in rows._has_stop_ids for row in rows._alive)
    watch_text = any(row in rows._strings for row in rows._alive)
    if not (watch_ids or watch_text):
        return None, None
    stop_B = torch.where(rows._table.hit_stop_id(tokens_B), tokens_B + 1, 0)
    if watch_text:
        stops, tokens = torch.stack((stop_B, tokens_B)).tolist()
        return stops, tokens
    return stop_B.tolist(), None


def match_tail(strings: StopStrings, tail: list[int], token: int) -> str | None:
    """Extend a row's host tail by its newest token; the stop string that now appears, if any."""
    tail.append(token)
    del tail[: -strings.window]
    return strings.match(tail)


def row_end(rows, row, b: int, stops, tokens, capped: bool) -> tuple[str, int | str | None] | None:
    """``(reason, matched)`` when live row ``b`` (key ``row``) ends on this step's token, else None."""
    if stops is not None and stops[b]:
        return STOP, stops[b] - 1
    if row in rows._strings and (matched := rows._match(row, tokens[b])) is not None:
        return STOP, matched
    return (LENGTH, None) if capped else None


class DecodingRows:
    def __init__(
        self, specs: list[RowSpec], tokenizer: Tokenizer | None, device: torch.device | str | None = None
    ):
        params = [s.params for s in specs]
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.steps = max(s.max_new for s in specs)
        self.settings = RowSettings.build(
            [p.temperature for p in params], [p.top_k for p in params], [p.top_p for p in params], self.device
        )
        self.uniforms = UniformStream([s.seed for s in specs], self.device)
        self._table = StopTable([s.stop_ids for s in specs], self.device)
        self._has_stop_ids = {row for row, s in enumerate(specs) if s.stop_ids}
        self._strings = {row: StopStrings(p.stop, tokenizer) for row, p in enumerate(params) if p.stop}
        self._tails: dict[int, list[int]] = {row: [] for row in self._strings}  # host tails of their outputs
        self._max_new = [s.max_new for s in specs]  # by original row
        self._ids_BT = torch.zeros((len(specs), self.steps), dtype=torch.long, device=self.device)
        self._logp_BT = torch.zeros((len(specs), self.steps), dtype=torch.float64, device=self.device)
        self._alive = list(range(len(specs)))  # the original row of each live row
        self._alive_B = torch.arange(len(specs), device=self.device)  # the same indices on the device
        self._ends: dict[int, tuple[int, str, int | str | None]] = {}  # row -> (length, reason, matched)

    @property
    def alive(self) -> tuple[int, ...]:
        """The original row of each live row, in live order (host values)."""
        return tuple(self._alive)

    def cap(self, row: int, length: int) -> None:
        """End original row ``row`` at ``length`` tokens at most (an abort: it stops after that step)."""
        self._max_new[row] = min(self._max_new[row], length)

    @property
    def live(self) -> int:
        """Rows still decoding."""
        return len(self._alive)

    def advance(self, t: int, tokens_B: torch.Tensor, logp_B: torch.Tensor) -> torch.Tensor | None:
        """Record step ``t``; ``None`` if every row goes on, else the (possibly empty) live rows to keep.

        The rows to keep come back as an index tensor on the device, for the cache and the tokens.
        """
        self._ids_BT[self._alive_B, t] = tokens_B
        self._logp_BT[self._alive_B, t] = logp_B.to(torch.float64)
        stops, tokens = self._read_back(tokens_B)
        done = []
        for b, row in enumerate(self._alive):
            end = row_end(self, row, b, stops, tokens, self._max_new[row] <= t + 1)
            if end is not None:
                self._ends[row] = (t + 1, *end)
                done.append(b)
        if not done:
            return None
        finished = set(done)
        keep = [b for b in range(len(self._alive)) if b not in finished]
        keep_B = torch.tensor(keep, dtype=torch.long, device=self.device)  # one upload, shared below
        self._select(keep, keep_B)
        return keep_B

    def _read_back(self, tokens_B: torch.Tensor) -> tuple[list[int] | None, list[int] | None]:
        return read_stops(self, tokens_B)

    def _match(self, row: int, token: int) -> str | None:
        return match_tail(self._strings[row], self._tails[row], token)

    def results(self) -> list[Finished]:
        """Every row's outcome, in row order; the output buffers come to the host here, once."""
        if len(self._ends) != self._ids_BT.shape[0]:
            raise RuntimeError(f"{self._ids_BT.shape[0] - len(self._ends)} rows are still decoding")
        ids, logp = self._ids_BT.tolist(), self._logp_BT.tolist()
        return [
            Finished(ids[row][:n], logp[row][:n], reason, matched)
            for row, (n, reason, matched) in sorted(self._ends.items())
        ]

    def _select(self, keep: list[int], keep_B: torch.Tensor) -> None:
        self.settings = self.settings.select(keep, keep_B)
        self.uniforms.select(keep, keep_B)
        self._table.select(keep_B)
        self._alive = [self._alive[b] for b in keep]
        self._alive_B = self._alive_B[keep_B]
