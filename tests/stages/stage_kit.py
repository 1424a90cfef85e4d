"""Micro configs shared by the stage tests: a two-layer model, the digit-sum task at 2 digits, a file
store."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import torch

from ringzero.config.run import RunConfig
from ringzero.metrics import MemoryMetricWriter
from ringzero.model.config import ModelConfig, PrecisionPolicy
from ringzero.model.hybrid import HybridLM
from ringzero.stages.base import StageContext
from ringzero.store import open_store
from ringzero.tasks.base import Problem, Task, as_random

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
MICRO_TASK = {
    "kind": "arithmetic",
    "operation": "digitsum",
    "digits": 2,
    "eval_prompts": 8,
    "trace_fraction": 0.2,
}
FP32 = {"train": "fp32", "rollout": "fp32"}


def run_config(root: Path, stages: list[dict], **sections) -> RunConfig:
    return RunConfig.model_validate(
        {
            "run": {"name": "micro", "seed": 0, "run_dir": str(root / "run")},
            "model": MICRO_MODEL,
            "task": MICRO_TASK,
            "precision": FP32,
            "storage": {"root": f"file://{root / 'store'}"},
            "stages": stages,
            **sections,
        }
    )


def context(cfg: RunConfig, stage_hash: str = "0" * 16) -> StageContext:
    """A stage context over the config's store, with metrics kept in memory."""
    return StageContext(
        cfg=cfg,
        store=open_store(cfg.storage.root),
        stage_hash=stage_hash,
        stage_dir=Path(cfg.run.run_dir),
        metrics=MemoryMetricWriter(),
    )


def state_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


class SayDigit(Task):
    """A trivially learnable reward for RL mechanics: 1 when the response starts with ``TARGET``.

    A random micro model says it with probability ~1/64, so a few samples per step find it and the
    group advantages have something to amplify.
    """

    TARGET = "7"
    stop = ("\n",)

    def prompts(self, split, n, rng=None):
        r = as_random(rng if rng is not None else 0)
        return [
            Problem(id=f"say:{i}", prompt=f"q: say {r.randrange(10)}\na: ", answer=self.TARGET)
            for i in range(n)
        ]

    def reward(self, problem, response):
        return 1.0 if response.startswith(self.TARGET) else 0.0


def micro_model(policy: str = "fp32", seed: int = 0) -> HybridLM:
    model = HybridLM(ModelConfig.model_validate(MICRO_MODEL), PrecisionPolicy.preset(policy))
    model.reset_parameters(torch.Generator().manual_seed(seed))
    return model


def rl_parts(
    *,
    task=None,
    minibatches=2,
    prompts=4,
    samples=4,
    max_new_tokens=6,
    lr=1e-3,
    kl_coef=0.0,
    deterministic=False,
    rollout_policy="fp32",
    loss=None,
    seed=0,
):
    """A micro model, an embedded engine, a trainer and an ``RLStep`` wired as the RL stage wires them."""
    from ringzero.config.stages import LossSettings, OptimSettings, SamplingSettings
    from ringzero.engines.optimizer import TrainOptimizer
    from ringzero.rl.rewards import TaskReward
    from ringzero.rl.step import PushingRollout, RLStep, StepShape
    from ringzero.rl.trainer import PolicyTrainer
    from ringzero.rollout.deployment.weight_push import WeightPusher, weight_version
    from ringzero.rollout.engine.embedded import EmbeddedEngine
    from ringzero.tokenizer import CharTokenizer

    task = task or SayDigit()
    tokenizer = CharTokenizer()
    model = micro_model()
    engine = EmbeddedEngine(
        model,
        tokenizer,
        PrecisionPolicy.preset(rollout_policy),
        deterministic=deterministic,
        max_batch=256,
        seed=seed,
    )
    optimizer = TrainOptimizer(
        model, OptimSettings(lr=lr, warmup_steps=0), total_steps=100, schedule="constant"
    )
    loss = loss or LossSettings(kl_coef=kl_coef)
    reference = micro_model().eval() if loss.kl_coef > 0 else None
    sampling = SamplingSettings(max_new_tokens=max_new_tokens)
    trainer = PolicyTrainer(
        model,
        optimizer,
        loss,
        minibatches=minibatches,
        max_new_tokens=max_new_tokens,
        temperature=1.0,
        reference=reference,
        batch_invariant=deterministic,
        pad_id=tokenizer.pad_id,
        micro_batch=16,
    )
    step = RLStep(
        rollout=PushingRollout(
            engine,
            lambda s: WeightPusher("in_process").push(
                engine, optimizer.master_state_dict(), weight_version(s + 1)
            ),
        ),
        trainer=trainer,
        task=task,
        tokenizer=tokenizer,
        reward=TaskReward(task),
        sampling=sampling,
        shape=StepShape(prompts, samples),
        seed=seed,
    )
    return SimpleNamespace(
        model=model,
        engine=engine,
        optimizer=optimizer,
        trainer=trainer,
        step=step,
        task=task,
        tokenizer=tokenizer,
    )
