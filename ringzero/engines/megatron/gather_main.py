"""Full tensors on global rank 0 only: what only rank 0 writes or sends (a checkpoint, a resume point, a
push to rollout servers) is never materialized on the other ranks.

``gather_to_main(local, model)`` takes this rank's MegatronLM-named tensors (weights, moments) and returns
the full ``HybridLM`` tensors on global rank 0 and ``{}`` everywhere else. Only the ranks that hold a piece
rank 0 lacks take part, one tensor at a time, over megatron's groups:

1. experts (``ep`` > 1): the EP group of the first data-parallel place (its ranks ``j = 0 .. ep - 1`` of
   the dp x cp places, megatron folds CP in) gathers each expert tensor to its first rank;
2. tensor parallelism: the TP group of that first place gathers each tensor to TP rank 0, which merges
   them (``convert.from_megatron``);
3. pipeline stages: each later stage's first rank sends its tensors, name by name, to global rank 0.

Every other rank (the other replicas hold the same shards) returns at once, in no collective. Every rank
of the job still calls it (the ones that take part must not skip).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from megatron.core import parallel_state

from ringzero.engines.megatron.convert import _expert_index, from_megatron


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
        local = _experts_to_first(local, model)
        if parallel_state.get_expert_model_parallel_rank() != 0:
            return {}
    if model.tp_size > 1:
        shards = _tp_to_first(local)
        if shards is None:
            return {}
        full = from_megatron(shards, model.cfg)
    else:
        full = from_megatron([local], model.cfg)
    return _stages_to_main(full, model)


def _experts_to_first(local: dict[str, torch.Tensor], model) -> dict[str, torch.Tensor]:
    group = parallel_state.get_expert_model_parallel_group()
    first = dist.get_process_group_ranks(group)[0]
    mine = dist.get_rank() == first
    per = model.cfg.num_experts // model.ep_size
    out = {}
    for name, t in local.items():
        parts = _expert_index(name)
        if parts is None:
            out[name] = t
            continue
        gathered = [torch.empty_like(t) for _ in range(model.ep_size)] if mine else None
        dist.gather(t.contiguous(), gathered, dst=first, group=group)
        if mine:
            for r, g in enumerate(gathered):
                out[f"{parts[0]}{r * per + parts[1]}{parts[2]}"] = g
    return out


def _tp_to_first(local: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]] | None:
    group = parallel_state.get_tensor_model_parallel_group()
    ranks = dist.get_process_group_ranks(group)
    mine = dist.get_rank() == ranks[0]
    shards: list[dict] = [{} for _ in ranks]
    for name, t in local.items():
        parts = [torch.empty_like(t) for _ in ranks] if mine else None
        dist.gather(t.contiguous(), parts, dst=ranks[0], group=group)
        if mine:
            for r, part in enumerate(parts):
                shards[r][name] = part
    return shards if mine else None


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
