"""What each reasoning depth is worth, per digit count: the probe behind the tiny task's design.

For a checkpoint and every digit count of the task's range, on held-out problems:

- ``direct``: the answer digit the model ranks first right after ``a: `` (its next-token argmax over the
  digits), so a model that would rather open a trace is still measured on its direct answer;
- ``trace``: ``--samples`` responses per problem at temperature 1 with the trace's opening forced
  (``<think> ``), split by how the policy went on: ``first_pass_accuracy`` (the first pass's final state
  is the answer: what an unchecked trace would have said, over every sample, so no selection by the
  policy's choice to check), ``slip_rate`` (first passes with a wrong step), ``check_rate`` (samples
  with at least one check pass), ``unchecked_accuracy`` / ``checked_accuracy`` (the answers of each);
- ``policy``: the policy's own samples (no forcing): accuracy, trace rate, mean tokens, the mean
  within-prompt standard deviation of length, and ``shortest_ratio`` = mean over prompts of (shortest
  correct, verified, finished sample) / (mean sample length): what shortest-of-N self-distillation can
  cut, with the sample count and temperature given (``--samples``, ``--temperature``).

One JSON line per (route, digits); ``--markdown`` prints a table too. Task settings come from the config
(``--set task.digits=12`` measures lengths a base never saw); the checkpoint from the store.

    python bench/depth_probe.py --config configs/tiny-cpu.yaml --checkpoint URI --per-length 32 --samples 8
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict

import torch

from ringzero.config.loader import load_config
from ringzero.engines.builders import task_and_tokenizer
from ringzero.model.checkpoint import load_model
from ringzero.rl.rollout_batch import encode_prompt, stop_settings
from ringzero.rl.seeds import derive_seed
from ringzero.rollout.engine.embedded import EmbeddedEngine
from ringzero.rollout.types import GenerateRequest, SamplingParams
from ringzero.store import open_store
from ringzero.tasks.base import THINK_OPEN, first_line, split_trace


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="configs/tiny-cpu.yaml")
    p.add_argument("--checkpoint", required=True, help="model URI (a stage's final checkpoint)")
    p.add_argument("--store", default=None, help="store root (default: the config's)")
    p.add_argument("--per-length", type=int, default=32, help="held-out problems per digit count")
    p.add_argument("--samples", type=int, default=8, help="samples per problem at --temperature")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=None, help="default: the config's longest RL sampling cap")
    p.add_argument("--markdown", action="store_true", help="also print a markdown table")
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


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else float("nan")


def trace_route(task, problems, texts_per_problem) -> dict[str, float]:
    """First pass against checks, over every sample of a forced trace."""
    first_ok, slipped, checked, answers = [], [], [], defaultdict(list)
    for problem, texts in zip(problems, texts_per_problem, strict=True):
        instance = task.op.instance_from_meta(problem.meta)
        for text in texts:
            body, _ = split_trace(first_line(text))
            passes = task.op.pass_results(body or "", instance)
            first = passes[0] if passes else (0, 0, None)
            first_ok.append(first[2] is not None and str(first[2]) == problem.answer and first[0] == len(instance))
            slipped.append(first[1] < first[0])
            checked.append(len(passes) > 1)
            answers[len(passes) > 1].append(task.reward(problem, text))
    return {"first_pass_accuracy": _mean(first_ok), "slip_rate": _mean(slipped), "check_rate": _mean(checked),
            "unchecked_accuracy": _mean(answers[False]), "checked_accuracy": _mean(answers[True])}


def policy_route(task, tokenizer, problems, outs) -> dict[str, float]:
    """The policy's own samples: accuracy, length and what shortest-of-N could cut."""
    correct, traced, lengths, spreads, ratios = [], [], [], [], []
    for problem, completions in zip(problems, outs, strict=True):
        texts = [tokenizer.decode(c.output_ids) for c in completions]
        mine = [len(c.output_ids) for c in completions]
        ok = [task.reward(problem, t) == 1.0 for t in texts]
        correct += ok
        traced += [THINK_OPEN in t for t in texts]
        lengths += mine
        spreads.append(statistics.pstdev(mine))
        good = [n for n, c, t, done in zip(mine, ok, texts, completions, strict=True)
                if c and done.finish_reason != "length" and task.verified(t, problem)]
        if good:
            ratios.append(min(good) / _mean(mine))
    return {"accuracy": _mean(correct), "trace_rate": _mean(traced), "len_mean": _mean(lengths),
            "len_spread": _mean(spreads), "shortest_ratio": _mean(ratios), "shortest_found": len(ratios) / len(problems)}


def main() -> int:
    args = parse_args()
    torch.set_num_threads(args.threads)
    cfg = load_config(args.config, args.set)
    task, tokenizer = task_and_tokenizer(cfg)
    store = open_store(args.store or cfg.storage.root, cfg.storage.s3)
    model = load_model(args.checkpoint, cfg.precision.rollout, store=store).model.eval()
    engine = EmbeddedEngine(model, tokenizer, max_batch=256, seed=cfg.run.seed)
    caps = [s.sampling.max_new_tokens for s in cfg.stages if getattr(s, "kind", "") == "rl"]
    max_new = args.max_new_tokens or max(caps, default=160)
    strings, ids = stop_settings(task, tokenizer)
    digit_ids = [tokenizer.encode(str(d))[0] for d in range(10)]
    rows = []
    for n, problems in by_length(task, args.per_length).items():
        prompts = [encode_prompt(tokenizer, p) for p in problems]
        with torch.no_grad():
            guesses = [max(range(10), key=lambda d: float(model(torch.tensor([p]))[0, -1][digit_ids[d]]))
                       for p in prompts]
        rows.append({"route": "direct", "digits": n,
                     "accuracy": _mean(str(g) == p.answer for g, p in zip(guesses, problems, strict=True))})

        def sample(inputs, salt, n=n):
            params = [SamplingParams(max_new_tokens=max_new, temperature=args.temperature, stop=strings,
                                     stop_token_ids=ids, n=args.samples, seed=derive_seed(cfg.run.seed, salt, n, i))
                      for i in range(len(inputs))]
            return engine.generate([GenerateRequest(x, sp) for x, sp in zip(inputs, params, strict=True)])

        opening = f"{THINK_OPEN} "
        forced = sample([p + tokenizer.encode(opening) for p in prompts], "trace")
        texts = [[opening + tokenizer.decode(c.output_ids) for c in cs] for cs in forced]
        rows.append({"route": "trace", "digits": n, **trace_route(task, problems, texts)})
        rows.append({"route": "policy", "digits": n, **policy_route(task, tokenizer, problems, sample(prompts, "own"))})
        for row in rows[-3:]:
            print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
    if args.markdown:
        print(markdown(rows))
    return 0


def markdown(rows: list[dict]) -> str:
    digits = sorted({r["digits"] for r in rows})
    cells = [("direct", "accuracy"), ("trace", "first_pass_accuracy"), ("trace", "slip_rate"), ("trace", "check_rate"),
             ("trace", "unchecked_accuracy"), ("trace", "checked_accuracy"), ("policy", "accuracy"),
             ("policy", "len_mean"), ("policy", "len_spread"), ("policy", "shortest_ratio")]
    lines = ["| route | measure | " + " | ".join(map(str, digits)) + " |", "| --- | --- |" + " --- |" * len(digits)]
    for route, key in cells:
        vals = {r["digits"]: r.get(key) for r in rows if r["route"] == route}
        lines.append(f"| {route} | {key} | " + " | ".join(
            "-" if vals.get(d) is None else f"{vals[d]:.2f}" if vals[d] < 10 else f"{vals[d]:.0f}" for d in digits) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
