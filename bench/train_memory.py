"""Peak CPU memory of one training step (forward, backward, AdamW) under ``fp32-islands`` vs all-``bf16``.

Two measurements, each in a fresh subprocess per policy so no allocator state carries over:

- ``tensors``: torch's profiler with ``profile_memory`` records every tensor allocation and free of the
  step; the peak of the live total over its memory timeline is the step's peak tensor memory (weights,
  gradients, AdamW state, activations kept for backward, temporaries). Python's ``tracemalloc`` cannot
  see these: torch allocates outside Python's allocator.
- ``rss``: the process's resident high-water mark (``VmHWM``, reset through ``/proc/self/clear_refs``
  just before the step) minus the resident size before it. glibc is told to serve every block above
  64 KiB by ``mmap`` (``MALLOC_MMAP_THRESHOLD_``), so freed tensors leave the resident set at once and
  the high-water mark follows live memory. It counts what the profiler does not (allocator slack,
  oneDNN scratch buffers) and misses the weights, which exist before the step.

The step is the first one: AdamW allocates its two moment buffers inside it, as a trainer's first step
does. The loss is the mean negative ``token_logprobs`` (the project's log-prob function, fp32 in both
policies), so the policies differ only where the islands are: the attention softmax and the LM head.

    python bench/train_memory.py --md docs/bench/rollout.md
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from common import write_section

POLICIES = ("fp32-islands", "bf16", "fp32")
TINY = dict(
    vocab_size=64,
    hidden_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    intermediate_size=352,
    max_position_embeddings=512,
    kv_lora_rank=32,
    qk_nope_head_dim=32,
    qk_rope_head_dim=16,
    v_head_dim=32,
    head_dim=32,
    lightning_block_size=64,
)
"""The model of configs/tiny-cpu.yaml (hybrid: three Lightning layers, then one MLA layer)."""


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def worker(policy_name: str, method: str, batch: int, seq_len: int) -> dict:
    import gc

    import torch

    from ringzero.model.config import ModelConfig, PrecisionPolicy
    from ringzero.model.hybrid import HybridLM
    from ringzero.model.logprobs import token_logprobs

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = HybridLM(ModelConfig.model_validate(TINY), PrecisionPolicy.preset(policy_name))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 64, (batch, seq_len + 1))
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())

    def step():
        logp = token_logprobs(model(ids[:, :-1]), ids[:, 1:])
        loss = -logp.mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    gc.collect()
    out = {"policy": policy_name, "method": method, "param_bytes": param_bytes}
    if method == "rss":
        before = _status_kib("VmRSS")
        Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current resident size
        step()
        out["peak_bytes"] = (_status_kib("VmHWM") - before) * 1024
    else:
        from torch.profiler import ProfilerActivity, profile
        from torch.profiler._memory_profiler import MemoryProfileTimeline

        with profile(
            activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True
        ) as prof:
            step()
        _, sizes = MemoryProfileTimeline(prof._memory_profile())._coalesce_timeline(torch.device("cpu"))
        out["peak_bytes"] = int(max(sum(s) for s in sizes))
    return out


def measure(policy: str, method: str, batch: int, seq_len: int) -> dict:
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        __file__,
        "--worker",
        policy,
        "--method",
        method,
        "--batch",
        str(batch),
        "--seq-len",
        str(seq_len),
    ]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=160)
    p.add_argument(
        "--repeats", type=int, default=3, help="subprocesses per (policy, method); the median is kept"
    )
    p.add_argument("--worker", choices=POLICIES, help=argparse.SUPPRESS)
    p.add_argument("--method", choices=["tensors", "rss"], default="tensors", help=argparse.SUPPRESS)
    p.add_argument("--md", type=Path, help="write the results as a markdown section into this file")
    args = p.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.method, args.batch, args.seq_len)))
        return

    mib = 1 / 2**20
    peaks: dict[tuple[str, str], float] = {}
    params = {}
    for policy in POLICIES:
        for method in ("tensors", "rss"):
            results = [measure(policy, method, args.batch, args.seq_len) for _ in range(args.repeats)]
            runs = sorted(r["peak_bytes"] for r in results)
            peaks[(policy, method)] = runs[len(runs) // 2]
            params[policy] = results[0]["param_bytes"]
            print(policy, method, [round(r * mib, 2) for r in runs], flush=True)
    rows = []
    for policy in POLICIES:
        over = {m: peaks[(policy, m)] / peaks[("bf16", m)] - 1 for m in ("tensors", "rss")}
        rows.append(
            f"| {policy} | {params[policy] * mib:.2f} | {peaks[(policy, 'tensors')] * mib:.2f} | "
            f"{over['tensors']:+.1%} | {peaks[(policy, 'rss')] * mib:.2f} | {over['rss']:+.1%} |"
        )
    cmd = (
        f"python bench/train_memory.py --batch {args.batch} --seq-len {args.seq_len} --repeats {args.repeats}"
    )
    body = "\n".join(
        [
            "## Peak memory of one training step: fp32-islands vs bf16",
            "",
            f"`{cmd}`",
            "",
            f"Tiny model (hidden_size 128, 4 layers: 3 Lightning + 1 MLA, vocab 64), batch {args.batch} x "
            f"{args.seq_len} "
            f"tokens, forward + backward + first AdamW step, one thread, median of {args.repeats} fresh "
            "processes. "
            "`tensors`: peak live tensor bytes on torch's profiler memory timeline (weights, grads, AdamW "
            "state, "
            "saved activations, temporaries). `rss`: resident high-water mark during the step minus the "
            "resident "
            "size before it (every block > 64 KiB mmapped so frees return memory at once); it excludes the "
            "weights.",
            "",
            "| policy | weights MiB | peak tensors MiB | vs bf16 | peak RSS growth MiB | vs bf16 |",
            "|---|---|---|---|---|---|",
            *rows,
        ]
    )
    print(body)
    if args.md:
        write_section(args.md, "train-memory", body)


if __name__ == "__main__":
    main()
