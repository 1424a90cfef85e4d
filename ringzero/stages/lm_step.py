"""One next-token training step over a global batch, on any ``dp x cp`` layout: pretraining and distillation.

Every rank builds the same global batch (batches are functions of the seed and the step); replica d
takes its contiguous share of the rows and each CP rank its columns, with global positions. The loss
is the mean negative log-likelihood over the *global* count of target tokens (the mask's sum over the
whole batch, known on every rank without a collective), so the gradients summed over all ranks equal
one process's. Each micro-batch runs forward and backward on its own.

Letter legend: B rows, L tokens per row, W = L - 1 input columns, S local columns.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ringzero.parallel.runtime import Runtime
from ringzero.parallel.token_shards import TokenShard, next_token_logprobs, shard_tokens


@dataclass
class LMStepResult:
    loss: float  # the global batch's mean NLL
    report: object | None  # the optimizer's StepReport (None when not training)


def _local_mask(mask_mW: torch.Tensor, shard: TokenShard) -> torch.Tensor:
    cols = shard.columns_S.clamp(max=shard.width - 1)
    return mask_mW.index_select(1, cols) & shard.valid_S[None, :]


def lm_step(model, ids_BL: torch.Tensor, runtime: Runtime, *, mask_BW: torch.Tensor | None = None,
            optimizer=None, sharding: str = "contiguous", micro_batch: int = 32) -> LMStepResult:
    """Mean NLL of ``ids_BL``'s next tokens where ``mask_BW`` is true (all of them when None); with an
    ``optimizer``, also backward, the gradient sum over ranks and one optimizer step."""
    dev = runtime.device
    ids_BL = ids_BL.to(dev)
    if mask_BW is None:
        mask_BW = torch.ones((ids_BL.shape[0], ids_BL.shape[1] - 1), dtype=torch.bool, device=dev)
    mask_BW = mask_BW.to(dev)
    count = mask_BW.sum().clamp(min=1).to(torch.float64)  # stays on the device: no sync per step
    rows = list(range(ids_BL.shape[0]))[runtime.dp_slice(ids_BL.shape[0])]
    total = torch.zeros((), dtype=torch.float64, device=dev)
    training = optimizer is not None
    if training:
        optimizer.zero_grad()
    with torch.set_grad_enabled(training):
        for start in range(0, len(rows), max(1, micro_batch)):
            at = torch.tensor(rows[start:start + micro_batch], device=dev)
            shard = shard_tokens(ids_BL.index_select(0, at), runtime, sharding)
            logp_mS, _ = next_token_logprobs(model, shard)
            loss = -(logp_mS * _local_mask(mask_BW.index_select(0, at), shard)).sum() / count.to(logp_mS.dtype)
            if training:
                loss.backward()
            total += loss.detach().double()
    runtime.sum_(total)
    report = None
    if training:
        if runtime.distributed:
            optimizer.reduce_grads(runtime.groups)
        report = optimizer.step()
    return LMStepResult(float(total), report)
