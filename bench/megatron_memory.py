"""Bytes a rank keeps after the megatron engine builds a stage: parameters, buffers and optimizer state, at
tensor-parallel sizes 1, 2 and 4, on the CPU under gloo (one process per rank), after one pretraining step
(so the optimizer's moments exist), against the ideal of (TP 1 bytes) / tp.

Everything a rank holds afterwards is counted once per storage: the model's parameters and buffers, every
tensor the optimizer keeps (masters, Adam moments), and the serving model if one was built (the engine builds
none until something samples in-process). ``full copy`` is what keeping a single-device fp32 HybridLM on
every rank, as the engine did before, adds.

``--from-checkpoint`` builds every rank from a committed checkpoint instead (written once by the parent
process) and adds the peak of the build itself: the growth of the rank's resident-set high-water mark
(``ru_maxrss``) across ``engine.build``, after a throwaway build of a small model of the same layout has
paid for imports and process groups; streamed (the engine's load: a layer at a time, a pipeline stage
reading only its own shard files) against ``--load full`` (the earlier load: the whole checkpoint read
into a full fp32 model on every rank, then scattered). Layouts are ``tpN`` or ``tpNxppM``.

    python bench/megatron_memory.py [--hidden 512 --layers 8 --heads 8]
    python bench/megatron_memory.py --from-checkpoint --layouts tp1,tp2,tp4,tp1xpp2 [--load full]
"""

from __future__ import annotations

import argparse
import sys

from ringzero.stages.rank_memory import config, measure

SHARD_BYTES = 8 * 2**20
"""Checkpoint shard files of 8 MiB: a tenth of this model, as a real checkpoint's 5 GB files are of a large
one."""


def write_checkpoint(root: str, hidden: int, layers: int, heads: int, optimizer: str) -> str:
    """A committed checkpoint of a fresh model in ``SHARD_BYTES`` files, written by this process."""
    from ringzero.engines.builders import fresh_model
    from ringzero.model.checkpoint import save_model
    from ringzero.model.config import PrecisionPolicy
    from ringzero.store import open_store

    cfg = config(1, hidden, layers, heads, optimizer)
    return save_model(
        open_store(root, max_shard_bytes=SHARD_BYTES),
        "start",
        fresh_model(cfg, PrecisionPolicy.preset("fp32")),
    )


def layouts(text: str) -> list[tuple[int, int]]:
    out = []
    for item in text.split(","):
        tp, _, pp = item.partition("x")
        out.append((int(tp.removeprefix("tp")), int(pp.removeprefix("pp")) if pp else 1))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--tp", default="1,2,4", help="TP sizes (dp 1, pp 1); --layouts overrides")
    p.add_argument("--layouts", default=None, help="e.g. tp1,tp2,tp4,tp1xpp2")
    p.add_argument(
        "--optimizer",
        choices=("ringzero", "megatron"),
        default="ringzero",
        help="ringzero's ShardedTrainOptimizer or megatron's DistributedOptimizer",
    )
    p.add_argument("--from-checkpoint", action="store_true", help="build from a committed checkpoint")
    p.add_argument("--load", choices=("streamed", "full"), default="streamed")
    args = p.parse_args()
    import tempfile

    from ringzero.parallel.launch import RankPool

    plan = layouts(args.layouts) if args.layouts else [(int(x), 1) for x in args.tp.split(",")]
    tmp = tempfile.TemporaryDirectory()
    checkpoint = None
    if args.from_checkpoint:
        checkpoint = write_checkpoint(
            f"file://{tmp.name}", args.hidden, args.layers, args.heads, args.optimizer
        )
    rows = []
    for tp, pp in plan:
        with RankPool(tp * pp, timeout_s=600) as pool:
            per_rank = pool.run(
                measure, tp, args.hidden, args.layers, args.heads, args.optimizer, pp, checkpoint, args.load
            )
        rows.append(
            (
                tp,
                pp,
                max(r["total"] for r in per_rank),
                max(r["model"] for r in per_rank),
                any(r["serving"] for r in per_rank),
                per_rank[0]["full_fp32"],
                max(r["build_peak"] for r in per_rank),
            )
        )
        print(f"tp {tp} pp {pp}: {rows[-1][2] / 2**20:.1f} MiB per rank", flush=True)
    base = rows[0][2] * rows[0][0] * rows[0][1]
    source = f"a committed checkpoint, {args.load} load" if checkpoint else "a fresh model"
    print(
        f"\nmodel: hidden {args.hidden}, {args.layers} layers, {args.heads} heads; fp32-islands (bf16 body); "
        f"optimizer: {args.optimizer}; dp 1; built from {source}\n"
    )
    print(
        "| tp | pp | bytes per rank (MiB) | of which parameters + buffers | / (one-rank bytes / ranks) | "
        "serving copy | with a full fp32 copy (before) | peak RSS growth during the build (MiB) |"
    )
    print("|---:|---:|---:|---:|---:|---|---:|---:|")
    for tp, pp, total, model, serving, full, peak in rows:
        print(
            f"| {tp} | {pp} | {total / 2**20:.1f} | {model / 2**20:.1f} | {total / (base / (tp * pp)):.3f} | "
            f"{'yes' if serving else 'none'} | {(total + full) / 2**20:.1f} | {peak / 2**20:.1f} |"
        )
    print(f"\nfull fp32 model: {rows[0][5] / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
