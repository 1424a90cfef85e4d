"""The CLI turns bad input into one clean message and exit status 2, never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def ringzero(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ringzero.cli.main", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_validate_tiny_config():
    out = ringzero("config", "validate", "configs/tiny-cpu.yaml")
    assert out.returncode == 0, out.stderr
    assert "6 stages: base(pretrain) -> stage1(rl)" in out.stdout


def test_three_mistakes_reported_without_traceback():
    out = ringzero(
        "config",
        "validate",
        "configs/tiny-cpu.yaml",
        "--set",
        "model.d_modl=3",
        "--set",
        "stages.stage1.loss.eps_high=-1",
        "--set",
        "run.name=Bad_Name",
    )
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
    assert {"model", "precision", "parallel", "engines", "task", "storage", "stages"} <= set(
        schema["properties"]
    )


def test_show_fills_defaults_and_applies_overrides():
    out = ringzero("config", "show", "configs/tiny-cpu.yaml", "--set", "stages.stage2.steps=3")
    assert out.returncode == 0, out.stderr
    assert "steps: 3" in out.stdout and "kv_lora_rank: 32" in out.stdout


def test_nproc_is_checked_against_the_config_before_any_rank_starts(tmp_path):
    """A job of the wrong size, or a config that does not load, stops before torchrun: one message, status
    2."""
    out = ringzero(
        "run",
        "configs/micro-megatron.yaml",
        "--nproc",
        "4",
        "--set",
        "engines.training.pp=2",
        "--set",
        f"run.run_dir={tmp_path / 'run'}",
        "--set",
        f"storage.root=file://{tmp_path / 'store'}",
    )
    assert out.returncode == 2
    assert (
        "--nproc 4: the config's parallel.dp x parallel.cp x engines.training.pp = 1 x 1 x 2 = 2 ranks"
        in out.stderr
    )
    assert "torch.distributed" not in out.stderr and not (tmp_path / "run").exists()
    out = ringzero(
        "stage",
        "run",
        "configs/micro-megatron.yaml",
        "--stage",
        "base",
        "--nproc",
        "2",
        "--set",
        "task.digits=1",
    )
    assert out.returncode == 2 and out.stderr.count("task.digits") == 1 and "Traceback" not in out.stderr
