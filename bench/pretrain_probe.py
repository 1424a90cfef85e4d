"""Pretrain the tiny base on a corpus variant and watch its trace mode form, every K steps.

What decides whether zero RL can work is whether the base's rare trace mode is reliable. This probe
pretrains with config overrides (task mix, steps, lr) and prints, every ``--every`` steps: the
teacher-forced accuracy of the lookup each trace step makes (``qd``: the digit after ``b=`` in the
question), of the terse and verbose state updates, and the held-out behaviour (accuracy at T=1, trace
usage, accuracy when tracing, forced-trace accuracy, mean length). One JSON line per measurement.

    python bench/pretrain_probe.py --steps 900 --every 150 --threads 1 \
        --set task.lookup_fraction=0.45 --set task.worked_fraction=0.3 --set task.filler_fraction=0.0
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from zero_rl_tiny import trace_roles  # noqa: E402

from ringzero.config.loader import load_config  # noqa: E402
from ringzero.engines.builders import fresh_model, task_and_tokenizer  # noqa: E402
from ringzero.engines.optimizer import TrainOptimizer  # noqa: E402
from ringzero.parallel.runtime import single  # noqa: E402
from ringzero.rollout.engine.embedded import EmbeddedEngine  # noqa: E402
from ringzero.stages.corpus_windows import CorpusWindows  # noqa: E402
from ringzero.stages.heldout_eval import evaluate_heldout  # noqa: E402
from ringzero.stages.lm_step import lm_step  # noqa: E402

HELDOUT_KEYS = ("accuracy", "trace_rate", "trace_accuracy", "forced_trace_accuracy", "len_mean", "greedy_accuracy")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="configs/tiny-cpu.yaml")
    p.add_argument("--stage", default="base", help="the pretrain stage whose batch, length and optimizer to use")
    p.add_argument("--steps", type=int, default=900, help="steps (the cosine schedule ends here)")
    p.add_argument("--every", type=int, default=150)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--prompts", type=int, default=64, help="held-out prompts per measurement (2 samples each)")
    p.add_argument("--out", default=None, help="append the JSON lines to this file too")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override (repeatable)")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    cfg = load_config(args.config, args.set)
    task, tokenizer = task_and_tokenizer(cfg)
    stage = cfg.stage(args.stage)
    torch.manual_seed(cfg.run.seed)
    model = fresh_model(cfg, cfg.precision.train).train()
    optimizer = TrainOptimizer(model, stage.optim, total_steps=args.steps, schedule="cosine")
    windows = CorpusWindows(task, tokenizer, stage.seq_len, cfg.run.seed)
    started, losses = time.time(), []
    runtime = single(next(model.parameters()).device)
    for step in range(args.steps):
        loss = lm_step(model, windows.batch(step, stage.batch_size), runtime, optimizer=optimizer,
                       micro_batch=stage.micro_batch).loss
        losses.append(float(loss))
        if (step + 1) % args.every:
            continue
        model.eval()
        roles = trace_roles(model, cfg, prompts=24)
        engine = EmbeddedEngine(model, tokenizer, cfg.precision.rollout, max_batch=256, seed=cfg.run.seed)
        held = evaluate_heldout(engine, task, tokenizer, prompts=args.prompts, samples=2, max_new_tokens=192)
        model.train()
        record = {"step": step + 1, "minutes": round((time.time() - started) / 60, 1),
                  "loss": round(sum(losses[-args.every:]) / args.every, 3), "qd": round(roles["question_digit"], 3),
                  "terse_state": round(roles.get("terse_state", 0.0), 3),
                  "verbose_state": round(roles.get("verbose_state", 0.0), 3),
                  **{k: round(held[f"eval/{k}"], 3) for k in HELDOUT_KEYS}}
        print(json.dumps(record), flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
