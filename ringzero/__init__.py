"""ringzero: Zero RL with FP32 islands, per-layer-type context parallelism and staged runs."""

__version__ = "0.1.0"
