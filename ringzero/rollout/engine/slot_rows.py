"""The rows of a continuous batch: ``DecodingRows`` whose rows come and go while the batch decodes.

A static group starts all its rows at step 0 and keeps outputs per original row until the end. Here rows
join at any step and leave as soon as they finish, so every per-row tensor (settings, uniforms, stop ids,
output buffers) is kept in live order, rows are keyed by a number that is never reused, and each row
counts its own steps. A finished row's outputs come back to the host in the step it finishes (one read
for all rows finishing together), which frees its buffers for newcomers.

Letter legend: L live rows, C output columns (the longest cap among live rows).
"""

from __future__ import annotations

import torch

from ringzero.rollout.engine.rows import DecodingRows, Finished, RowSpec, row_end
from ringzero.rollout.engine.sampling import RowSettings, UniformStream
from ringzero.rollout.engine.stopping import StopStrings, StopTable
from ringzero.tokenizer.base import Tokenizer


def _settings(specs: list[RowSpec], device) -> RowSettings:
    params = [s.params for s in specs]
    return RowSettings.build(
        [p.temperature for p in params], [p.top_k for p in params], [p.top_p for p in params], device
    )


class SlotRows(DecodingRows):
    """Live rows keyed by ``key``; ``slot`` is each live row's row in the batch's cache."""

    def __init__(self, tokenizer: Tokenizer | None, device: torch.device):
        self.device = device
        self._tokenizer = tokenizer
        self.settings = _settings([], device)
        self.uniforms = UniformStream([], device)
        self._table = StopTable([], device)
        self._has_stop_ids: set[int] = set()
        self._strings: dict[int, StopStrings] = {}
        self._tails: dict[int, list[int]] = {}
        self._max_new: dict[int, int] = {}
        self._alive: list[int] = []  # key of each live row
        self.slots: list[int] = []  # cache row of each live row
        self._steps: list[int] = []  # tokens sampled so far, per live row
        self._steps_L = torch.empty(0, dtype=torch.long, device=device)
        self._ids_LC = torch.zeros((0, 1), dtype=torch.long, device=device)
        self._logp_LC = torch.zeros((0, 1), dtype=torch.float64, device=device)

    def steps_of(self, b: int) -> int:
        return self._steps[b]

    def join(self, specs: list[RowSpec], keys: list[int], slots: list[int]) -> None:
        """Append rows after the live ones; their first token is sampled at the next ``advance``."""
        self.settings = self.settings.cat(_settings(specs, self.device))
        self.uniforms.join([s.seed for s in specs])
        self._table.cat(StopTable([s.stop_ids for s in specs], self.device))
        for key, s in zip(keys, specs, strict=True):
            self._max_new[key] = s.max_new
            if s.stop_ids:
                self._has_stop_ids.add(key)
            if s.params.stop:
                self._strings[key], self._tails[key] = StopStrings(s.params.stop, self._tokenizer), []
        self._alive += keys
        self.slots += slots
        self._steps += [0] * len(specs)
        self._steps_L = torch.cat([self._steps_L, self._steps_L.new_zeros(len(specs))])
        width = max(self._ids_LC.shape[1], max(s.max_new for s in specs))
        self._ids_LC, self._logp_LC = (
            torch.cat([self._widened(buf, width), buf.new_zeros((len(specs), width))])
            for buf in (self._ids_LC, self._logp_LC)
        )

    @staticmethod
    def _widened(buf: torch.Tensor, width: int) -> torch.Tensor:
        return torch.nn.functional.pad(buf, (0, width - buf.shape[1])) if width > buf.shape[1] else buf

    def advance(self, tokens_L: torch.Tensor, logp_L: torch.Tensor) -> tuple[dict[int, Finished], list[int]]:
        """Record one token per live row; ``(finished rows by key, live indices kept)``."""
        self._ids_LC.scatter_(1, self._steps_L[:, None], tokens_L[:, None])
        self._logp_LC.scatter_(1, self._steps_L[:, None], logp_L.to(torch.float64)[:, None])
        self._steps_L += 1
        self._steps = [s + 1 for s in self._steps]
        stops, tokens = self._read_back(tokens_L)
        ends = {}
        for b, key in enumerate(self._alive):
            end = row_end(self, key, b, stops, tokens, self._max_new[key] <= self._steps[b])
            if end is not None:
                ends[b] = end
        if not ends:
            return {}, list(range(len(self._alive)))
        return self._finish(ends), self._keep_all_but(set(ends))

    def _finish(self, ends: dict[int, tuple]) -> dict[int, Finished]:
        done = list(ends)
        done_L = torch.tensor(done, dtype=torch.long, device=self.device)
        ids, logp = self._ids_LC[done_L].tolist(), self._logp_LC[done_L].tolist()  # one read for all of them
        out = {}
        for i, b in enumerate(done):
            n, key = self._steps[b], self._alive[b]
            out[key] = Finished(ids[i][:n], logp[i][:n], *ends[b])
            for table in (self._strings, self._tails, self._max_new):
                table.pop(key, None)
            self._has_stop_ids.discard(key)
        return out

    def _keep_all_but(self, finished: set[int]) -> list[int]:
        keep = [b for b in range(len(self._alive)) if b not in finished]
        keep_L = torch.tensor(keep, dtype=torch.long, device=self.device)
        self.settings = self.settings.select(keep, keep_L)
        self.uniforms.select(keep, keep_L)
        self._table.select(keep_L)
        self._alive, self.slots, self._steps = (
            [xs[b] for b in keep] for xs in (self._alive, self.slots, self._steps)
        )
        self._steps_L, self._ids_LC, self._logp_LC = (
            t[keep_L] for t in (self._steps_L, self._ids_LC, self._logp_LC)
        )
        return keep

    def results(self):
        raise NotImplementedError("a continuous batch hands each row's outcome out of advance()")
