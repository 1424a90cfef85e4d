"""The megatron engine on the device: parity with the torch engine and training speed on the same model
(results in $OUT/megatron_check.json).

1. Parity: identical fp32 weights in ``HybridLM`` and ``MegatronLM`` (TP 1: one device), per-token
   log-probs and every parameter's gradient, max abs / rel difference; then the same under the
   ``fp32-islands`` policy (bf16 body), log-probs only.
2. Speed: a few RL steps of one micro stage (the RL session the runner builds) per engine, same model,
   prompts and lengths: seconds per step and trained tokens per second, fp32-islands.
TP 2 needs two devices (one NCCL rank per GPU); with one it is reported as not run, with the reason.

    python bench/gpu/megatron_check.py            # on the GPU machine
    python bench/gpu/megatron_check.py --smoke    # on the CPU, tiny sizes: everything imports and runs
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from ringzero.config.loader import parse_config
from ringzero.metrics import MemoryMetricWriter
from ringzero.model.config import ModelConfig, PrecisionPolicy
from ringzero.model.hybrid import HybridLM
from ringzero.model.logprobs import token_logprobs
from ringzero.parallel.dims import ParallelDims
from ringzero.parallel.runtime import Runtime
from ringzero.stages.base import StageContext, StageInputs
from ringzero.stages.rl_session import build_session
from ringzero.store import open_store

MODEL = dict(
    vocab_size=64,
    hidden_size=512,
    num_hidden_layers=8,
    num_attention_heads=8,
    layer_group_size=4,
    head_dim=64,
    qk_rope_head_dim=32,
    qk_nope_head_dim=64,
    v_head_dim=64,
    kv_lora_rank=128,
    q_lora_rank=192,
    intermediate_size=1408,
    group_norm_size=4,
    lightning_block_size=64,
    max_position_embeddings=1024,
)
SMOKE = dict(
    MODEL,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    layer_group_size=2,
    head_dim=8,
    qk_rope_head_dim=4,
    qk_nope_head_dim=8,
    v_head_dim=8,
    kv_lora_rank=8,
    q_lora_rank=None,
    intermediate_size=48,
    group_norm_size=2,
    lightning_block_size=8,
    max_position_embeddings=128,
)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--steps", type=int, default=4)
    return p.parse_known_args(argv)[0]


def join_one_rank() -> None:
    if not dist.is_initialized():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    from ringzero.engines.megatron import cpu_shim

    cpu_shim.apply()
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=1)
    model_parallel_cuda_manual_seed(0)


def parity(cfg: ModelConfig, device: torch.device, preset: str) -> dict:
    from ringzero.engines.megatron.convert import hybrid_grads, load_hybrid_state_
    from ringzero.engines.megatron.model import MegatronLM

    policy = PrecisionPolicy.preset(preset)
    ref = HybridLM(cfg, policy)
    ref.reset_parameters(torch.Generator().manual_seed(0))
    ref = ref.to(device)
    mlm = MegatronLM(cfg, policy, device).to(device)  # shards allocated on the GPU, as the engine does
    load_hybrid_state_(mlm, ref.state_dict())
    ids = torch.randint(
        0,
        cfg.vocab_size,
        (4, min(256, cfg.max_position_embeddings)),
        device=device,
        generator=torch.Generator(device=device).manual_seed(1),
    )
    out = {}
    for name, model in (("torch", ref), ("megatron", mlm)):
        lp = token_logprobs(model(ids)[:, :-1].float(), ids[:, 1:])
        lp.sum().backward()
        out[name] = lp.detach()
    diff = (out["megatron"] - out["torch"]).abs()
    report = {
        "policy": preset,
        "logprob_max_abs": float(diff.max()),
        "logprob_max_rel": float(diff.max() / out["torch"].abs().max()),
    }
    if preset == "fp32":
        grads = hybrid_grads(mlm)
        worst = max(
            (
                (n, float((grads[n] - p.grad).abs().max() / p.grad.abs().max().clamp(min=1e-30)))
                for n, p in ref.named_parameters()
            ),
            key=lambda t: t[1],
        )
        report["grad_worst_rel"] = {"param": worst[0], "rel": worst[1]}
    return report


def speed(model: dict, device: torch.device, kind: str, steps: int, smoke: bool) -> dict:
    cfg = parse_config(
        {
            "run": {"name": "megatron-check", "seed": 0, "device": device.type},
            "model": model,
            "precision": {"train": "fp32-islands", "rollout": "fp32-islands"},
            "engines": {"training": {"kind": kind}},
            "task": {
                "kind": "arithmetic",
                "operation": "digitsum",
                "digits": 3 if smoke else 8,
                "eval_prompts": 4,
            },
            "stages": [
                {
                    "name": "rl",
                    "kind": "rl",
                    "steps": steps,
                    "prompts_per_step": 2 if smoke else 16,
                    "samples_per_prompt": 4 if smoke else 8,
                    "minibatches": 2,
                    "micro_batch": 4 if smoke else 32,
                    "sampling": {"max_new_tokens": 8 if smoke else 128},
                    "optim": {"lr": 1e-4, "warmup_steps": 0},
                    "loss": {"kind": "sg_clip_is", "kl_coef": 0.0},
                }
            ],
        },
        "megatron-check",
    )
    rt = Runtime(device=device, dims=ParallelDims(dp=1, cp=1, world_size=1))
    with tempfile.TemporaryDirectory() as root:
        ctx = StageContext(
            cfg=cfg,
            store=open_store(f"file://{root}/store"),
            stage_hash="m" * 16,
            stage_dir=root,
            metrics=MemoryMetricWriter(),
            runtime=rt,
        )
        session = build_session(ctx, cfg.stages[0], StageInputs())
        times, tokens = [], []
        for step in range(steps):
            if device.type == "cuda":
                torch.cuda.synchronize()
            started = time.time()
            metrics = session.stepper.run(step)
            if device.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.time() - started)
            tokens.append(float(session.stepper.last_batch.mask_NT.sum()))
    later = times[1:] or times  # the first step pays for warm-up
    return {
        "engine": kind,
        "seconds_per_step": sum(later) / len(later),
        "response_tokens_per_s": sum(tokens[1:] or tokens) / sum(later),
        "last_loss": metrics.get("loss/total"),
    }


def main() -> None:
    args = parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    out_dir = Path(os.environ.get("OUT", "bench-gpu-out"))
    out_dir.mkdir(parents=True, exist_ok=True)
    model = SMOKE if args.smoke else MODEL
    join_one_rank()
    result = {
        "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
        "parity_tp1": [
            parity(ModelConfig.model_validate(model), device, p) for p in ("fp32", "fp32-islands")
        ],
        "speed": [
            speed(model, device, k, 2 if args.smoke else args.steps, args.smoke)
            for k in ("torch", "megatron")
        ],
    }
    gpus = torch.cuda.device_count() if device.type == "cuda" else 0
    result["tp2"] = (
        "not run: one device here; TP 2 needs two (one NCCL rank per GPU): "
        "torchrun --nproc-per-node 2 -m ringzero.cli.main run configs/micro-megatron.yaml "
        "--set engines.training.tp=2"
        if gpus < 2
        else "run it with the torchrun line above"
    )
    (out_dir / "megatron_check.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
