"""Zero RL on the tiny CPU config: pretrain the base, run stage-1 RL from it, measure both on held-out
prompts.

Targets (issue: zero RL on a CPU): held-out accuracy up by >= 25 points absolute, trace usage from
<= 10% to >= 50%, mean response length >= 1.5x the base's, within 15 minutes of RL.

The same script measures the ratio tail with the rollout engine under ``bf16`` versus ``fp32-islands``
while the trainer runs ``fp32-islands``: short RL runs from the same base, same seed and prompts.

    python bench/zero_rl_tiny.py --config configs/tiny-cpu.yaml --out runs/bench-zero-rl

Stages are cached by identity in the store (``--store``, default ``--out``'s): a second invocation
reuses the base (and the RL run) and only redoes what changed; ``--store file://runs/store`` measures
the very base and stage 1 that ``make run`` produced. Wall times on a shared machine are inflated; the CPU
time of the process divided by its threads is printed beside them as the uncontended estimate.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections import defaultdict
from pathlib import Path

import torch

from ringzero.config.loader import load_config
from ringzero.model.checkpoint import load_model
from ringzero.pipeline.execute import execute_stage
from ringzero.stages.base import StageInputs
from ringzero.store import open_store
from ringzero.tasks import make_task
from ringzero.tokenizer import build_tokenizer

PLOTTED = (
    ("reward/mean", "reward (mean)"),
    ("trace/rate", "trace usage"),
    ("len/mean", "response length (tokens)"),
    ("ratio/p99", "|r - 1| p99"),
)
TAIL_KEYS = (
    "ratio/first_minibatch_max",
    "ratio/p99",
    "ratio/p99.9",
    "ratio/max",
    "logratio/p99",
    "ratio/above_clip_frac",
)
HELDOUT = (
    ("eval/accuracy", "accuracy (T=1)"),
    ("eval/greedy_accuracy", "accuracy (greedy)"),
    ("eval/trace_rate", "trace usage (T=1)"),
    ("eval/trace_accuracy", "accuracy when tracing"),
    ("eval/forced_trace_accuracy", "accuracy with a forced trace"),
    ("eval/len_mean", "mean length (tokens)"),
)


STEP = re.compile(r"([a-z])=(\d)( (\d)\+(\d)=(\d+))?>(\d)")
"""One worked step, verbose (``b=3 7+3=10>0``) or terse (``b=3>0``)."""


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="configs/tiny-cpu.yaml")
    p.add_argument("--out", default="runs/bench-zero-rl", help="store, run folder and results.json go here")
    p.add_argument("--pretrain", default="base", help="name of the pretrain stage in the config")
    p.add_argument("--rl", default="stage1", help="name of the RL stage in the config")
    p.add_argument("--store", default=None, help="checkpoint store URI (default: file://OUT/store)")
    p.add_argument(
        "--rl-minutes", type=float, default=None, help="wall budget of the RL stage (default: the config's)"
    )
    p.add_argument("--gap-steps", type=int, default=5, help="steps of each ratio-tail run (0 = skip them)")
    p.add_argument("--gap-prompts", type=int, default=8, help="prompts per step of the ratio-tail runs")
    p.add_argument("--plot", default="docs/img/zero_rl_tiny.png")
    p.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="config override (repeatable)"
    )
    return p.parse_args()


class Clock:
    """Wall and process CPU time of a block."""

    def __enter__(self):
        self.wall, self.cpu = time.time(), time.process_time()
        return self

    def __exit__(self, *exc):
        self.wall, self.cpu = time.time() - self.wall, time.process_time() - self.cpu


def run_stage(cfg, store, run_dir, stage, inputs):
    with Clock() as clock:
        ex = execute_stage(cfg, store, stage, inputs, run_dir)
    return ex, clock


def main() -> None:
    args = parse_args()
    out = Path(args.out)
    store_uri = args.store or f"file://{out.resolve() / 'store'}"
    overrides = [*args.set, f"storage.root={store_uri}", f"run.run_dir={out / 'run'}"]
    if args.rl_minutes is not None:
        overrides.append(f"stages.{args.rl}.max_wall_minutes={args.rl_minutes}")
    cfg = load_config(args.config, overrides)
    threads = cfg.run.threads or torch.get_num_threads()
    torch.set_num_threads(threads)
    store, run_dir = open_store(cfg.storage.root), out / "run"
    base_stage, rl_stage = cfg.stage(args.pretrain), cfg.stage(args.rl)

    base, base_clock = run_stage(cfg, store, run_dir, base_stage, StageInputs())
    base_uri = base.outcome.output_uri
    inputs = StageInputs(init_uri=base_uri, reference_uri=base_uri, base_uri=base_uri)
    rl, rl_clock = run_stage(cfg, store, run_dir, rl_stage, inputs)

    tails = {
        "main run (train "
        + cfg.precision.train.name()
        + ", rollout "
        + cfg.precision.rollout.name()
        + ")": mean_tail(rl.metrics)
    }
    for rollout in ("bf16", "fp32-islands"):
        if not args.gap_steps:
            break
        gap_cfg = load_config(
            args.config,
            overrides
            + [
                "precision.train=fp32-islands",
                f"precision.rollout={rollout}",
                f"stages.{args.rl}.steps={args.gap_steps}",
                f"stages.{args.rl}.prompts_per_step={args.gap_prompts}",
                f"stages.{args.rl}.min_steps={args.gap_steps}",
            ],
        )
        gap, _ = run_stage(gap_cfg, store, run_dir / f"gap-{rollout}", gap_cfg.stage(args.rl), inputs)
        tails[f"train fp32-islands, rollout {rollout}"] = mean_tail(gap.metrics)

    roles = {
        name: trace_roles(load_model(uri, cfg.precision.train).model, cfg)
        for name, uri in (("base", base_uri), ("rl", rl.outcome.output_uri))
    }
    results = {
        "config": args.config,
        "threads": threads,
        "trace_roles": roles,
        "base": {k: base.outcome.summary.get(k) for k, _ in HELDOUT},
        "rl": {k: rl.outcome.summary.get(k) for k, _ in HELDOUT},
        "rl_steps": rl.outcome.steps,
        "rl_stop_reason": rl.outcome.stop_reason,
        "pretrain_minutes": {
            "wall": base.outcome.wall_s / 60,
            "this_call_cpu_per_thread": base_clock.cpu / threads / 60,
        },
        "rl_minutes": {
            "wall": rl.outcome.wall_s / 60,
            "this_call_cpu_per_thread": rl_clock.cpu / threads / 60,
            "loop_wall": sum(r.get("time/step", 0.0) for r in rl.metrics) / 60,
        },
        "ratio_tail": tails,
    }
    (out / "results.json").write_text(json.dumps(results, indent=1))
    plot(rl.metrics, args.plot)
    print(report(results))


@torch.no_grad()
def trace_roles(model, cfg, prompts: int = 64) -> dict[str, float]:
    """Teacher-forced next-token accuracy on correct worked traces of held-out problems, per kind of token:
    where a trace mode that does not work breaks (the lookup of a digit in the question, the sums...)."""
    task, tokenizer = make_task(cfg.task), build_tokenizer(cfg.tokenizer)
    hits = defaultdict(list)
    for problem in task.prompts("eval", prompts):
        for form in ("verbose", "terse"):
            response = task.worked_response(problem, verbose=form == "verbose")
            ids = tokenizer.encode(problem.prompt + response, add_bos=True)
            predicted = model(torch.tensor([ids[:-1]])).argmax(-1)[0].tolist()
            roles = ["format"] * len(response)
            for m in STEP.finditer(response):
                roles[m.start(1)], roles[m.start(2)], roles[m.start(7)] = (
                    "label",
                    "question_digit",
                    f"{form}_state",
                )
                if m.group(3):
                    roles[m.start(4)], roles[m.start(5)] = "previous_state", "repeated_digit"
                    roles[m.start(6) : m.end(6)] = ["sum"] * len(m.group(6))
            first = len(ids) - len(response)
            for j, role in enumerate(roles):
                hits[role].append(predicted[first - 1 + j] == ids[first + j])
    return {role: sum(v) / len(v) for role, v in sorted(hits.items())}


def mean_tail(records: list[dict]) -> dict[str, float]:
    out = {}
    for key in TAIL_KEYS:
        values = [r[key] for r in records if r.get(key) is not None]
        out[key] = sum(values) / len(values) if values else float("nan")
    return out


def plot(records: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(PLOTTED), figsize=(4 * len(PLOTTED), 3.2))
    steps = [r["step"] for r in records]
    for ax, (key, title) in zip(axes, PLOTTED, strict=True):
        ax.plot(steps, [r.get(key) if r.get(key) is not None else float("nan") for r in records], lw=1.5)
        ax.set_title(title)
        ax.set_xlabel("RL step")
        ax.grid(alpha=0.3)
    axes[-1].set_yscale("log")
    fig.suptitle("Stage-1 zero RL from the tiny base (held-out numbers in docs/bench/rl.md)")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def _fmt(v) -> str:
    return "-" if v is None else f"{v:.3f}" if abs(v) < 100 else f"{v:.0f}"


def report(r: dict) -> str:
    lines = ["| held-out (128 prompts) | base | after stage-1 RL |", "|---|---:|---:|"]
    lines += [f"| {label} | {_fmt(r['base'].get(k))} | {_fmt(r['rl'].get(k))} |" for k, label in HELDOUT]
    pm, rm = r["pretrain_minutes"], r["rl_minutes"]
    lines += [
        "",
        f"RL: {r['rl_steps']} steps, stop reason: {r['rl_stop_reason']}",
        f"minutes (wall / this call's CPU per thread): pretrain {pm['wall']:.1f} / "
        f"{pm['this_call_cpu_per_thread']:.1f}, "
        f"RL {rm['wall']:.1f} / {rm['this_call_cpu_per_thread']:.1f} (RL loop alone {rm['loop_wall']:.1f} "
        "wall)",
        "",
        "| ratio tail (mean over steps) | " + " | ".join(TAIL_KEYS) + " |",
        "|---|" + "---:|" * len(TAIL_KEYS),
    ]
    lines += [
        f"| {name} | " + " | ".join(f"{t[k]:.2e}" for k in TAIL_KEYS) + " |"
        for name, t in r["ratio_tail"].items()
    ]
    roles = sorted(r["trace_roles"]["base"])
    lines += [
        "",
        "| teacher-forced accuracy on correct traces | " + " | ".join(roles) + " |",
        "|---|" + "---:|" * len(roles),
    ]
    lines += [
        f"| {name} | " + " | ".join(f"{acc[k]:.3f}" for k in roles) + " |"
        for name, acc in r["trace_roles"].items()
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
