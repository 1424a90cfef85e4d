"""The training-engine seam: one protocol both engines implement, one value a stage holds.

Every tensor that crosses the seam is a full (unsharded) tensor under the model's Ling 2.5 names without
the ``model.`` prefix (``HybridLM.state_dict()`` names): checkpoints, resume points, rollback snapshots
and weight pushes read and write the same dicts whatever engine and layout trained them. Methods that
gather or scatter shards are collectives: every rank of the job calls them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch

from ringzero.model.config import PrecisionPolicy
from ringzero.model.hybrid import HybridLM
from ringzero.parallel.runtime import Runtime


class EngineOptimizer(Protocol):
    """What the trainer, resume points and rollback use of an optimizer."""

    def zero_grad(self) -> None: ...

    def reduce_grads(self, groups) -> None:
        """Complete the accumulated gradients over the data-parallel ranks (``groups``: the job's
        ``ParallelGroups``) before ``step``; a collective. The optimizer owns it: a sharded optimizer
        reduce-scatters into its own buffers."""
        ...

    def step(self) -> Any: ...  # -> ringzero.stages.optimizer.StepReport

    def master_state_dict(self) -> dict[str, torch.Tensor]: ...

    def load_weights(self, state: dict[str, torch.Tensor], source: str) -> None: ...

    def state(self) -> tuple[dict[str, torch.Tensor], dict]: ...

    def load_state(self, tensors: dict[str, torch.Tensor], meta: dict) -> None: ...


@dataclass
class TrainingSetup:
    """``model``: what the trainer scores and trains (``hidden(ids, positions)``, ``logits(hidden)``, ``cfg``),
    placed on this rank's device and layout. ``serving``: a single-device ``HybridLM`` holding the same
    start weights, what an embedded rollout engine copies."""

    model: torch.nn.Module
    optimizer: EngineOptimizer
    serving: HybridLM

    def served(self) -> HybridLM:
        """``serving`` holding the current weights (a collective when the engine shards them)."""
        if self.serving is not self.model:
            from ringzero.rollout.engine.weights import load_weights_

            load_weights_(self.serving, self.optimizer.master_state_dict(), source="the training engine")
        return self.serving


class TrainingEngine(Protocol):
    kind: str

    def build(self, cfg, store, init_uri: str | None, policy: PrecisionPolicy, runtime: Runtime, *,
              optim, total_steps: int, schedule: str) -> TrainingSetup:
        """The stage's model from ``init_uri`` (a fresh one when None) and its optimizer (``optim``: the
        stage's ``OptimSettings``)."""
        ...

    def frozen(self, cfg, store, uri: str, policy: PrecisionPolicy, runtime: Runtime) -> torch.nn.Module:
        """A frozen copy of ``uri`` on the same layout (the KL reference), scored as ``model`` is."""
        ...
