"""Each engine keeps its own copy of the weights, cast to its own precision policy.

The trainer and the rollout engine may run the same weights under different policies (the gap the
project measures); a copy per engine keeps one side's casts from leaking into the other.
"""

from __future__ import annotations

import torch

from ringzero.errors import RingzeroError
from ringzero.model.checkpoint import check_tensors
from ringzero.model.config import PrecisionPolicy
from ringzero.model.hybrid import HybridLM


def copy_under_policy(model: HybridLM, policy: PrecisionPolicy) -> HybridLM:
    """A new ``HybridLM`` with ``model``'s config and weights, cast to ``policy``'s body dtype."""
    copy = HybridLM(model.cfg, policy).to(model.word_embeddings.weight.device)
    load_weights_(copy, model.state_dict(), source="copy_under_policy")
    return copy


@torch.no_grad()
def load_weights_(model: HybridLM, state_dict: dict[str, torch.Tensor], source: str) -> None:
    """Copy ``state_dict`` into ``model`` in place (cast to its dtype); refuse any name or shape mismatch."""
    if not isinstance(state_dict, dict):
        raise RingzeroError(f"{source}: expected a dict of tensors, got {type(state_dict).__name__}")
    check_tensors(model, state_dict, source)
    model.load_state_dict(state_dict, strict=True)
