"""Decoding caches for a batch of sequences of different lengths.

Layout: left padding. All rows share one column axis; a row whose prompt is shorter starts with padding
columns at *negative* positions, so its real tokens sit at positions 0, 1, ... like an unpadded sequence.
Padding never becomes visible (MLA masks negative key positions; Lightning zeroes their keys and
values, so its state stays exactly zero until the first real token). After prefill every row decodes at
the same column, each at its own next position. That is what a batched rollout engine needs:

- many prompts at once: ``left_padded(prompts, pad_id)`` gives ids and positions for one prefill;
- different prompt lengths: positions per row (``[B, T]``), never a shared offset;
- rows finishing at different times: ``cache.select(rows)`` keeps (or repeats) rows, so finished ones
  stop costing compute and one prefilled prompt can fan out into n samples;
- rows joining a running batch (continuous batching): ``put(slots, fresh)`` writes a fresh prefill into
  some rows, right-aligned to the last column, masking those rows' older columns (position -1);
  ``add_rows``, ``pad_front`` and ``drop_front`` grow the rows, add masked leading columns or forget
  leading columns, each without copying the rows it does not write (``drop_front`` moves a view's start).

Per layer: MLA keeps ``[c_kv; k_rope]`` per token (``r + dr`` values) in the body dtype, exactly the
values the parallel form computes; Lightning keeps its ``[B, H, dk, dv]`` state in at least fp32.
Letter legend: B rows, T columns (cached tokens), c latent width r + dr.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ringzero.errors import RingzeroError


class _Columns:
    """A ``[B, T, ...]`` tensor that grows along T with amortised doubling (no copy per token).

    The view starts at ``_start`` so a continuous batch can drop or add leading columns without copying
    the rows; a full buffer is reallocated from the view only, which reclaims dropped columns.
    """

    def __init__(self, batch: int, tail: tuple[int, ...], dtype, device, capacity: int, fill: float = 0):
        self._buf = torch.full((batch, max(capacity, 1), *tail), fill, dtype=dtype, device=device)
        self._fill = fill
        self._start = 0
        self._end = 0

    @property
    def length(self) -> int:
        return self._end - self._start

    def view(self) -> torch.Tensor:
        return self._buf[:, self._start : self._end]

    def _realloc(self, front: int, width: int) -> None:
        grown = self._buf.new_full((self._buf.shape[0], width, *self._buf.shape[2:]), self._fill)
        grown[:, front : front + self.length] = self.view()
        self._buf, self._start, self._end = grown, front, front + self.length

    def append(self, new_BS: torch.Tensor) -> torch.Tensor:
        if self._end + new_BS.shape[1] > self._buf.shape[1]:
            self._realloc(0, max(self.length + new_BS.shape[1], 2 * self._buf.shape[1]))
        self._buf[:, self._end : self._end + new_BS.shape[1]] = new_BS
        self._end += new_BS.shape[1]
        return self.view()

    def select(self, rows: torch.Tensor) -> None:
        self._buf = self._buf.index_select(0, rows)

    def pad_front(self, k: int) -> None:
        """``k`` more leading columns of ``fill`` for every row (a longer newcomer joins)."""
        if k > self._start:
            self._realloc(k, max(k + self.length, 2 * self._buf.shape[1]))
        self._start -= k
        self._buf[:, self._start : self._start + k] = self._fill

    def drop_front(self, k: int) -> None:
        """Forget the ``k`` leading columns: no copy, the next reallocation reclaims them."""
        self._start += min(k, self.length)

    def add_rows(self, n: int) -> None:
        self._buf = torch.cat([self._buf, self._buf.new_full((n, *self._buf.shape[1:]), self._fill)])

    def put(self, rows_B: torch.Tensor, src_BS: torch.Tensor) -> None:
        """Rows ``rows_B`` become ``src_BS`` right-aligned, ``fill`` before it: only those rows are
        written."""
        cut = self._end - src_BS.shape[1]
        self._buf[rows_B, self._start : cut] = self._fill
        self._buf[rows_B, cut : self._end] = src_BS


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

    def pad_front(self, k: int) -> None:
        self._cols.pad_front(k)

    def drop_front(self, k: int) -> None:
        self._cols.drop_front(k)

    def add_rows(self, n: int) -> None:
        self._cols.add_rows(n)

    def put(self, rows_B: torch.Tensor, other: MLALayerCache) -> None:
        self._cols.put(rows_B, other.latent)


class LightningLayerCache:
    """The recurrent state ``[B, H, dk, dv]`` (at least fp32)."""

    def __init__(self, batch: int, num_attention_heads: int, dk: int, dv: int, dtype, device):
        self.state = torch.zeros((batch, num_attention_heads, dk, dv), dtype=dtype, device=device)

    def select(self, rows: torch.Tensor) -> None:
        self.state = self.state.index_select(0, rows)

    def pad_front(self, k: int) -> None:
        """A fixed-size state has no columns: nothing to pad or drop."""

    drop_front = pad_front

    def add_rows(self, n: int) -> None:
        self.state = torch.cat([self.state, self.state.new_zeros((n, *self.state.shape[1:]))])

    def put(self, rows_B: torch.Tensor, other: LightningLayerCache) -> None:
        self.state[rows_B] = other.state


class DecodeCache:
    """Every layer's cache plus the positions of all cached columns (``positions`` ``[B, T]``, int64).

    Build one with ``HybridLM.new_cache(batch_size)``; pass it to ``HybridLM.forward`` for prefill chunks
    and decode steps. ``forward`` appends; nothing else mutates it except ``select``.
    """

    def __init__(self, layers: list, batch_size: int, device, capacity: int):
        self.layers = layers
        # Unwritten columns hold position -1: masked for every query, so padding is free to add.
        self._positions = _Columns(batch_size, (), torch.long, device, capacity, fill=-1)

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
            raise RingzeroError(
                f"cache holds {self.batch_size} rows but the input has {positions_BS.shape[0]}"
            )
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
                raise RingzeroError(
                    f"row index out of range for a cache of {self.batch_size} rows: {rows.tolist()}"
                )
        self._positions.select(rows)
        for layer in self.layers:
            layer.select(rows)

    # -- a slot pool for continuous batching: rows are slots, written one newcomer at a time --

    def add_rows(self, n: int) -> None:
        """``n`` empty slots at the end (every column masked, zero state)."""
        self._positions.add_rows(n)
        for layer in self.layers:
            layer.add_rows(n)

    def put(self, slots: torch.Tensor, other: DecodeCache) -> None:
        """Slots ``slots`` take ``other``'s rows (a fresh prefill), right-aligned to this cache's last column.

        Columns are added at the front when ``other`` is longer; the slots' older columns are masked. Only
        the written slots and the added columns are touched: the other rows are not copied.
        """
        self.pad_front(max(other.length - self.length, 0))
        self._positions.put(slots, other.positions)
        for mine, theirs in zip(self.layers, other.layers, strict=True):
            mine.put(slots, theirs)

    def pad_front(self, k: int) -> None:
        if k > 0:
            self._positions.pad_front(k)
            for layer in self.layers:
                layer.pad_front(k)

    def drop_front(self, k: int) -> None:
        """Forget leading columns no live row can see (they hold padding or finished rows' tokens)."""
        if k > 0:
            self._positions.drop_front(k)
            for layer in self.layers:
                layer.drop_front(k)


def left_padded(prompts: Sequence[Sequence[int]], pad_id: int, device=None):
    """``(ids [B, T], positions [B, T])`` for a prefill of prompts of different lengths.

    Padding columns come first and get negative positions (-k .. -1), the prompt tokens 0 .. len-1.
    Both are laid out on the host and copied to ``device`` in one piece each.
    """
    width = max((len(p) for p in prompts), default=0)
    ids = [[pad_id] * (width - len(p)) + [int(t) for t in p] for p in prompts]
    positions = [list(range(len(p) - width, len(p))) for p in prompts]
    shape = (len(prompts), width)
    return (
        torch.tensor(ids, dtype=torch.long, device=device).reshape(shape),
        torch.tensor(positions, dtype=torch.long, device=device).reshape(shape),
    )
