"""Rotary position embedding at absolute positions, "rotate-half" layout.

Pairs are ``(x[i], x[i + d/2])`` (GPT-NeoX / Llama layout). DeepSeek checkpoints use interleaved pairs
``(x[2i], x[2i+1])``; the two differ only by a fixed permutation of the projection's output rows.

Letter legend: B batch, S sequence, H heads, d rotary dims.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar

import torch

from ringzero.model.precision import at_least_fp32

_SHARED: ContextVar[dict | None] = ContextVar("rope_shared_tables", default=None)


@contextmanager
def shared_tables():
    """Inside, ``rope_cos_sin`` builds each (positions tensor, dim, theta, dtype) table once.

    ``HybridLM.hidden`` opens one per forward: every layer rotates by the same positions tensor, and a
    decoding step would otherwise build the same tables once per layer. Scoped to one forward, so a
    positions tensor changed in place between forwards is never served stale tables.
    """
    token = _SHARED.set({})
    try:
        yield
    finally:
        _SHARED.reset(token)


def rope_cos_sin(positions: torch.Tensor, dim: int, theta: float, dtype: torch.dtype):
    """cos/sin of shape ``positions.shape + (dim,)`` in ``dtype``.

    Angles are formed in at least fp32: positions reach 1e5+ and bf16 would alias neighbouring angles.
    """
    shared = _SHARED.get()
    if shared is None:
        return _cos_sin(positions, dim, theta, dtype)
    key = (id(positions), dim, theta, dtype)
    hit = shared.get(key)
    if hit is None or hit[0] is not positions:  # the entry holds the tensor, so its id is never reused
        hit = shared[key] = (positions, _cos_sin(positions, dim, theta, dtype))
    return hit[1]


def _cos_sin(positions: torch.Tensor, dim: int, theta: float, dtype: torch.dtype):
    compute = at_least_fp32(dtype)
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=compute, device=positions.device) / dim))
    angles = positions.to(compute)[..., None] * inv_freq
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x_BSHd: torch.Tensor, cos_BSd: torch.Tensor, sin_BSd: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` (``[B, S, H, d]``) by per-token cos/sin (``[S, d]`` or ``[B, S, d]``)."""
    half = x_BSHd.shape[-1] // 2
    x1, x2 = x_BSHd[..., :half], x_BSHd[..., half:]
    rotated = torch.cat([-x2, x1], dim=-1)
    cos, sin = cos_BSd.unsqueeze(-2), sin_BSd.unsqueeze(-2)
    return x_BSHd * cos + rotated * sin
