"""Parallel degrees of a job, checked against the world size, and the process groups they imply.

Ranks are laid out with CP innermost: ``rank = dp_index * cp + cp_index``, so a CP group is a run of
neighbouring ranks (on one host first, where the all-to-all traffic is cheapest). ``ParallelDims`` is a
plain value; ``build_groups`` creates every process group once and returns them in a ``ParallelGroups``
that the caller passes on explicitly. Nothing is stored in module globals. ``tp``, ``pp`` and ``ep`` are
named so configs can carry them, but only degree 1 is accepted until those parallelisms exist.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist

from ringzero.errors import RingzeroError


@dataclass(frozen=True)
class ParallelDims:
    dp: int
    cp: int
    world_size: int
    tp: int = 1
    pp: int = 1
    ep: int = 1

    def __post_init__(self) -> None:
        problems = []
        for name in ("dp", "cp", "tp", "pp", "ep", "world_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                problems.append(f"{name} must be an integer >= 1 (got {value!r})")
        for name in ("tp", "pp", "ep"):
            value = getattr(self, name)
            if isinstance(value, int) and value > 1:
                problems.append(f"{name}={value}: only degree 1 is implemented")
        if not problems and self.dp * self.cp * self.tp * self.pp != self.world_size:
            problems.append(
                f"dp*cp*tp*pp = {self.dp}*{self.cp}*{self.tp}*{self.pp} = "
                f"{self.dp * self.cp * self.tp * self.pp} does not match world size {self.world_size}"
            )
        if problems:
            raise RingzeroError("invalid parallel dims: " + "; ".join(problems))

    @classmethod
    def from_config(cls, cfg, world_size: int) -> ParallelDims:
        """From a ``ringzero.parallel.config.ParallelConfig``."""
        return cls(dp=cfg.dp, cp=cfg.cp, world_size=world_size)

    def coords(self, rank: int) -> tuple[int, int]:
        """``(dp_index, cp_index)`` of a global rank."""
        return divmod(rank, self.cp)

    def cp_ranks(self, dp_index: int) -> list[int]:
        return [dp_index * self.cp + c for c in range(self.cp)]

    def dp_ranks(self, cp_index: int) -> list[int]:
        return [d * self.cp + cp_index for d in range(self.dp)]


@dataclass(frozen=True)
class ParallelGroups:
    """The process groups of one rank. ``dp_cp`` spans every rank that holds a replica of the weights
    (gradients of replicated parameters are summed over it)."""

    dims: ParallelDims
    rank: int
    cp: object
    dp: object
    dp_cp: object

    @property
    def cp_rank(self) -> int:
        return self.dims.coords(self.rank)[1]

    @property
    def dp_rank(self) -> int:
        return self.dims.coords(self.rank)[0]


def build_groups(dims: ParallelDims) -> ParallelGroups:
    """Create the process groups for ``dims``. Every rank must call this, in the same order, once per job
    (``new_group`` is a collective). The default process group must already be initialised with the
    backend of the device (gloo on CPU, NCCL on GPU); the subgroups inherit it."""
    if not dist.is_initialized():
        raise RingzeroError("torch.distributed is not initialised; start ranks with torchrun or a RankPool")
    world = dist.get_world_size()
    if world != dims.world_size:
        raise RingzeroError(f"parallel dims are for world size {dims.world_size}, the job has {world} ranks")
    rank = dist.get_rank()
    dp_index, cp_index = dims.coords(rank)
    cp_group = dp_group = None
    for d in range(dims.dp):
        g = dist.new_group(dims.cp_ranks(d))
        if d == dp_index:
            cp_group = g
    for c in range(dims.cp):
        g = dist.new_group(dims.dp_ranks(c))
        if c == cp_index:
            dp_group = g
    dp_cp_group = dist.new_group(list(range(world)))
    return ParallelGroups(dims=dims, rank=rank, cp=cp_group, dp=dp_group, dp_cp=dp_cp_group)
