"""Helpers of the pipeline tests: micro run configs and reading back what a run left behind."""

import json
from pathlib import Path

import yaml

from ringzero.config import load_config

PLUGINS = Path(__file__).parent / "plugins"  # pipeline_fake_runners: put on sys.path and PYTHONPATH


def staged_config(root: Path, *, stage1_gate: list[str] | None = None, rl_steps: int = 4) -> Path:
    """base -> stage1 (gated) -> distill -> stage2 -> eval (compares all four); returns its path."""
    data = {
        "run": {"name": "micro", "run_dir": str(root / "run")},
        "storage": {"root": f"file://{root / 'store'}"},
        "stages": [
            {"name": "base", "kind": "pretrain", "steps": 2},
            {"name": "stage1", "kind": "rl", "steps": rl_steps, "prompts_per_step": 1, "samples_per_prompt": 2,
             "minibatches": 1, "gate": stage1_gate or []},
            {"name": "distill", "kind": "distill", "prompts": 2, "epochs": 2},
            {"name": "stage2", "kind": "rl", "steps": rl_steps, "prompts_per_step": 1, "samples_per_prompt": 2,
             "minibatches": 1, "loss": {"normalization": "sample_mean"}},
            {"name": "eval", "kind": "eval", "prompts": 2, "compare": ["base", "stage1", "distill", "stage2"]},
        ],
    }
    path = root / "micro.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def load(path: Path):
    return load_config(path, [])


def fake_calls(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "fake_calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def manifest(run_dir: Path) -> dict:
    return json.loads((Path(run_dir) / "manifest.json").read_text())
