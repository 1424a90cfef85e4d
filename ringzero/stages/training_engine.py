"""The training engine a stage trains with, chosen once from ``engines.training.kind``.

Stages call ``training_engine(cfg).build(...)`` and never import an engine directly; megatron-core is
imported only when the config names it.
"""

from __future__ import annotations

from ringzero.engines.training import TrainingEngine


def training_engine(cfg) -> TrainingEngine:
    """The engine ``cfg.engines.training`` names."""
    kind = cfg.engines.training.kind
    if kind == "megatron":
        from ringzero.engines.megatron.engine import MegatronEngine

        return MegatronEngine(cfg.engines.training)
    from ringzero.engines.torch_engine import TorchEngine

    return TorchEngine()
