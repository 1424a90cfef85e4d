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

    def step(self) -> Any: ...  # -> ringzero.engines.optimizer.StepReport

    def master_state_dict(self, everywhere: bool = True) -> dict[str, torch.Tensor]:
        """Full fp32 weights; with ``everywhere=False`` a sharding engine gathers them to rank 0 only (``{}``
        elsewhere): what only rank 0 writes or sends never exists on the other ranks."""
        ...

    def load_weights(self, state: dict[str, torch.Tensor], source: str) -> None: ...

    def state(self, everywhere: bool = True) -> tuple[dict[str, torch.Tensor], dict]: ...

    def load_state(self, tensors: dict[str, torch.Tensor], meta: dict) -> None: ...


@dataclass
class TrainingSetup:
    """``model``: what the trainer scores and trains (``hidden(ids, positions)``, ``logits(hidden)``,
    ``cfg``), placed on this rank's device and layout. ``serving``: a single-device ``HybridLM`` with the same
    weights, what an embedded rollout engine copies and evaluations sample from; ``None`` until ``served()``
    is first called, for an engine that shards its weights (no rank keeps a full copy it does not use: a stage
    whose rollouts run on SGLang servers never builds one)."""

    model: torch.nn.Module
    optimizer: EngineOptimizer
    serving: HybridLM | None
    cfg: object = None  # the ModelConfig a lazily built serving model has
    device: torch.device | None = None

    def served(self) -> HybridLM:
        """``serving`` holding the current weights (a collective when the engine shards them)."""
        if self.serving is self.model:
            return self.serving
        from ringzero.model.weights import load_weights_

        state = self.optimizer.master_state_dict()
        if self.serving is None:
            from ringzero.model.config import PrecisionPolicy

            self.serving = HybridLM(self.cfg, PrecisionPolicy.preset("fp32")).to(self.device or "cpu")
        load_weights_(self.serving, state, source="the training engine")
        return self.serving

    def sampler_model(self, engines) -> torch.nn.Module:
        """What a rollout client is built over: the serving model for the embedded engine, the trainer's own
        model for SGLang servers (they hold the weights; pushes read the optimizer's masters)."""
        return self.served() if engines.rollout.kind == "embedded" else self.model


class TrainingEngine(Protocol):
    kind: str

    def build(
        self,
        cfg,
        store,
        init_uri: str | None,
        policy: PrecisionPolicy,
        runtime: Runtime,
        *,
        optim,
        total_steps: int,
        schedule: str,
    ) -> TrainingSetup:
        """The stage's model from ``init_uri`` (a fresh one when None) and its optimizer (``optim``: the
        stage's ``OptimSettings``)."""
        ...

    def frozen(self, cfg, store, uri: str, policy: PrecisionPolicy, runtime: Runtime) -> torch.nn.Module:
        """A frozen copy of ``uri`` on the same layout (the KL reference), scored as ``model`` is."""
        ...
