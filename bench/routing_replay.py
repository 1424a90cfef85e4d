"""The MoE train/rollout gap with and without routing replay, on a tiny MoE model of the tiny config's size.

The rollout engine samples under its precision policy (bf16 body, or fp32 islands) and reports each
token's experts; the trainer rescores the same tokens in fp32, once routing on its own and once replaying
the engine's experts (``loss.routing_replay``). Reported per rollout policy: the share of (token, MoE
layer) pairs whose expert set differs between the engines, and the tail of the token ratio
``r = p_train / p_rollout`` (p99 and max of ``|r - 1|``) over every sampled token.

    python bench/routing_replay.py                 # about a minute on two cores
    python bench/routing_replay.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from ringzero.config.stages import LossSettings
from ringzero.model.config import ModelConfig, PrecisionPolicy
from ringzero.model.decode_check import random_weights_
from ringzero.model.hybrid import HybridLM
from ringzero.model.routing import capture_routing
from ringzero.rl.rollout_batch import RolloutBatch, pad_rows
from ringzero.rl.trainer import PolicyTrainer
from ringzero.rollout.engine.embedded import EmbeddedEngine
from ringzero.rollout.types import GenerateRequest, SamplingParams

MODEL = dict(
    vocab_size=64,
    hidden_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    layer_group_size=2,
    head_dim=32,
    qk_rope_head_dim=16,
    qk_nope_head_dim=32,
    v_head_dim=32,
    kv_lora_rank=32,
    intermediate_size=352,
    max_position_embeddings=256,
    num_experts=8,
    num_experts_per_tok=2,
    n_group=4,
    topk_group=2,
    moe_intermediate_size=96,
    first_k_dense_replace=1,
)


def sample(model_fp32: HybridLM, rollout: str, prompts: int, samples: int, new_tokens: int, seed: int):
    engine = EmbeddedEngine(model_fp32, policy=PrecisionPolicy.preset(rollout), max_batch=256, seed=seed)
    g = torch.Generator().manual_seed(seed)
    reqs = [
        GenerateRequest(
            torch.randint(3, 64, (24,), generator=g).tolist(),
            SamplingParams(max_new_tokens=new_tokens, temperature=1.0, n=samples, seed=seed + i),
            return_routed_experts=True,
        )
        for i in range(prompts)
    ]
    return [c for group in engine.generate(reqs) for c in group]


def batch_of(completions) -> tuple[RolloutBatch, int]:
    T = max(len(c.output_ids) for c in completions)
    n = len(completions)
    return RolloutBatch(
        problems=[None] * n,
        prompt_ids=[c.prompt_ids for c in completions],
        output_ids=[c.output_ids for c in completions],
        responses=[""] * n,
        logp_rollout_NT=pad_rows([c.output_logprobs for c in completions], T, torch.float64),
        mask_NT=pad_rows([[True] * len(c.output_ids) for c in completions], T, torch.bool),
        rewards_N=torch.zeros(n),
        correct=[False] * n,
        truncated=[False] * n,
        uses_trace=[False] * n,
        group_size=1,
        routed_experts=[c.routed_experts for c in completions],
    ), T


def routing_mismatch(model: HybridLM, completions) -> float:
    """Share of (fed token, MoE layer) pairs whose expert set differs between the engine and the trainer."""
    differ = total = 0
    for c in completions:
        seq = c.prompt_ids + c.output_ids
        with torch.no_grad(), capture_routing(model) as own:
            model(torch.tensor([seq[:-1]]))
        for layer, ids in own.items():
            mine = ids[0].sort(-1).values
            theirs = c.routed_experts[:, layer].long().sort(-1).values
            differ += int((mine != theirs).any(-1).sum())
            total += mine.shape[0]
    return differ / max(total, 1)


def ratio_tail(model: HybridLM, batch: RolloutBatch, T: int, replay: bool) -> dict[str, float]:
    trainer = PolicyTrainer(
        model,
        None,
        LossSettings(routing_replay=replay),
        minibatches=1,
        max_new_tokens=T,
        temperature=1.0,
        micro_batch=16,
    )
    with torch.no_grad():
        logp = trainer.score(model, batch, list(range(len(batch))), T)[0].double()
    dev = (logp - batch.logp_rollout_NT).exp().sub(1).abs()[batch.mask_NT]
    return {
        "p99": float(torch.quantile(dev, 0.99)),
        "max": float(dev.max()),
        "mean": float(dev.mean()),
        "tokens": int(dev.numel()),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--new-tokens", type=int, default=48)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rollout", nargs="+", default=["bf16", "fp32-islands"])
    p.add_argument("--json", default=None)
    args = p.parse_args()
    torch.set_num_threads(2)
    model = random_weights_(
        HybridLM(ModelConfig.model_validate(MODEL), PrecisionPolicy.preset("fp32")),
        torch.Generator().manual_seed(args.seed),
    )
    rows = []
    for rollout in args.rollout:
        started = time.time()
        completions = sample(model, rollout, args.prompts, args.samples, args.new_tokens, args.seed)
        batch, T = batch_of(completions)
        row = {
            "rollout": rollout,
            "routing_mismatch": routing_mismatch(model, completions),
            "without_replay": ratio_tail(model, batch, T, False),
            "with_replay": ratio_tail(model, batch, T, True),
            "seconds": round(time.time() - started, 1),
        }
        rows.append(row)
        print(
            f"rollout {rollout:>13}: experts differ on {100 * row['routing_mismatch']:.2f}% of (token, "
            "layer); "
            f"|r-1| p99 {row['without_replay']['p99']:.4f} -> {row['with_replay']['p99']:.4f}, "
            f"max {row['without_replay']['max']:.4f} -> {row['with_replay']['max']:.4f} "
            f"({row['with_replay']['tokens']} tokens, {row['seconds']} s)"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": MODEL, "args": vars(args), "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
