"""Metric records: namespaced keys (``ratio/p99``, ``len/mean``) appended as JSON lines per stage.

A ``MetricWriter`` is the only way stages emit metrics; tests use ``MemoryMetricWriter``.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np


def _check_key(key: str) -> None:
    if not key or "/" not in key or key.startswith("/") or key.endswith("/"):
        raise ValueError(f"metric key {key!r} must be namespaced as 'group/name', e.g. 'ratio/p99'")


def _plain(v: Any) -> Any:
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else (1e308 if v > 0 else -1e308)
    return v


class MetricWriter:
    """Appends one JSON object per ``log`` call: ``{"step": n, "time": t, "ratio/p99": ...}``."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = self.path.open("a", buffering=1)

    def log(self, step: int, metrics: dict[str, Any]) -> dict[str, Any]:
        record = {"step": int(step), "time": time.time()}
        for key, value in metrics.items():
            _check_key(key)
            record[key] = _plain(value)
        self._fh.write(json.dumps(record, sort_keys=True) + "\n")
        self._fh.flush()
        return record

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> MetricWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class MemoryMetricWriter(MetricWriter):
    """Keeps records in memory: the dummy backend for tests."""

    def __init__(self):  # noqa: D107 - no file
        self.records: list[dict[str, Any]] = []

    def log(self, step: int, metrics: dict[str, Any]) -> dict[str, Any]:
        record = {"step": int(step)}
        for key, value in metrics.items():
            _check_key(key)
            record[key] = _plain(value)
        self.records.append(record)
        return record

    def close(self) -> None:
        pass


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Read a metrics JSONL file; a torn last line (crash mid-write) is ignored, any other bad line is an
    error."""
    lines = Path(path).read_text().splitlines()
    out = []
    for i, line in enumerate(lines):
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                break
            raise ValueError(f"{path}:{i + 1}: not a JSON metric record") from None
    return out


def merge_by_step(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record per step, in step order; a later record's keys win. A stage that resumes from its
    last checkpoint logs again the steps it had done after that checkpoint, and those replace the
    interrupted attempt's; records of one step from different sources (train, eval) merge."""
    merged: dict[int, dict[str, Any]] = {}
    for record in records:
        merged.setdefault(int(record["step"]), {}).update(record)
    return [merged[step] for step in sorted(merged)]


def distribution(prefix: str, values: np.ndarray | list[float]) -> dict[str, float]:
    """mean, p50, p90, p99, p99.9 and max of ``values`` under ``prefix/``."""
    arr = np.asarray(values, dtype=np.float64).ravel()
    if arr.size == 0:
        return {f"{prefix}/{k}": float("nan") for k in ("mean", "p50", "p90", "p99", "p99.9", "max")}
    q = np.quantile(arr, [0.5, 0.9, 0.99, 0.999])
    return {
        f"{prefix}/mean": float(arr.mean()),
        f"{prefix}/p50": float(q[0]),
        f"{prefix}/p90": float(q[1]),
        f"{prefix}/p99": float(q[2]),
        f"{prefix}/p99.9": float(q[3]),
        f"{prefix}/max": float(arr.max()),
    }
