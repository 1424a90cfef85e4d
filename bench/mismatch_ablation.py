"""Train/rollout mismatch corrections, side by side: the ``mismatch`` study (``ringzero.pipeline.studies``),
the tiny stage 1 under each objective from the same base and seeds, and its table into BENCHMARKS.md.

The trainer runs ``fp32-islands`` (bf16 body, fp32 softmax and LM head); the rollout engine runs ``bf16``
(a real engine gap: the islands differ), then ``fp32-islands`` too (the gap left is kernel order). Each
arm is stage 1 with 10 steps (no early stop) and one objective:

- ``sg_clip_is``: the paper's form, the ratio train/rollout clipped above, gradient through log p only;
- ``ppo_clip``: PPO's clipped surrogate on the same ratio (no correction);
- ``tis``, ``seq_is``, ``seq_is_geo``, ``masked_is``, ``icepop``: ``ppo_clip`` whose policy ratio is train
  over the trainer's own pre-update log-probs, times the correction of the trainer/rollout ratio (the
  decoupled form verl, slime and AReaL use);
- ``rollback``: bf16 rollout, ``sg_clip_is`` and ``rollback: {on: ["gap/ratio/max > 0.02"], remedy:
  raise_precision}``: the first step whose engine gap crosses the limit is retried on fp32 islands.

Reported per arm (mean ± half-range over seeds): held-out accuracy, trace rate and length under the arm's
rollout engine, the engine gap (mean over steps of the first minibatch's p99 of ``|r - 1|``, and its max),
gradient coverage (``grad/coverage`` over kept tokens times the share kept), tokens dropped, whether the run
collapsed (a non-finite loss, the last five steps' reward below half its best five-step mean, or held-out
accuracy below the base's) and the rollbacks. This is ``ringzero ablate CONFIG --study mismatch`` with the
table written into BENCHMARKS.md:

    python bench/mismatch_ablation.py --store file://runs/store --write   # the base `make run` pretrained
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ringzero.pipeline.ablate import print_study, run_study
from ringzero.pipeline.ablate_report import table_rows
from ringzero.pipeline.studies import STUDIES


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="configs/tiny-cpu.yaml")
    p.add_argument("--out", default="runs/bench-mismatch", help="the arms' run folders and ablation.json")
    p.add_argument("--store", default=None, help="checkpoint store URI (default: the config's)")
    p.add_argument("--seeds", default="0", help="comma-separated seeds (two give a verdict a spread)")
    p.add_argument("--write", action="store_true", help="write the table into BENCHMARKS.md")
    args = p.parse_args()
    study = STUDIES["mismatch"]
    overrides = [f"storage.root={args.store}"] if args.store else []
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    result = run_study(study, args.config, overrides, seeds, Path(args.out))
    print_study(study, result)
    if args.write:
        from common import write_section

        write_section(Path("BENCHMARKS.md"), "mismatch-ablation", markdown(study, result))


def markdown(study, result: dict) -> str:
    headers, rows = table_rows(study, result)
    lines = [
        f"`python bench/mismatch_ablation.py --seeds {','.join(map(str, result['seeds']))}`: every arm "
        "10 stage-1 steps from the same base, same seeds (mean ± half-range over seeds).",
        "",
        "| " + " | ".join(headers) + " |",
        "|" + "---|" * len(headers),
        *("| " + " | ".join(r) + " |" for r in rows),
        "",
        *(f"- {v['claim']}: **{v['verdict']}** ({v['detail']})" for v in result["verdicts"]),
        *(f"- arm `{f['arm']}` seed {f['seed']} failed: {f['error']}" for f in result.get("failed", [])),
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
