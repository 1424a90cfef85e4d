"""A decode cache with fixed shapes and fixed addresses, so one decoding step can be a CUDA graph.

``DecodeCache`` grows along T and hands out views ``[:, start:end]``: every step changes shapes, which a
captured graph cannot replay. ``StaticDecodeCache`` offers what ``HybridLM.hidden`` uses of it
(``layers[i]``, ``next_positions()``, ``append_positions``; MLA ``append``; Lightning ``state``), with:

- ``C`` columns preallocated per buffer; ``append`` returns the WHOLE ``[B, C, ...]`` buffer. Columns not
  yet written hold position -1, which ``attention.visible_mask`` never shows to a query, so attention over
  the buffer equals attention over the written prefix;
- the write index and each row's next position as device tensors advanced in place: nothing a step
  computes depends on a host int, so replaying a captured step writes the next column each time;
- the Lightning state updated in place (``state``'s setter copies a new tensor into the old storage).

Prefill appends the prompt (S > 1) through the same calls; only the one-token step has static shapes.
Capacity is checked on the host against a count of the columns appended by Python calls (no device
read). A replayed graph runs no Python, so that count does not move: whoever replays bounds the steps
(``length`` + steps <= ``capacity``). Past capacity on a device the index op fails (CUDA: a device-side
assert that ends the process's CUDA context). The graph also reads tensors the model caches between
calls (Lightning decay tables, the LM head's cast): they must stay alive while it is replayed.

Create and use the cache in the same autograd mode: inference tensors may not be written outside
``torch.inference_mode()``. Letter legend: B rows, C capacity (columns), S new columns, c latent width.
"""

from __future__ import annotations

import torch

from ringzero.model.precision import body_dtype, state_dtype


class _Cursor:
    """The columns of the step in progress, shared by every layer of one cache.

    ``append_positions`` runs before any layer (``HybridLM.hidden``), takes ``cols = end + arange(S)``
    and advances ``end``; the layers then write at ``cols``.
    """

    def __init__(self, device):
        self.end = torch.zeros(1, dtype=torch.long, device=device)
        self.cols = self.end.clone()

    def advance(self, S: int) -> torch.Tensor:
        self.cols = self.end + torch.arange(S, device=self.end.device)
        self.end.add_(S)
        return self.cols


class StaticMLALayerCache:
    """``[c_kv; k_rope]`` per column, ``latent`` ``[B, C, r + dr]``."""

    def __init__(self, cursor: _Cursor, batch: int, capacity: int, width: int, dtype, device):
        self._cursor = cursor
        self.latent = torch.zeros((batch, capacity, width), dtype=dtype, device=device)

    def append(self, latent_BSc: torch.Tensor) -> torch.Tensor:
        return self.latent.index_copy_(1, self._cursor.cols, latent_BSc.to(self.latent.dtype))

    def reset(self) -> None:
        self.latent.zero_()


class StaticLightningLayerCache:
    """The recurrent state ``[B, H, dk, dv]``, always the same storage."""

    def __init__(self, batch: int, num_attention_heads: int, dk: int, dv: int, dtype, device):
        self._state = torch.zeros((batch, num_attention_heads, dk, dv), dtype=dtype, device=device)

    @property
    def state(self) -> torch.Tensor:
        return self._state

    @state.setter
    def state(self, value: torch.Tensor) -> None:
        # The inference-mode step updates in place and hands the same tensor back; prefill and the
        # autograd step return a new one, copied in so the address a graph recorded stays valid.
        if value is not self._state:
            self._state.copy_(value)

    def reset(self) -> None:
        self._state.zero_()


class StaticDecodeCache:
    """Every layer's fixed-size cache plus the key positions ``positions`` ``[B, C]`` (-1 = unwritten)."""

    def __init__(self, layers: list, batch_size: int, capacity: int, device, cursor: _Cursor):
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1 column (got {capacity})")
        self.layers, self.capacity, self._cursor = layers, capacity, cursor
        self.positions = torch.full((batch_size, capacity), -1, dtype=torch.long, device=device)
        self._next = torch.zeros(batch_size, dtype=torch.long, device=device)
        self._length = 0  # columns appended by Python calls; a graph replay does not count here

    @property
    def batch_size(self) -> int:
        return self.positions.shape[0]

    @property
    def length(self) -> int:
        """Columns appended through Python calls (prefill, eager steps, a capture): see the module doc."""
        return self._length

    def buffers(self) -> list[torch.Tensor]:
        """Every tensor a captured step reads or writes in place (their addresses never change)."""
        out = [self.positions, self._next, self._cursor.end]
        for layer in self.layers:
            out.append(layer.state if isinstance(layer, StaticLightningLayerCache) else layer.latent)
        return out

    def next_positions(self) -> torch.Tensor:
        """``[B]``: the position the next token of each row takes (0 for an empty cache); a copy, as
        ``DecodeCache`` gives, since the buffer moves at the next ``append_positions``."""
        return self._next.clone()

    def append_positions(self, positions_BS: torch.Tensor) -> torch.Tensor:
        B, S = positions_BS.shape
        if B != self.batch_size:
            raise ValueError(f"cache holds {self.batch_size} rows but the input has {B}")
        if self._length + S > self.capacity:
            raise ValueError(
                f"static decode cache of capacity {self.capacity} columns cannot take {S} more "
                f"after {self._length} (requested length {self._length + S})"
            )
        self._length += S
        cols = self._cursor.advance(S)
        self.positions.index_copy_(1, cols, positions_BS.to(torch.long))
        # As DecodeCache: one past the last column's position, padding (negative) counting as empty.
        self._next.copy_((positions_BS[:, -1] + 1).clamp(min=0))
        return self.positions

    def reset(self) -> None:
        """Empty again, in place: a graph captured on this cache replays on the next prefill."""
        self.positions.fill_(-1)
        self._next.zero_()
        self._cursor.end.zero_()
        self._length = 0
        for layer in self.layers:
            layer.reset()


def new_static_cache(model, batch_size: int, capacity: int) -> StaticDecodeCache:
    """A ``StaticDecodeCache`` for ``model`` (a ``HybridLM``), laid out as ``HybridLM.new_cache``."""
    device = model.word_embeddings.weight.device
    cursor = _Cursor(device)
    layers = []
    for block in model.layers:
        a = block.attention
        if block.kind == "mla":
            layers.append(
                StaticMLALayerCache(
                    cursor, batch_size, capacity, a.latent_width, body_dtype(model.policy), device
                )
            )
        else:
            layers.append(
                StaticLightningLayerCache(
                    batch_size,
                    a.num_attention_heads,
                    a.head_dim,
                    a.head_dim,
                    state_dtype(model.policy),
                    device,
                )
            )
    return StaticDecodeCache(layers, batch_size, capacity, device, cursor)
