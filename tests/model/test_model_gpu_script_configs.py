"""The prepared GPU scripts build valid models: a renamed config field must fail here, not on a lent GPU."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ringzero.model.config import ModelConfig

GPU = Path(__file__).resolve().parents[2] / "bench" / "gpu"


def _module(name: str):
    spec = importlib.util.spec_from_file_location(name, GPU / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("argv", [[], ["--smoke"]])
def test_stage_steps_model_section_validates(argv):
    steps = _module("stage_steps")
    ModelConfig.model_validate(steps.model_section(steps.parse_args(argv)))


def test_gap_checks_smoke_runs_on_the_cpu(tmp_path):
    env = {"OUT": str(tmp_path), "PYTHONPATH": str(GPU.parents[1])}
    subprocess.run(
        [sys.executable, str(GPU / "gap_checks.py"), "--smoke"],
        check=True,
        capture_output=True,
        env={**os.environ, **env},
    )
    out = json.loads((tmp_path / "gap_checks.json").read_text())
    assert out["percentiles"]["max_abs_diff_vs_numpy"] == 0.0
    assert all(row["rows_not_bitwise"] == 0 for row in out["bitwise"])
