"""Context-parallel strategies side by side: wall time, recorded bytes and steps, and a critical-path model.

Three parts, all from real calls of the CP cores over local gloo ranks:

1. Forward+backward wall time of one attention core per layer type, ring vs a2a (MLA) and ring vs
   allgather (Lightning), at each CP degree and sequence length, measured in one run, interleaved.
2. Recorded bytes with Ling-like MLA dims (H=32, d_qk=192, d_v=128, r=512, d_r=64): a2a vs ring over
   materialised K/V at P = 4 and 8.
3. Recorded sequential steps and bytes per rank at CP = 8, 16, 32 (tiny sequences; steps do not depend
   on length, MLA bytes are linear in it, Lightning bytes constant), fed into a critical-path model
   ``steps * latency + path_bytes / bandwidth`` at a target sequence length, where path bytes are what
   one link carries along the chain of sequential steps (for LASP-1 the P-1 hops of one state each).

Usage: python bench/cp_bench.py [--seq-lens 2048 8192] [--lightning-only-seq-lens 32768] [--cps 2 4]
       [--iters 2] [--model-cps 4 8 16 32] [--json out.json]
Prints markdown tables. Letter legend as in ``ringzero.parallel``.
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import torch
import torch.distributed as dist

from ringzero.parallel.comm import CommLedger
from ringzero.parallel.dims import ParallelDims
from ringzero.parallel.launch import RankPool
from ringzero.parallel.sharding import SeqLayout
from ringzero.parallel.strategies import STRATEGIES

# Small enough that S^2 attention fits a 2-core machine at 8k tokens; wall time is then compute-bound.
TIMED_MLA = {"H": 4, "n": 32, "p": 16, "v": 32, "r": 128}
TIMED_LIGHTNING = {"H": 8, "k": 64, "v": 64, "block": 128}
# Ling-like dims for bytes and steps (MLA from Ling-2.6-flash; Lightning heads assumed 32 x 128).
LING_MLA = {"H": 32, "n": 128, "p": 64, "v": 128, "r": 512}
LING_LIGHTNING = {"H": 32, "k": 128, "v": 128, "block": 64}
PAIRS = {"mla": ("ring", "a2a"), "lightning": ("ring", "allgather")}
# Timed variants: (strategy, sharding). The zigzag ring is the reference at its causal load balance.
TIMED_VARIANTS = {
    "mla": [("ring", "contiguous"), ("ring", "zigzag"), ("a2a", "contiguous")],
    "lightning": [("ring", "contiguous"), ("allgather", "contiguous")],
}


def _inputs(layer: str, dims: dict, local_len: int, dtype, seed: int):
    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape, scale=0.3):
        return (torch.randn(shape, generator=gen) * scale).to(dtype).requires_grad_(True)

    if layer == "mla":
        d, S = dims, local_len
        return [
            rnd(1, S, d["H"], d["n"]),
            rnd(1, S, d["H"], d["p"]),
            rnd(1, S, d["r"]),
            rnd(1, S, d["p"]),
            rnd(d["H"], d["n"], d["r"], scale=d["r"] ** -0.5),
            rnd(d["H"], d["v"], d["r"], scale=d["r"] ** -0.5),
        ]
    d, S = dims, local_len
    return [rnd(1, S, d["H"], d["k"]), rnd(1, S, d["H"], d["k"]), rnd(1, S, d["H"], d["v"])]


def _call(layer, core, inputs, dims, positions, dtype):
    if layer == "mla":
        return core(*inputs, positions, (dims["n"] + dims["p"]) ** -0.5, True)
    log_decay = -torch.linspace(0.01, 0.3, dims["H"], dtype=torch.promote_types(dtype, torch.float32))
    return core(*inputs, log_decay, dims["block"])


def layer_job(
    ctx,
    layer: str,
    strategy: str,
    seq_len: int,
    dims: dict,
    iters: int,
    dtype: str = "float32",
    mode: str = "contiguous",
):
    """``iters`` timed forward+backward calls after one warm-up; returns (seconds per call, fwd, bwd)."""
    P = ctx.world_size
    groups = ctx.groups(ParallelDims(dp=1, cp=P, world_size=P))
    tdtype = getattr(torch, dtype)
    layout = SeqLayout(seq_len, P, mode)
    positions = layout.positions(groups.cp_rank)
    ledger = CommLedger()
    core = STRATEGIES[(layer, strategy)].build(groups.cp, ledger, mode)
    times = []
    for i in range(iters + 1):
        inputs = _inputs(layer, dims, layout.local_len, tdtype, seed=groups.cp_rank)
        dist.barrier(group=groups.cp)
        start = time.perf_counter()
        _call(layer, core, inputs, dims, positions, tdtype).float().sum().backward()
        dist.barrier(group=groups.cp)  # the call is done when the slowest rank is done
        if i:
            times.append(time.perf_counter() - start)
    rec = ledger.calls[-1]
    return min(times), rec.fwd.__dict__.copy(), rec.bwd.__dict__.copy()


def _fmt_bytes(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def timed_section(cps, seq_lens, iters, lightning_only=()) -> list[dict]:
    rows = []
    for cp in cps:
        with RankPool(cp) as pool:
            for seq_len in [*seq_lens, *lightning_only]:
                for layer, variants in TIMED_VARIANTS.items():
                    if layer == "mla" and seq_len in lightning_only and seq_len not in seq_lens:
                        continue
                    dims = TIMED_MLA if layer == "mla" else TIMED_LIGHTNING
                    for strategy, mode in variants:
                        per_rank = pool.run(layer_job, layer, strategy, seq_len, dims, iters, "float32", mode)
                        seconds = max(r[0] for r in per_rank)
                        sent = max(r[1]["bytes_sent"] + r[2]["bytes_sent"] for r in per_rank)
                        rows.append(
                            {
                                "cp": cp,
                                "seq_len": seq_len,
                                "layer": layer,
                                "strategy": strategy,
                                "sharding": mode,
                                "seconds": seconds,
                                "bytes_sent_max_rank": sent,
                                "steps_fwd": per_rank[0][1]["steps"],
                                "steps_bwd": per_rank[0][2]["steps"],
                            }
                        )
                        print(
                            f"# timed cp={cp} S={seq_len} {layer} {strategy} {mode}: {seconds:.3f} s",
                            flush=True,
                        )
    return rows


def recorded_section(cps, seq_len=None) -> list[dict]:
    """Steps and bytes per rank of one call with Ling-like dims, bf16 body, at each CP degree."""
    rows = []
    for cp in cps:
        with RankPool(cp) as pool:
            for layer, pair in PAIRS.items():
                dims = LING_MLA if layer == "mla" else LING_LIGHTNING
                for S in (2 * cp, 4 * cp):  # two lengths: MLA bytes grow with S, Lightning's must not
                    for strategy in pair:
                        per_rank = pool.run(layer_job, layer, strategy, S, dims, 1, "bfloat16")
                        fwd, bwd = per_rank[0][1], per_rank[0][2]
                        rows.append(
                            {
                                "cp": cp,
                                "seq_len": S,
                                "layer": layer,
                                "strategy": strategy,
                                "steps_fwd": fwd["steps"],
                                "steps_bwd": bwd["steps"],
                                "bytes_fwd": max(r[1]["bytes_sent"] for r in per_rank),
                                "bytes_bwd": max(r[2]["bytes_sent"] for r in per_rank),
                                "path_fwd": max(r[1]["path_bytes"] for r in per_rank),
                                "path_bwd": max(r[2]["path_bytes"] for r in per_rank),
                            }
                        )
        print(f"# recorded cp={cp}", flush=True)
    return rows


def bytes_at(row_short: dict, row_long: dict, key: str, seq_len: int) -> float:
    """Bytes at ``seq_len`` from two recorded lengths (exactly linear: every term is per token or fixed)."""
    s1, s2 = row_short["seq_len"], row_long["seq_len"]
    slope = (row_long[key] - row_short[key]) / (s2 - s1)
    return row_short[key] + slope * (seq_len - s1)


def model_rows(recorded, target_seq, latency_s, bandwidth_Bps) -> list[dict]:
    out = []
    by_key = {(r["cp"], r["layer"], r["strategy"], r["seq_len"]): r for r in recorded}
    for cp in sorted({r["cp"] for r in recorded}):
        for layer, pair in PAIRS.items():
            for strategy in pair:
                short, long = by_key[(cp, layer, strategy, 2 * cp)], by_key[(cp, layer, strategy, 4 * cp)]
                fwd_b = bytes_at(short, long, "bytes_fwd", target_seq)
                path_f = bytes_at(short, long, "path_fwd", target_seq)
                path_b = bytes_at(short, long, "path_bwd", target_seq)
                steps_f, steps_b = short["steps_fwd"], short["steps_bwd"]
                out.append(
                    {
                        "cp": cp,
                        "layer": layer,
                        "strategy": strategy,
                        "steps_fwd": steps_f,
                        "steps_bwd": steps_b,
                        "bytes_fwd": fwd_b,
                        "path_fwd": path_f,
                        "path_bwd": path_b,
                        "latency_fwd_s": steps_f * latency_s,
                        "transfer_fwd_s": path_f / bandwidth_Bps,
                        "comm_fwd_bwd_s": (steps_f + steps_b) * latency_s + (path_f + path_b) / bandwidth_Bps,
                    }
                )
    return out


def print_markdown(timed, recorded, modeled, args) -> None:
    if timed:
        print("\n### Forward+backward wall time per core call (gloo loopback, fp32)\n")
        print(
            "| CP | seq | layer | strategy | sharding | steps fwd/bwd | bytes sent (max rank) | time (s) "
            "| vs contiguous ring |"
        )
        print("|---:|---:|---|---|---|---:|---:|---:|---:|")
        ring = {
            (r["cp"], r["seq_len"], r["layer"]): r["seconds"]
            for r in timed
            if r["strategy"] == "ring" and r["sharding"] == "contiguous"
        }
        for r in timed:
            ratio = r["seconds"] / ring[(r["cp"], r["seq_len"], r["layer"])]
            print(
                f"| {r['cp']} | {r['seq_len']} | {r['layer']} | {r['strategy']} | {r['sharding']} "
                f"| {r['steps_fwd']}/{r['steps_bwd']} "
                f"| {_fmt_bytes(r['bytes_sent_max_rank'])} | {r['seconds']:.3f} | {ratio:.2f}x |"
            )
    rec = {(r["cp"], r["layer"], r["strategy"], r["seq_len"]): r for r in recorded}
    print("\n### Recorded MLA bytes, Ling-like dims (H=32, d_qk=192, d_v=128, r=512, d_r=64), bf16\n")
    print(
        "| CP | seq | a2a fwd bytes/rank | ring fwd bytes/rank | a2a/ring fwd | a2a/ring fwd+bwd | formula "
        "fwd |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    d = LING_MLA
    for cp in sorted({r["cp"] for r in recorded}):
        S = 4 * cp
        a, g = rec[(cp, "mla", "a2a", S)], rec[(cp, "mla", "ring", S)]
        formula = (d["r"] + d["p"]) / (d["H"] * (d["n"] + d["p"] + d["v"])) + 1 / cp
        print(
            f"| {cp} | {S} | {a['bytes_fwd']} | {g['bytes_fwd']} | {a['bytes_fwd'] / g['bytes_fwd']:.3f} | "
            f"{(a['bytes_fwd'] + a['bytes_bwd']) / (g['bytes_fwd'] + g['bytes_bwd']):.3f} | {formula:.3f} |"
        )
    print(
        f"\n### Critical-path model: {args.latency_us:g} us per message, {args.bandwidth_gbs:g} GB/s per "
        "link, "
        f"{args.target_seq} tokens, Ling-like dims, bf16\n"
    )
    print(
        "| CP | layer | strategy | steps fwd | steps bwd | depth vs ring (fwd) | bytes/rank fwd | path bytes "
        "fwd "
        "| fwd latency | fwd transfer | fwd+bwd comm |"
    )
    print("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    ring_steps = {(m["cp"], m["layer"]): m["steps_fwd"] for m in modeled if m["strategy"] == "ring"}
    for m in modeled:
        depth = ring_steps[(m["cp"], m["layer"])] / m["steps_fwd"]
        print(
            f"| {m['cp']} | {m['layer']} | {m['strategy']} | {m['steps_fwd']} | {m['steps_bwd']} | "
            f"{depth:.1f}x | "
            f"{_fmt_bytes(m['bytes_fwd'])} | {_fmt_bytes(m['path_fwd'])} | {m['latency_fwd_s'] * 1e6:.0f} us "
            "| "
            f"{m['transfer_fwd_s'] * 1e3:.3f} ms | {m['comm_fwd_bwd_s'] * 1e3:.3f} ms |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seq-lens", type=int, nargs="*", default=[2048, 8192])
    parser.add_argument(
        "--lightning-only-seq-lens",
        type=int,
        nargs="*",
        default=[],
        help="extra lengths for Lightning only (MLA's S^2 scores do not fit at 32k on a small host)",
    )
    parser.add_argument("--cps", type=int, nargs="*", default=[2, 4])
    parser.add_argument("--iters", type=int, default=2, help="timed calls per case (the minimum is reported)")
    parser.add_argument("--model-cps", type=int, nargs="*", default=[4, 8, 16, 32])
    parser.add_argument("--target-seq", type=int, default=131072, help="sequence length of the model")
    parser.add_argument("--latency-us", type=float, default=5.0)
    parser.add_argument("--bandwidth-gbs", type=float, default=50.0)
    parser.add_argument("--json", help="also write every row as JSON here")
    args = parser.parse_args()
    timed = (
        timed_section(args.cps, args.seq_lens, args.iters, args.lightning_only_seq_lens)
        if args.seq_lens or args.lightning_only_seq_lens
        else []
    )
    recorded = recorded_section(args.model_cps)
    modeled = model_rows(recorded, args.target_seq, args.latency_us * 1e-6, args.bandwidth_gbs * 1e9)
    print(
        f"\nhost: {platform.machine()}, {torch.get_num_threads()} torch threads in the parent, "
        f"torch {torch.__version__}; one intra-op thread per rank"
    )
    print_markdown(timed, recorded, modeled, args)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(
                {"args": vars(args), "timed": timed, "recorded": recorded, "modeled": modeled}, fh, indent=1
            )


if __name__ == "__main__":
    main()
