"""Where a decoding step of the embedded engine spends its time (CPU, one thread, fp32, tiny model).

``EmbeddedEngine.generate`` runs 64 rows x 128 new tokens (no stop, so every step has 64 rows); the
model's forward, ``sample_next`` and ``DecodingRows.advance`` are timed by wrapping them, and one
generate runs under torch's profiler for the matmul share (``aten::mm`` + ``aten::bmm`` self time)
and under a dispatch counter for the number of aten calls per step, inside the model and outside it.
What is left after the forward, the sampling and the stop bookkeeping is the loop itself.

``--train-config`` adds the same matmul share for the pretraining step of a run config (``lm_step``
with its optimizer on the config's base-stage batch, 2 threads): the floor that pretraining's
matrix multiplications set on a stage's wall time.

    OMP_NUM_THREADS=1 python bench/decode_anatomy.py --md docs/bench/rollout.md
    python bench/decode_anatomy.py --train-config configs/tiny-cpu.yaml --md docs/bench/rollout.md
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.profiler import profile
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parent))

from mdsection import write_section  # noqa: E402
from rollout_throughput import fixed_prompts, tiny_model  # noqa: E402

import ringzero.rollout.engine.embedded as engine_mod  # noqa: E402
import ringzero.rollout.engine.rows as rows_mod  # noqa: E402
from ringzero.rollout.engine.embedded import EmbeddedEngine  # noqa: E402


class Timed:
    """Accumulated seconds of a wrapped callable."""

    def __init__(self):
        self.seconds = 0.0

    def wrap(self, fn):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start
        return timed


class OpCount(TorchDispatchMode):
    """aten calls, split by whether the model's forward is running."""

    def __init__(self):
        super().__init__()
        self.inside = False
        self.counts = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts["model" if self.inside else "loop"] += 1
        return func(*args, **(kwargs or {}))


def build(batch: int, prompt_len: int, new_tokens: int):
    model = tiny_model(prompt_len + new_tokens)
    engine = EmbeddedEngine(model, None, model.policy, max_batch=batch)
    return engine, fixed_prompts(batch, prompt_len, new_tokens, model.cfg.vocab_size)[1]


def measure(batch: int, prompt_len: int, new_tokens: int, repeats: int) -> dict:
    engine, requests = build(batch, prompt_len, new_tokens)
    forward, sample, advance = Timed(), Timed(), Timed()
    model_forward = engine.model.forward
    engine.model.forward = forward.wrap(model_forward)  # decoding steps only: the prefill calls hidden()
    real_sample, real_advance = engine_mod.sample_next, rows_mod.DecodingRows.advance
    engine_mod.sample_next = sample.wrap(real_sample)
    rows_mod.DecodingRows.advance = advance.wrap(real_advance)
    try:
        engine.generate(requests)  # warm-up
        runs = []
        for _ in range(repeats):
            for t in (forward, sample, advance):
                t.seconds = 0.0
            start = time.perf_counter()
            engine.generate(requests)
            runs.append({"total": time.perf_counter() - start, "forward": forward.seconds,
                         "sample": sample.seconds, "advance": advance.seconds})
        with profile() as prof:
            engine.generate(requests)
        counter = OpCount()

        def counted_forward(*args, **kwargs):
            counter.inside = True
            try:
                return model_forward(*args, **kwargs)
            finally:
                counter.inside = False
        engine.model.forward = counted_forward
        with torch.inference_mode(), counter:
            engine.generate(requests)
    finally:
        engine.model.forward = model_forward
        engine_mod.sample_next, rows_mod.DecodingRows.advance = real_sample, real_advance
    steps = new_tokens  # one sampling per new token; the forward runs after every sampling but the last
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    events = {e.key: e.self_cpu_time_total for e in prof.key_averages()}
    all_us = sum(events.values())
    matmul_us = events.get("aten::mm", 0.0) + events.get("aten::bmm", 0.0)
    return {
        "ms_per_step": 1e3 * med["total"] / steps,
        "forward_ms": 1e3 * med["forward"] / (steps - 1),
        "sample_ms": 1e3 * med["sample"] / steps,
        "advance_ms": 1e3 * med["advance"] / steps,
        "rest_ms": 1e3 * (med["total"] - med["forward"] - med["sample"] - med["advance"]) / steps,
        "tokens_per_s": batch * new_tokens / med["total"],
        "matmul_share": matmul_us / all_us if all_us else 0.0,
        "model_ops_per_step": counter.counts["model"] / (steps - 1),
        "loop_ops_per_step": counter.counts["loop"] / steps,
    }


def train_profile(config: str, threads: int, steps: int = 3) -> dict:
    """Seconds per pretraining step and the matmul share of its profiled CPU time."""
    from ringzero.config.loader import load_config
    from ringzero.engines.builders import fresh_model, task_and_tokenizer
    from ringzero.engines.optimizer import TrainOptimizer
    from ringzero.parallel.runtime import single
    from ringzero.stages.corpus_windows import CorpusWindows
    from ringzero.stages.lm_step import lm_step

    torch.set_num_threads(threads)
    cfg = load_config(config)
    stage = next(s for s in cfg.stages if s.kind == "pretrain")
    task, tokenizer = task_and_tokenizer(cfg)
    model = fresh_model(cfg, cfg.precision.train).train()
    optimizer = TrainOptimizer(model, stage.optim, total_steps=stage.steps, schedule="cosine")
    runtime = single(torch.device("cpu"))
    windows = CorpusWindows(task, tokenizer, stage.seq_len, cfg.run.seed)
    lm_step(model, windows.batch(0, stage.batch_size), runtime, optimizer=optimizer,
            micro_batch=stage.micro_batch)  # warm-up
    with profile() as prof:
        start = time.perf_counter()
        for step in range(1, steps + 1):
            lm_step(model, windows.batch(step, stage.batch_size), runtime, optimizer=optimizer,
                    micro_batch=stage.micro_batch)
        seconds = (time.perf_counter() - start) / steps
    events = {e.key: e.self_cpu_time_total for e in prof.key_averages()}
    share = (events.get("aten::mm", 0.0) + events.get("aten::bmm", 0.0)) / sum(events.values())
    return {"config": config, "threads": threads, "steps": stage.steps, "batch": stage.batch_size,
            "seq_len": stage.seq_len, "s_per_step": seconds, "matmul_share": share}


def train_markdown(t: dict) -> str:
    matmul_s = t["s_per_step"] * t["matmul_share"]
    return "\n".join([
        "",
        f"Pretraining step of `{t['config']}` (`--train-config`, {t['threads']} threads, {t['batch']} x "
        f"{t['seq_len']} tokens, forward + backward + AdamW, profiled): {t['s_per_step']:.2f} s a step, of which "
        f"matrix multiplications {t['matmul_share']:.0%} ({matmul_s:.2f} s). Over the stage's {t['steps']} steps "
        f"that is {t['steps'] * t['s_per_step'] / 60:.1f} min (profiler overhead included), "
        f"{t['steps'] * matmul_s / 60:.1f} min of it matmul.",
    ])


def markdown(r: dict, args, load: tuple[float, float]) -> str:
    cmd = (f"python bench/decode_anatomy.py --batch {args.batch} --prompt-len {args.prompt_len} "
           f"--new-tokens {args.new_tokens} --repeats {args.repeats}"
           + (f" --train-config {args.train_config}" if args.train_config else ""))
    rest = r["rest_ms"]
    return "\n".join([
        "## Anatomy of one decoding step (CPU, one thread)",
        "",
        f"`{cmd}`",
        "",
        f"torch {torch.__version__}; tiny model (hidden 128, 4 layers: 3 Lightning + 1 MLA, vocab 64), fp32, "
        f"{args.batch} rows x {args.new_tokens} new tokens, no stop; median of {args.repeats}. "
        f"1-minute load average {load[0]:.1f} before, {load[1]:.1f} after.",
        "",
        "| part | ms per step | share | aten calls per step |",
        "|---|---:|---:|---:|",
        f"| model forward (one token per row, cached) | {r['forward_ms']:.2f} | {r['forward_ms'] / r['ms_per_step']:.0%} "
        f"| {r['model_ops_per_step']:.0f} |",
        f"| sampling (`sample_next`: log-softmax, inverse CDF) | {r['sample_ms']:.2f} | "
        f"{r['sample_ms'] / r['ms_per_step']:.0%} | {r['loop_ops_per_step']:.0f} (sampling, stop check, loop) |",
        f"| stop bookkeeping (`DecodingRows.advance`: record, stop check) | {r['advance_ms']:.2f} | "
        f"{r['advance_ms'] / r['ms_per_step']:.0%} | |",
        f"| the rest of the loop (uniforms, prefill spread over the steps) | {rest:.2f} | "
        f"{rest / r['ms_per_step']:.0%} | |",
        f"| **whole step** | **{r['ms_per_step']:.2f}** | | {r['tokens_per_s']:,.0f} tokens/s |",
        "",
        f"Matrix multiplications (`aten::mm`, `aten::bmm`) are {r['matmul_share']:.0%} of the profiled CPU time; "
        "the rest of the forward is the small element-wise and view ops between them, each a few microseconds "
        "at these shapes.",
    ])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--train-config", help="also profile this run config's pretraining step")
    p.add_argument("--train-threads", type=int, default=2)
    p.add_argument("--md", type=Path, help="write the results as a markdown section into this file")
    args = p.parse_args()
    torch.set_num_threads(1)
    before = os.getloadavg()[0]
    r = measure(args.batch, args.prompt_len, args.new_tokens, args.repeats)
    text = markdown(r, args, (before, os.getloadavg()[0]))
    if args.train_config:
        text += "\n" + train_markdown(train_profile(args.train_config, args.train_threads))
    print(text)
    if args.md:
        write_section(args.md, "decode-anatomy", text)


if __name__ == "__main__":
    main()
