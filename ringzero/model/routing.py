"""Which experts each token went to, read out of a forward or forced into one (routing replay).

    with capture_routing(model) as chosen:      # {layer index: LongTensor [B, S, K]}
        model(ids)
    with replay_routing(model, chosen):          # the same experts; weights from this forward's router
        model(ids)

A capture over several forwards of the same rows (a prefill then decode steps) concatenates them along
the sequence. Replay needs one ``[B, S, K]`` tensor per MoE layer for exactly the tokens of the forward
it wraps, and refuses anything else.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import torch

from ringzero.errors import RingzeroError
from ringzero.model.moe import MoE


def moe_layers(model) -> list[tuple[int, MoE]]:
    return [(i, block.mlp) for i, block in enumerate(model.layers) if isinstance(block.mlp, MoE)]


@contextmanager
def capture_routing(model) -> Iterator[dict[int, torch.Tensor]]:
    chosen: dict[int, torch.Tensor] = {}
    layers = moe_layers(model)
    for _, m in layers:
        m.record = []
    try:
        yield chosen
    finally:
        for i, m in layers:
            parts, m.record = m.record, None
            if parts:
                same_rows = all(p.shape[0] == parts[0].shape[0] for p in parts)
                chosen[i] = torch.cat(parts, dim=1) if same_rows else parts[-1]


@contextmanager
def replay_routing(model, experts: Mapping[int, torch.Tensor]) -> Iterator[None]:
    layers = moe_layers(model)
    missing = sorted({i for i, _ in layers} - set(experts))
    extra = sorted(set(experts) - {i for i, _ in layers})
    if missing or extra:
        raise RingzeroError(
            f"routing replay: experts given for layers {sorted(experts)}, the model's MoE layers "
            f"are {[i for i, _ in layers]}"
        )
    for i, m in layers:
        m.replay = experts[i]
    try:
        yield
    finally:
        for _, m in layers:
            m.replay = None
