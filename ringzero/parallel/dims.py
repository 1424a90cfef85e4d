"""Parallel degrees of a job, checked against the world size, and the process groups they imply.

Ranks are laid out with TP innermost, then CP: ``rank = (dp_index * cp + cp_index) * tp + tp_index``, so
a TP group, then a CP group, is a run of neighbouring ranks (on one host first, where their traffic is
heaviest). This is megatron-core's order too, so its tensor-parallel groups are these. ``ParallelDims`` is
a plain value; ``build_groups`` creates every process group once and returns them in a ``ParallelGroups``
that the caller passes on explicitly. Nothing is stored in module globals. ``tp`` > 1 is the megatron
engine's (the ranks of a TP group hold one replica's shards and see the same rows). ``ep`` > 1 is the
megatron engine's expert parallelism, carved out of the data- and context-parallel ranks as megatron-core
does: it must divide ``dp * cp`` and does not change the world size. megatron folds the CP ranks in: with
``j = dp_index * cp + cp_index`` (the rank's place among the replicas' ranks), ranks ``j = k * ep .. k * ep +
ep - 1`` hold the ``ep`` shards of the routed experts, so under CP the two halves of one sequence may sit
on two expert shards; each rank still sees its own rows. ``pp`` > 1 is the megatron engine's pipeline
parallelism, outermost as in megatron-core's ``tp-cp-ep-dp-pp`` order: ``rank = pp_index * (dp * cp * tp) +
inner``, where ``inner`` is the rank's place in one pipeline stage laid out as above. Every group except
``pp`` and ``values`` lives inside one stage; the ``pp`` group joins the ranks of one (dp, cp, tp) place
across the stages (megatron's pipeline group), and ``values`` spans every stage's dp x cp ranks of one TP
index: per-token values that only the last stage computes are summed over it, so every rank gets them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist

from ringzero.errors import RingzeroError
from ringzero.parallel.config import ep_problem


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
        if not problems and (problem := ep_problem(self.ep, self.dp, self.cp)):
            problems.append(problem)
        if not problems and self.dp * self.cp * self.tp * self.pp != self.world_size:
            problems.append(
                f"dp*cp*tp*pp = {self.dp}*{self.cp}*{self.tp}*{self.pp} = "
                f"{self.dp * self.cp * self.tp * self.pp} does not match world size {self.world_size}"
            )
        if problems:
            raise RingzeroError("invalid parallel dims: " + "; ".join(problems))

    @classmethod
    def from_config(cls, cfg, world_size: int, tp: int = 1, ep: int = 1, pp: int = 1) -> ParallelDims:
        """From a ``ringzero.parallel.config.ParallelConfig`` (and the training engine's ``tp``, ``ep``,
        ``pp``)."""
        return cls(dp=cfg.dp, cp=cfg.cp, world_size=world_size, tp=tp, ep=ep, pp=pp)

    @property
    def stage_size(self) -> int:
        """Ranks in one pipeline stage: dp x cp x tp."""
        return self.dp * self.cp * self.tp

    def coords(self, rank: int) -> tuple[int, int]:
        """``(dp_index, cp_index)`` of a global rank."""
        return divmod((rank % self.stage_size) // self.tp, self.cp)

    def tp_index(self, rank: int) -> int:
        return rank % self.tp

    def pp_index(self, rank: int) -> int:
        return rank // self.stage_size

    def rank_of(self, dp_index: int, cp_index: int, tp_index: int = 0, pp_index: int = 0) -> int:
        return pp_index * self.stage_size + (dp_index * self.cp + cp_index) * self.tp + tp_index

    def cp_ranks(self, dp_index: int, tp_index: int = 0, pp_index: int = 0) -> list[int]:
        return [self.rank_of(dp_index, c, tp_index, pp_index) for c in range(self.cp)]

    def dp_ranks(self, cp_index: int, tp_index: int = 0, pp_index: int = 0) -> list[int]:
        return [self.rank_of(d, cp_index, tp_index, pp_index) for d in range(self.dp)]

    def replica_ranks(self, tp_index: int = 0, pp_index: int = 0) -> list[int]:
        """Every rank holding the same shard of the weights (all ranks when tp = pp = 1)."""
        return [self.rank_of(d, c, tp_index, pp_index) for d in range(self.dp) for c in range(self.cp)]

    def tp_ranks(self, dp_index: int, cp_index: int, pp_index: int = 0) -> list[int]:
        return [self.rank_of(dp_index, cp_index, t, pp_index) for t in range(self.tp)]

    def pp_ranks(self, dp_index: int, cp_index: int, tp_index: int = 0) -> list[int]:
        """One rank per pipeline stage, first to last (megatron's pipeline group)."""
        return [self.rank_of(dp_index, cp_index, tp_index, p) for p in range(self.pp)]

    def values_ranks(self, tp_index: int = 0) -> list[int]:
        """Every stage's dp x cp ranks of one TP index (what ``Runtime.sum_`` sums over)."""
        return [r for p in range(self.pp) for r in self.replica_ranks(tp_index, p)]

    def ep_index(self, rank: int) -> int:
        """Which shard of the routed experts ``rank`` holds (megatron's expert-model-parallel rank)."""
        return ((rank % self.stage_size) // self.tp) % self.ep

    def expert_dp_ranks(self, rank: int) -> list[int]:
        """The ranks holding the same experts (and TP index and stage) as ``rank``: its expert gradients are
        summed over them (megatron's expert-data-parallel group; under CP it mixes CP indices)."""
        e, t, base = self.ep_index(rank), self.tp_index(rank), self.pp_index(rank) * self.stage_size
        return [base + (k * self.ep + e) * self.tp + t for k in range(self.dp * self.cp // self.ep)]


@dataclass(frozen=True)
class ParallelGroups:
    """The process groups of one rank. ``dp_cp`` spans every rank that holds the same shard of the weights
    (gradients are summed over it); ``tp`` the ranks that hold one replica's shards (None when tp = 1);
    ``pp`` one rank per pipeline stage (None when pp = 1); ``values`` every stage's ``dp_cp`` ranks of
    this TP index (``dp_cp`` itself when pp = 1)."""

    dims: ParallelDims
    rank: int
    cp: object
    dp: object
    dp_cp: object
    tp: object = None
    pp: object = None
    values: object = None

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

    def pick(rank_lists) -> object:
        """Create every group of one kind (all ranks, in one order: ``new_group`` is a collective) and
        return the one holding this rank."""
        chosen = None
        for ranks in rank_lists:
            group = dist.new_group(ranks)
            if rank in ranks:
                chosen = group
        return chosen

    P, T, D, C = range(dims.pp), range(dims.tp), range(dims.dp), range(dims.cp)
    dp_cp = pick(dims.replica_ranks(t, p) for p in P for t in T)
    return ParallelGroups(
        dims=dims,
        rank=rank,
        cp=pick(dims.cp_ranks(d, t, p) for p in P for t in T for d in D),
        dp=pick(dims.dp_ranks(c, t, p) for p in P for t in T for c in C),
        dp_cp=dp_cp,
        tp=pick(dims.tp_ranks(d, c, p) for p in P for d in D for c in C) if dims.tp > 1 else None,
        pp=pick(dims.pp_ranks(d, c, t) for d in D for c in C for t in T) if dims.pp > 1 else None,
        values=pick(dims.values_ranks(t) for t in T) if dims.pp > 1 else dp_cp,
    )
