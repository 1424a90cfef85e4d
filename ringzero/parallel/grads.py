"""What makes a sharded training step equal the unsharded one: global loss normalisation and gradient sums.

Each CP rank sees a slice of every sequence and each DP rank a slice of the batch, so a rank's loss
term is its own tokens' sum divided by the token count of the *whole* global batch, and the gradient
of every replicated weight is the sum of the ranks' gradients over the ``dp_cp`` group. (A ``W_uk``
slice that only one rank touched under ``a2a`` is completed by the same sum.)
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

import torch
import torch.distributed as dist

from ringzero.model.precision import at_least_fp32
from ringzero.parallel.dims import ParallelGroups


def global_sum(x: torch.Tensor, group) -> torch.Tensor:
    """Sum of a (detached) tensor over ``group``; for denominators and logged values, not for gradients."""
    out = x.detach().clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)
    return out


def token_mean(values_BS: torch.Tensor, mask_BS: torch.Tensor, groups: ParallelGroups) -> torch.Tensor:
    """This rank's share of the mean of ``values`` over every valid token of the global batch.

    Summed over the ``dp_cp`` ranks (as ``sync_grads`` does for the gradients) it is the global mean."""
    mask = mask_BS.to(values_BS.dtype)
    count = global_sum(mask.sum(), groups.dp_cp).clamp(min=1)
    return (values_BS * mask).sum() / count


def sequence_mean(values_BS: torch.Tensor, mask_BS: torch.Tensor, groups: ParallelGroups) -> torch.Tensor:
    """This rank's share of sample-level normalisation: each sequence's token sum over its own length,
    averaged over the sequences of the global batch. A sequence's length is summed over its CP shards;
    the sequence count over the data-parallel replicas (every CP rank of a replica holds the same rows)."""
    mask = mask_BS.to(values_BS.dtype)
    lengths_B = global_sum(mask.sum(-1), groups.cp).clamp(min=1)
    n_seqs = global_sum(torch.tensor(float(values_BS.shape[0]), dtype=values_BS.dtype), groups.dp)
    return ((values_BS * mask).sum(-1) / lengths_B).sum() / n_seqs


@torch.no_grad()
def sync_grads(params: Iterable[torch.nn.Parameter], groups: ParallelGroups) -> None:
    """Sum gradients over the ``dp_cp`` group, one flat all-reduce per gradient dtype.

    A parameter without a gradient on this rank gets zeros, so every rank reduces the same buffers."""
    if groups.dims.world_size == 1:
        return
    buckets: dict[tuple, list[torch.nn.Parameter]] = defaultdict(list)
    for p in params:
        if not p.requires_grad:
            continue
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        buckets[(p.grad.dtype, p.grad.device)].append(p)
    for (dtype, _), bucket in buckets.items():
        # bf16 partial gradients are summed in fp32 and rounded once, as one process's matmul would.
        flat = torch.cat([p.grad.reshape(-1) for p in bucket]).to(at_least_fp32(dtype))
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=groups.dp_cp)
        offset = 0
        for p in bucket:
            n = p.grad.numel()
            p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
            offset += n
