"""The hybrid MLA / Lightning-attention model (single-device code; parallelism is applied from outside).

This package's ``__init__`` stays light: importing ``ringzero.model.config`` must not import torch.
"""
