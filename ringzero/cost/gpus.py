"""The accelerators a plan can name, from ``gpus.yaml`` (each number with its public source there)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

import yaml

from ringzero.errors import RingzeroError

TABLE = Path(__file__).with_name("gpus.yaml")


@dataclass(frozen=True)
class Gpu:
    key: str
    name: str
    source: str
    hbm_bytes: int
    hbm_tbs: float  # HBM bandwidth, TB/s
    bf16_tflops: float  # dense tensor-core peaks
    tf32_tflops: float
    fp32_tflops: float  # SIMT
    nvlink_gbs: float  # both directions, per GPU
    net_gbs: float  # scale-out network per GPU, one direction

    def flops(self, arithmetic: str) -> float:
        """Peak FLOP/s of ``bf16``, ``tf32`` or ``fp32`` arithmetic."""
        return {"bf16": self.bf16_tflops, "tf32": self.tf32_tflops, "fp32": self.fp32_tflops}[
            arithmetic
        ] * 1e12


@cache
def gpus() -> dict[str, Gpu]:
    return {key: Gpu(key=key, **row) for key, row in yaml.safe_load(TABLE.read_text()).items()}


def gpu(key: str) -> Gpu:
    table = gpus()
    if key.lower() not in table:
        raise RingzeroError(f"--gpu {key!r}: unknown GPU; the table ({TABLE.name}) has {sorted(table)}")
    return table[key.lower()]
