"""Training engines behind one seam: what a stage needs to train a model, whichever engine holds it.

- ``training``: the ``TrainingEngine`` protocol and the ``TrainingSetup`` it builds;
- ``torch_engine``: the embedded default (``HybridLM``, dp x cp with ringzero's CP attention, AdamW on
  fp32 masters);
- ``megatron``: megatron-core (tensor parallelism, its MLA and MoE layers, ringzero's Lightning layer as a
  megatron-core module), imported only when ``engines.training.kind`` is ``megatron``.

Stages call ``training_engine(cfg).build(...)`` and never import an engine directly.
"""

from __future__ import annotations

from ringzero.engines.training import TrainingEngine, TrainingSetup


def training_engine(cfg) -> TrainingEngine:
    """The engine ``cfg.engines.training`` names."""
    kind = cfg.engines.training.kind
    if kind == "megatron":
        from ringzero.engines.megatron.engine import MegatronEngine

        return MegatronEngine(cfg.engines.training)
    from ringzero.engines.torch_engine import TorchEngine

    return TorchEngine()


__all__ = ["TrainingEngine", "TrainingSetup", "training_engine"]
