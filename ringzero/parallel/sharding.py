"""Sequence sharding over CP ranks: which global positions each rank holds, and moving tensors between
the global sequence and the local shards.

The sequence is cut into equal chunks. ``contiguous``: rank p holds chunk p of P. ``zigzag``: rank p
holds chunks p and 2P-1-p of 2P, which gives every rank the same amount of causal attention work in
the ring. A length that does not divide evenly is padded at the end; padded positions come after every
real position, so causal attention and the decayed recurrence never let them reach a real token, and
``valid_mask`` marks them for the loss. RoPE and decay use the global positions returned here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.distributed as dist

from ringzero.errors import RingzeroError

ShardMode = Literal["contiguous", "zigzag"]
MODES = ("contiguous", "zigzag")


def chunks_per_rank(mode: str) -> int:
    if mode not in MODES:
        raise RingzeroError(f"sharding must be one of {MODES} (got {mode!r})")
    return 1 if mode == "contiguous" else 2


def chunk_ids(rank: int, cp: int, mode: str) -> list[int]:
    """Global chunk indices held by ``rank``, in local order."""
    return [rank] if chunks_per_rank(mode) == 1 else [rank, 2 * cp - 1 - rank]


def position_list(local_len: int, cp: int, rank: int, mode: str) -> list[int]:
    """``shard_positions`` as plain ints, for index arithmetic that must not touch a device."""
    n = chunks_per_rank(mode)
    if local_len % n:
        raise RingzeroError(f"{mode} sharding needs an even local length (got {local_len})")
    c = local_len // n
    return [p for i in chunk_ids(rank, cp, mode) for p in range(i * c, (i + 1) * c)]


def shard_positions(local_len: int, cp: int, rank: int, mode: str, device=None) -> torch.Tensor:
    """Global positions of ``rank``'s ``local_len`` tokens. Every rank's layout follows from its own
    length, which is how CP cores know where other ranks' keys sit without sending positions."""
    n = chunks_per_rank(mode)
    if local_len % n:
        raise RingzeroError(f"{mode} sharding needs an even local length (got {local_len})")
    c = local_len // n
    return torch.cat([torch.arange(i * c, (i + 1) * c, device=device) for i in chunk_ids(rank, cp, mode)])


@dataclass(frozen=True)
class SeqLayout:
    """How a global sequence of ``seq_len`` tokens is laid out over ``cp`` ranks."""

    seq_len: int
    cp: int
    mode: ShardMode = "contiguous"

    def __post_init__(self) -> None:
        if self.seq_len < 1 or self.cp < 1:
            raise RingzeroError(f"seq_len and cp must be >= 1 (got seq_len={self.seq_len}, cp={self.cp})")
        chunks_per_rank(self.mode)

    @property
    def n_chunks(self) -> int:
        return self.cp * chunks_per_rank(self.mode)

    @property
    def chunk_len(self) -> int:
        return -(-self.seq_len // self.n_chunks)

    @property
    def padded_len(self) -> int:
        return self.chunk_len * self.n_chunks

    @property
    def local_len(self) -> int:
        return self.padded_len // self.cp

    @property
    def padding(self) -> int:
        return self.padded_len - self.seq_len

    def positions(self, rank: int, device=None) -> torch.Tensor:
        return shard_positions(self.local_len, self.cp, rank, self.mode, device)

    def position_list(self, rank: int) -> list[int]:
        return position_list(self.local_len, self.cp, rank, self.mode)

    def valid_mask(self, rank: int) -> torch.Tensor:
        return self.positions(rank) < self.seq_len

    def shard(self, x: torch.Tensor, rank: int, dim: int = 1, pad_value: float = 0) -> torch.Tensor:
        """This rank's part of a global tensor whose ``dim`` is the sequence (padded with ``pad_value``)."""
        if x.shape[dim] != self.seq_len:
            raise RingzeroError(
                f"tensor has {x.shape[dim]} positions on dim {dim}, layout expects {self.seq_len}"
            )
        if self.padding:
            pad_shape = list(x.shape)
            pad_shape[dim] = self.padding
            x = torch.cat([x, x.new_full(pad_shape, pad_value)], dim=dim)
        return x.index_select(dim, self.positions(rank, x.device))

    def unshard(self, parts: list[torch.Tensor], dim: int = 1) -> torch.Tensor:
        """Reassemble the global tensor from every rank's shard (group-rank order); padding dropped."""
        if len(parts) != self.cp:
            raise RingzeroError(f"got {len(parts)} shards for a layout over {self.cp} ranks")
        order = torch.cat([self.positions(r) for r in range(self.cp)])
        stacked = torch.cat(parts, dim=dim)
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(order.numel())
        return stacked.index_select(dim, inverse[: self.seq_len].to(stacked.device))

    def gather(self, x_local: torch.Tensor, group, dim: int = 1) -> torch.Tensor:
        """All-gather per-token values (e.g. log-probs) into the global sequence on every rank."""
        parts = [torch.empty_like(x_local) for _ in range(self.cp)]
        dist.all_gather(parts, x_local.contiguous(), group=group)
        return self.unshard(parts, dim=dim)
