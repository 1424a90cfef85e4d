"""``ringzero check gap``: the train/rollout importance-ratio tail of a checkpoint (or random weights).

Re-run it after every engine or kernel change: it samples with the embedded rollout engine under the
rollout policy, rescores with the training path under the train policy and prints the distribution of
``|r - 1|`` and ``|log r|``. The work lives in ``ringzero.rollout.engine.gap``; this module only parses.
Exit status is non-zero only for bad input (2, from the CLI's error handling): a wide gap is a finding.
"""

from __future__ import annotations

import argparse
import json

from ringzero.cli.check_cmd import check_subcommands, model_config_from_file
from ringzero.cli.model_source import add_model_source_args, load_source_model, refuse_config_with_checkpoint
from ringzero.errors import RingzeroError

PRESET_NAMES = ["fp32-islands", "bf16", "fp32", "fp64"]


def register(sub) -> None:
    p = check_subcommands(sub).add_parser(
        "gap",
        help="train/rollout importance-ratio tail: rollout engine vs training path",
        description="Samples with the rollout engine, recomputes log-probs with the training path (parallel, "
        "teacher-forced) and prints mean/p50/p90/p99/p99.9/max of |r-1| and |log r|, overall and per "
        "trajectory-length bucket.",
    )
    add_model_source_args(p, "model for --init random: a run config or a model section")
    p.add_argument("--train-policy", choices=PRESET_NAMES, default="fp32-islands")
    p.add_argument("--rollout-policy", choices=PRESET_NAMES, default="fp32-islands")
    p.add_argument(
        "--deterministic",
        action="store_true",
        help="rollout engine in deterministic mode (needs equal policies): the ratio must be exactly 1",
    )
    p.add_argument("--samples", type=int, default=16, help="trajectories, one per random prompt")
    p.add_argument("--prompt-len", type=int, default=8, help="tokens per random prompt")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument(
        "--length-edges", default="256,1024,4096", help="comma-separated trajectory-length bucket edges"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print the full report as JSON")
    p.set_defaults(handler=_gap)


def _load_weights(args: argparse.Namespace):
    """The weights to compare, in fp32: each side casts its own copy to its own policy."""
    from ringzero.model.config import PrecisionPolicy

    refuse_config_with_checkpoint(args)
    cfg = model_config_from_file(args.config) if args.config else None
    return load_source_model(args, PrecisionPolicy.preset("fp32"), cfg)[0]


def _edges(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise RingzeroError(f"--length-edges must be comma-separated integers (got {text!r})") from None


def _gap(args: argparse.Namespace) -> int:
    import torch

    from ringzero.model.config import PrecisionPolicy
    from ringzero.rollout.engine.gap import length_buckets, measure_gap
    from ringzero.rollout.types import SamplingParams

    for name in ("samples", "prompt_len", "max_new_tokens"):
        if getattr(args, name) < 1:
            raise RingzeroError(f"--{name.replace('_', '-')} must be >= 1 (got {getattr(args, name)})")
    edges = _edges(args.length_edges)
    length_buckets(edges)  # refuse bad edges before sampling
    model = _load_weights(args)
    gen = torch.Generator().manual_seed(args.seed)
    prompts = torch.randint(0, model.cfg.vocab_size, (args.samples, args.prompt_len), generator=gen).tolist()
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature)
    report = measure_gap(
        model,
        prompts,
        params,
        deterministic=args.deterministic,
        length_edges=edges,
        seed=args.seed,
        train_policy=PrecisionPolicy.preset(args.train_policy),
        rollout_policy=PrecisionPolicy.preset(args.rollout_policy),
    )
    report["source"] = args.checkpoint or f"random init (seed {args.seed})"
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        a = report["all"]
        print(
            f"check gap train {report['train_policy']} / rollout {report['rollout_policy']}"
            f"{' (deterministic)' if args.deterministic else ''}: {report['samples']} trajectories, "
            f"{report['tokens']} tokens; |r-1| mean {a['ratio/mean']:.3e} p99 {a['ratio/p99']:.3e} "
            f"max {a['ratio/max']:.3e}"
        )
    return 0
