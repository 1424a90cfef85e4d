"""What each reasoning depth is worth, per difficulty: greedy accuracy of a checkpoint answering held-out
digitsum problems of every length directly, after an empty thought, by the short trace (two digits a
step) and by the full trace (one digit a step), with the response's opening forced so each route is
measured on every problem.

- direct: the answer digit the model ranks first right after ``a: `` (its next-token argmax over the ten
  digits), so a model that would rather open a trace is still measured on its direct answer;
- empty: forced to open with the empty thought ``<think> </think>`` (the fast tier's way out of a long
  item, and what tier RL's forced openings offer it), then greedy;
- short: the response forced to open ``<think> ab=``, then greedy to the newline;
- full: forced to open ``<think> a=``, then greedy.
Each line of output is one (route, digits) cell: accuracy and mean response length in tokens. The task
settings come from the config (``--set task.min_digits=4 --set task.digits=16`` measures lengths a base
was never trained on); the checkpoint from the store.

    python bench/depth_probe.py --config configs/tiny-cpu.yaml --checkpoint URI \
        --set task.min_digits=4 --set task.digits=16 --per-length 32
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict

import torch

from ringzero.config.loader import load_config
from ringzero.model.checkpoint import load_model
from ringzero.rl.rollout_batch import encode_prompt
from ringzero.rollout.engine import EmbeddedEngine
from ringzero.rollout.types import GenerateRequest, SamplingParams
from ringzero.stages.setup import task_and_tokenizer
from ringzero.store import open_store
from ringzero.tasks.base import THINK_CLOSE, THINK_OPEN


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="configs/tiny-cpu.yaml")
    p.add_argument("--checkpoint", required=True, help="model URI (a stage's final checkpoint)")
    p.add_argument("--per-length", type=int, default=32, help="held-out problems per digit count")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=200)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override (repeatable)")
    return p.parse_args()


def by_length(task, per_length: int) -> dict[int, list]:
    """Held-out problems grouped by digit count, ``per_length`` of each (drawn from the fixed eval set)."""
    groups: dict[int, list] = defaultdict(list)
    lo, hi = task.cfg.min_digits or task.cfg.digits, task.cfg.digits
    rng = 0
    while any(len(groups[n]) < per_length for n in range(lo, hi + 1)):
        for p in task.prompts("eval", 512, rng):
            n = task.difficulty(p) or task.cfg.digits
            if len(groups[n]) < per_length:
                groups[n].append(p)
        rng += 1
    return dict(sorted(groups.items()))


def main() -> int:
    args = parse_args()
    torch.set_num_threads(args.threads)
    cfg = load_config(args.config, args.set)
    task, tokenizer = task_and_tokenizer(cfg)
    store = open_store(cfg.storage.root, cfg.storage.s3)
    model = load_model(args.checkpoint, cfg.precision.rollout, store=store).model.eval()
    engine = EmbeddedEngine(model, tokenizer, max_batch=256, seed=cfg.run.seed)
    digit_ids = [tokenizer.encode(str(d))[0] for d in range(10)]
    greedy = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=0.0, stop=task.stop)
    for n, problems in by_length(task, args.per_length).items():
        prompts = [encode_prompt(tokenizer, p) for p in problems]
        # direct: the first response token, restricted to the digits
        correct = []
        for p, ids in zip(problems, prompts, strict=True):
            with torch.no_grad():
                logits = model(torch.tensor([ids]))[0, -1]
            guess = max(range(10), key=lambda d: float(logits[digit_ids[d]]))
            correct.append(str(guess) == p.answer)
        print(json.dumps({"route": "direct", "digits": n, "accuracy": sum(correct) / len(correct), "len_mean": 1.0}),
              flush=True)
        for route, opening in (("empty", f"{THINK_OPEN} {THINK_CLOSE}"), ("short", f"{THINK_OPEN} ab="),
                               ("full", f"{THINK_OPEN} a=")):
            forced = [ids + tokenizer.encode(opening) for ids in prompts]
            outs = engine.generate([GenerateRequest(ids, greedy) for ids in forced])
            texts = [opening + tokenizer.decode(o[0].output_ids) for o in outs]
            acc = sum(task.reward(p, t) for p, t in zip(problems, texts, strict=True)) / len(problems)
            length = sum(len(tokenizer.encode(t)) for t in texts) / len(texts)
            print(json.dumps({"route": route, "digits": n, "accuracy": acc, "len_mean": length}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
