"""GPU checks of the train/rollout gap machinery that CPU tests cannot show (results in $OUT/gap_checks.json).

1. Percentiles on the device path: ``tail_metrics.quantiles`` of 2^25 CUDA values (one sort there)
   against numpy's ``np.quantile`` of the same values on the host.
2. The bitwise deterministic mode on CUDA: a tiny MoE model decodes deterministically under fp32 and bf16;
   every reported log-prob is compared bit for bit with the trainer's batch-invariant scoring.

    python bench/gpu/gap_checks.py            # on the GPU machine
    python bench/gpu/gap_checks.py --smoke    # on the CPU, tiny sizes: everything imports and runs
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import torch

from ringzero.model.config import ModelConfig, PrecisionPolicy
from ringzero.model.decode_check import random_weights_
from ringzero.model.hybrid import HybridLM
from ringzero.model.scoring import score_sequences
from ringzero.model.weights import copy_under_policy
from ringzero.rl.tail_metrics import QUANTILES, quantiles
from ringzero.rollout.engine.embedded import EmbeddedEngine
from ringzero.rollout.types import GenerateRequest, SamplingParams

MOE = dict(
    vocab_size=64,
    hidden_size=64,
    num_hidden_layers=4,
    num_attention_heads=2,
    layer_group_size=2,
    head_dim=16,
    qk_rope_head_dim=8,
    qk_nope_head_dim=16,
    v_head_dim=16,
    kv_lora_rank=16,
    intermediate_size=96,
    group_norm_size=2,
    num_experts=4,
    n_group=2,
    topk_group=1,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    first_k_dense_replace=1,
    max_position_embeddings=128,
)


def percentiles(device: torch.device, n: int) -> dict:
    values = torch.randn(n, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    want = np.quantile(values.numpy(), QUANTILES).tolist()
    started = time.time()
    got = quantiles(values.to(device), QUANTILES)
    return {
        "values": n,
        "max_abs_diff_vs_numpy": max(abs(a - b) for a, b in zip(got, want, strict=True)),
        "seconds": round(time.time() - started, 3),
    }


def bitwise(device: torch.device, preset: str, rows: int) -> dict:
    master = random_weights_(
        HybridLM(ModelConfig.model_validate(MOE), PrecisionPolicy.preset("fp32")),
        torch.Generator().manual_seed(0),
    ).to(device)
    policy = PrecisionPolicy.preset(preset)
    g = torch.Generator().manual_seed(1)
    reqs = [
        GenerateRequest(
            torch.randint(3, 64, (12,), generator=g).tolist(),
            SamplingParams(max_new_tokens=24, temperature=1.0, seed=i),
        )
        for i in range(rows)
    ]
    engine = EmbeddedEngine(master, policy=policy, deterministic=True, max_batch=rows, seed=0)
    started = time.time()
    completions = [c for group in engine.generate(reqs) for c in group]
    seconds = time.time() - started
    trainer = copy_under_policy(master, policy)
    unequal = 0
    for c in completions:
        (train,) = score_sequences(
            trainer, [c.prompt_ids + c.output_ids], [len(c.prompt_ids)], 1.0, batch_invariant=True
        )
        unequal += int(
            not torch.equal(train.detach().cpu(), torch.tensor(c.output_logprobs, dtype=train.dtype))
        )
    tokens = sum(len(c.output_ids) for c in completions)
    return {
        "preset": preset,
        "rows": len(completions),
        "tokens": tokens,
        "rows_not_bitwise": unequal,
        "tokens_per_s": round(tokens / seconds, 1),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true")
    args, _ = p.parse_known_args()
    device = torch.device("cpu" if args.smoke or not torch.cuda.is_available() else "cuda")
    out = {
        "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
        "percentiles": percentiles(device, 1 << (12 if args.smoke else 25)),
        "bitwise": [bitwise(device, preset, 2 if args.smoke else 8) for preset in ("fp32", "bf16")],
    }
    print(json.dumps(out, indent=2))
    target = Path(os.environ.get("OUT", "bench-gpu-out"))
    target.mkdir(parents=True, exist_ok=True)
    (target / "gap_checks.json").write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
