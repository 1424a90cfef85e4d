"""Pretrain and RL steps of a small config on one GPU: tokens/s, peak memory and the ratio tail per precision.

The stage code itself runs, in one process (a job of one rank): ``lm_step`` as the pretrain runner calls
it, and the RL session ``build_session`` builds (embedded rollout engine on the same device, minibatch
updates, weight push). Each precision case runs both:

- ``fp32-islands``: ``precision.train`` and ``precision.rollout`` both ``fp32-islands`` (bf16 body,
  fp32 attention softmax and LM head);
- ``bf16``: both all-bf16, the comparison for the ratio tail.

The model is the tiny config's scaled up (``--hidden-size 512``, 8 layers alternating Lightning and MLA,
8 heads, the 64-symbol char tokenizer, ``max_position_embeddings`` = ``--seq-len`` 2048), fresh init (seeded,
the same weights in both cases). Pretrain: ``--batch`` rows x ``--seq-len`` tokens of the task corpus. RL:
``--prompts`` x ``--samples`` digit-sum responses of exactly ``--max-new-tokens`` tokens (stop string and eos
switched off, so every case decodes the same lengths), ``--minibatches`` updates (default 1: the ratio then
measures the train/rollout engine gap alone, the policy has not moved).

Reported per case: pretrain tokens/s (rows x target tokens / step time), RL tokens/s (generated +
trained tokens, i.e. responses + prompt and response of every trained row, / step time) and generated
tokens/s, peak ``torch.cuda.max_memory_allocated`` of each phase, and from the RL step metrics
``ratio/p99``, ``ratio/p99.9``, ``ratio/max`` of ``|r - 1|`` (median over the measured steps) and the
worst ``ratio/max``. Warm-up steps are not counted; the figure is the median of the measured steps.

Results go to ``$OUT`` (else ``./bench-gpu-out``) as ``stage_steps.json`` and ``stage_steps.md``,
rewritten after every case, so a run cut short keeps what it finished.

    python bench/gpu/stage_steps.py             # on a CUDA device (what bench/gpu/run.sh runs)
    python bench/gpu/stage_steps.py --smoke     # tiny sizes on the CPU, a check that the script works
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

CASES = {"fp32-islands": ("fp32-islands", "fp32-islands"), "bf16": ("bf16", "bf16")}
"""case name -> (precision.train, precision.rollout)"""

RATIO_KEYS = ("ratio/p99", "ratio/p99.9", "ratio/max", "ratio/first_minibatch_max")


class NoEos:
    """The char tokenizer with an eos id nothing samples: rows run to ``max_new_tokens``."""

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer

    eos_id = -1

    def __getattr__(self, name: str):
        return getattr(self._tokenizer, name)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--smoke", action="store_true", help="tiny sizes on the CPU (a check that the script runs)"
    )
    p.add_argument(
        "--device", choices=["auto", "cpu", "cuda"], default=None, help="default: cuda, cpu with --smoke"
    )
    p.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    p.add_argument("--hidden-size", type=int, default=512)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument(
        "--seq-len",
        type=int,
        default=2048,
        help="pretrain row length and the model's max_position_embeddings",
    )
    p.add_argument("--batch", type=int, default=8, help="pretrain rows per step")
    p.add_argument("--micro-batch", type=int, default=8, help="rows per forward/backward (pretrain and RL)")
    p.add_argument("--warmup", type=int, default=2, help="pretrain steps not counted")
    p.add_argument("--steps", type=int, default=5, help="pretrain steps counted")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=512)
    p.add_argument("--minibatches", type=int, default=1)
    p.add_argument("--rl-warmup", type=int, default=1, help="RL steps not counted")
    p.add_argument("--rl-steps", type=int, default=3, help="RL steps counted")
    p.add_argument(
        "--attention-impl",
        choices=["explicit", "sdpa"],
        default="sdpa",
        help="MLA attention of the parallel form (sdpa keeps the island through fp32 inputs)",
    )
    p.add_argument(
        "--budget-s",
        type=float,
        default=120.0,
        help="start no new phase after this many seconds (the run stays within the device lease)",
    )
    p.add_argument("--out", type=Path, default=None, help="default: $OUT, else ./bench-gpu-out")
    args = p.parse_args(argv)
    if args.smoke:
        args.hidden_size, args.layers, args.heads, args.seq_len = 32, 2, 4, 64
        args.batch, args.micro_batch, args.warmup, args.steps = 4, 2, 1, 2
        args.prompts, args.samples, args.max_new_tokens, args.rl_warmup, args.rl_steps = 2, 2, 8, 1, 1
    args.device = args.device or ("cpu" if args.smoke else "cuda")
    args.out = args.out or Path(os.environ.get("OUT") or "bench-gpu-out")
    return args


def model_section(args) -> dict:
    d, h = args.hidden_size, args.heads
    head = d // h
    return {
        "vocab_size": 64,
        "hidden_size": d,
        "num_hidden_layers": args.layers,
        "num_attention_heads": h,
        "layout": "hybrid",
        "layer_group_size": 2,
        "kv_lora_rank": d // 4,
        "qk_nope_head_dim": head,
        "qk_rope_head_dim": head // 2,
        "v_head_dim": head,
        "mla_attention_impl": args.attention_impl,
        "head_dim": head,
        "lightning_block_size": min(64, args.seq_len),
        "intermediate_size": (11 * d // 4 + 63) // 64 * 64 if not args.smoke else 3 * d,
        "max_position_embeddings": args.seq_len,
    }


def run_config(args, train: str, rollout: str):
    from ringzero.config.loader import parse_config

    return parse_config(
        {
            "run": {"name": "gpu-stage-steps", "seed": 0, "device": args.device},
            "model": model_section(args),
            "tokenizer": {"kind": "char"},
            "precision": {"train": train, "rollout": rollout},
            "parallel": {"dp": 1, "cp": 1},
            "task": {"kind": "arithmetic", "operation": "digitsum", "digits": 8, "eval_prompts": 4},
            "stages": [
                {
                    "name": "base",
                    "kind": "pretrain",
                    "steps": 1000,
                    "batch_size": args.batch,
                    "micro_batch": args.micro_batch,
                    "seq_len": args.seq_len,
                },
                {
                    "name": "rl",
                    "kind": "rl",
                    "steps": 1000,
                    "prompts_per_step": args.prompts,
                    "samples_per_prompt": args.samples,
                    "minibatches": args.minibatches,
                    "micro_batch": args.micro_batch,
                    "sampling": {"max_new_tokens": args.max_new_tokens},
                    "optim": {"lr": 1e-5, "warmup_steps": 0},
                    "loss": {"kind": "sg_clip_is", "normalization": "token_sum", "kl_coef": 0.0},
                },
            ],
        }
    )


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def _peak(device: torch.device) -> dict:
    if device.type != "cuda":
        return {"peak_allocated_bytes": None, "peak_reserved_bytes": None}
    return {
        "peak_allocated_bytes": torch.cuda.max_memory_allocated(device),
        "peak_reserved_bytes": torch.cuda.max_memory_reserved(device),
    }


def pretrain_phase(cfg, rt, args) -> dict:
    from ringzero.engines.builders import task_and_tokenizer, training_model
    from ringzero.engines.optimizer import TrainOptimizer
    from ringzero.stages.corpus_windows import CorpusWindows
    from ringzero.stages.lm_step import lm_step

    pre = cfg.stages[0]
    task, tokenizer = task_and_tokenizer(cfg)
    _reset_peak(rt.device)
    model = training_model(cfg, None, None, cfg.precision.train, rt).train()
    optimizer = TrainOptimizer(model, pre.optim, total_steps=pre.steps, schedule="cosine")
    windows = CorpusWindows(task, tokenizer, pre.seq_len, cfg.run.seed)
    times, losses, tokens = [], [], 0
    for s in range(args.warmup + args.steps):
        ids = windows.batch(s, pre.batch_size)
        _sync(rt.device)
        t0 = time.perf_counter()
        result = lm_step(model, ids, rt, optimizer=optimizer, micro_batch=pre.micro_batch)
        _sync(rt.device)
        if s >= args.warmup:
            times.append(time.perf_counter() - t0)
            losses.append(result.loss)
            tokens = ids.shape[0] * (ids.shape[1] - 1)
    out = {
        "tokens_per_step": tokens,
        "step_s": statistics.median(times),
        "tokens_per_s": tokens / statistics.median(times),
        "losses": losses,
        "params": sum(p.numel() for p in model.parameters()),
        **_peak(rt.device),
    }
    del model, optimizer
    return out


def rl_phase(cfg, rt, args) -> dict:
    from ringzero.metrics import MemoryMetricWriter
    from ringzero.stages.base import StageContext, StageInputs
    from ringzero.stages.rl_session import build_session
    from ringzero.store import open_store

    rl_stage = cfg.stages[1]
    _reset_peak(rt.device)
    with tempfile.TemporaryDirectory() as store_root, tempfile.TemporaryDirectory() as stage_dir:
        sctx = StageContext(
            cfg=cfg,
            store=open_store(f"file://{store_root}"),
            stage_hash=f"gpu-{'0' * 16}",
            stage_dir=Path(stage_dir),
            metrics=MemoryMetricWriter(),
            runtime=rt,
        )
        session = build_session(sctx, rl_stage, StageInputs())
        # Every response runs to max_new_tokens: no stop string, no eos (the same lengths in every case).
        session.stepper.task.stop = ()
        session.rollout.client.tokenizer = NoEos(session.rollout.client.tokenizer)
        steps = []
        for s in range(args.rl_warmup + args.rl_steps):
            _sync(rt.device)
            t0 = time.perf_counter()
            m = session.stepper.run(s)
            _sync(rt.device)
            wall = time.perf_counter() - t0
            if s < args.rl_warmup:
                continue
            batch = session.stepper.last_batch
            generated = sum(batch.lengths)
            trained = generated + sum(len(p) for p in batch.prompt_ids)
            steps.append(
                {
                    "step_s": wall,
                    "generated": generated,
                    "trained": trained,
                    **{k: m[k] for k in ("time/generate", "time/train", "time/sync") if k in m},
                    **{k: m.get(k, float("nan")) for k in RATIO_KEYS},
                }
            )
        del session
    med = statistics.median
    step_s = med(s["step_s"] for s in steps)
    out = {
        "step_s": step_s,
        "generated_per_step": med(s["generated"] for s in steps),
        "trained_per_step": med(s["trained"] for s in steps),
        "tokens_per_s": med((s["generated"] + s["trained"]) / s["step_s"] for s in steps),
        "generated_per_s": med(s["generated"] / s["step_s"] for s in steps),
        **{k: med(s[k] for s in steps) for k in ("time/generate", "time/train", "time/sync")},
        **{k: med(s[k] for s in steps) for k in RATIO_KEYS},
        "ratio/max_worst": max(s["ratio/max"] for s in steps),
        "steps": steps,
        **_peak(rt.device),
    }
    return out


def environment(rt) -> dict:
    env = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "device": str(rt.device),
        "cuda": torch.version.cuda,
    }
    if rt.device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(rt.device)
        env["gpu_memory_bytes"] = torch.cuda.get_device_properties(rt.device).total_memory
    return env


def _gib(b) -> str:
    return "-" if b is None else f"{b / 2**30:.2f}"


def markdown(report: dict) -> str:
    a, env = report["args"], report["env"]
    lines = [
        "## Pretrain and RL steps on one GPU (`bench/gpu/stage_steps.py`)",
        "",
        f"`{report['command']}` ({env.get('gpu', env['device'])}, torch {env['torch']}, CUDA {env['cuda']}; "
        f"{report['wall_s']:.0f} s)",
        "",
        f"Model: hidden_size {a['hidden_size']}, {a['layers']} layers (Lightning / MLA alternating), "
        f"{a['heads']} heads, "
        f"vocab 64, {report.get('params', 0) / 1e6:.2f}M parameters, fresh init, MLA "
        f"`{a['attention_impl']}`. "
        f"Pretrain: {a['batch']} x {a['seq_len']} tokens per step (micro-batch {a['micro_batch']}). "
        f"RL: {a['prompts']} x {a['samples']} responses of {a['max_new_tokens']} tokens, {a['minibatches']} "
        "minibatch(es); tokens/s = (generated + trained) / step. Medians of "
        f"{a['steps']} pretrain / {a['rl_steps']} RL steps after {a['warmup']} / {a['rl_warmup']} warm-up.",
        "",
        "| policy (train / rollout) | pretrain tok/s | pretrain peak GiB | RL tok/s | RL generated tok/s | "
        "RL s/step (gen / train / sync) | RL peak GiB | ratio/p99 | ratio/p99.9 | ratio/max (worst) |",
        "|---|---:|---:|---:|---:|---|---:|---:|---:|---:|",
    ]
    for case in report["cases"].values():
        pre, rl = case.get("pretrain"), case.get("rl")
        cells = [f"{case['train']} / {case['rollout']}"]
        cells += [f"{pre['tokens_per_s']:.0f}", _gib(pre["peak_allocated_bytes"])] if pre else ["not run"] * 2
        if rl:
            cells += [
                f"{rl['tokens_per_s']:.0f}",
                f"{rl['generated_per_s']:.0f}",
                f"{rl['step_s']:.2f} ({rl['time/generate']:.2f} / {rl['time/train']:.2f} / "
                f"{rl['time/sync']:.2f})",
                _gib(rl["peak_allocated_bytes"]),
                f"{rl['ratio/p99']:.2e}",
                f"{rl['ratio/p99.9']:.2e}",
                f"{rl['ratio/max']:.2e} ({rl['ratio/max_worst']:.2e})",
            ]
        else:
            cells += ["not run"] * 7
        lines.append("| " + " | ".join(cells) + " |")
    if report.get("skipped"):
        lines += ["", "Not run (time budget): " + ", ".join(report["skipped"])]
    return "\n".join(lines)


def write(report: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "stage_steps.json").write_text(json.dumps(report, indent=1, default=str))
    (out / "stage_steps.md").write_text(markdown(report) + "\n")


def main(argv=None) -> int:
    args = parse_args(argv)
    from ringzero.parallel.runtime import resolve_device, single

    device = resolve_device(args.device)
    if args.device == "cuda" and device.type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 islands mean fp32, not tf32
        torch.backends.cudnn.allow_tf32 = False
    rt = single(device)
    t_start = time.perf_counter()
    report = {
        "command": "python bench/gpu/stage_steps.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "env": environment(rt),
        "cases": {},
        "skipped": [],
        "wall_s": 0.0,
    }
    print(
        f"device {rt.device} ({report['env'].get('gpu', platform.processor() or platform.machine())}), "
        f"torch {torch.__version__}; results to {args.out}",
        flush=True,
    )
    for name in args.cases:
        train, rollout = CASES[name]
        cfg = run_config(args, train, rollout)
        case = report["cases"][name] = {"train": train, "rollout": rollout}
        for phase, fn in (("pretrain", pretrain_phase), ("rl", rl_phase)):
            if time.perf_counter() - t_start > args.budget_s:
                report["skipped"].append(f"{name} {phase}")
                print(f"{name} {phase}: skipped (past --budget-s {args.budget_s:.0f})", flush=True)
                continue
            t0 = time.perf_counter()
            torch.manual_seed(0)
            result = fn(cfg, rt, args)
            if phase == "pretrain":
                report["params"] = result["params"]
            case[phase] = result
            ratio = (
                f", ratio/p99 {result['ratio/p99']:.2e}, ratio/max {result['ratio/max']:.2e}"
                if phase == "rl"
                else ""
            )
            print(
                f"{name} {phase}: {result['tokens_per_s']:.0f} tok/s, {result['step_s']:.3f} s/step, peak "
                f"{_gib(result['peak_allocated_bytes'])} GiB{ratio} [{time.perf_counter() - t0:.0f} s]",
                flush=True,
            )
            report["wall_s"] = time.perf_counter() - t_start
            write(report, args.out)
    report["wall_s"] = time.perf_counter() - t_start
    write(report, args.out)
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
