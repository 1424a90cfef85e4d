"""Decoding caches for a batch of sequences of different lengths.

Layout: left padding. All rows share one column axis; a row whose prompt is shorter starts with padding
columns at *negative* positions, so its real tokens sit at positions 0, 1, ... like an unpadded sequence.
Padding never becomes visible (MLA masks negative key positions; Lightning zeroes their keys and
values, so its state stays exactly zero until the first real token). After prefill every row decodes at
the same column, each at its own next position. That is what a batched rollout engine needs:

- many prompts at once: ``left_padded(prompts, pad_id)`` gives ids and positions for one prefill;
- different prompt lengths: positions per row (``[B, T]``), never a shared offset;
- rows finishing at different times: ``cache.select(rows)`` keeps (or repeats) rows, so finished ones
  stop costing compute and one prefilled prompt can fan out into n samples.

Per layer: MLA keeps ``[c_kv; k_rope]`` per token (``r + dr`` values) in the body dtype, exactly the
values the parallel form computes; Lightning keeps its ``[B, H, dk, dv]`` state in at least fp32.
Letter legend: B rows, T columns (cached tokens), c latent width r + dr.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ringzero.errors import RingzeroError


class _Columns:
    """A ``[B, T, ...]`` tensor that grows along T with amortised doubling (no copy per token)."""

    def __init__(self, batch: int, tail: tuple[int, ...], dtype, device, capacity: int):
        self._buf = torch.zeros((batch, max(capacity, 1), *tail), dtype=dtype, device=device)
        self.length = 0

    def view(self) -> torch.Tensor:
        return self._buf[:, : self.length]

    def append(self, new_BS: torch.Tensor) -> torch.Tensor:
        need = self.length + new_BS.shape[1]
        if need > self._buf.shape[1]:
            grown = self._buf.new_zeros((self._buf.shape[0], max(need, 2 * self._buf.shape[1]),
                                         *self._buf.shape[2:]))
            grown[:, : self.length] = self.view()
            self._buf = grown
        self._buf[:, self.length:need] = new_BS
        self.length = need
        return self.view()

    def select(self, rows: torch.Tensor) -> None:
        self._buf = self._buf.index_select(0, rows)


class MLALayerCache:
    """``[c_kv; k_rope]`` per cached token: ``latent`` is ``[B, T, r + dr]``."""

    def __init__(self, batch: int, width: int, dtype, device, capacity: int):
        self._cols = _Columns(batch, (width,), dtype, device, capacity)

    @property
    def latent(self) -> torch.Tensor:
        return self._cols.view()

    def append(self, latent_BSc: torch.Tensor) -> torch.Tensor:
        return self._cols.append(latent_BSc)

    def select(self, rows: torch.Tensor) -> None:
        self._cols.select(rows)


class LightningLayerCache:
    """The recurrent state ``[B, H, dk, dv]`` (at least fp32)."""

    def __init__(self, batch: int, num_attention_heads: int, dk: int, dv: int, dtype, device):
        self.state = torch.zeros((batch, num_attention_heads, dk, dv), dtype=dtype, device=device)

    def select(self, rows: torch.Tensor) -> None:
        self.state = self.state.index_select(0, rows)


class DecodeCache:
    """Every layer's cache plus the positions of all cached columns (``positions`` ``[B, T]``, int64).

    Build one with ``HybridLM.new_cache(batch_size)``; pass it to ``HybridLM.forward`` for prefill chunks
    and decode steps. ``forward`` appends; nothing else mutates it except ``select``.
    """

    def __init__(self, layers: list, batch_size: int, device, capacity: int):
        self.layers = layers
        self._positions = _Columns(batch_size, (), torch.long, device, capacity)

    @property
    def batch_size(self) -> int:
        return self._positions._buf.shape[0]

    @property
    def length(self) -> int:
        """Columns cached so far (padding included)."""
        return self._positions.length

    @property
    def positions(self) -> torch.Tensor:
        return self._positions.view()

    def next_positions(self) -> torch.Tensor:
        """``[B]``: the position the next token of each row takes (0 for an empty cache)."""
        if self.length == 0:
            return torch.zeros(self.batch_size, dtype=torch.long, device=self._positions._buf.device)
        return (self.positions[:, -1] + 1).clamp(min=0)

    def append_positions(self, positions_BS: torch.Tensor) -> torch.Tensor:
        if positions_BS.shape[0] != self.batch_size:
            raise RingzeroError(f"cache holds {self.batch_size} rows but the input has {positions_BS.shape[0]}")
        return self._positions.append(positions_BS.to(torch.long))

    def select(self, rows: Sequence[int] | torch.Tensor, *, check: bool = True) -> None:
        """Keep rows in this order, in place; indices may repeat (n samples of one prefilled prompt).

        ``rows``: host indices (always checked, then copied to the cache's device once) or an index
        tensor. Indices out of range are refused; checking a tensor reads it back to the host, so a
        caller whose tensor is valid by construction (a decoding loop on a GPU) passes ``check=False``.
        """
        if not isinstance(rows, torch.Tensor):
            rows = list(rows)
            if any(not 0 <= r < self.batch_size for r in rows):
                raise RingzeroError(f"row index out of range for a cache of {self.batch_size} rows: {rows}")
            check = False
        rows = torch.as_tensor(rows, dtype=torch.long, device=self._positions._buf.device)
        if check and rows.numel():
            low, high = torch.stack((rows.min(), rows.max())).tolist()
            if low < 0 or high >= self.batch_size:
                raise RingzeroError(f"row index out of range for a cache of {self.batch_size} rows: "
                                    f"{rows.tolist()}")
        self._positions.select(rows)
        for layer in self.layers:
            layer.select(rows)


def left_padded(prompts: Sequence[Sequence[int]], pad_id: int, device=None):
    """``(ids [B, T], positions [B, T])`` for a prefill of prompts of different lengths.

    Padding columns come first and get negative positions (-k .. -1), the prompt tokens 0 .. len-1.
    Both are laid out on the host and copied to ``device`` in one piece each.
    """
    width = max((len(p) for p in prompts), default=0)
    ids = [[pad_id] * (width - len(p)) + [int(t) for t in p] for p in prompts]
    positions = [list(range(len(p) - width, len(p))) for p in prompts]
    shape = (len(prompts), width)
    return (torch.tensor(ids, dtype=torch.long, device=device).reshape(shape),
            torch.tensor(positions, dtype=torch.long, device=device).reshape(shape))
