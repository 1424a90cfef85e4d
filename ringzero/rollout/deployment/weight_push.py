"""The trainer's weights to the rollout engine: one transport, chosen once from ``engines.rollout``.

- ``in_process`` (the embedded engine): the fp32 master state dict is copied in; the engine casts it to
  its OWN precision policy, so a bf16 rollout stays bf16 while the trainer keeps fp32 masters.
- ``distributed`` (SGLang, ``weight_sync: distributed``): the replica set broadcasts the tensors under the
  checkpoint's names over its torch.distributed weight group, cast to the rollout body dtype.
- ``disk`` (SGLang, ``weight_sync: disk``): rank 0 writes a Ling 2.5 folder under ``weights_dir`` and
  every replica loads that path (``folder_push``).
- ``store`` (``ringzero serve``, ``weight_sync: store``): a weights checkpoint is committed to the store
  (or an already committed one named) and the server loads its URI.

The version string is the ``weight_version`` the engine reports back in every case; an RL step's is
``weight_version(step)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from ringzero.errors import RingzeroError
from ringzero.model.checkpoint import save_state
from ringzero.model.config import ModelConfig
from ringzero.rollout.deployment.folder_push import push_folder

PushMode = Literal["in_process", "distributed", "disk", "store"]


def weight_version(step: int) -> str:
    return f"step-{step}"


def push_mode(rollout) -> PushMode:
    """The transport ``engines.rollout`` names (``local``: a stage whose job has no rollout servers samples
    with an embedded engine whatever the settings say)."""
    return "in_process" if rollout.kind == "embedded" else rollout.weight_sync


@dataclass(frozen=True)
class WeightPusher:
    """Pushes state dicts to a rollout client by one transport. ``store`` and ``prefix``: where a ``store``
    push commits its checkpoint; ``weights_dir``: the shared volume of a ``disk`` push."""

    mode: PushMode
    model_cfg: ModelConfig | None = None
    store: object = None
    prefix: str | None = None
    weights_dir: str | None = None
    runtime: object = None
    tokenizer: object = None

    def __post_init__(self):
        if self.mode == "disk" and self.weights_dir is None:
            raise RingzeroError(
                "engines.rollout.weight_sync disk needs engines.rollout.weights_dir: the shared volume the "
                "servers "
                "mount, where pushed folders are written; set it, use weight_sync distributed, or sample "
                "only "
                "from the checkpoint the servers started with (engines.rollout.served_uri)"
            )
        if self.mode == "disk" and self.model_cfg is None:
            raise RingzeroError("a disk weight push writes a model folder and needs the model config")

    @classmethod
    def for_rollout(cls, rollout, *, local: bool = False, **where) -> WeightPusher:
        return cls("in_process" if local else push_mode(rollout), weights_dir=rollout.weights_dir, **where)

    def push(
        self,
        client,
        state_dict: dict[str, torch.Tensor],
        version: str,
        *,
        dtype: torch.dtype | None = None,
        committed_uri: str | None = None,
    ) -> str | None:
        """Send ``state_dict`` as ``version``; returns the folder path or checkpoint URI the servers loaded.
        ``committed_uri``: the store checkpoint these weights already are (a ``store`` push names it as
        is)."""
        if self.mode in ("in_process", "distributed"):
            if not hasattr(client, "update_weights"):
                raise RingzeroError(
                    f"a {self.mode} weight push needs a rollout client that takes tensors "
                    f"({type(client).__name__} does not)"
                )
            client.update_weights(state_dict, version)
            return None
        if self.mode == "disk":
            return push_folder(
                client,
                state_dict,
                version,
                model_cfg=self.model_cfg,
                weights_dir=self.weights_dir,
                runtime=self.runtime,
                tokenizer=self.tokenizer,
                dtype=dtype,
            )
        uri = committed_uri or self._commit(state_dict, version, dtype)
        client.update_weights_from_disk(uri, version)
        return uri

    def _commit(self, state_dict, version: str, dtype) -> str:
        if self.store is None or self.prefix is None or self.model_cfg is None:
            raise RingzeroError(
                "a store weight push of new weights needs the stage's store, checkpoint prefix "
                "and model config"
            )
        name = f"{self.prefix}/weights-{version}"
        if any(self.store.name_of(u) == name for u in self.store.list(name)):
            return self.store.uri_of(
                name
            )  # pushed before an interruption: the same step's weights, committed
        return save_state(
            self.store, name, self.model_cfg, state_dict, {"weight_version": version}, self.tokenizer, dtype
        )
