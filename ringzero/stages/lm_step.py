"""One next-token training step over a global batch, on any ``dp x cp`` layout: pretraining and distillation.

Every rank builds the same global batch (batches are functions of the seed and the step); replica d
takes its contiguous share of the rows and each CP rank its columns, with global positions. The loss
is the mean negative log-likelihood over the *global* count of target tokens (the mask's sum over the
whole batch, known on every rank without a collective), so the gradients summed over all ranks equal
one process's. Each micro-batch runs forward and backward on its own (``run_micro_batches``; under
pipeline parallelism megatron's schedule interleaves them over the stages and only the last stage
computes the loss: the sum over ``Runtime.sum_`` gives every rank the total).

Letter legend: B rows, L tokens per row, W = L - 1 input columns, S local columns.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ringzero.errors import RingzeroError
from ringzero.parallel.micro_batches import MicroBatch, run_micro_batches
from ringzero.parallel.runtime import Runtime
from ringzero.parallel.token_shards import TokenShard, logprobs_from_hidden, shard_tokens


@dataclass
class LMStepResult:
    loss: float  # the global batch's mean NLL
    report: object | None  # the optimizer's StepReport (None when not training)


def _local_mask(mask_mW: torch.Tensor, shard: TokenShard) -> torch.Tensor:
    cols = shard.columns_S.clamp(max=shard.width - 1)
    return mask_mW.index_select(1, cols) & shard.valid_S[None, :]


def micro_batch_rows(
    rows: list[int], total: int, runtime: Runtime, micro_batch: int, equal_counts: bool = False
) -> list[list[int]]:
    """This rank's rows cut into micro-batches of at most ``micro_batch``. With ``equal_counts`` (an
    expert-parallel model: the data-parallel ranks' MoE layers exchange tokens in every forward) every rank
    cuts its share into as many micro-batches as the largest share needs, near-equal in size, so no rank
    waits in a forward its peer never runs."""
    if not equal_counts or runtime.dims.dp == 1:
        return [rows[s : s + micro_batch] for s in range(0, len(rows), micro_batch)]
    dp = runtime.dims.dp
    largest = -(-total // dp)  # the largest share, in rows (ceil)
    count = -(-largest // micro_batch)
    if total // dp < count:  # the smallest share, the same test on every rank: all refuse together
        raise RingzeroError(
            f"a batch of {total} rows over parallel.dp {dp} leaves the smallest share {total // dp} "
            f"rows for {count} micro-batches of at most {micro_batch}: with expert parallelism every "
            "data-parallel rank must run as many micro-batches; use more rows or a larger micro_batch"
        )
    cuts = [len(rows) * k // count for k in range(count + 1)]
    return [rows[cuts[k] : cuts[k + 1]] for k in range(count)]


def lm_step(
    model,
    ids_BL: torch.Tensor,
    runtime: Runtime,
    *,
    mask_BW: torch.Tensor | None = None,
    optimizer=None,
    sharding: str = "contiguous",
    micro_batch: int = 32,
) -> LMStepResult:
    """Mean NLL of ``ids_BL``'s next tokens where ``mask_BW`` is true (all of them when None); with an
    ``optimizer``, also backward, the gradient sum over ranks and one optimizer step."""
    dev = runtime.device
    ids_BL = ids_BL.to(dev)
    if mask_BW is None:
        mask_BW = torch.ones((ids_BL.shape[0], ids_BL.shape[1] - 1), dtype=torch.bool, device=dev)
    mask_BW = mask_BW.to(dev)
    count = mask_BW.sum().clamp(min=1).to(torch.float64)  # stays on the device: no sync per step
    rows = list(range(ids_BL.shape[0]))[runtime.dp_slice(ids_BL.shape[0])]
    training = optimizer is not None
    if training:
        optimizer.zero_grad()

    def micro(at: torch.Tensor) -> MicroBatch:
        shard = shard_tokens(ids_BL.index_select(0, at), runtime, sharding)
        mask_mS = _local_mask(mask_BW.index_select(0, at), shard)

        def head(hidden_BSD):
            logp_mS, _ = logprobs_from_hidden(model, shard, hidden_BSD)
            loss = -(logp_mS * mask_mS).sum() / count.to(logp_mS.dtype)
            return loss, loss.detach().double()

        return MicroBatch(shard, head)

    parts = micro_batch_rows(
        rows, ids_BL.shape[0], runtime, max(1, micro_batch), getattr(model, "ep_size", 1) > 1
    )
    micro_batches = [micro(torch.tensor(part, device=dev)) for part in parts]
    with torch.set_grad_enabled(training):
        records = run_micro_batches(model, micro_batches, backward=training)
    total = torch.zeros((), dtype=torch.float64, device=dev)
    for loss in records:
        if loss is not None:  # None: a pipeline stage other than the last
            total += loss
    runtime.sum_(total)
    report = None
    if training:
        if runtime.distributed:
            optimizer.reduce_grads(runtime.groups)
        report = optimizer.step()
    return LMStepResult(float(total), report)
