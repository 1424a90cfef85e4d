"""The hybrid MLA / Lightning-attention model (single-device code; parallelism is applied from outside).

This package's ``__init__`` stays light: importing ``ringzero.model.config`` must not import torch.
"""

# The run config imports this package's config module, which needs ringzero.config.base: loading the
# config package first lets ``import ringzero.model.config`` work as the first import of a process.
import ringzero.config  # noqa: F401
