"""The prepared GPU check of the megatron engine runs (in its CPU smoke form) and reports parity and speed:
a broken import or a renamed field must fail here, not on a lent GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("megatron.core")
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_megatron_check_smoke(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu" / "megatron_check.py"), "--smoke"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads((tmp_path / "megatron_check.json").read_text())
    fp32, islands = result["parity_tp1"]
    assert fp32["logprob_max_abs"] < 1e-4 and fp32["grad_worst_rel"]["rel"] < 1e-4
    assert islands["logprob_max_abs"] < 5e-2  # bf16 body
    assert [s["engine"] for s in result["speed"]] == ["torch", "megatron"]
    assert all(s["response_tokens_per_s"] > 0 for s in result["speed"])
