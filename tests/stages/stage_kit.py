"""Micro configs shared by the stage tests: a two-layer model, the digit-sum task at 2 digits, a file store."""

from __future__ import annotations

from pathlib import Path

import torch

from ringzero.config.run import RunConfig
from ringzero.metrics import MemoryMetricWriter
from ringzero.stages.base import StageContext
from ringzero.store import open_store

MICRO_MODEL = {
    "vocab_size": 64, "d_model": 32, "n_layers": 2, "n_heads": 2, "layout": "LM", "mlp_hidden": 64,
    "max_seq_len": 96, "mla": {"kv_lora_rank": 8, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8},
    "lightning": {"head_dim": 8, "block_size": 16},
}
MICRO_TASK = {"kind": "arithmetic", "operation": "digitsum", "digits": 2, "eval_prompts": 8, "trace_fraction": 0.2}
FP32 = {"train": "fp32", "rollout": "fp32"}


def run_config(root: Path, stages: list[dict], **sections) -> RunConfig:
    return RunConfig.model_validate({
        "run": {"name": "micro", "seed": 0, "run_dir": str(root / "run")},
        "model": MICRO_MODEL, "task": MICRO_TASK, "precision": FP32,
        "storage": {"root": f"file://{root / 'store'}"}, "stages": stages, **sections,
    })


def context(cfg: RunConfig, stage_hash: str = "0" * 16) -> StageContext:
    """A stage context over the config's store, with metrics kept in memory."""
    return StageContext(cfg=cfg, store=open_store(cfg.storage.root), stage_hash=stage_hash,
                        stage_dir=Path(cfg.run.run_dir), metrics=MemoryMetricWriter())


def state_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
