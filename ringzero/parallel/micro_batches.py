"""Forward (and backward) of a list of micro-batches, whatever splits the model's layers.

A ``MicroBatch`` is a ``TokenShard`` and a ``head``: a function of the model's final hidden states
``[B, S, D]`` that returns ``(loss, record)``: the loss to backpropagate (None when only scoring) and
whatever the caller keeps (log-probs, metrics). ``run_micro_batches`` runs them one after the other on a
model that holds every layer (forward, head, backward, so no graph outlives its micro-batch), or hands
them to the model's pipeline (``model.pipeline``: megatron's 1F1B schedule over the stages), where the
head runs on the last stage only and the other stages get ``None`` records. Sum per-token values over
``Runtime.sum_`` afterwards: its group spans the pipeline stages.

``context`` (optional) wraps one micro-batch's forward and head: routing replay sets the experts there.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from ringzero.parallel.token_shards import TokenShard


@dataclass
class MicroBatch:
    shard: TokenShard
    head: Callable[[torch.Tensor], tuple[torch.Tensor | None, Any]]
    context: Callable[[], AbstractContextManager] | None = None


def run_micro_batches(model, micro_batches: list[MicroBatch], *, backward: bool) -> list[Any]:
    """Each micro-batch's record, in order (``None`` on pipeline stages other than the last)."""
    pipeline = getattr(model, "pipeline", None)
    if pipeline is not None:
        return pipeline.run(micro_batches, backward=backward)
    records = []
    for mb in micro_batches:
        with (mb.context or nullcontext)():
            loss, record = mb.head(model.hidden(mb.shard.inputs_BS, mb.shard.positions_BS))
        if backward and loss is not None:
            loss.backward()
        records.append(record)
    return records
