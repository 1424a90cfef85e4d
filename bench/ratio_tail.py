"""How much do FP32 islands shrink the tail of the train/rollout importance ratio?

For each precision-policy pair (train, rollout) the rollout engine samples trajectories of fixed
lengths (no eos, so each length bucket is exactly filled) and the training path rescores them
(``ringzero.rollout.engine.gap.measure_gap``); the tables give the distribution of ``|r - 1|`` and ``|log r|``
per pair and length. Pairs: ``fp32-islands`` on both sides, ``bf16`` on both sides, ``fp32`` on both
sides, and ``deterministic`` (``fp32-islands`` on both sides with the engine in deterministic mode).

Weights matter: random-init weights give near-uniform logits, where a rounding error in a logit moves
every probability alike and the islands have little to fix. A real policy has peaked logits. So the
bench first trains the tiny model briefly on the synthetic task's web-like corpus (next-character
prediction, fp32, AdamW) and reports the trained weights, and the random-init weights for contrast.
``--checkpoint URI`` uses a committed checkpoint instead of training: a full URI, or with ``--store ROOT``
a name in that store (a staged run's ``stages/<hash>/final``). ``--config RUN.yaml`` draws the prompts from
that run's task (its held-out split) instead of the addition prompts: the context a checkpoint trained on
that task knows, so its logits are as peaked as in its own rollouts.

    python bench/ratio_tail.py --store file://runs/store --checkpoint stages/<hash>/final \
        --config configs/tiny-cpu.yaml --lengths 128,512 --no-random-init

    python bench/ratio_tail.py --md docs/bench/rollout.md
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
from common import write_section

from ringzero.model.config import ModelConfig, PrecisionPolicy
from ringzero.model.hybrid import HybridLM
from ringzero.rollout.engine.gap import measure_gap
from ringzero.rollout.types import SamplingParams
from ringzero.tokenizer import CharTokenizer

TINY = dict(
    vocab_size=64,
    hidden_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    intermediate_size=352,
    kv_lora_rank=32,
    qk_nope_head_dim=32,
    qk_rope_head_dim=16,
    v_head_dim=32,
    head_dim=32,
    lightning_block_size=64,
)
"""The model of configs/tiny-cpu.yaml (hybrid: three Lightning layers, then one MLA layer)."""

PAIRS = [  # (label, train preset, rollout preset, deterministic)
    ("fp32-islands", "fp32-islands", "fp32-islands", False),
    ("bf16", "bf16", "bf16", False),
    ("fp32", "fp32", "fp32", False),
    ("deterministic", "fp32-islands", "fp32-islands", True),
]
STATS = ("mean", "p50", "p90", "p99", "p99.9", "max")


def corpus_batches(batch: int, seq_len: int, seed: int):
    """Endless ``[batch, seq_len + 1]`` windows of the synthetic task's pretraining corpus."""
    from ringzero.tasks.arithmetic import SyntheticArithmetic
    from ringzero.tasks.chatter import DOC_SEPARATOR
    from ringzero.tasks.config import ArithmeticTask
    from ringzero.tasks.corpus import CorpusGenerator

    tok = CharTokenizer()
    docs = CorpusGenerator(SyntheticArithmetic(ArithmeticTask(operation="add", digits=10))).stream(seed)
    buffer: list[int] = []
    while True:
        while len(buffer) < batch * (seq_len + 1):
            buffer += tok.encode(next(docs) + DOC_SEPARATOR)
        window, buffer = buffer[: batch * (seq_len + 1)], buffer[batch * (seq_len + 1) :]
        yield torch.tensor(window).view(batch, seq_len + 1)


def train_briefly(model: HybridLM, steps: int, batch: int, seq_len: int, lr: float, seed: int) -> list[float]:
    """Next-character pretraining in the model's own (fp32) policy; returns the loss every 50 steps."""
    torch.manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.1)
    losses = []
    model.train()
    for step, ids in zip(range(steps), corpus_batches(batch, seq_len, seed), strict=False):
        logits = model(ids[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), ids[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 50 == 0 or step == steps - 1:
            losses.append(round(float(loss.detach()), 3))
    return losses


def prompts(n: int, seed: int) -> list[list[int]]:
    """Task-style prompts (``q: a+b\\na: ``): the context the trained model knows."""
    gen = torch.Generator().manual_seed(seed)
    tok = CharTokenizer()
    out = []
    for _ in range(n):
        a, b = (int(torch.randint(10**9, 10**10, (1,), generator=gen)) for _ in range(2))
        out.append(tok.encode(f"q: {a}+{b}\na: "))
    return out


def task_prompts(config: Path):
    """``(n, seed) -> prompts`` of the run config's task, held-out split, tokenized as the eval stage does."""
    from ringzero.config.loader import load_config
    from ringzero.engines.builders import task_and_tokenizer
    from ringzero.rl.rollout_batch import encode_prompt

    task, tokenizer = task_and_tokenizer(load_config(config))
    return lambda n, seed: [encode_prompt(tokenizer, p) for p in task.prompts("eval", n, seed)]


def checkpoint_model(uri: str, store_uri: str | None, room: int) -> HybridLM:
    """The committed checkpoint in fp32, with ``room`` positions (the weights do not depend on it)."""
    from ringzero.model.checkpoint import load_model
    from ringzero.store import open_store

    fp32 = PrecisionPolicy.preset("fp32")
    loaded = load_model(uri, fp32, store=open_store(store_uri) if store_uri else None).model
    model = HybridLM(loaded.cfg.model_copy(update={"max_position_embeddings": room}), fp32)
    model.load_state_dict(loaded.state_dict())
    return model


def measure(
    model: HybridLM,
    lengths: list[int],
    samples: dict[int, int],
    temperature: float,
    seed: int,
    make_prompts=prompts,
):
    rows = []
    for label, train, rollout, det in PAIRS:
        for length in lengths:
            started = time.perf_counter()
            # A seed per length: otherwise a long trajectory would begin with a shorter one's tokens.
            report = measure_gap(
                model,
                make_prompts(samples[length], seed + length),
                SamplingParams(max_new_tokens=length, temperature=temperature),
                train_policy=PrecisionPolicy.preset(train),
                rollout_policy=PrecisionPolicy.preset(rollout),
                deterministic=det,
                length_edges=lengths,
                seed=seed + length,
                micro_batch=max(1, 2048 // length),
            )
            rows.append(
                {
                    "pair": label,
                    "length": length,
                    "seconds": round(time.perf_counter() - started, 1),
                    **report["all"],
                    "by_position": report["by_position"],
                }
            )
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "by_position"}), flush=True)
    return rows


def table(rows: list[dict]) -> list[str]:
    head = (
        "| pair (train = rollout) | length | tokens | NLL | "
        + " | ".join(f"\\|r-1\\| {s}" for s in STATS)
        + " | \\|log r\\| p99 | \\|log r\\| max |"
    )
    lines = [head, "|" + "---|" * (4 + len(STATS) + 2)]
    for r in rows:
        cells = [r["pair"], str(r["length"]), str(r["tokens"]), f"{r['train_nll/mean']:.2f}"]
        cells += [f"{r[f'ratio/{s}']:.2e}" for s in STATS]
        cells += [f"{r['logratio/p99']:.2e}", f"{r['logratio/max']:.2e}"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def islands_vs_bf16(rows: list[dict]) -> list[str]:
    """Per length: islands' p99 and max of |r-1| as a fraction of all-bf16's (target: <= 1/3)."""
    by = {(r["pair"], r["length"]): r for r in rows}
    out = []
    for length in sorted({r["length"] for r in rows}):
        isl, bf = by[("fp32-islands", length)], by[("bf16", length)]
        p99 = isl["ratio/p99"] / bf["ratio/p99"] if bf["ratio/p99"] else float("nan")
        mx = isl["ratio/max"] / bf["ratio/max"] if bf["ratio/max"] else float("nan")
        verdict = "meets" if p99 <= 1 / 3 and mx <= 1 / 3 else "misses"
        out.append(
            f"- length {length}: fp32-islands / bf16 = {p99:.2f} at p99, {mx:.2f} at max "
            f"({verdict} the 1/3 target); deterministic max |r-1| = "
            f"{by[('deterministic', length)]['ratio/max']:g}"
        )
    return out


def position_table(rows: list[dict]) -> list[str]:
    """Inside the longest trajectories: the tail per position bucket, fp32-islands next to bf16."""
    longest = max(r["length"] for r in rows)
    by = {r["pair"]: r["by_position"] for r in rows if r["length"] == longest}
    lines = [
        f"Inside the {longest}-token trajectories, by token position:",
        "",
        "| positions | tokens | islands p99 | bf16 p99 | ratio | islands p99.9 | bf16 p99.9 | ratio "
        "| islands max | bf16 max | ratio |",
        "|" + "---|" * 11,
    ]
    for label, isl in by["fp32-islands"].items():
        bf = by["bf16"][label]
        cells = [label, str(isl["tokens"])]
        for s in ("p99", "p99.9", "max"):
            a, b = isl[f"ratio/{s}"], bf[f"ratio/{s}"]
            cells += [f"{a:.2e}", f"{b:.2e}", f"{a / b:.2f}" if b else "n/a"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--checkpoint",
        help="committed checkpoint to measure instead of training one: a URI, or a name in --store",
    )
    p.add_argument("--store", help="checkpoint store root (file://... or s3://...) holding --checkpoint")
    p.add_argument(
        "--config",
        type=Path,
        help="run config whose task's held-out prompts are continued (default: addition prompts)",
    )
    p.add_argument("--train-steps", type=int, default=400)
    p.add_argument("--train-batch", type=int, default=16)
    p.add_argument("--train-seq-len", type=int, default=256)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--lengths", default="256,1024,4096", help="comma-separated trajectory lengths")
    p.add_argument(
        "--tokens-per-length",
        type=int,
        default=8192,
        help="tokens sampled per (pair, length): trajectories = this / length (at least 1)",
    )
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--no-random-init", action="store_true", help="skip the random-init contrast")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--md", type=Path, help="write the results as a markdown section into this file")
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    lengths = [int(x) for x in args.lengths.split(",")]
    samples = {n: max(1, args.tokens_per_length // n) for n in lengths}
    fp32 = PrecisionPolicy.preset("fp32")
    # max_position_embeddings only caps the engine's generation; the weights do not depend on it.
    room = max(lengths) + 32
    if args.store and not args.checkpoint:
        p.error("--store names where --checkpoint lives; give --checkpoint too")
    make_prompts = task_prompts(args.config) if args.config else prompts
    if args.checkpoint:
        trained = checkpoint_model(args.checkpoint, args.store, room)
        origin, losses = f"checkpoint {args.checkpoint}" + (f" in {args.store}" if args.store else ""), None
    else:
        cfg = ModelConfig.model_validate({**TINY, "max_position_embeddings": room})
        trained = HybridLM(cfg, fp32)
        trained.reset_parameters(torch.Generator().manual_seed(args.seed))
        started = time.perf_counter()
        losses = train_briefly(
            trained, args.train_steps, args.train_batch, args.train_seq_len, args.lr, args.seed
        )
        origin = (
            f"tiny model trained {args.train_steps} steps (batch {args.train_batch} x {args.train_seq_len} "
            f"chars, AdamW lr {args.lr}, fp32) in {time.perf_counter() - started:.0f} s; "
            f"loss every 50 steps: {losses}"
        )
        print(origin, flush=True)
    trained.eval()
    results = {"trained": measure(trained, lengths, samples, args.temperature, args.seed, make_prompts)}
    if not args.no_random_init:
        rand = HybridLM(trained.cfg, fp32).eval()
        rand.reset_parameters(torch.Generator().manual_seed(args.seed))
        results["random init"] = measure(rand, lengths, samples, args.temperature, args.seed, make_prompts)

    cmd = "python bench/ratio_tail.py " + " ".join(
        f"--{k.replace('_', '-')}" + ("" if v is True else f" {v}")
        for k, v in vars(args).items()
        if k != "md" and v not in (None, False)
    )
    parts = [
        "## Train/rollout ratio tail per precision pair",
        "",
        f"`{cmd}`",
        "",
        f"Weights: {origin}. Trajectories sampled at T = {args.temperature} by the embedded engine "
        f"(cached decoding) under the rollout policy, rescored by the training path (parallel teacher-forced "
        f"forward) under the train policy; {args.tokens_per_length} tokens per row (trajectories = tokens / "
        "length). "
        f"NLL is the mean -log p of the sampled tokens under the train policy (low = peaked logits). "
        + (
            f"Training windows are {args.train_seq_len} characters: later positions are extrapolation. "
            if not args.checkpoint
            else ""
        )
        + f"torch {torch.__version__}, {args.threads} thread(s), load average {os.getloadavg()[0]:.1f}.",
    ]
    for kind, rows in results.items():
        parts += [
            "",
            f"### {kind} weights",
            "",
            *table(rows),
            "",
            *islands_vs_bf16(rows),
            "",
            *position_table(rows),
        ]
    body = "\n".join(parts)
    print(body)
    if args.md:
        write_section(args.md, "ratio-tail", body)


if __name__ == "__main__":
    main()
