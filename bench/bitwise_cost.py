"""What the bitwise deterministic mode costs: embedded-engine tokens/s in normal vs deterministic mode.

The model is configs/tiny-cpu.yaml's (random weights, fp32, its 512-token context). One batch of
``--batch`` prompts of ``--prompt-len`` tokens decodes ``--new-tokens`` tokens each (no stop ids, so every
row runs to its cap), T = 1, seeded; throughput is generated tokens per wall-clock second, the median of
``--repeats`` runs, modes interleaved. Normal mode decodes all rows together from caches; deterministic mode
runs, per row and token, one batch-invariant forward over the whole context
(``ringzero.rollout.engine.bitwise``).

Also printed: the trainer side's scoring time of the same finished sequences, batched (``batch_invariant``
off) vs batch-invariant (what a deterministic run's trainer calls), and the largest |logp_train -
logp_rollout| of the deterministic run under the batch-invariant scoring (0.0 when the mode holds).

    python bench/bitwise_cost.py
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = ModelConfig(**yaml.safe_load(CONFIG.read_text())["model"])
    fp32 = PrecisionPolicy.preset("fp32")
    model = HybridLM(cfg, fp32).eval()
    gen = torch.Generator().manual_seed(1)
    reqs = [
        GenerateRequest(
            torch.randint(3, cfg.vocab_size, (args.prompt_len,), generator=gen).tolist(),
            SamplingParams(max_new_tokens=args.new_tokens, seed=i, ignore_eos=True),
        )
        for i in range(args.batch)
    ]
    engines = {
        mode: EmbeddedEngine(model, policy=fp32, deterministic=mode == "deterministic", max_batch=args.batch)
        for mode in ("normal", "deterministic")
    }
    times: dict[str, list[float]] = {mode: [] for mode in engines}
    outputs = {}
    for _ in range(args.repeats):
        for mode, engine in engines.items():
            start = time.perf_counter()
            outputs[mode] = [c for g in engine.generate(reqs) for c in g]
            times[mode].append(time.perf_counter() - start)
    tokens = args.batch * args.new_tokens
    rate = {mode: tokens / statistics.median(ts) for mode, ts in times.items()}
    print(
        f"tiny-cpu model (hidden {cfg.hidden_size}, {cfg.num_hidden_layers} layers, context "
        f"{cfg.max_position_embeddings}), fp32, {args.threads} threads, batch {args.batch} x "
        f"{args.new_tokens} new tokens, prompts of {args.prompt_len}, median of {args.repeats}"
    )
    for mode, r in rate.items():
        print(f"  {mode:>13}: {r:9.1f} tokens/s  ({statistics.median(times[mode]):.3f} s a batch)")
    print(f"  normal / deterministic: {rate['normal'] / rate['deterministic']:.1f}x")

    done = outputs["deterministic"]
    seqs, plens = [c.prompt_ids + c.output_ids for c in done], [len(c.prompt_ids) for c in done]
    score_time = {}
    with torch.no_grad():
        for invariant in (False, True):
            start = time.perf_counter()
            logp = score_sequences(model, seqs, plens, 1.0, batch_invariant=invariant)
            score_time[invariant] = time.perf_counter() - start
    gap = max(
        float((t.double() - torch.tensor(c.output_logprobs, dtype=torch.float64)).abs().max())
        for t, c in zip(logp, done, strict=True)
    )
    print(
        f"  trainer scoring of the batch: batched {score_time[False]:.3f} s, batch-invariant "
        f"{score_time[True]:.3f} s; deterministic max |logp_train - logp_rollout| = {gap}"
    )


if __name__ == "__main__":
    main()
