"""A few pretraining and RL steps of a micro run on every rank of a pool, for the layout-invariance tests.

Every layout runs the stage code itself (``lm_step`` as the pretrain runner calls it, and the RL
session the RL runner builds), so what is compared is what a stage does under ``dp x cp``.
"""

from __future__ import annotations

import tempfile

import torch

from ringzero.config.loader import parse_config
from ringzero.engines.builders import task_and_tokenizer, training_model
from ringzero.engines.optimizer import TrainOptimizer
from ringzero.metrics import MemoryMetricWriter
from ringzero.parallel.dims import ParallelDims
from ringzero.parallel.one_writer import one_writer
from ringzero.parallel.runtime import Runtime, single
from ringzero.rl.rewards import TaskReward
from ringzero.stages.base import StageContext, StageInputs
from ringzero.stages.corpus_windows import CorpusWindows
from ringzero.stages.lm_step import lm_step
from ringzero.stages.rl_session import build_session
from ringzero.store import open_store


class VaryingReward(TaskReward):
    """A random-init policy never solves the task, so every advantage would be 0 and no RL step would
    move the weights; this reward varies with the sampled text so the policy loss has work to do."""

    def __call__(self, problem, text: str, tokens: int, truncated: bool) -> float:
        return float(sum(map(ord, text)) % 5) / 4


PRETRAIN_STEPS = 3
RL_STEPS = 2


def micro_config(dp: int, cp: int, normalization: str = "token_sum", kl_coef: float = 0.0):
    return parse_config(
        {
            "run": {"name": "layouts", "seed": 3, "device": "cpu"},
            "model": {
                "vocab_size": 64,
                "hidden_size": 32,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "layout": "LM",
                "kv_lora_rank": 12,
                "qk_nope_head_dim": 8,
                "qk_rope_head_dim": 4,
                "v_head_dim": 8,
                "head_dim": 8,
                "lightning_block_size": 8,
                "intermediate_size": 48,
                "max_position_embeddings": 96,
            },
            "precision": {"train": "fp32", "rollout": "fp32"},
            "parallel": {"dp": dp, "cp": cp},
            "task": {"kind": "arithmetic", "operation": "digitsum", "digits": 3, "eval_prompts": 4},
            "stages": [
                {
                    "name": "base",
                    "kind": "pretrain",
                    "steps": PRETRAIN_STEPS,
                    "batch_size": 4,
                    "micro_batch": 1,
                    "seq_len": 40,
                },
                {
                    "name": "rl",
                    "kind": "rl",
                    "steps": RL_STEPS,
                    "prompts_per_step": 4,
                    "samples_per_prompt": 2,
                    "minibatches": 2,
                    "micro_batch": 1,
                    "sampling": {"max_new_tokens": 10},
                    "optim": {"lr": 3e-3, "warmup_steps": 0},
                    "loss": {"kind": "sg_clip_is", "normalization": normalization, "kl_coef": kl_coef},
                },
            ],
        }
    )


def runtime_of(ctx, dp: int, cp: int) -> Runtime:
    if ctx is None:
        return single()
    dims = ParallelDims(dp=dp, cp=cp, world_size=dp * cp)
    return Runtime(device=torch.device("cpu"), dims=dims, rank=ctx.rank, groups=ctx.groups(dims))


def run_layout(
    ctx,
    dp: int,
    cp: int,
    store_root: str,
    normalization: str = "token_sum",
    kl_coef: float = 0.0,
    skip_grad_sum: bool = False,
) -> dict:
    """Pretrain losses and final weights, then per RL step its metrics and sampled tokens, and the
    final RL weights. Only rank 0 returns the record (every rank holds the same replicated state).

    ``skip_grad_sum``: pretrain without summing gradients over ranks (a negative control)."""
    import ringzero.engines.optimizer as optimizer_module  # the optimizer reduces gradients over ranks

    real_sum = optimizer_module.sync_grads
    optimizer_module.sync_grads = (lambda params, groups: None) if skip_grad_sum else real_sum
    try:
        return _run_layout(ctx, dp, cp, store_root, normalization, kl_coef)
    finally:
        optimizer_module.sync_grads = real_sum


def _run_layout(ctx, dp, cp, store_root, normalization, kl_coef) -> dict:
    rt = runtime_of(ctx, dp, cp)
    cfg = micro_config(dp, cp, normalization, kl_coef)
    pre, rl_stage = cfg.stages
    task, tokenizer = task_and_tokenizer(cfg)
    torch.manual_seed(0)
    model = training_model(cfg, None, None, cfg.precision.train, rt).train()
    optimizer = TrainOptimizer(model, pre.optim, total_steps=pre.steps, schedule="cosine")
    windows = CorpusWindows(task, tokenizer, pre.seq_len, cfg.run.seed)
    pretrain_losses = [
        lm_step(
            model, windows.batch(s, pre.batch_size), rt, optimizer=optimizer, micro_batch=pre.micro_batch
        ).loss
        for s in range(pre.steps)
    ]
    pretrained = {k: v.detach().clone() for k, v in model.state_dict().items()}

    store = one_writer(open_store(store_root), rt)
    with tempfile.TemporaryDirectory() as stage_dir:
        sctx = StageContext(
            cfg=cfg,
            store=store,
            stage_hash=f"layout-{dp}x{cp}-{'0' * 16}",
            stage_dir=stage_dir,
            metrics=MemoryMetricWriter(),
            runtime=rt,
        )
        session = build_session(sctx, rl_stage, StageInputs())
        rl_init = {k: v.detach().clone() for k, v in session.model.state_dict().items()}  # RL's own start
        session.stepper.reward = VaryingReward(task)
        steps = []
        for step in range(rl_stage.steps):
            metrics = session.stepper.run(step)
            batch = session.stepper.last_batch
            steps.append({"metrics": metrics, "output_ids": batch.output_ids})
        rl_weights = {k: v.detach().clone() for k, v in session.model.state_dict().items()}
    if not rt.is_main:
        return None
    return {
        "pretrain_losses": pretrain_losses,
        "pretrained": pretrained,
        "rl_steps": steps,
        "rl_init": rl_init,
        "rl_weights": rl_weights,
    }
