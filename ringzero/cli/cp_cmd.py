"""``ringzero check cp``: context-parallel strategies against the single-process reference.

Spawns ``--dp`` x ``--cp`` gloo ranks on loopback, runs forward and backward on the same global inputs, and
prints the max abs/rel errors of output, input gradient and every weight gradient, plus each rank's comm
accounting. Exit status 1 past the dtype's tolerance, 2 for a refused configuration.
"""

from __future__ import annotations

import argparse
import json

from ringzero.cli.check_cmd import check_subcommands


def register(sub) -> None:
    p = check_subcommands(sub).add_parser(
        "cp",
        help="context-parallel strategies vs the single-process reference (spawns gloo ranks)",
        description="Runs one layer (or a whole HybridLM step) with context parallelism over --dp x --cp "
        "local "
        "gloo ranks and compares output and gradients with one process. For --layer model, 'ring' means ring "
        "for both layer types; 'a2a' or 'allgather' means the default plan (MLA a2a, Lightning allgather). "
        "Exit status 1 past the dtype's tolerance, 2 for a configuration that is refused.",
    )
    p.add_argument("--layer", choices=["mla", "lightning", "model"], default="mla")
    p.add_argument(
        "--strategy",
        choices=["ring", "a2a", "allgather"],
        default=None,
        help="default: a2a for mla and model, allgather for lightning",
    )
    p.add_argument("--cp", type=int, default=2, help="context-parallel degree")
    p.add_argument("--dp", type=int, default=1, help="data-parallel degree (dp*cp ranks are spawned)")
    p.add_argument("--seq-len", type=int, default=64, help="global sequence length (need not divide by cp)")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--dtype", choices=["float64", "float32", "bfloat16"], default="float64")
    p.add_argument("--sharding", choices=["contiguous", "zigzag"], default="contiguous")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print the full result as JSON")
    p.set_defaults(handler=_check_cp)


def _check_cp(args: argparse.Namespace) -> int:
    from ringzero.stages.cp_equivalence import CheckSpec, run_check

    strategy = args.strategy or ("allgather" if args.layer == "lightning" else "a2a")
    spec = CheckSpec(
        layer=args.layer,
        strategy=strategy,
        cp=args.cp,
        dp=args.dp,
        seq_len=args.seq_len,
        heads=args.heads,
        dtype=args.dtype,
        sharding=args.sharding,
        batch=args.batch,
        seed=args.seed,
    )
    result = run_check(spec)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        verdict = "ok" if result["ok"] else "FAIL"
        steps = {
            k: v for k, v in result["comm"].items() if k.endswith(("steps_fwd", "steps_bwd", "bytes_sent"))
        }
        print(
            f"{verdict}: check cp {args.layer} {strategy} cp={args.cp} seq={args.seq_len} {args.dtype}: "
            f"max abs {result['max_abs']:.3e}, max rel {result['max_rel']:.3e}; rank 0 comm {steps}"
        )
    return 0 if result["ok"] else 1
