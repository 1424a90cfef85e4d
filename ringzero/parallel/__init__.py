"""Context and data parallelism, applied to single-device model code from outside.

Where to start:
- ``dims``: ``ParallelDims`` (validated degrees) and ``build_groups`` (process groups, built once)
- ``sharding``: ``SeqLayout``, contiguous or zigzag shards with global positions, shard/unshard/gather
- ``parallelize``: swaps each attention layer's ``.core`` for the CP core its layer type's strategy builds
- ``grads``: global loss normalisation and the gradient sum that make a CP step equal a single-process one
- ``strategies``: which strategy serves which layer type, and why other pairings are refused
- ``mla_cp``, ``lightning_cp``, ``ring_attention``: the CP cores; ``comm``: their communication ledger
- ``launch``: ``RankPool`` of local gloo ranks (checks, tests, benchmarks), ``init_from_env`` for torchrun

Importing this package (or ``config``) does not import torch.
"""
