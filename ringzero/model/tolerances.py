"""Agreement tolerances per dtype, for comparing two forms of the same math (``|a - b| <= atol + rtol |b|``).

- float64: 1e-10. Parallel and decoding forms differ only in summation order; fp64 rounding (~1e-16
  relative) accumulated over these depths stays many orders below it, so a miss is a real bug.
- float32: atol = rtol = 1e-4, the level used by kernel equivalence tests in public PyTorch projects
  (torchtitan, fla use relative RMSE 3e-3..5e-3 for fused kernels; an elementwise 1e-4 is stricter).
- bfloat16: atol = rtol = 2.5e-2, as Transformer Engine's context-parallel attention tests.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float
    source: str


TOLERANCES = {
    torch.float64: Tolerance(1e-10, 1e-10, "fp64 equivalence: summation order only"),
    torch.float32: Tolerance(1e-4, 1e-4, "fp32 kernel equivalence (torchtitan/fla level)"),
    torch.bfloat16: Tolerance(2.5e-2, 2.5e-2, "Transformer Engine CP tests"),
}


def tolerance(dtype: torch.dtype) -> Tolerance:
    return TOLERANCES[dtype]


def compare(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> dict:
    """``max_abs``, ``max_rel`` (max_abs over max |expected|), the tolerance and ``ok``.

    Shapes must be equal (``[N, 1]`` against ``[N]`` would broadcast to ``[N, N]`` and could pass) and the
    tensors non-empty (an empty comparison proves nothing): either is a ValueError, not a pass."""
    if actual.shape != expected.shape:
        raise ValueError(
            f"compare: shapes differ, actual {tuple(actual.shape)} vs expected {tuple(expected.shape)}"
        )
    if actual.numel() == 0:
        raise ValueError(f"compare: empty tensors (shape {tuple(actual.shape)}) prove nothing")
    tol = tolerance(dtype)
    a, e = actual.detach().double(), expected.detach().double()
    diff = (a - e).abs()
    max_abs = float(diff.max())
    scale = float(e.abs().max())
    ok = bool((diff <= tol.atol + tol.rtol * e.abs()).all()) and bool(torch.isfinite(a).all())
    return {
        "max_abs": max_abs,
        "max_rel": max_abs / scale if scale else max_abs,
        "atol": tol.atol,
        "rtol": tol.rtol,
        "ok": ok,
    }
