"""Pushing the trainer's new weights to the rollout engine after each RL step.

- In process (the embedded engine): copy the fp32 master state dict; the engine casts it to its OWN
  precision policy, so a bf16 rollout stays bf16 while the trainer keeps fp32 masters.
- Over HTTP (``ringzero serve`` or SGLang): commit a weights checkpoint to the store and ask the server
  to ``update_weights_from_disk`` it, with the step as ``weight_version``.
"""

from __future__ import annotations

import torch

from ringzero.model.checkpoint import save_state
from ringzero.model.config import ModelConfig


def weight_version(step: int) -> str:
    return f"step-{step}"


def push_weights(client, state_dict: dict[str, torch.Tensor], version: str, *, store=None,
                 prefix: str | None = None, model_cfg: ModelConfig | None = None) -> str | None:
    """Send ``state_dict`` to ``client``; returns the checkpoint URI when it went through the store."""
    if hasattr(client, "update_weights"):
        client.update_weights(state_dict, version)
        return None
    if store is None or prefix is None or model_cfg is None:
        raise ValueError("a rollout client without in-process weight updates needs store, prefix and model_cfg")
    name = f"{prefix}/weights-{version}"
    if any(store.name_of(u) == name for u in store.list(name)):
        uri = store.uri_of(name)  # pushed before an interruption: the same step's weights, committed
    else:
        uri = save_state(store, name, model_cfg, state_dict, {"weight_version": version})
    client.update_weights_from_disk(uri, version)
    return uri
