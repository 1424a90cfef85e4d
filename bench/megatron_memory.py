"""Bytes a rank keeps after the megatron engine builds a stage: parameters, buffers and optimizer state, at
tensor-parallel sizes 1, 2 and 4, on the CPU under gloo (one process per rank), after one pretraining step
(so the optimizer's moments exist), against the ideal of (TP 1 bytes) / tp.

Everything a rank holds afterwards is counted once per storage: the model's parameters and buffers, every
tensor the optimizer keeps (masters, Adam moments), and the serving model if one was built (the engine builds
none until something samples in-process). ``full copy`` is what keeping a single-device fp32 HybridLM on
every rank, as the engine did before, adds.

    python bench/megatron_memory.py [--hidden 512 --layers 8 --heads 8] [--md BENCHMARKS-section.md]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def config(tp: int, hidden: int, layers: int, heads: int, optimizer: str):
    from ringzero.config.loader import parse_config

    return parse_config({
        "run": {"name": "memory", "seed": 0, "device": "cpu"},
        "model": {"vocab_size": 64, "hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
                  "layer_group_size": 2, "kv_lora_rank": hidden // 4, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16,
                  "v_head_dim": 32, "head_dim": 32, "lightning_block_size": 64,
                  "intermediate_size": hidden * 11 // 4, "max_position_embeddings": 512},
        "precision": {"train": "fp32-islands", "rollout": "fp32-islands"},
        "engines": {"training": {"kind": "megatron", "tp": tp, "distributed_optimizer": optimizer == "megatron"}},
        "task": {"kind": "arithmetic", "operation": "digitsum", "digits": 3},
        "stages": [{"name": "base", "kind": "pretrain", "steps": 1, "batch_size": 2, "seq_len": 32}],
    }, "memory")


def tensors_in(obj, seen: set[int], depth: int = 0):
    """Every tensor reachable from ``obj`` through attributes, dicts, lists and tuples (not into modules'
    submodules twice, nor into other objects' internals past a few levels)."""
    if depth > 6 or id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from tensors_in(v, seen, depth + 1)
    elif isinstance(obj, (list, tuple, set)):
        for v in obj:
            yield from tensors_in(v, seen, depth + 1)
    elif isinstance(obj, torch.nn.Module):
        yield from obj.parameters()
        yield from obj.buffers()
    elif hasattr(obj, "__dict__") and type(obj).__module__.split(".")[0] in ("ringzero", "megatron", "torch"):
        for v in vars(obj).values():
            yield from tensors_in(v, seen, depth + 1)


def storage_bytes(tensors) -> int:
    storages = {}
    for t in tensors:
        s = t.untyped_storage()
        storages[s.data_ptr()] = s.nbytes()
    return sum(storages.values())


def measure(ctx, tp: int, hidden: int, layers: int, heads: int, optimizer: str) -> dict:
    from ringzero.engines import training_engine
    from ringzero.model.hybrid import HybridLM
    from ringzero.parallel.dims import ParallelDims
    from ringzero.parallel.runtime import Runtime

    torch.set_num_threads(1)
    dims = ParallelDims(dp=1, cp=1, world_size=tp, tp=tp)
    rt = Runtime(device=torch.device("cpu"), dims=dims, rank=ctx.rank, groups=ctx.groups(dims))
    cfg = config(tp, hidden, layers, heads, optimizer)
    stage = cfg.stages[0]
    setup = training_engine(cfg).build(cfg, None, None, cfg.precision.train, rt, optim=stage.optim,
                                       total_steps=1, schedule="constant")
    # one pretraining step, so the optimizer's moments exist as they do for the rest of a stage
    from ringzero.stages.corpus_windows import CorpusWindows
    from ringzero.stages.lm_step import lm_step
    from ringzero.stages.setup import task_and_tokenizer

    task, tokenizer = task_and_tokenizer(cfg)
    windows = CorpusWindows(task, tokenizer, stage.seq_len, cfg.run.seed)
    lm_step(setup.model, windows.batch(0, stage.batch_size), rt, optimizer=setup.optimizer,
            sharding=cfg.parallel.sharding, micro_batch=stage.batch_size)
    model_bytes = storage_bytes(list(setup.model.parameters()) + list(setup.model.buffers()))
    everything = storage_bytes(tensors_in(setup, set()))
    full = sum(p.numel() * 4 for p in HybridLM(cfg.model, cfg.precision.train).parameters())
    try:
        from megatron.core import parallel_state

        parallel_state.destroy_model_parallel()
    except ImportError:
        pass
    return {"rank": ctx.rank, "model": model_bytes, "total": everything, "serving": setup.serving is not None,
            "full_fp32": full}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--tp", default="1,2,4")
    p.add_argument("--optimizer", choices=("ringzero", "megatron"), default="ringzero",
                   help="ringzero's ShardedTrainOptimizer or megatron's DistributedOptimizer")
    args = p.parse_args()
    from ringzero.parallel.launch import RankPool

    rows = []
    for tp in [int(x) for x in args.tp.split(",")]:
        with RankPool(tp, timeout_s=600) as pool:
            per_rank = pool.run(measure, tp, args.hidden, args.layers, args.heads, args.optimizer)
        rows.append((tp, max(r["total"] for r in per_rank), max(r["model"] for r in per_rank),
                     any(r["serving"] for r in per_rank), per_rank[0]["full_fp32"]))
        print(f"tp {tp}: {rows[-1][1] / 2**20:.1f} MiB per rank", flush=True)
    base = rows[0][1]
    print(f"\nmodel: hidden {args.hidden}, {args.layers} layers, {args.heads} heads; fp32-islands (bf16 body); "
          f"optimizer: {args.optimizer}; one rank per TP index, dp 1\n")
    print("| tp | bytes per rank (MiB) | of which parameters + buffers | / (tp 1 bytes / tp) | serving copy | "
          "with a full fp32 copy (before) |")
    print("|---:|---:|---:|---:|---|---:|")
    for tp, total, model, serving, full in rows:
        print(f"| {tp} | {total / 2**20:.1f} | {model / 2**20:.1f} | {total / (base / tp):.3f} | "
              f"{'yes' if serving else 'none'} | {(total + full) / 2**20:.1f} |")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    sys.exit(main())
