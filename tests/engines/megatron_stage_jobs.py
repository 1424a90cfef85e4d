"""The stage code under each training engine, on every rank of a pool: a few pretraining steps (``lm_step``
as the pretrain runner calls it) and RL steps (the session the RL runner builds), from the same fresh
weights. Module level, so a gloo rank pool can import it."""

from __future__ import annotations

import tempfile
from unittest import mock

import torch

import ringzero.engines.megatron  # noqa: F401  - megatron.core as ringzero imports it (eager_import)
from ringzero.config.loader import parse_config
from ringzero.engines.builders import task_and_tokenizer
from ringzero.metrics import MemoryMetricWriter
from ringzero.parallel.dims import ParallelDims
from ringzero.parallel.one_writer import one_writer
from ringzero.parallel.runtime import Runtime
from ringzero.rl.rewards import TaskReward
from ringzero.stages.base import StageContext, StageInputs
from ringzero.stages.corpus_windows import CorpusWindows
from ringzero.stages.lm_step import lm_step
from ringzero.stages.rl_session import build_session
from ringzero.stages.training_engine import training_engine
from ringzero.store import open_store


class VaryingReward(TaskReward):
    """A fresh policy never solves the task; a reward that varies with the text gives the loss work."""

    def __call__(self, problem, text: str, tokens: int, truncated: bool) -> float:
        return float(sum(map(ord, text)) % 5) / 4


# a MoE MLP in layer 1 (the MLA layer): 4 experts in 2 groups, top 2, one shared expert
MOE = {
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "n_group": 2,
    "topk_group": 1,
    "moe_intermediate_size": 16,
    "num_shared_experts": 1,
    "first_k_dense_replace": 1,
    "routed_scaling_factor": 2.5,
}


def micro_config(
    kind: str,
    tp: int,
    dp: int = 1,
    moe: bool = False,
    distributed_optimizer: bool = False,
    ep: int = 1,
    cp: int = 1,
    pp: int = 1,
    corrections: bool = False,
):
    loss = {
        "kind": "sg_clip_is",
        "kl_coef": 0.05,
        **({"corrections": [{"kind": "tis"}]} if corrections else {}),
    }
    return parse_config(
        {
            "run": {"name": "engines", "seed": 3, "device": "cpu"},
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
                **(MOE if moe else {}),
            },
            "precision": {"train": "fp32", "rollout": "fp32"},
            "parallel": {"dp": dp, "cp": cp, "sharding": "zigzag" if cp > 1 else "contiguous"},
            "engines": {
                "training": {
                    "kind": kind,
                    "tp": tp,
                    "ep": ep,
                    "pp": pp,
                    "distributed_optimizer": distributed_optimizer,
                }
            },
            "task": {"kind": "arithmetic", "operation": "digitsum", "digits": 3, "eval_prompts": 4},
            "stages": [
                {
                    "name": "base",
                    "kind": "pretrain",
                    "steps": 3,
                    "batch_size": 4,
                    "micro_batch": 2,
                    "seq_len": 40,
                },
                {
                    "name": "rl",
                    "kind": "rl",
                    "steps": 2,
                    "prompts_per_step": 4,
                    "samples_per_prompt": 2,
                    "minibatches": 2,
                    "micro_batch": 2,
                    "sampling": {"max_new_tokens": 10},
                    "optim": {"lr": 3e-3, "warmup_steps": 0},
                    "loss": loss,
                },
            ],
        },
        "engine-micro",
    )


def destroy_megatron_state() -> None:
    """megatron's parallel state torn down, so the next job on the same pool may ask for another layout."""
    try:
        from megatron.core import parallel_state
    except ImportError:
        return
    parallel_state.destroy_model_parallel()


def run_engine(ctx, *args, **kwargs) -> dict | None:
    """``engine_record`` on a pool rank; megatron's parallel state is torn down after, so the next job on
    the same pool may ask for another layout."""
    try:
        return engine_record(ctx, *args, **kwargs)
    finally:
        destroy_megatron_state()


def engine_record(
    ctx,
    kind: str,
    tp: int,
    store_root: str,
    dp: int = 1,
    moe: bool = False,
    distributed_optimizer: bool = False,
    resume_check: bool = False,
    ep: int = 1,
    cp: int = 1,
    pp: int = 1,
    corrections: bool = False,
    rollback_check: bool = False,
) -> dict | None:
    """Rank 0's record: pretrain losses and weights, per RL step its metrics and tokens, final RL weights
        (full tensors under HybridLM names, however the engine holds them).

        ``distributed_optimizer``: megatron's sharded optimizer (the record adds ``moment_elements``, each
        rank's count of Adam moment elements after RL). ``resume_check``: also the RL optimizer's state loaded
        into a fresh optimizer of the same kind and one more identical pretraining step taken by both
        (``resumed``: the two final weight dicts and step reports). ``ep``: megatron's expert parallelism (the
        record adds ``expert_shards``: every rank's expert parameter names and shapes as it holds them).
        ``cp``:
    context parallelism on zigzag shards (the record adds ``cp_calls``: the strategies rank 0's layers ran).
        ``pp``: pipeline stages (the record adds ``stages``: every rank's stage layers and parameter names).
        ``corrections``: the RL loss with truncated importance sampling (a no-gradient scoring pass first).
        ``rollback_check``: the record adds ``rollback``: a step after ``local_snapshot`` and the same step
        again after ``restore_local`` (weights before and after each, full tensors)."""
    torch.set_num_threads(1)
    world = dp * cp * tp * pp
    dims = ParallelDims(dp=dp, cp=cp, world_size=world, tp=tp, ep=ep, pp=pp)
    rt = Runtime(device=torch.device("cpu"), dims=dims, rank=ctx.rank, groups=ctx.groups(dims))
    cfg = micro_config(kind, tp, dp, moe, distributed_optimizer, ep, cp, pp, corrections)
    pre, rl_stage = cfg.stages
    task, tokenizer = task_and_tokenizer(cfg)
    engine = training_engine(cfg)
    setup = engine.build(
        cfg, None, None, cfg.precision.train, rt, optim=pre.optim, total_steps=pre.steps, schedule="cosine"
    )
    windows = CorpusWindows(task, tokenizer, pre.seq_len, cfg.run.seed)
    losses = [
        lm_step(
            setup.model,
            windows.batch(s, pre.batch_size),
            rt,
            optimizer=setup.optimizer,
            sharding=cfg.parallel.sharding,
            micro_batch=pre.micro_batch,
        ).loss
        for s in range(pre.steps)
    ]
    pretrained = setup.optimizer.master_state_dict()
    store = one_writer(open_store(store_root), rt)
    with tempfile.TemporaryDirectory() as stage_dir:
        sctx = StageContext(
            cfg=cfg,
            store=store,
            stage_hash=f"engine-{kind}-{tp}-{'0' * 16}",
            stage_dir=stage_dir,
            metrics=MemoryMetricWriter(),
            runtime=rt,
        )
        session = build_session(sctx, rl_stage, StageInputs())
        rl_init = {k: v.clone() for k, v in session.optimizer.master_state_dict().items()}  # RL's own start
        session.stepper.reward = VaryingReward(task)
        steps = []
        for step in range(rl_stage.steps):
            metrics = session.stepper.run(step)
            steps.append({"metrics": metrics, "output_ids": session.stepper.last_batch.output_ids})
        rl_weights = session.optimizer.master_state_dict()
        if kind == "megatron":  # the torch engine holds the whole model on every rank anyway
            check_rank0_only_gather(session.optimizer, rl_weights, rt, world)
        tensors, meta = session.optimizer.state()
        counts = None
        if distributed_optimizer:
            count = torch.tensor([session.optimizer.local_moment_elements()])
            parts = [torch.zeros_like(count) for _ in range(world)]
            torch.distributed.all_gather(parts, count)
            counts = [int(c) for c in parts]
        resumed = (
            _resume_round_trip(cfg, engine, rt, session, tensors, meta, windows) if resume_check else None
        )
        rollback = _rollback_round_trip(rt, session, windows) if rollback_check else None
    shards = None
    if kind == "megatron" and ep > 1:
        mine = {
            n: tuple(p.shape) for n, p in session.model.named_parameters() if ".experts.local_experts." in n
        }
        shards = [None] * world
        torch.distributed.all_gather_object(shards, {"ep_rank": session.model.ep_rank, "experts": mine})
    stages = None
    if kind == "megatron" and pp > 1:
        stages = [None] * world
        mine = {
            "stage": session.model.stage,
            "params": sorted(n for n, _ in session.model.named_parameters()),
        }
        torch.distributed.all_gather_object(stages, mine)
    if not rt.is_main:
        return None
    ledger = getattr(session.model, "ledger", None)
    calls = sorted({(c.layer_type, c.strategy) for c in ledger.calls}) if ledger is not None else None
    return {
        "moment_elements": counts,
        "stages": stages,
        "rollback": rollback,
        "resumed": resumed,
        "expert_shards": shards,
        "cp_calls": calls,
        "pretrain_losses": losses,
        "pretrained": pretrained,
        "rl_steps": steps,
        "rl_init": rl_init,
        "rl_weights": rl_weights,
        "optim_keys": sorted(tensors),
        "optim_meta": meta,
        "trained": type(session.model).__name__,
        "tp_shard": tuple(session.model.word_embeddings.weight.shape),
    }


def check_rank0_only_gather(optimizer, everywhere: dict, rt, world: int) -> None:
    """``master_state_dict(everywhere=False)``: the same full tensors on rank 0, nothing on any other rank."""
    main_only = optimizer.master_state_dict(everywhere=False)
    sizes = [None] * world
    torch.distributed.all_gather_object(sizes, len(main_only)) if world > 1 else sizes.__setitem__(
        0, len(main_only)
    )
    assert sizes == [len(everywhere)] + [0] * (world - 1), sizes
    if rt.is_main:
        assert main_only.keys() == everywhere.keys()
        assert all(torch.equal(main_only[k], everywhere[k]) for k in everywhere)


def _rollback_round_trip(rt, session, windows) -> dict:
    """Snapshot this rank's shards, step, restore, step again on the same batch (what a rollback does)."""
    optimizer, batch = session.optimizer, windows.batch(98, 4)
    snap = optimizer.local_snapshot()
    before = optimizer.master_state_dict()
    lm_step(session.model, batch, rt, optimizer=optimizer, micro_batch=2)
    after = optimizer.master_state_dict()
    optimizer.restore_local(snap)
    restored = optimizer.master_state_dict()
    lm_step(session.model, batch, rt, optimizer=optimizer, micro_batch=2)
    return {"before": before, "after": after, "restored": restored, "again": optimizer.master_state_dict()}


def _resume_round_trip(cfg, engine, rt, session, tensors, meta, windows) -> dict:
    """The RL optimizer's ``state()`` loaded into a fresh optimizer (other start weights); one more
    pretraining step on the same batch from each: the weights and reports must agree."""
    rl_stage = cfg.stages[1]
    fresh = engine.build(
        cfg,
        None,
        None,
        cfg.precision.train,
        rt,
        optim=rl_stage.optim,
        total_steps=rl_stage.steps,
        schedule="constant",
    )
    fresh.optimizer.load_state(tensors, meta)
    batch = windows.batch(99, 4)
    out = {}
    for label, setup_model, optimizer in (
        ("original", session.model, session.optimizer),
        ("resumed", fresh.model, fresh.optimizer),
    ):
        report = lm_step(setup_model, batch, rt, optimizer=optimizer, micro_batch=2).report
        out[label] = {
            "weights": optimizer.master_state_dict(),
            "lr": report.lr,
            "grad_norm": report.grad_norm,
        }
    return out


def assert_state_sharded(record: dict) -> None:
    """Every trained element's Adam moments live on exactly one rank of the job (none replicated)."""
    counts = record["moment_elements"]
    total = sum(v.numel() for n, v in record["rl_weights"].items() if not n.endswith("expert_bias"))
    assert sum(counts) == total and max(counts) < total, (counts, total)


def run_engine_experts_summed_over_dp(ctx, *args, **kwargs) -> dict | None:
    """``run_engine`` with the megatron optimizer summing the routed experts' gradients over every DP rank
    (as if they were replicated) instead of the ranks holding the same experts: a negative control."""
    from ringzero.engines.megatron.optimizer import ShardedTrainOptimizer
    from ringzero.parallel.grads import sync_grads

    with mock.patch.object(
        ShardedTrainOptimizer, "reduce_expert_grads", lambda self, params, groups: sync_grads(params, groups)
    ):
        return run_engine(ctx, *args, **kwargs)


def run_engine_values_within_one_stage(ctx, *args, **kwargs):
    """``run_engine`` with ``Runtime.sum_`` over this stage's dp x cp ranks only (a negative control)."""
    import torch.distributed as dist

    def within_stage(self, tensor):
        if self.distributed:
            dist.all_reduce(tensor, group=self.groups.dp_cp)
        return tensor

    with mock.patch.object(Runtime, "sum_", within_stage):
        return run_engine(ctx, *args, **kwargs)


def run_engine_norm_within_one_stage(ctx, *args, **kwargs):
    """``run_engine`` with the gradient norm of this stage's parameters only (a negative control)."""
    from ringzero.engines.megatron.optimizer import ShardedTrainOptimizer

    with mock.patch.object(ShardedTrainOptimizer, "sum_over_stages", lambda self, squares: None):
        return run_engine(ctx, *args, **kwargs)


def uneven_pretrain_loss(ctx, kind: str, rows: int, dp: int = 1, ep: int = 1) -> float | None:
    """The pretraining loss of one ``rows``-row batch (no step) under ``kind`` at dp x ep: at dp 2 an odd
    batch gives the two ranks shares of different sizes."""
    try:
        torch.set_num_threads(1)
        dims = ParallelDims(dp=dp, cp=1, world_size=dp, ep=ep)
        rt = Runtime(device=torch.device("cpu"), dims=dims, rank=ctx.rank, groups=ctx.groups(dims))
        cfg = micro_config(kind, 1, dp, True, ep=ep)
        pre = cfg.stages[0]
        task, tokenizer = task_and_tokenizer(cfg)
        setup = training_engine(cfg).build(
            cfg, None, None, cfg.precision.train, rt, optim=pre.optim, total_steps=1, schedule="constant"
        )
        batch = CorpusWindows(task, tokenizer, pre.seq_len, cfg.run.seed).batch(0, rows)
        loss = lm_step(setup.model, batch, rt, micro_batch=2).loss
        return loss if rt.is_main else None
    finally:
        destroy_megatron_state()
