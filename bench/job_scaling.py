"""Tokens per second of a pretrain step and of an RL step at nproc 1 and 2, side by side, on this machine.

Each layout runs the stage code itself, as ``ringzero run --nproc N`` runs it: ``lm_step`` (what the
pretrain runner calls) and the RL session ``build_session`` builds (rollouts spread over the ranks,
minibatch updates sharded over ``dp x cp``, weights pushed to every rank's embedded engine). Ranks are
the local gloo processes of a ``ringzero.parallel.launch.RankPool`` (one fresh pool per layout), each
with ``cores // nproc`` torch threads, so every layout uses the same cores.

The model is configs/tiny-cpu.yaml's ``model`` section (fresh init, fp32, as that config trains);
sequences are shortened so the whole run takes a few minutes. Layouts (and one rank on one thread,
the share of the machine each rank of a two-rank job gets, as a reference):

- pretrain: (dp 1, cp 1), (dp 2, cp 1), (dp 1, cp 2). Tokens per step = rows x target columns of the
  global batch (the same batch on every layout).
- RL: (dp 1, cp 1), (dp 2, cp 1). Tokens per step = generated tokens (the sampled responses) + trained
  tokens (prompt + response of every row the minibatch updates run forward and backward on). The
  sampled tokens are the same on every layout (per-request seeds), so both layouts do the same work.

Each step is timed on rank 0 between barriers; the first ``--warmup`` steps are not counted and the
figure is the median of the rest.

    python bench/job_scaling.py --md docs/bench/scaling.md
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

from common import write_section

ROOT = Path(__file__).resolve().parents[1]


def job_config(dp: int, cp: int, threads: int, args):
    import yaml

    from ringzero.config.loader import parse_config

    model = yaml.safe_load((ROOT / "configs/tiny-cpu.yaml").read_text())["model"]
    return parse_config(
        {
            "run": {"name": "job-scaling", "seed": 0, "device": "cpu", "threads": threads},
            "model": model,
            "tokenizer": {"kind": "char"},
            "precision": {"train": "fp32", "rollout": "fp32"},
            "parallel": {"dp": dp, "cp": cp},
            "task": {"kind": "arithmetic", "operation": "digitsum", "digits": 8, "eval_prompts": 4},
            "stages": [
                {
                    "name": "base",
                    "kind": "pretrain",
                    "steps": 1000,
                    "batch_size": args.batch,
                    "micro_batch": args.batch,
                    "seq_len": args.seq_len,
                },
                {
                    "name": "rl",
                    "kind": "rl",
                    "steps": 1000,
                    "prompts_per_step": args.prompts,
                    "samples_per_prompt": args.samples,
                    "minibatches": args.minibatches,
                    "micro_batch": args.prompts * args.samples,
                    "sampling": {"max_new_tokens": args.max_new_tokens},
                    "optim": {"lr": 1e-5, "warmup_steps": 0},
                    "loss": {"kind": "sg_clip_is", "normalization": "token_sum", "kl_coef": 0.0},
                },
            ],
        }
    )


def _runtime(ctx, dp: int, cp: int):
    import torch

    from ringzero.parallel.dims import ParallelDims
    from ringzero.parallel.runtime import Runtime

    dims = ParallelDims(dp=dp, cp=cp, world_size=dp * cp)
    return Runtime(device=torch.device("cpu"), dims=dims, rank=ctx.rank, groups=ctx.groups(dims))


def pretrain_job(ctx, dp: int, cp: int, threads: int, args) -> dict | None:
    import torch

    from ringzero.engines.builders import task_and_tokenizer, training_model
    from ringzero.engines.optimizer import TrainOptimizer
    from ringzero.stages.corpus_windows import CorpusWindows
    from ringzero.stages.lm_step import lm_step

    rt = _runtime(ctx, dp, cp)
    cfg = job_config(dp, cp, threads, args)
    pre = cfg.stages[0]
    task, tokenizer = task_and_tokenizer(cfg)
    torch.manual_seed(0)
    model = training_model(cfg, None, None, cfg.precision.train, rt).train()
    optimizer = TrainOptimizer(model, pre.optim, total_steps=pre.steps, schedule="cosine")
    windows = CorpusWindows(task, tokenizer, pre.seq_len, cfg.run.seed)
    times, tokens = [], []
    for s in range(args.warmup + args.steps):
        ids = windows.batch(s, pre.batch_size)
        rt.barrier()
        t0 = time.perf_counter()
        lm_step(model, ids, rt, optimizer=optimizer, micro_batch=pre.micro_batch)
        rt.barrier()
        if s >= args.warmup:
            times.append(time.perf_counter() - t0)
            tokens.append(ids.shape[0] * (ids.shape[1] - 1))
    return {"times": times, "tokens": tokens, "threads": torch.get_num_threads()} if rt.is_main else None


def rl_job(ctx, dp: int, cp: int, threads: int, args, store_root: str) -> dict | None:
    import torch

    from ringzero.metrics import MemoryMetricWriter
    from ringzero.parallel.one_writer import one_writer
    from ringzero.stages.base import StageContext, StageInputs
    from ringzero.stages.rl_session import build_session
    from ringzero.store import open_store

    rt = _runtime(ctx, dp, cp)
    cfg = job_config(dp, cp, threads, args)
    rl_stage = cfg.stages[1]
    torch.manual_seed(0)
    times, generated, trained, parts = [], [], [], []
    with tempfile.TemporaryDirectory() as stage_dir:
        store = one_writer(open_store(f"file://{store_root}"), rt)
        sctx = StageContext(
            cfg=cfg,
            store=store,
            stage_hash=f"scaling-{dp}x{cp}-{'0' * 16}",
            stage_dir=Path(stage_dir),
            metrics=MemoryMetricWriter(),
            runtime=rt,
        )
        session = build_session(sctx, rl_stage, StageInputs())
        for s in range(args.rl_warmup + args.rl_steps):
            rt.barrier()
            t0 = time.perf_counter()
            m = session.stepper.run(s)
            rt.barrier()
            if s >= args.rl_warmup:
                times.append(time.perf_counter() - t0)
                batch = session.stepper.last_batch
                gen = sum(batch.lengths)
                generated.append(gen)
                trained.append(gen + sum(len(p) for p in batch.prompt_ids))
                parts.append({k: m[k] for k in ("time/generate", "time/train", "time/sync")})
    if not rt.is_main:
        return None
    return {
        "times": times,
        "generated": generated,
        "trained": trained,
        "parts": parts,
        "threads": torch.get_num_threads(),
    }


def run_layout(kind: str, dp: int, cp: int, threads: int, args) -> dict:
    from ringzero.parallel.launch import RankPool

    n = dp * cp
    t0 = time.perf_counter()
    with RankPool(n, threads=threads, timeout_s=1800) as pool, tempfile.TemporaryDirectory() as store_root:
        if kind == "pretrain":
            out = pool.run(pretrain_job, dp, cp, threads, args)[0]
        else:  # one store for the job, written by rank 0 only (pushed weights)
            out = pool.run(rl_job, dp, cp, threads, args, store_root)[0]
    out["wall_s"] = time.perf_counter() - t0
    out.update(kind=kind, dp=dp, cp=cp, nproc=n)
    if kind == "pretrain":
        rates = [t / s for t, s in zip(out["tokens"], out["times"], strict=True)]
    else:
        rates = [(g + t) / s for g, t, s in zip(out["generated"], out["trained"], out["times"], strict=True)]
        out["gen_rate"] = statistics.median(
            g / s for g, s in zip(out["generated"], out["times"], strict=True)
        )
    out["rate"] = statistics.median(rates)
    out["step_s"] = statistics.median(out["times"])
    return out


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--cores",
        type=int,
        default=os.cpu_count(),
        help="cores shared by the ranks (threads = cores / nproc)",
    )
    p.add_argument("--batch", type=int, default=16, help="pretrain rows per step")
    p.add_argument("--seq-len", type=int, default=192, help="pretrain tokens per row")
    p.add_argument("--warmup", type=int, default=2, help="pretrain steps not counted")
    p.add_argument("--steps", type=int, default=20, help="pretrain steps counted")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--minibatches", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--rl-warmup", type=int, default=1, help="RL steps not counted")
    p.add_argument("--rl-steps", type=int, default=8, help="RL steps counted")
    p.add_argument("--md", type=Path, help="write the results as a markdown section into this file")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # each rank sets its own torch threads
    # (kind, dp, cp, threads per rank): cores / nproc, plus one rank on one thread, the share of the
    # machine each rank of an nproc-2 job gets
    full = args.cores
    layouts = [
        ("pretrain", 1, 1, full),
        ("pretrain", 1, 1, 1),
        ("pretrain", 2, 1, full // 2),
        ("pretrain", 1, 2, full // 2),
        ("rl", 1, 1, full),
        ("rl", 1, 1, 1),
        ("rl", 2, 1, full // 2),
    ]
    t_start = time.perf_counter()
    results = []
    for kind, dp, cp, threads in layouts:
        r = run_layout(kind, dp, cp, max(1, threads), args)
        results.append(r)
        print(
            f"{kind} dp={dp} cp={cp}: {r['rate']:.0f} tok/s, {r['step_s']:.3f} s/step "
            f"({r['threads']} threads/rank, layout {r['wall_s']:.0f} s)",
            flush=True,
        )
    total_s = time.perf_counter() - t_start

    def rate_of(kind: str, threads: int) -> float:
        return next(
            r["rate"] for r in results if r["kind"] == kind and r["nproc"] == 1 and r["threads"] == threads
        )

    rows = [
        f"| step | nproc | dp | cp | threads per rank | median s/step | tokens/step | tokens/s | "
        f"vs nproc 1, {full} threads | vs nproc 1, 1 thread | generated tok/s | generate / train / sync s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in results:
        if r["kind"] == "pretrain":
            per_step, gen, split = str(r["tokens"][0]), "-", "-"
        else:
            per_step = (
                f"{statistics.median(g + t for g, t in zip(r['generated'], r['trained'], strict=True)):.0f}"
            )
            gen = f"{r['gen_rate']:.0f}"
            split = " / ".join(
                f"{statistics.median(p[k] for p in r['parts']):.2f}"
                for k in ("time/generate", "time/train", "time/sync")
            )
        rows.append(
            f"| {r['kind']} | {r['nproc']} | {r['dp']} | {r['cp']} | {r['threads']} | {r['step_s']:.3f} | "
            f"{per_step} | {r['rate']:.0f} | {r['rate'] / rate_of(r['kind'], full):.2f}x | "
            f"{r['rate'] / rate_of(r['kind'], 1):.2f}x | {gen} | {split} |"
        )
    cmd = "python bench/job_scaling.py" + (f" --md {args.md}" if args.md else "")
    import torch

    body = "\n".join(
        [
            "## Pretrain and RL step throughput at nproc 1 and 2 (`bench/job_scaling.py`)",
            "",
            f"`{cmd}` (torch {torch.__version__}, {platform.machine()}, {args.cores} cores shared by the "
            "ranks, "
            f"threads per rank = {args.cores} / nproc; the whole run took {total_s:.0f} s)",
            "",
            "Model: configs/tiny-cpu.yaml's (hidden_size 128, layers L M L M, vocab 64), fresh init, fp32. "
            "Pretrain: "
            f"{args.batch} rows x {args.seq_len} tokens per step. RL: {args.prompts} prompts x "
            f"{args.samples} samples, "
            f"at most {args.max_new_tokens} new tokens, {args.minibatches} minibatches, token-level "
            "`sg_clip_is`, no KL; "
            "RL tokens/step = generated + trained (prompt + response of every row). Median of "
            f"{args.steps} pretrain / {args.rl_steps} RL steps after {args.warmup} / {args.rl_warmup} "
            "warm-up steps, "
            "timed on rank 0 between barriers.",
            "",
            *rows,
        ]
    )
    print(body)
    if args.md:
        write_section(args.md, "job-scaling", body, title="# Scaling of one stage job over local ranks")


if __name__ == "__main__":
    main()
