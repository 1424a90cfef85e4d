"""One tolerance per dtype for every comparison in tests/model (``|a - b| <= atol + rtol |b|``).

The numbers live in ``ringzero.model.tolerances`` (the ``check decode`` command applies the same ones);
where they come from:
- float64 atol = rtol = 1e-10: two forms of the same math differ only in summation order.
- float32 atol = rtol = 1e-4: the elementwise level of kernel equivalence tests in torchtitan and fla.
- bfloat16 atol = rtol = 2.5e-2: Transformer Engine's context-parallel attention tests.
"""

from __future__ import annotations

import torch

from ringzero.model.tolerances import tolerance


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype | None = None) -> None:
    """Compare at the tolerance of ``dtype`` (default: ``actual``'s dtype); dtypes may differ."""
    tol = tolerance(dtype or actual.dtype)
    torch.testing.assert_close(
        actual.detach().double(), expected.detach().double(), atol=tol.atol, rtol=tol.rtol
    )
