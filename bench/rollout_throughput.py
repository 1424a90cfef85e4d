"""Rollout throughput on CPU: the embedded engine vs naive recomputation vs Hugging Face ``generate``.

Three generators produce the same number of tokens for the same batch of prompts, side by side in one
process, in fp32 with the same thread count:

- ``engine``: ``EmbeddedEngine`` (left-padded prefill, preallocated decoding caches, one token per step
  for all rows, sampling at T = 1 with per-row generators, per-token log-probs returned);
- ``naive``: the same model without caches: every step runs the parallel forward over the whole
  sequence so far and samples from the last position (what a rollout costs without decoding forms);
- ``hf``: ``LlamaForCausalLM.generate`` (its default dynamic KV cache, ``do_sample=True``, ``top_k=0``
  so no top-k warper runs, no eos) on a Llama of the same vocab, width, depth, heads and MLP width.

Throughput is generated tokens per wall-clock second (batch x new tokens / time). Runs are interleaved
(engine, naive, hf, engine, ...) and the median of ``--repeats`` is reported, since a shared machine's
load moves between runs; the load average is printed with the results.

    python bench/rollout_throughput.py --md docs/bench/rollout.md
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch
from common import hf_llama, write_section

from ringzero.model.config import ModelConfig, PrecisionPolicy
from ringzero.model.hybrid import HybridLM
from ringzero.rollout.engine.embedded import EmbeddedEngine
from ringzero.rollout.types import GenerateRequest, SamplingParams

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


@torch.inference_mode()
def naive_generate(model: HybridLM, prompts_BP: torch.Tensor, new_tokens: int, gen: torch.Generator):
    ids_BT = prompts_BP
    for _ in range(new_tokens):
        logits_BV = model(ids_BT)[:, -1]
        probs_BV = torch.softmax(logits_BV.float(), dim=-1)
        ids_BT = torch.cat([ids_BT, torch.multinomial(probs_BV, 1, generator=gen)], dim=1)
    return ids_BT


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def tiny_model(context: int) -> HybridLM:
    """The TINY model in fp32 with seed-0 weights, its context ``context`` tokens."""
    cfg = ModelConfig.model_validate({**TINY, "max_position_embeddings": context})
    model = HybridLM(cfg, PrecisionPolicy.preset("fp32")).eval()
    model.reset_parameters(torch.Generator().manual_seed(0))
    return model


def fixed_prompts(batch: int, prompt_len: int, new_tokens: int, vocab_size: int):
    """``(prompts [batch, prompt_len], requests)``: seeded random prompts, each request run to
    ``new_tokens``."""
    prompts_BP = torch.randint(3, vocab_size, (batch, prompt_len), generator=torch.Generator().manual_seed(1))
    requests = [
        GenerateRequest(p, SamplingParams(max_new_tokens=new_tokens, seed=i))
        for i, p in enumerate(prompts_BP.tolist())
    ]
    return prompts_BP, requests


def run(batch: int, prompt_len: int, new_tokens: int, repeats: int, with_naive: bool) -> dict:
    model = tiny_model(prompt_len + new_tokens)
    cfg = model.cfg
    engine = EmbeddedEngine(model, None, model.policy, max_batch=batch)
    hf = hf_llama(cfg)
    prompts_BP, requests = fixed_prompts(batch, prompt_len, new_tokens, cfg.vocab_size)
    gen = torch.Generator().manual_seed(2)

    def hf_generate():
        with torch.inference_mode():
            out = hf.generate(
                prompts_BP,
                attention_mask=torch.ones_like(prompts_BP),
                do_sample=True,
                top_k=0,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
            )
        assert out.shape == (batch, prompt_len + new_tokens)

    def engine_generate():
        out = engine.generate(requests)
        assert sum(len(c.output_ids) for (c,) in out) == batch * new_tokens

    runners = {"engine": engine_generate, "hf": hf_generate}
    if with_naive:
        runners["naive"] = lambda: naive_generate(model, prompts_BP, new_tokens, gen)
    for fn in runners.values():  # warm-up: first-call allocations and lazy imports
        fn()
    seconds = {name: [] for name in runners}
    for _ in range(repeats):
        for name, fn in runners.items():
            seconds[name].append(timed(fn))
    tokens = batch * new_tokens
    out = {name: tokens / statistics.median(s) for name, s in seconds.items()}
    out["engine_over_hf_per_repeat"] = [h / e for e, h in zip(seconds["engine"], seconds["hf"], strict=True)]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--new-tokens", default="128,512", help="comma-separated generation lengths")
    p.add_argument(
        "--naive-up-to",
        type=int,
        default=128,
        help="run naive recomputation only for lengths up to this (its cost grows quadratically)",
    )
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--md", type=Path, help="write the results as a markdown section into this file")
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    load_before = os.getloadavg()[0]
    rows = []
    for n in [int(x) for x in args.new_tokens.split(",")]:
        r = run(args.batch, args.prompt_len, n, args.repeats, with_naive=n <= args.naive_up_to)
        naive = f"{r['naive']:,.0f}" if "naive" in r else "not run"
        ratios = ", ".join(f"{x:.2f}" for x in r["engine_over_hf_per_repeat"])
        rows.append(
            f"| {args.batch} | {args.prompt_len} | {n} | {r['engine']:,.0f} | {naive} | {r['hf']:,.0f} "
            f"| {r['engine'] / r['hf']:.2f}x ({ratios}) |"
        )
        print(rows[-1], flush=True)
    load_after = os.getloadavg()[0]

    cmd = "python bench/rollout_throughput.py " + " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "md" and v is not None
    )
    body = "\n".join(
        [
            "## Rollout throughput (CPU, fp32)",
            "",
            f"`{cmd}`",
            "",
            f"torch {torch.__version__}, {args.threads} thread(s); tiny model hidden_size 128, 4 layers (3 "
            "Lightning + "
            f"1 MLA), 4 heads, MLP 352, vocab 64, random weights. 1-minute load average {load_before:.1f} "
            "before, "
            f"{load_after:.1f} after (a shared 2-core machine).",
            "",
            "| batch | prompt | new tokens | engine tok/s | naive tok/s | HF generate tok/s | engine / HF "
            "(per repeat) |",
            "|---|---|---|---|---|---|---|",
            *rows,
        ]
    )
    print(body)
    if args.md:
        write_section(args.md, "throughput", body)


if __name__ == "__main__":
    main()
