"""Stage summaries hold finite numbers only: a NaN (a route never taken, an empty bucket) means "not
measured", so it is left out, and a gate on that key fails with "missing" instead of comparing NaN."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence


def finite_only(metrics: Mapping[str, float]) -> dict[str, float]:
    return {
        k: float(v)
        for k, v in metrics.items()
        if isinstance(v, int | float) and v is not None and math.isfinite(float(v))
    }


def mean_of_last(history: Sequence[Mapping[str, float]], keys: Sequence[str], last: int) -> dict[str, float]:
    """Per key, the mean of its finite values over the last ``last`` records that have it."""
    out = {}
    for key in keys:
        values = [
            float(r[key]) for r in history[-last:] if r.get(key) is not None and math.isfinite(float(r[key]))
        ]
        if values:
            out[key] = sum(values) / len(values)
    return out


def median_of(values: Sequence[float], key: str) -> dict[str, float]:
    """``{key: median of the finite values}``, {} when there are none (a summary leaves unmeasured keys
    out)."""
    finite = sorted(float(v) for v in values if v is not None and math.isfinite(float(v)))
    if not finite:
        return {}
    mid = len(finite) // 2
    return {key: finite[mid] if len(finite) % 2 else (finite[mid - 1] + finite[mid]) / 2}
