"""The embedded default: ``HybridLM`` in plain PyTorch, dp x cp with ringzero's CP attention inside."""

from __future__ import annotations

from ringzero.engines.builders import placed, start_model
from ringzero.engines.optimizer import TrainOptimizer
from ringzero.engines.training import TrainingSetup


class TorchEngine:
    kind = "torch"

    def build(self, cfg, store, init_uri, policy, runtime, *, optim, total_steps, schedule) -> TrainingSetup:
        model = placed(start_model(cfg, store, init_uri, policy), cfg, runtime).train()
        return TrainingSetup(
            model, TrainOptimizer(model, optim, total_steps=total_steps, schedule=schedule), model
        )

    def frozen(self, cfg, store, uri, policy, runtime):
        model = placed(start_model(cfg, store, uri, policy), cfg, runtime).eval()
        for p in model.parameters():
            p.requires_grad_(False)
        return model
