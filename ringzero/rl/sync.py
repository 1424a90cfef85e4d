"""Pushing the trainer's new weights to the rollout engine after each RL step.

- In process (the embedded engine): copy the fp32 master state dict; the engine casts it to its OWN
  precision policy, so a bf16 rollout stays bf16 while the trainer keeps fp32 masters.
- SGLang over a torch.distributed group (``weight_sync: distributed``): the replica set broadcasts the
  tensors under the checkpoint's names, cast to the rollout dtype.
- SGLang through a shared volume (``weight_sync: disk``): rank 0 writes a Ling 2.5 folder under
  ``weights_dir`` and every replica loads that path (``ringzero.rollout.replicas.folder_push``).
- ``ringzero serve`` (``weight_sync: store``): commit a weights checkpoint to the store and ask the server
  to ``update_weights_from_disk`` its URI.
The step is the ``weight_version`` in every case.
"""

from __future__ import annotations

import torch

from ringzero.model.checkpoint import save_state
from ringzero.model.config import ModelConfig


def weight_version(step: int) -> str:
    return f"step-{step}"


def push_weights(client, state_dict: dict[str, torch.Tensor], version: str, *, store=None,
                 prefix: str | None = None, model_cfg: ModelConfig | None = None, weights_dir: str | None = None,
                 runtime=None, tokenizer=None, dtype: torch.dtype | None = None) -> str | None:
    """Send ``state_dict`` to ``client``; returns the folder path or checkpoint URI the servers loaded."""
    if hasattr(client, "update_weights"):
        client.update_weights(state_dict, version)
        return None
    if model_cfg is None:
        raise ValueError("a rollout client without in-process weight updates needs model_cfg")
    if weights_dir is not None:
        from ringzero.rollout.replicas.folder_push import push_folder

        return push_folder(client, state_dict, version, model_cfg=model_cfg, weights_dir=weights_dir,
                           runtime=runtime, tokenizer=tokenizer, dtype=dtype)
    if store is None or prefix is None:
        raise ValueError("a push through the store needs store and prefix")
    name = f"{prefix}/weights-{version}"
    if any(store.name_of(u) == name for u in store.list(name)):
        uri = store.uri_of(name)  # pushed before an interruption: the same step's weights, committed
    else:
        uri = save_state(store, name, model_cfg, state_dict, {"weight_version": version}, tokenizer, dtype)
    client.update_weights_from_disk(uri, version)
    return uri
