"""Peak memory per rank of one context-parallel training step (forward + backward) on one long sequence.

The model is configs/tiny-cpu.yaml's (hidden_size 128, 4 layers alternating Lightning and MLA, 4 heads,
vocab 64) with ``max_position_embeddings`` raised to the sequence, fp32. One sequence of ``--seq-len`` tokens
is sharded contiguously over ``cp`` gloo ranks (``SeqLayout``); each rank runs the parallelized ``HybridLM``
with the default plan (MLA ``a2a``, Lightning ``allgather``): hidden states, the chunked log-prob of each next
token (``chunked_token_logprobs``), the loss normalised by the global token count (``token_mean``), backward
and the CP gradient sum (``sync_grads``), as ``ringzero.stages.cp_equivalence`` builds a CP step. Every CP
degree runs once per MLA attention implementation of ``--impls`` (``model.mla_attention_impl``: ``explicit``,
``sdpa``): ``cp = 1`` is the unparallelized model with that ``MLACore``, ``cp > 1`` the ``a2a`` core, which
attends with the layer's implementation.

What is measured, on every rank, in a fresh pool of processes per configuration:

- ``rss``: the resident high-water mark during the step (``VmHWM``, reset through
  ``/proc/self/clear_refs`` just before it) minus the resident size before it. Weights exist before the
  step, so they are not in it; the gradients (one copy of the weights) are, and everything else is
  activations kept for backward, temporaries and communication buffers. glibc serves every block above
  64 KiB by ``mmap`` (``MALLOC_MMAP_THRESHOLD_``), so freed tensors leave the resident set at once.

torch's profiler memory timeline (what ``bench/train_memory.py`` reads) is not used here: its data-flow
pass rejects the graphs of the CP cores' custom autograd functions with collectives.

``activation`` = RSS growth minus the gradient bytes. The table compares each CP degree's largest
per-rank activation figure with ``1/cp`` of the ``cp = 1`` one of each implementation.

    python bench/cp_memory.py --seq-len 8192 --cps 1 2 4 --impls explicit sdpa --md docs/bench/memory.md
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import time
from pathlib import Path

from common import write_section

MODEL = dict(
    vocab_size=64,
    hidden_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    layout="hybrid",
    layer_group_size=2,
    intermediate_size=352,
    kv_lora_rank=32,
    qk_nope_head_dim=32,
    qk_rope_head_dim=16,
    v_head_dim=32,
    head_dim=32,
    lightning_block_size=64,
)
"""The model of configs/tiny-cpu.yaml (layers 0, 2 Lightning; 1, 3 MLA)."""

MIB = 2**20


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def rank_step(ctx, cp: int, seq_len: int, impl: str) -> dict:
    """One rank: build the model and its shard, run one step, report its memory."""
    import torch

    from ringzero.model.config import ModelConfig, PrecisionPolicy
    from ringzero.model.hybrid import HybridLM
    from ringzero.model.logprobs import chunked_token_logprobs
    from ringzero.parallel.dims import ParallelDims
    from ringzero.parallel.grads import sync_grads, token_mean
    from ringzero.parallel.parallelize import parallelize
    from ringzero.parallel.sharding import SeqLayout

    groups = ctx.groups(ParallelDims(dp=1, cp=cp, world_size=cp))
    torch.manual_seed(0)
    cfg = ModelConfig.model_validate(
        {**MODEL, "max_position_embeddings": seq_len, "mla_attention_impl": impl}
    )
    model = HybridLM(cfg, PrecisionPolicy.preset("fp32"))
    parallelize(model, groups)  # default plan; cp == 1 leaves the model as it is
    layout = SeqLayout(seq_len, cp, "contiguous")
    me = groups.cp_rank
    ids = torch.randint(0, cfg.vocab_size, (1, seq_len + 1), generator=torch.Generator().manual_seed(1))
    inputs = layout.shard(ids[:, :-1], me)
    targets = layout.shard(ids[:, 1:], me)
    positions = layout.positions(me)
    real = (positions < seq_len)[None]
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())

    def step():
        hidden = model.hidden(inputs, positions)
        logp, _ = chunked_token_logprobs(model.logits, hidden, targets)
        token_mean(-logp, real, groups).backward()
        sync_grads(model.parameters(), groups)

    out = {"rank": me, "local_tokens": int(inputs.shape[1]), "param_bytes": param_bytes}
    gc.collect()
    torch.distributed.barrier(groups.cp)
    before = _status_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current resident size
    t0 = time.perf_counter()
    step()
    out["step_s"] = time.perf_counter() - t0
    out["rss_growth"] = (_status_kib("VmHWM") - before) * 1024
    torch.distributed.barrier(groups.cp)
    return out


def run_config(cp: int, seq_len: int, impl: str) -> list[dict]:
    from ringzero.parallel.launch import RankPool

    with RankPool(cp, timeout_s=900) as pool:
        return pool.run(rank_step, cp, seq_len, impl)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seq-len", type=int, default=8192)
    p.add_argument("--cps", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument(
        "--impls",
        nargs="+",
        choices=["explicit", "sdpa"],
        default=["explicit", "sdpa"],
        help="MLA attention implementations (model.mla_attention_impl) to run at every CP degree",
    )
    p.add_argument("--md", type=Path, help="write the results as a markdown section into this file")
    args = p.parse_args()
    # Before the first pool starts its forkserver, so every rank inherits it.
    os.environ["MALLOC_MMAP_THRESHOLD_"] = "65536"
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    configs = [(cp, impl) for impl in args.impls for cp in args.cps]
    results = {}
    t_start = time.perf_counter()
    for cp, impl in configs:
        t0 = time.perf_counter()
        per_rank = run_config(cp, args.seq_len, impl)
        results[(cp, impl)] = per_rank
        print(
            f"cp={cp} {impl}: "
            + ", ".join(
                f"rank {r['rank']} rss +{r['rss_growth'] / MIB:.1f} MiB ({r['step_s']:.1f} s)"
                for r in per_rank
            )
            + f" [{time.perf_counter() - t0:.0f} s]",
            flush=True,
        )
    total_s = time.perf_counter() - t_start

    def activation(r: dict) -> int:
        return r["rss_growth"] - r["param_bytes"]  # gradients: one copy of the (fp32) weights

    base = {
        impl: max(activation(r) for r in results[(1, impl)])
        for impl in ("explicit", "sdpa")
        if (1, impl) in results
    }
    header = (
        "| cp | MLA attention impl / core | tokens per rank | weights MiB | peak RSS growth MiB (max rank) | "
        "activation MiB (max rank) | activation per rank, each rank | vs 1/cp of cp=1 explicit | vs 1/cp of "
        "cp=1 sdpa |"
    )
    rows = [header, "|" + "---|" * (header.count("|") - 1)]
    for (cp, impl), per_rank in results.items():
        acts = [activation(r) for r in per_rank]
        worst = max(acts)
        core = impl if cp == 1 else f"a2a ({impl}) + allgather"

        def ratio(name: str, worst: int = worst, cp: int = cp) -> str:
            return f"{worst / (base[name] / cp):.2f}x" if name in base and cp > 1 else "-"

        row = (
            f"| {cp} | {core} | {per_rank[0]['local_tokens']} | {per_rank[0]['param_bytes'] / MIB:.2f} | "
            f"{max(r['rss_growth'] for r in per_rank) / MIB:.1f} | {worst / MIB:.1f} | "
            f"{' / '.join(f'{a / MIB:.0f}' for a in acts)} | {ratio('explicit')} | {ratio('sdpa')} |"
        )
        rows.append(row)
    cmd = (
        f"python bench/cp_memory.py --seq-len {args.seq_len} --cps {' '.join(map(str, args.cps))} "
        f"--impls {' '.join(args.impls)} --md docs/bench/memory.md"
    )
    import torch

    body = "\n".join(
        [
            "## Peak memory per rank under context parallelism (`bench/cp_memory.py`)",
            "",
            f"`{cmd}` (torch {torch.__version__}, {platform.machine()}, {os.cpu_count()} cores shared by the "
            "ranks, "
            f"one thread per rank; the whole run took {total_s:.0f} s)",
            "",
            f"One sequence of {args.seq_len} tokens, batch 1, the tiny-cpu model (hidden_size 128, layers L "
            "M L M, "
            "4 heads, vocab 64) in fp32, forward + chunked log-probs + backward + CP gradient sum. Peak RSS "
            "growth: resident high-water mark during the step minus the resident size before it (weights "
            "excluded, gradients included); activation = growth minus one copy of the weights (the "
            "gradients).",
            "",
            *rows,
        ]
    )
    print(body)
    if args.md:
        write_section(args.md, "cp-memory", body, title="# Memory at real sizes")


if __name__ == "__main__":
    main()
