"""Helpers of the pipeline tests: micro run configs and reading back what a run left behind."""

import json
from pathlib import Path

import yaml

from ringzero.config import load_config

PLUGINS = Path(__file__).parent / "plugins"  # pipeline_fake_runners: put on sys.path and PYTHONPATH


def staged_config(
    root: Path, *, stage1_gate: list[str] | None = None, rl_steps: int = 4, targets: list | None = None
) -> Path:
    """base -> stage1 (gated) -> distill -> stage2 -> eval (compares all four); returns its path."""
    data = {
        "run": {"name": "micro", "run_dir": str(root / "run")},
        "storage": {"root": f"file://{root / 'store'}"},
        "stages": [
            {"name": "base", "kind": "pretrain", "steps": 2},
            {
                "name": "stage1",
                "kind": "rl",
                "steps": rl_steps,
                "prompts_per_step": 1,
                "samples_per_prompt": 2,
                "minibatches": 1,
                "gate": stage1_gate or [],
            },
            {"name": "distill", "kind": "distill", "prompts": 2, "epochs": 2},
            {
                "name": "stage2",
                "kind": "rl",
                "steps": rl_steps,
                "prompts_per_step": 1,
                "samples_per_prompt": 2,
                "minibatches": 1,
                "loss": {"normalization": "sample_mean"},
            },
            {
                "name": "eval",
                "kind": "eval",
                "prompts": 2,
                "compare": ["base", "stage1", "distill", "stage2"],
            },
        ],
    }
    if targets is not None:
        data["targets"] = targets
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


MICRO_MODEL = {
    "vocab_size": 64,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "layout": "LM",
    "intermediate_size": 64,
    "max_position_embeddings": 96,
    "kv_lora_rank": 8,
    "qk_nope_head_dim": 8,
    "qk_rope_head_dim": 4,
    "v_head_dim": 8,
    "head_dim": 8,
    "lightning_block_size": 16,
}


def real_micro_config(root: Path, rl_steps: int) -> Path:
    """base (pretrain) -> stage1 (RL, a resume point every step) -> eval, sized for seconds on a CPU."""
    data = {
        "run": {"name": "micro-real", "seed": 0, "run_dir": str(root / "run"), "threads": 1},
        "model": MICRO_MODEL,
        "task": {
            "kind": "arithmetic",
            "operation": "digitsum",
            "digits": 2,
            "eval_prompts": 4,
            "trace_fraction": 0.2,
        },
        "precision": {"train": "fp32", "rollout": "fp32"},
        "storage": {"root": f"file://{root / 'store'}"},
        "stages": [
            {
                "name": "base",
                "kind": "pretrain",
                "steps": 20,
                "batch_size": 8,
                "seq_len": 48,
                "checkpoint_every": 10,
            },
            {
                "name": "stage1",
                "kind": "rl",
                "steps": rl_steps,
                "prompts_per_step": 2,
                "samples_per_prompt": 2,
                "minibatches": 1,
                "checkpoint_every": 1,
                "min_steps": 0,
                "sampling": {"max_new_tokens": 12},
            },
            {
                "name": "eval",
                "kind": "eval",
                "prompts": 4,
                "k": 2,
                "sampling": {"max_new_tokens": 12},
                "compare": ["base", "stage1"],
            },
        ],
    }
    path = root / "micro-real.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def log_events(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "log.jsonl"
    return (
        [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    )
