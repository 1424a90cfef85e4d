"""Training engines behind one seam: what a stage needs to train a model, whichever engine holds it.

- ``training``: the ``TrainingEngine`` protocol and the ``TrainingSetup`` it builds;
- ``torch_engine``: the embedded default (``HybridLM``, dp x cp with ringzero's CP attention, AdamW on
  fp32 masters);
- ``megatron``: megatron-core (tensor parallelism, its MLA and MoE layers, ringzero's Lightning layer as a
  megatron-core module), imported only when ``engines.training.kind`` is ``megatron``.

- ``optimizer``: AdamW on fp32 masters (the embedded engine's; megatron's optimizers share its interface);
- ``builders``: task, tokenizer and model construction, and ``placed`` (device + ``parallelize``).

A stage picks its engine with ``ringzero.stages.training_engine`` and never imports an engine directly.
"""

from __future__ import annotations

from ringzero.engines.training import TrainingEngine, TrainingSetup

__all__ = ["TrainingEngine", "TrainingSetup"]
