"""The model side of the Megatron-core training engine (megatron-core 0.16.1).

- ``eager_import``: megatron.core imported with its torch.compile jit fuser off on a build without CUDA. This
  package imports it first, so every ringzero module that imports megatron gets it that way;
- ``cpu_shim``: the patches megatron-core needs without Transformer Engine (always) and on a CPU torch
  build under gloo (CPU only); ``apply()`` once per process;
- ``lightning``: Ling 2.5's Lightning linear-attention layer as a megatron module, heads split over TP;
- ``model``: ``MegatronLM``, ringzero's model from megatron modules with ``HybridLM``'s training contract;
- ``convert``: weights between ``HybridLM`` and ``MegatronLM`` names, TP shards included.
"""

from ringzero.engines.megatron.eager_import import import_megatron_core

import_megatron_core()
