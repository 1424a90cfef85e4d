"""Rank jobs of the cost tests: what a rank of the megatron engine holds after one training step, counted
from the tensors themselves (``stages.rank_memory``), by what the cost model calls them."""

from __future__ import annotations

import torch

MODEL = dict(
    vocab_size=64,
    hidden_size=64,
    num_hidden_layers=4,
    num_attention_heads=4,
    layer_group_size=2,
    kv_lora_rank=16,
    qk_nope_head_dim=8,
    qk_rope_head_dim=8,
    v_head_dim=8,
    head_dim=16,
    intermediate_size=96,
    num_experts=4,
    num_experts_per_tok=2,
    num_shared_experts=1,
    moe_intermediate_size=32,
    first_k_dense_replace=1,
    moe_router_enable_expert_bias=True,
    max_position_embeddings=128,
)


def run_config(tp: int, ep: int, pp: int, dp: int, distributed_optimizer: bool, model: dict | None = None):
    from ringzero.config.loader import parse_config

    return parse_config(
        {
            "run": {"name": "cost", "seed": 0, "device": "cpu"},
            "model": model or MODEL,
            "precision": {"train": "fp32-islands", "rollout": "fp32-islands"},
            "parallel": {"dp": dp},
            "engines": {
                "training": {
                    "kind": "megatron",
                    "tp": tp,
                    "pp": pp,
                    "ep": ep,
                    "distributed_optimizer": distributed_optimizer,
                }
            },
            "task": {"kind": "arithmetic", "operation": "digitsum", "digits": 3},
            "stages": [{"name": "base", "kind": "pretrain", "steps": 1, "batch_size": 4, "seq_len": 32}],
        },
        "cost",
    )


def held_bytes(
    ctx, tp: int, ep: int, pp: int, dp: int, distributed_optimizer: bool, model: dict | None = None
) -> dict:
    """This rank's stage, parameter numel and bytes, gradient bytes and optimizer-state bytes after a step."""
    from ringzero.engines.builders import task_and_tokenizer
    from ringzero.parallel.dims import ParallelDims
    from ringzero.parallel.runtime import Runtime
    from ringzero.stages.corpus_windows import CorpusWindows
    from ringzero.stages.lm_step import lm_step
    from ringzero.stages.rank_memory import storage_bytes, tensors_in
    from ringzero.stages.training_engine import training_engine

    torch.set_num_threads(1)
    cfg = run_config(tp, ep, pp, dp, distributed_optimizer, model)
    dims = ParallelDims(dp=dp, cp=1, world_size=tp * pp * dp, tp=tp, pp=pp, ep=ep)
    rt = Runtime(device=torch.device("cpu"), dims=dims, rank=ctx.rank, groups=ctx.groups(dims))
    stage = cfg.stages[0]
    setup = training_engine(cfg).build(
        cfg, None, None, cfg.precision.train, rt, optim=stage.optim, total_steps=1, schedule="constant"
    )
    task, tokenizer = task_and_tokenizer(cfg)
    windows = CorpusWindows(task, tokenizer, stage.seq_len, cfg.run.seed)
    batch = windows.batch(0, stage.batch_size)
    params = list(setup.model.parameters())
    seen: dict[str, int] = {}
    step = setup.optimizer.step

    def counting_step():  # the gradients as the optimizer finds them: their peak, before it frees them
        grads = [g for p in params for g in (getattr(p, "main_grad", None), p.grad) if g is not None]
        seen["grads"] = storage_bytes(grads) if grads else 0
        return step()

    setup.optimizer.step = counting_step
    lm_step(setup.model, batch, rt, optimizer=setup.optimizer, micro_batch=stage.batch_size)
    experts = [p for n, p in setup.model.named_parameters() if "local_experts" in n]
    weights = storage_bytes(params)
    grads = [g for p in params for g in (getattr(p, "main_grad", None), p.grad) if g is not None]
    grad_bytes = storage_bytes(grads) if grads else 0  # what stays allocated after the step
    buffers = storage_bytes(list(setup.model.buffers()))
    everything = storage_bytes(tensors_in(setup, set(), limit=12))  # down to megatron's Adam moments
    out = {
        "stage": getattr(getattr(setup.model, "stage", None), "index", 0),
        "numel": sum(p.numel() for p in params),
        "expert_numel": sum(p.numel() for p in experts),
        "weights": sum(p.numel() * p.element_size() for p in params),
        "weight_storage": weights,
        "grads": seen["grads"],
        "optimizer": everything - weights - grad_bytes - buffers,
    }
    try:
        from megatron.core import parallel_state

        out["stage"] = parallel_state.get_pipeline_model_parallel_rank()
        parallel_state.destroy_model_parallel()
    except ImportError:
        pass
    return out
