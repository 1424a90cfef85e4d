"""What a rank holds after its training engine builds a stage and takes one step: the bytes of every tensor
it keeps (parameters, buffers, optimizer masters and moments, a serving model if one was built), counted
once per storage, and the resident-set growth of the build itself. ``measure`` runs on each rank of a
``RankPool``; ``bench/megatron_memory.py`` prints its table and ``tests/engines/test_megatron_memory.py``
bounds it."""

from __future__ import annotations

import torch


def config(tp: int, hidden: int, layers: int, heads: int, optimizer: str, pp: int = 1):
    from ringzero.config.loader import parse_config

    return parse_config(
        {
            "run": {"name": "memory", "seed": 0, "device": "cpu"},
            "model": {
                "vocab_size": 64,
                "hidden_size": hidden,
                "num_hidden_layers": layers,
                "num_attention_heads": heads,
                "layer_group_size": 2,
                "kv_lora_rank": hidden // 4,
                "qk_nope_head_dim": 32,
                "qk_rope_head_dim": 16,
                "v_head_dim": 32,
                "head_dim": 32,
                "lightning_block_size": 64,
                "intermediate_size": hidden * 11 // 4,
                "max_position_embeddings": 512,
            },
            "precision": {"train": "fp32-islands", "rollout": "fp32-islands"},
            "engines": {
                "training": {
                    "kind": "megatron",
                    "tp": tp,
                    "pp": pp,
                    "distributed_optimizer": optimizer == "megatron",
                }
            },
            "task": {"kind": "arithmetic", "operation": "digitsum", "digits": 3},
            "stages": [{"name": "base", "kind": "pretrain", "steps": 1, "batch_size": 2, "seq_len": 32}],
        },
        "memory",
    )


def tensors_in(obj, seen: set[int], depth: int = 0, limit: int = 6):
    """Every tensor reachable from ``obj`` through attributes, dicts, lists and tuples (not into modules'
    submodules twice, nor into other objects' internals past a few levels)."""
    if depth > limit or id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from tensors_in(v, seen, depth + 1, limit)
    elif isinstance(obj, (list, tuple, set)):
        for v in obj:
            yield from tensors_in(v, seen, depth + 1, limit)
    elif isinstance(obj, torch.nn.Module):
        # nn.Module's methods: a wrapper may shadow them (megatron's DDP keeps a list named ``buffers``, its
        # parameter and gradient buffers, which only a walk of its attributes reaches)
        yield from torch.nn.Module.parameters(obj)
        yield from torch.nn.Module.buffers(obj)
        if not callable(getattr(obj, "buffers", None)):
            yield from tensors_in(obj.buffers, seen, depth + 1, limit)
    elif hasattr(obj, "__dict__") and type(obj).__module__.split(".")[0] in ("ringzero", "megatron", "torch"):
        for v in vars(obj).values():
            yield from tensors_in(v, seen, depth + 1, limit)


def storage_bytes(tensors) -> int:
    storages = {}
    for t in tensors:
        s = t.untyped_storage()
        storages[s.data_ptr()] = s.nbytes()
    return sum(storages.values())


def peak_rss() -> int:
    """This process's resident-set high-water mark, bytes (Linux reports KiB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def measure(
    ctx,
    tp: int,
    hidden: int,
    layers: int,
    heads: int,
    optimizer: str,
    pp: int = 1,
    checkpoint: str | None = None,
    load: str = "streamed",
) -> dict:
    from ringzero.model.hybrid import HybridLM
    from ringzero.parallel.dims import ParallelDims
    from ringzero.parallel.runtime import Runtime
    from ringzero.stages.training_engine import training_engine

    torch.set_num_threads(1)
    dims = ParallelDims(dp=1, cp=1, world_size=tp * pp, tp=tp, pp=pp)
    rt = Runtime(device=torch.device("cpu"), dims=dims, rank=ctx.rank, groups=ctx.groups(dims))
    cfg = config(tp, hidden, layers, heads, optimizer, pp)
    stage = cfg.stages[0]
    if load == "full":  # the earlier load: the whole checkpoint into a full fp32 model on every rank
        import ringzero.engines.megatron.streamed as streamed
        from ringzero.model.checkpoint import load_model
        from ringzero.model.config import PrecisionPolicy

        streamed.stage_state = lambda store, uri, model_cfg, layers_: load_model(
            uri, PrecisionPolicy.preset("fp32")
        ).model.state_dict()
    # A throwaway build of a small model of the same layout first: imports, megatron's parallel state and
    # the optimizer's modules then cost nothing inside the measured build.
    import gc

    import ringzero.engines.megatron.streamed  # noqa: F401
    import ringzero.store  # noqa: F401

    small = config(tp, 64, layers, heads, optimizer, pp)
    warm = training_engine(small).build(
        small, None, None, small.precision.train, rt, optim=stage.optim, total_steps=1, schedule="constant"
    )
    del warm
    gc.collect()
    torch.distributed.barrier()
    before = peak_rss()
    setup = training_engine(cfg).build(
        cfg, None, checkpoint, cfg.precision.train, rt, optim=stage.optim, total_steps=1, schedule="constant"
    )
    build_peak = peak_rss() - before
    # one pretraining step, so the optimizer's moments exist as they do for the rest of a stage
    from ringzero.engines.builders import task_and_tokenizer
    from ringzero.stages.corpus_windows import CorpusWindows
    from ringzero.stages.lm_step import lm_step

    task, tokenizer = task_and_tokenizer(cfg)
    windows = CorpusWindows(task, tokenizer, stage.seq_len, cfg.run.seed)
    lm_step(
        setup.model,
        windows.batch(0, stage.batch_size),
        rt,
        optimizer=setup.optimizer,
        sharding=cfg.parallel.sharding,
        micro_batch=stage.batch_size,
    )
    model_bytes = storage_bytes(list(setup.model.parameters()) + list(setup.model.buffers()))
    everything = storage_bytes(tensors_in(setup, set()))
    full = sum(p.numel() * 4 for p in HybridLM(cfg.model, cfg.precision.train).parameters())
    try:
        from megatron.core import parallel_state

        parallel_state.destroy_model_parallel()
    except ImportError:
        pass
    return {
        "rank": ctx.rank,
        "model": model_bytes,
        "total": everything,
        "serving": setup.serving is not None,
        "full_fp32": full,
        "build_peak": build_peak,
    }
