"""A micro policy for the real distill and eval runners: ``SFT_STEPS`` steps of fine-tuning make a tiny model
answer four fixed digit-sum problems with worked traces, half of them terse and half verbose.

Both forms are correct, so the shortest correct sample of a prompt is its terse trace: exactly what
self-distillation should keep, and a length it should bring the policy down to.
"""

import hashlib
from dataclasses import dataclass
from pathlib import Path

import torch

from ringzero.config.run import RunConfig
from ringzero.config.stages import OptimSettings
from ringzero.engines.optimizer import TrainOptimizer
from ringzero.metrics import MemoryMetricWriter
from ringzero.model.checkpoint import save_model
from ringzero.model.hybrid import HybridLM
from ringzero.stages.base import StageContext
from ringzero.stages.distill_data import response_loss, sft_batch
from ringzero.store import open_store
from ringzero.tasks.arithmetic import SyntheticArithmetic
from ringzero.tokenizer import CharTokenizer

DIGITS = 4
PROBLEMS = 4
SFT_STEPS = 120
MODEL = {
    "vocab_size": 64,
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "layout": "hybrid",
    "layer_group_size": 2,
    "kv_lora_rank": 16,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 16,
    "head_dim": 16,
    "lightning_block_size": 32,
    "intermediate_size": 128,
    "max_position_embeddings": 160,
}


class FourProblems(SyntheticArithmetic):
    """The digit-sum task restricted to four problems, for training and held-out prompts alike."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.fixed = super().prompts("train", PROBLEMS, 0)

    def prompts(self, split, n, rng=None):
        return [self.fixed[i % len(self.fixed)] for i in range(n)]


def run_config(root: Path, stages: list[dict], **extra) -> RunConfig:
    return RunConfig.model_validate(
        {
            "run": {"name": "micro", "seed": 0, "run_dir": str(root / "run")},
            "model": MODEL,
            "task": {
                "kind": "arithmetic",
                "operation": "digitsum",
                "digits": DIGITS,
                "eval_prompts": PROBLEMS,
            },
            "storage": {"root": f"file://{root / 'store'}"},
            "stages": stages,
            **extra,
        }
    )


def patch_task(monkeypatch, *modules) -> FourProblems:
    """Make the stage modules given build the four-problem task."""
    cfg = run_config(Path("/nonexistent"), [])
    task = FourProblems(cfg.task)
    for module in modules:
        monkeypatch.setattr(module, "task_and_tokenizer", lambda _cfg: (task, CharTokenizer()))
    return task


def train_policy(cfg: RunConfig, store, verbose_copies: int = 1) -> str:
    """Fine-tune a fresh micro model on each problem's terse trace and ``verbose_copies`` verbose ones."""
    torch.manual_seed(0)
    task, tok = FourProblems(cfg.task), CharTokenizer()
    examples = []
    for p in task.fixed:
        for verbose in [False] + [True] * verbose_copies:
            examples.append(
                {
                    "prompt_ids": tok.encode(p.prompt, add_bos=True),
                    "output_ids": tok.encode(task.worked_response(p, verbose) + "\n"),
                }
            )
    model = HybridLM(cfg.model, cfg.precision.train).train()
    optimizer = TrainOptimizer(model, OptimSettings(lr=6e-3, warmup_steps=10), total_steps=SFT_STEPS)
    ids_BS, mask_BS1 = sft_batch(examples, tok.pad_id)
    for _ in range(SFT_STEPS):
        response_loss(model, ids_BS, mask_BS1).backward()
        optimizer.step()
    return save_model(store, "policy", model.eval())


@dataclass
class Micro:
    cfg: RunConfig
    store: object
    policy_uri: str

    def context(self, root: Path) -> StageContext:
        """A stage context of its own per ``root``: tests share the store, never each other's checkpoints."""
        stage_hash = hashlib.sha256(str(root).encode()).hexdigest()
        return StageContext(
            cfg=self.cfg,
            store=self.store,
            stage_hash=stage_hash,
            stage_dir=root / "stage",
            metrics=MemoryMetricWriter(),
        )


def trained_store(root: Path) -> tuple[Path, str]:
    """A store under ``root`` holding the trained micro policy; returns (root, policy URI)."""
    cfg = run_config(root, [])
    return root, train_policy(cfg, open_store(cfg.storage.root, cfg.storage.s3))


def micro(trained: tuple[Path, str], stages: list[dict]) -> Micro:
    """The trained policy's store, under a run config with ``stages`` (the model section is the same)."""
    root, policy_uri = trained
    cfg = run_config(root, stages)
    return Micro(cfg, open_store(cfg.storage.root, cfg.storage.s3), policy_uri)
