"""What a bf16 body costs on this CPU: embedded-engine decoding and trainer scoring per precision policy.

The model is configs/tiny-cpu.yaml's (random weights, its 512-token context), built once per policy
(``fp32``, ``fp32-islands``, ``bf16``). One batch of ``--batch`` prompts of ``--prompt-len`` tokens decodes
``--new-tokens`` tokens each (no stop ids), T = 1, seeded; generated tokens per wall-clock second, the
median of ``--repeats`` runs, policies interleaved. Then the trainer's scoring of the finished sequences
(one batched forward, no grad) and one training forward + backward of the same batch per policy (median
of ``--repeats``). Also printed: the CPU capability torch dispatches to, and the time of one matmul at
the model's MLP shape in fp32 and bf16, so the cost can be traced to the kernels.

A CPU with AVX-512 BF16 or AMX runs bf16 matmuls natively; one without converts every operand, and a bf16
body is then slower than fp32. This is what decides which precision a CPU run's rollout engine uses.

    python bench/bf16_cost.py
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
import yaml

from ringzero.model.config import ModelConfig, PrecisionPolicy
from ringzero.model.hybrid import HybridLM
from ringzero.model.scoring import score_sequences
from ringzero.rollout.engine.embedded import EmbeddedEngine
from ringzero.rollout.types import GenerateRequest, SamplingParams

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "tiny-cpu.yaml"
POLICIES = ("fp32", "fp32-islands", "bf16")


def cpu_flags() -> str:
    try:
        flags = next(
            line.split(":", 1)[1].split() for line in open("/proc/cpuinfo") if line.startswith("flags")
        )
    except (OSError, StopIteration):
        return "unknown"
    wanted = [f for f in flags if f in ("avx512_bf16", "amx_bf16", "amx_tile", "avx512f", "avx2")]
    return " ".join(wanted) or "none of avx2/avx512f/avx512_bf16/amx"


def matmul_us(rows: int, width: int, inner: int, dtype: torch.dtype, repeats: int = 50) -> float:
    a, b = torch.randn(rows, width, dtype=dtype), torch.randn(width, inner, dtype=dtype)
    for _ in range(5):
        a @ b
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    return (time.perf_counter() - start) / repeats * 1e6


def train_step_s(model: HybridLM, seqs: list[list[int]]) -> float:
    """One forward + backward of a next-token loss over the batch (the trainer's dominant cost)."""
    ids = torch.tensor(seqs)
    model.train()
    start = time.perf_counter()
    logits = model(ids[:, :-1]).float()
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten()).backward()
    elapsed = time.perf_counter() - start
    model.zero_grad(set_to_none=True)
    model.eval()
    return elapsed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=48)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    torch.manual_seed(0)
    cfg = ModelConfig(**yaml.safe_load(CONFIG.read_text())["model"])
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads (the machine's default), capability "
        f"{torch.backends.cpu.get_cpu_capability()}, cpu flags: {cpu_flags()}"
    )
    fp32_us = matmul_us(args.batch, cfg.hidden_size, cfg.intermediate_size, torch.float32)
    bf16_us = matmul_us(args.batch, cfg.hidden_size, cfg.intermediate_size, torch.bfloat16)
    print(
        f"  matmul {args.batch}x{cfg.hidden_size} @ {cfg.hidden_size}x{cfg.intermediate_size}: fp32 "
        f"{fp32_us:.1f} us, bf16 {bf16_us:.1f} us ({bf16_us / fp32_us:.1f}x)"
    )
    weights = HybridLM(cfg, PrecisionPolicy.preset("fp32")).state_dict()
    gen = torch.Generator().manual_seed(1)
    reqs = [
        GenerateRequest(
            torch.randint(3, cfg.vocab_size, (args.prompt_len,), generator=gen).tolist(),
            SamplingParams(max_new_tokens=args.new_tokens, seed=i, ignore_eos=True),
        )
        for i in range(args.batch)
    ]
    models, engines = {}, {}
    for name in POLICIES:
        policy = PrecisionPolicy.preset(name)
        models[name] = HybridLM(cfg, policy).eval()
        models[name].load_state_dict(weights)
        engines[name] = EmbeddedEngine(models[name], policy=policy, max_batch=args.batch)
    times: dict[str, list[float]] = {name: [] for name in POLICIES}
    done = {}
    for _ in range(args.repeats):
        for name, engine in engines.items():
            start = time.perf_counter()
            done[name] = [c for g in engine.generate(reqs) for c in g]
            times[name].append(time.perf_counter() - start)
    print(
        f"  tiny-cpu model (hidden {cfg.hidden_size}, {cfg.num_hidden_layers} layers), batch {args.batch} x "
        f"{args.new_tokens} new tokens, prompts of {args.prompt_len}, median of {args.repeats}"
    )
    tokens = args.batch * args.new_tokens
    base = statistics.median(times["fp32"])
    seqs = [c.prompt_ids + c.output_ids for c in done["fp32"]]  # every policy scores the same sequences
    for name in POLICIES:
        t = statistics.median(times[name])
        with torch.no_grad():
            start = time.perf_counter()
            score_sequences(models[name], seqs, [args.prompt_len] * len(seqs), 1.0)
            score_s = time.perf_counter() - start
        train_s = statistics.median(train_step_s(models[name], seqs) for _ in range(args.repeats))
        print(
            f"  {name:>13}: decode {tokens / t:8.1f} tokens/s ({t / base:4.1f}x fp32's time), "
            f"trainer scoring {score_s:.3f} s, forward + backward {train_s:.3f} s"
        )


if __name__ == "__main__":
    main()
