"""Rollout tests run single-threaded on a two-layer model (one Lightning, one MLA layer) of tiny dims."""

from __future__ import annotations

import torch

torch.set_num_threads(1)
