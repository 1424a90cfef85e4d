"""Train/rollout mismatch corrections, side by side: the tiny stage 1 under each, from the same base and
seeds.

The trainer runs ``fp32-islands`` (bf16 body, fp32 softmax and LM head); the rollout engine runs ``bf16``
(a real engine gap: the islands differ), then ``fp32-islands`` too (the gap left is kernel order). Each
arm is stage 1 of the config with a fixed number of steps (no early stop) and one objective:

- ``sg_clip_is``: the paper's form, the ratio train/rollout clipped above, gradient through log p only;
- ``ppo_clip``: PPO's clipped surrogate on the same ratio (no correction);
- ``tis``, ``seq_is``, ``seq_is_geo``, ``masked_is``, ``icepop``: ``ppo_clip`` whose policy ratio is train
  over the trainer's own pre-update log-probs, times the correction of the trainer/rollout ratio (the
  decoupled form verl, slime and AReaL use).

Reported per arm: held-out accuracy and trace rate (``--eval-prompts`` x 4 at T=1, under the arm's rollout
engine), the engine gap (mean over steps of the first minibatch's p99 of ``|r - 1|``, and its max),
gradient coverage (share of response tokens with a non-zero gradient: ``grad/coverage`` over kept tokens
times the share kept), tokens dropped, and whether the run collapsed (a non-finite loss, the last five
steps' reward below half its best five-step mean, or held-out accuracy below the base's).

A last arm shows the automatic rollback in a real run: bf16 rollout, ``sg_clip_is``, and
``rollback: {on: ["gap/ratio/max > LIMIT"], remedy: raise_precision}``: the first step whose engine gap
crosses the limit is rolled back and retried with an fp32-islands rollout engine.

    python bench/mismatch_ablation.py --store file://runs/store       # the base `make run` pretrained
    python bench/mismatch_ablation.py --arms sg_clip_is,tis --rollouts bf16 --steps 5   # a quick look

Results go to ``OUT/results.json`` and, with ``--write``, into BENCHMARKS.md's ablation block.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from ringzero.config.loader import load_config
from ringzero.errors import RingzeroError
from ringzero.pipeline.ablation import MISMATCH_ARMS as ARMS
from ringzero.pipeline.ablation import ROLLBACK_ARM, arm_overrides, measure
from ringzero.pipeline.execute import execute_stage
from ringzero.stages.base import StageInputs
from ringzero.store import open_store


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="configs/tiny-cpu.yaml")
    p.add_argument("--out", default="runs/bench-mismatch", help="run folder and results.json")
    p.add_argument("--store", default=None, help="checkpoint store URI (default: file://OUT/store)")
    p.add_argument("--pretrain", default="base")
    p.add_argument("--rl", default="stage1")
    p.add_argument("--steps", type=int, default=10, help="RL steps of every arm")
    p.add_argument("--prompts", type=int, default=8, help="prompts per step (0: the stage's)")
    p.add_argument("--eval-prompts", type=int, default=64, help="held-out prompts measured after each arm")
    p.add_argument(
        "--arms",
        default="sg_clip_is,ppo_clip,tis,seq_is,masked_is,icepop," + ROLLBACK_ARM,
        help=f"comma-separated, of {','.join([*ARMS, ROLLBACK_ARM])}",
    )
    p.add_argument("--rollouts", default="bf16,fp32-islands", help="rollout precision policies to run")
    p.add_argument(
        "--rollback-limit", type=float, default=0.02, help="gap/ratio/max that triggers the rollback arm"
    )
    p.add_argument("--write", action="store_true", help="write the table into BENCHMARKS.md")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    out = Path(args.out)
    store_uri = args.store or f"file://{(out / 'store').resolve()}"
    common = [f"storage.root={store_uri}", f"run.run_dir={out / 'run'}"]
    cfg = load_config(args.config, common)
    common.append(f"task.eval_prompts={args.eval_prompts}")  # after the base: its identity stays make run's
    torch.set_num_threads(cfg.run.threads or torch.get_num_threads())
    store = open_store(cfg.storage.root)
    base = execute_stage(cfg, store, cfg.stage(args.pretrain), StageInputs(), out / "run")
    uri = base.outcome.output_uri
    inputs = StageInputs(init_uri=uri, reference_uri=uri, base_uri=uri)
    base_accuracy = base.outcome.summary.get("eval/accuracy", float("nan"))
    results = {
        "config": args.config,
        "steps": args.steps,
        "base": {"accuracy": base_accuracy, "trace_rate": base.outcome.summary.get("eval/trace_rate")},
        "arms": {},
    }
    path = out / "results.json"
    if path.exists():  # reruns of a subset keep the other arms' rows
        results["arms"] = json.loads(path.read_text()).get("arms", {})
    for rollout in args.rollouts.split(","):
        for arm in args.arms.split(","):
            if arm == ROLLBACK_ARM and rollout != "bf16":
                continue  # the rollback arm needs the gap a bf16 engine opens
            arm_cfg = load_config(
                args.config,
                common + arm_overrides(args.rl, arm, rollout, args.steps, args.prompts, args.rollback_limit),
            )
            started = time.time()
            try:
                ex = execute_stage(
                    arm_cfg, store, arm_cfg.stage(args.rl), inputs, out / "run" / f"{arm}-{rollout}"
                )
            except RingzeroError as exc:  # e.g. the rollback arm spending its budget: a result, not a crash
                results["arms"][f"{arm} | {rollout}"] = {"failed": str(exc)}
                path.write_text(json.dumps(results, indent=1))
                print(f"{arm:>11} {rollout:>12}: failed: {exc}", flush=True)
                continue
            row = measure(ex.metrics, ex.outcome.summary, base_accuracy)
            row.update(minutes=(time.time() - started) / 60, stage_minutes=ex.outcome.wall_s / 60)
            results["arms"][f"{arm} | {rollout}"] = row
            print(
                f"{arm:>11} {rollout:>12}: acc {row['accuracy']:.3f} trace {row['trace_rate']:.3f} "
                f"gap p99 {row['gap_p99']:.2e} coverage {row['coverage']:.3f} collapsed {row['collapsed']}",
                flush=True,
            )
            path.write_text(json.dumps(results, indent=1))
    print(report(results))
    if args.write:
        from common import write_section

        write_section(Path("BENCHMARKS.md"), "mismatch-ablation", report(results))


def report(r: dict) -> str:
    lines = [
        f"Base: held-out accuracy {r['base']['accuracy']:.3f}, trace rate {r['base']['trace_rate']:.3f}; "
        f"every arm {r['steps']} stage-1 steps from it, same seeds.",
        "",
        "| arm | rollout | held-out acc | trace rate | len | gap p99 (mean) | gap max | grad coverage | "
        "adv != 0 | dropped | collapsed | minutes |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for name, a in r["arms"].items():
        arm, rollout = name.split(" | ")
        if "failed" in a:
            lines.append(f"| {arm} | {rollout} | failed: {a['failed']} |" + " |" * 9)
            continue
        lines.append(
            f"| {arm} | {rollout} | {a['accuracy']:.3f} | {a['trace_rate']:.3f} | {a['len_mean']:.0f} | "
            f"{a['gap_p99']:.2e} | {a['gap_max']:.2e} | {a['coverage']:.3f} | {a['adv_nonzero']:.3f} | "
            f"{a['masked']:.4f} | {'yes' if a['collapsed'] else 'no'} | {a['stage_minutes']:.1f} |"
        )
    for name, a in r["arms"].items():
        for e in a.get("rollbacks", []):
            lines.append(f"\n`{name}`: rollback at step {e['step']} ({e['reason']}; remedy {e['remedy']})")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
