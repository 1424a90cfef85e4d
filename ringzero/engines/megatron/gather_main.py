"""Full tensors on global rank 0 only: what only rank 0 writes or sends (a checkpoint, a resume point, a
push to rollout servers) is never materialized on the other ranks.

``gather_to_main(local, model)`` takes this rank's MegatronLM-named tensors (weights, moments) and returns
the full ``HybridLM`` tensors on global rank 0 and ``{}`` everywhere else. Only the ranks that hold a piece
rank 0 lacks take part, one tensor at a time, over megatron's groups:

1. experts (``ep`` > 1): the EP group of the first data-parallel place (its ranks ``j = 0 .. ep - 1`` of
   the dp x cp places, megatron folds CP in) gathers each expert tensor to its first rank;
2. tensor parallelism: the TP group of that first place gathers each tensor to TP rank 0, which merges
   them (``convert.from_megatron``); both gathers are ``convert``'s with ``to_first``;
3. pipeline stages: each later stage's first rank sends its tensors, name by name, to global rank 0.

Every other rank (the other replicas hold the same shards) returns at once, in no collective. Every rank
of the job still calls it (the ones that take part must not skip).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from megatron.core import parallel_state

from ringzero.engines.megatron.convert import from_megatron, gather_experts, gather_tp


def _place() -> int:
    """This rank's index among the dp x cp places of its stage and TP index (megatron's DP-with-CP rank)."""
    return parallel_state.get_data_parallel_rank(with_context_parallel=True)


def gather_to_main(local: dict[str, torch.Tensor], model) -> dict[str, torch.Tensor]:
    stage = getattr(model, "stage", None)
    if stage is not None:
        local = {stage.to_global(n): t for n, t in local.items()}
    ep = getattr(model, "ep_size", 1)
    if _place() >= ep:  # another replica of shards the first place's EP group holds
        return {}
    if ep > 1:
        local = gather_experts(local, model, to_first=True)
        if parallel_state.get_expert_model_parallel_rank() != 0:
            return {}
    shards = gather_tp(local, model, to_first=True) if model.tp_size > 1 else [local]
    if parallel_state.get_tensor_model_parallel_rank() != 0:
        return {}
    full = from_megatron(shards, model.cfg)
    return _stages_to_main(full, model)


def _stages_to_main(mine: dict[str, torch.Tensor], model) -> dict[str, torch.Tensor]:
    if getattr(model, "pp_size", 1) == 1:
        return mine
    group = parallel_state.get_pipeline_model_parallel_group()
    ranks = dist.get_process_group_ranks(group)
    me, main = dist.get_rank(), ranks[0]
    metas: list | None = [None] * len(ranks) if me == main else None
    dist.gather_object({n: (tuple(t.shape), t.dtype) for n, t in mine.items()}, metas, dst=main, group=group)
    if me != main:
        for name in mine:
            dist.send(mine[name].contiguous(), dst=main, group=group)
        return {}
    out = dict(mine)
    device = next(iter(mine.values())).device if mine else torch.device("cpu")
    for src, meta in zip(ranks[1:], metas[1:], strict=True):
        for name, (shape, dtype) in meta.items():
            buf = torch.empty(shape, dtype=dtype, device=device)
            dist.recv(buf, src=src, group=group)
            out[name] = buf
    return out
