"""The CLI turns bad input into one clean message and exit status 2, never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def ringzero(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ringzero.cli.main", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def test_validate_tiny_config():
    out = ringzero("config", "validate", "configs/tiny-cpu.yaml")
    assert out.returncode == 0, out.stderr
    assert "6 stages: base(pretrain) -> stage1(rl)" in out.stdout


def test_three_mistakes_reported_without_traceback():
    out = ringzero("config", "validate", "configs/tiny-cpu.yaml", "--set", "model.d_modl=3",
                   "--set", "stages.stage1.loss.eps_high=-1", "--set", "run.name=Bad_Name")
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert "3 problems" in out.stderr
    for path in ("model.d_modl", "stages[1].loss.eps_high", "run.name"):
        assert f"  - {path}:" in out.stderr


def test_missing_file_is_clean():
    out = ringzero("config", "validate", "nope.yaml")
    assert out.returncode == 2 and "nope.yaml: 1 problem" in out.stderr and "Traceback" not in out.stderr


def test_schema_is_json_schema_of_run_configs():
    out = ringzero("config", "schema")
    assert out.returncode == 0
    schema = json.loads(out.stdout)
    assert set(schema["required"]) == {"run"}
    assert {"model", "precision", "parallel", "engines", "task", "storage", "stages"} <= set(schema["properties"])


def test_show_fills_defaults_and_applies_overrides():
    out = ringzero("config", "show", "configs/tiny-cpu.yaml", "--set", "stages.stage2.steps=3")
    assert out.returncode == 0, out.stderr
    assert "steps: 3" in out.stdout and "kv_lora_rank: 32" in out.stdout
