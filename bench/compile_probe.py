"""Does ``torch.compile`` (inductor, CPU) pay on the CPU paths? Eager vs compiled, side by side in one process.

Two paths of the tiny model (fp32, random weights), each variant on its own freshly built model with the
same seed, so every variant does the same work:

- ``decode``: ``EmbeddedEngine.generate`` of ``--batch`` rows x ``--new-tokens`` tokens from
  ``--prompt-len``-token prompts (the setup of ``bench/rollout_throughput.py``). Variants: eager; each
  block's ``mlp`` and both layer norms compiled (``module.compile(dynamic=True)``); whole blocks compiled
  (``engine.model.layers[i].compile(dynamic=True)``; the decode cache is expected to cause graph breaks).
- ``train``: ``lm_step`` with ``TrainOptimizer`` on the pretraining batch of ``configs/tiny-cpu.yaml``
  (rows, length, micro-batch and optimizer of its ``base`` stage). Variants: eager; whole blocks compiled
  (``model.layers[i].compile()``, static shapes).

The first call of each variant is timed on its own (``first call s``: for a compiled variant it holds the
compilation, cold: the run uses a fresh inductor cache directory unless ``--warm-cache``). Then one untimed warm-up call, then ``--repeats`` timed rounds that interleave the variants
(decode: one ``generate`` each; train: ``--train-steps`` steps each), and the median round is reported,
since a shared machine's load moves between runs. A variant whose compilation raises is reported with
the exception's type and first line instead of a rate.

    OMP_NUM_THREADS=1 python bench/compile_probe.py --md docs/bench/rollout.md
    OMP_NUM_THREADS=1 python bench/compile_probe.py --quick   # smoke: 8 rows x 16 tokens, 2 train steps
"""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

# Cold compiles by default: inductor's on-disk caches (FX graphs, AOTAutograd) would otherwise make a
# rerun's first calls cheaper than a fresh machine's. Set before torch is imported.
COLD_CACHE = "--warm-cache" not in sys.argv and "TORCHINDUCTOR_CACHE_DIR" not in os.environ
if COLD_CACHE:
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="compile_probe-")
    atexit.register(shutil.rmtree, os.environ["TORCHINDUCTOR_CACHE_DIR"], ignore_errors=True)

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

from mdsection import write_section  # noqa: E402
from rollout_throughput import TINY, fixed_prompts, tiny_model  # noqa: E402

from ringzero.config.loader import load_config  # noqa: E402
from ringzero.engines.builders import fresh_model, task_and_tokenizer  # noqa: E402
from ringzero.engines.optimizer import TrainOptimizer  # noqa: E402
from ringzero.model.hybrid import HybridLM  # noqa: E402
from ringzero.parallel.runtime import single  # noqa: E402
from ringzero.rollout.engine.embedded import EmbeddedEngine  # noqa: E402
from ringzero.stages.corpus_windows import CorpusWindows  # noqa: E402
from ringzero.stages.lm_step import lm_step  # noqa: E402

EAGER = "eager"


@dataclass
class Variant:
    """One variant of one path: ``call()`` runs one unit of work (a generate call, or ``steps`` steps)."""

    name: str
    call: Callable[[], object]
    first_s: float = 0.0
    rounds: list[float] = field(default_factory=list)
    error: str | None = None
    graphs: int = 0
    graph_breaks: int = 0
    check: object = None  # what the first call produced (sampled ids, or the first step's loss)


def timed(fn) -> tuple[float, object]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def first_call(v: Variant) -> None:
    """Time the first call (compilation included); on an exception record its type and first line."""
    from torch._dynamo.utils import counters

    counters.clear()
    try:
        v.first_s, v.check = timed(v.call)
    except Exception as e:  # noqa: BLE001 - the probe reports any compile failure instead of stopping
        lines = str(e).strip().splitlines()
        v.error = f"{type(e).__name__}: {lines[0] if lines else ''}"[:200]
        print(f"  {v.name}: failed: {v.error}", flush=True)
        return
    v.graphs = int(counters["stats"]["unique_graphs"])
    v.graph_breaks = int(sum(counters["graph_break"].values()))
    print(
        f"  {v.name}: first call {v.first_s:.2f} s ({v.graphs} graphs, {v.graph_breaks} graph breaks)",
        flush=True,
    )


def measure(variants: list[Variant], repeats: int) -> None:
    for v in variants:
        first_call(v)
    live = [v for v in variants if v.error is None]
    for v in live:  # warm-up: a recompilation the first call's shapes did not trigger happens here
        v.call()
    for r in range(repeats):
        for v in live:
            v.rounds.append(timed(v.call)[0])
        print(f"  round {r + 1}: " + ", ".join(f"{v.name} {v.rounds[-1]:.3f} s" for v in live), flush=True)


def compile_each(modules, **kwargs) -> None:
    for m in modules:
        m.compile(**kwargs)


def decode_variants(batch: int, prompt_len: int, new_tokens: int, with_blocks: bool) -> list[Variant]:
    context = prompt_len + new_tokens
    requests = fixed_prompts(batch, prompt_len, new_tokens, TINY["vocab_size"])[1]

    def engine(prepare: Callable[[HybridLM], None]) -> Callable[[], object]:
        model = tiny_model(context)
        eng = EmbeddedEngine(model, None, model.policy, max_batch=batch)
        prepare(eng.model)

        def generate():
            out = eng.generate(requests)
            assert sum(len(c.output_ids) for (c,) in out) == batch * new_tokens
            return [c.output_ids for (c,) in out]

        return generate

    def parts(m: HybridLM) -> None:
        compile_each(
            [mod for b in m.layers for mod in (b.mlp, b.input_layernorm, b.post_attention_layernorm)],
            dynamic=True,
        )

    out = [Variant(EAGER, engine(lambda m: None)), Variant("mlp + norms compiled", engine(parts))]
    if with_blocks:
        out.append(Variant("blocks compiled", engine(lambda m: compile_each(m.layers, dynamic=True))))
    return out


def train_variants(config: str, stage_name: str, steps: int) -> tuple[list[Variant], int]:
    cfg = load_config(config)
    task, tokenizer = task_and_tokenizer(cfg)
    stage = cfg.stage(stage_name)
    windows = CorpusWindows(task, tokenizer, stage.seq_len, cfg.run.seed)
    runtime = single("cpu")

    def trainer(prepare: Callable[[HybridLM], None]) -> Callable[[], object]:
        torch.manual_seed(cfg.run.seed)
        model = fresh_model(cfg, cfg.precision.train).train()
        optimizer = TrainOptimizer(model, stage.optim, total_steps=stage.steps, schedule="cosine")
        prepare(model)
        clock = iter(range(10**9))  # every variant walks the same batches in the same order

        def run_steps():
            losses = [
                lm_step(
                    model,
                    windows.batch(next(clock), stage.batch_size),
                    runtime,
                    optimizer=optimizer,
                    micro_batch=stage.micro_batch,
                ).loss
                for _ in range(steps)
            ]
            return losses[0]

        return run_steps

    variants = [
        Variant(EAGER, trainer(lambda m: None)),
        Variant("blocks compiled", trainer(lambda m: compile_each(m.layers))),
    ]
    return variants, stage.batch_size * stage.seq_len


def rows_for(
    path: str, variants: list[Variant], tokens_per_round: int, per_round: int
) -> tuple[list[str], dict]:
    """Markdown rows and each live variant's ratio to eager (median round against median round)."""
    eager = statistics.median(variants[0].rounds) if variants[0].rounds else None
    rows, ratios = [], {}
    for v in variants:
        if v.error is not None:
            rows.append(f"| {path} | {v.name} | failed: `{v.error}` | | |")
            continue
        med = statistics.median(v.rounds)
        rate = f"{tokens_per_round / med:,.0f}"
        if per_round > 1 or path == "train":
            rate += f" ({per_round / med:.2f} steps/s)"
        ratio = eager / med if eager else float("nan")
        if v.name != EAGER:
            ratios[v.name] = ratio
        rows.append(f"| {path} | {v.name} | {rate} | {ratio:.2f}x | {v.first_s:.1f} |")
    return rows, ratios


def break_even(variants: list[Variant], per_round: int) -> tuple[str, float] | None:
    """Steps after which the fastest compiled variant's extra first-call time is repaid (None: never)."""
    eager, live = variants[0], [v for v in variants[1:] if v.error is None and v.rounds]
    if not live or not eager.rounds:
        return None
    v = min(live, key=lambda v: statistics.median(v.rounds))
    saved = (statistics.median(eager.rounds) - statistics.median(v.rounds)) / per_round
    extra = v.first_s - eager.first_s
    return (v.name, extra / saved) if saved > 0 else None


def conclusion(decode: dict, train: dict, train_even: tuple[str, float] | None) -> str:
    def best(ratios: dict) -> tuple[str, float] | None:
        return max(ratios.items(), key=lambda kv: kv[1]) if ratios else None

    d, t = best(decode), best(train)
    parts = []
    if d:
        parts.append(f"the best compiled decode variant ({d[0]}) runs at {d[1]:.2f}x eager")
    if t:
        parts.append(f"the compiled training step at {t[1]:.2f}x eager")
    if not parts:
        return "No compiled variant ran."
    wins = [r for r in (d, t) if r and r[1] >= 1.05]
    losses = [r for r in (d, t) if r and r[1] <= 0.95]
    if not wins and not losses:
        verdict = "within 5% of eager on both paths: compilation does not pay for its compile time here"
    elif wins and not losses:
        verdict = "faster, at the price of the first-call compile times above"
    elif losses and not wins:
        verdict = "slower than eager: compilation does not pay on these CPU paths"
    else:
        verdict = "a gain on one path and a loss on the other"
    even = (
        f" The training step's extra first-call time is repaid after about {train_even[1]:,.0f} steps."
        if train_even and t and t[1] > 1
        else ""
    )
    return "Compiled vs eager: " + " and ".join(parts) + f"; {verdict}." + even


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=64, help="decode rows")
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--no-blocks", action="store_true", help="skip the whole-block compiled decode variant")
    p.add_argument("--config", default="configs/tiny-cpu.yaml")
    p.add_argument(
        "--stage", default="base", help="the pretrain stage whose batch, length and optimizer to use"
    )
    p.add_argument("--train-steps", type=int, default=4, help="training steps per timed round")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument(
        "--quick", action="store_true", help="smoke: 8 rows x 16 tokens, 2 training steps, 1 repeat"
    )
    p.add_argument(
        "--warm-cache",
        action="store_true",
        help="keep inductor's default on-disk cache (first calls then reuse earlier runs' compiles)",
    )
    p.add_argument("--md", type=Path, help="write the results as a markdown section into this file")
    args = p.parse_args()
    if args.quick:
        args.batch, args.new_tokens, args.train_steps, args.repeats = 8, 16, 2, 1
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()[0]
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, load {load_before:.2f}",
        flush=True,
    )

    print(
        f"decode: {args.batch} rows x {args.new_tokens} new tokens, prompts of {args.prompt_len}", flush=True
    )
    dec = decode_variants(args.batch, args.prompt_len, args.new_tokens, with_blocks=not args.no_blocks)
    measure(dec, args.repeats)
    print(f"train: {args.config} stage {args.stage}, {args.train_steps} steps per round", flush=True)
    trn, tokens_per_step = train_variants(args.config, args.stage, args.train_steps)
    measure(trn, args.repeats)
    load_after = os.getloadavg()[0]

    dec_rows, dec_ratios = rows_for("decode", dec, args.batch * args.new_tokens, 1)
    trn_rows, trn_ratios = rows_for("train", trn, tokens_per_step * args.train_steps, args.train_steps)
    same = [v.name for v in dec[1:] if v.error is None and v.check == dec[0].check]
    loss_gap = max((abs(v.check - trn[0].check) for v in trn[1:] if v.error is None), default=float("nan"))
    checks = (
        f"Checks: decode variants sampling the same tokens as eager: {', '.join(same) or 'none'}; "
        f"first training step's loss, compiled minus eager: {loss_gap:.1e}."
    )
    graphs = "; ".join(
        f"{path} {v.name}: {v.graphs} graphs, {v.graph_breaks} graph breaks"
        for path, vs in (("decode", dec), ("train", trn))
        for v in vs[1:]
        if v.error is None
    )

    flags = [
        f"--batch {args.batch}",
        f"--prompt-len {args.prompt_len}",
        f"--new-tokens {args.new_tokens}",
        f"--train-steps {args.train_steps}",
        f"--repeats {args.repeats}",
        f"--threads {args.threads}",
    ]
    if args.no_blocks:
        flags.append("--no-blocks")
    if args.warm_cache:
        flags.append("--warm-cache")
    if args.config != "configs/tiny-cpu.yaml" or args.stage != "base":
        flags += [f"--config {args.config}", f"--stage {args.stage}"]
    cmd = (
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', args.threads)} python bench/compile_probe.py "
        + " ".join(flags)
    )
    body = "\n".join(
        [
            "## torch.compile on the CPU paths",
            "",
            f"`{cmd}`",
            "",
            f"torch {torch.__version__}, {args.threads} thread(s), inductor backend, "
            f"{'cold compile caches (a fresh inductor cache dir)' if COLD_CACHE else 'inductor cache as found'}; tiny model (fp32, random "
            f"weights). Decode: the embedded engine, {args.batch} rows x {args.new_tokens} new tokens from "
            f"{args.prompt_len}-token prompts. Train: `lm_step` + `TrainOptimizer` on the `{args.stage}` stage "
            f"batch of `{args.config}` ({tokens_per_step} tokens a step), {args.train_steps} steps a round. "
            f"Median of {args.repeats} interleaved round(s) after one warm-up; 1-minute load average "
            f"{load_before:.1f} before, {load_after:.1f} after (a shared 2-core machine).",
            "",
            "| path | variant | tokens/s | vs eager | first call s |",
            "|---|---|---|---|---|",
            *dec_rows,
            *trn_rows,
            "",
            checks + (f" Dynamo: {graphs}." if graphs else ""),
            "",
            conclusion(dec_ratios, trn_ratios, break_even(trn, args.train_steps)),
        ]
    )
    print(body)
    if args.md:
        write_section(args.md, "compile", body)


if __name__ == "__main__":
    main()
