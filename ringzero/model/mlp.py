"""SwiGLU feed-forward: ``down(silu(gate(x)) * up(x))``."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SwiGLU(nn.Module):
    def __init__(self, hidden_size: int, hidden: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, hidden, bias=False)
        self.up_proj = nn.Linear(hidden_size, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, hidden_size, bias=False)

    def forward(self, x_BSD: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x_BSD)) * self.up_proj(x_BSD))
