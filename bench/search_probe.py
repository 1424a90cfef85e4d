"""What searching is worth to a checkpoint on the row-search task, per row count: the probe behind its design.

For a checkpoint and every row count of the task (``task.rows``), on held-out problems:

- ``direct``: the label the model ranks first right after ``a: `` (its next-token argmax over the
  problem's labels) and how often that is the cue, so a model that would rather open a trace is still
  measured on its direct answer;
- ``trace``: ``--samples`` responses per problem at temperature 1 with the trace's opening forced
  (``<think> ``): accuracy, the share of tries that hold (``try_ok``: row copied, sums and verdict right),
  and the search behaviours of ``RowSearch.behaviour_metrics`` (tries, give-up hazard, re-checks,
  cue first, first-try hits);
- ``policy``: the policy's own samples: accuracy, trace rate, mean tokens, the mean within-prompt
  standard deviation of length, and ``shortest_ratio`` = mean over prompts of (shortest verified sample)
  / (mean sample length): what shortest-of-N self-distillation can cut.

One JSON line per (route, rows); ``--markdown`` prints a table too.

    python bench/search_probe.py --config configs/tiny-cpu.yaml --checkpoint URI --per-bucket 32 --samples 8
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch

from ringzero.config.loader import load_config
from ringzero.engines.builders import task_and_tokenizer
from ringzero.model.checkpoint import load_model
from ringzero.rl.rollout_batch import encode_prompt, stop_settings
from ringzero.rl.seeds import derive_seed
from ringzero.rollout.engine.embedded import EmbeddedEngine
from ringzero.rollout.types import GenerateRequest, SamplingParams
from ringzero.store import open_store
from ringzero.tasks.base import THINK_OPEN
from ringzero.tasks.search_items import LABELS

ROUTE_KEYS = {
    "direct": ("accuracy", "cue_share"),
    "trace": (
        "accuracy",
        "try_ok",
        "tries",
        "give_up",
        "recheck",
        "likely_first",
        "first_try_hit",
        "confirm",
    ),
    "policy": ("accuracy", "trace_rate", "len_mean", "len_spread", "shortest_ratio"),
}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="configs/tiny-cpu.yaml")
    p.add_argument("--checkpoint", required=True, help="model URI (a stage's final checkpoint)")
    p.add_argument("--store", default=None, help="store root (default: the config's)")
    p.add_argument("--per-bucket", type=int, default=32, help="held-out problems per row count")
    p.add_argument("--samples", type=int, default=8, help="samples per problem at --temperature")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=None, help="default: the config's longest RL cap")
    p.add_argument("--markdown", action="store_true", help="also print a markdown table")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override")
    return p.parse_args()


def by_rows(task, per_bucket: int) -> dict[int, list]:
    groups: dict[int, list] = {n: [] for n in task.cfg.rows}
    seed = 0
    while any(len(g) < per_bucket for g in groups.values()):
        for p in task.prompts("eval", 512, seed):
            g = groups[len(p.meta["rows"])]
            if len(g) < per_bucket:
                g.append(p)
        seed += 1
    return groups


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else float("nan")


def trace_route(task, problems, texts_per_problem) -> dict[str, float]:
    from ringzero.tasks.base import first_line, split_trace
    from ringzero.tasks.row_search import parse_tries, try_holds

    responses, probs, oks, held = [], [], [], []
    for problem, texts in zip(problems, texts_per_problem, strict=True):
        item = task.item(problem)
        for text in texts:
            responses.append(text)
            probs.append(problem)
            oks.append(task.reward(problem, text))
            body, _ = split_trace(first_line(text))
            held += [try_holds(t, item) for t in parse_tries(body or "")[0]]
    out = {"accuracy": _mean(oks), "try_ok": _mean(held)}
    out.update({k.removeprefix("search/"): v for k, v in task.behaviour_metrics(responses, probs).items()})
    return out


def policy_route(task, tokenizer, problems, outs) -> dict[str, float]:
    correct, traced, lengths, spreads, ratios = [], [], [], [], []
    for problem, completions in zip(problems, outs, strict=True):
        texts = [tokenizer.decode(c.output_ids) for c in completions]
        mine = [len(c.output_ids) for c in completions]
        correct += [task.reward(problem, t) == 1.0 for t in texts]
        traced += [THINK_OPEN in t for t in texts]
        lengths += mine
        spreads.append(statistics.pstdev(mine))
        good = [
            n
            for n, t, done in zip(mine, texts, completions, strict=True)
            if done.finish_reason != "length" and task.verified(t, problem)
        ]
        if good:
            ratios.append(min(good) / _mean(mine))
    return {
        "accuracy": _mean(correct),
        "trace_rate": _mean(traced),
        "len_mean": _mean(lengths),
        "len_spread": _mean(spreads),
        "shortest_ratio": _mean(ratios),
    }


def main() -> int:
    args = parse_args()
    torch.set_num_threads(args.threads)
    cfg = load_config(args.config, args.set)
    task, tokenizer = task_and_tokenizer(cfg)
    if cfg.task.kind != "search":
        raise SystemExit("search_probe: the config's task is not row search (task.kind: search)")
    store = open_store(args.store or cfg.storage.root, cfg.storage.s3)
    model = load_model(args.checkpoint, cfg.precision.rollout, store=store).model.eval()
    engine = EmbeddedEngine(model, tokenizer, max_batch=256, seed=cfg.run.seed)
    caps = [s.sampling.max_new_tokens for s in cfg.stages if getattr(s, "kind", "") == "rl"]
    max_new = args.max_new_tokens or max(caps, default=160)
    strings, ids = stop_settings(task, tokenizer)
    label_ids = [tokenizer.encode(c)[0] for c in LABELS]
    rows = []
    for n, problems in by_rows(task, args.per_bucket).items():
        prompts = [encode_prompt(tokenizer, p) for p in problems]
        with torch.no_grad():
            firsts = [model(torch.tensor([p]))[0, -1] for p in prompts]
        guesses = [max(range(n), key=lambda i, f=f: float(f[label_ids[i]])) for f in firsts]
        rows.append(
            {
                "route": "direct",
                "rows": n,
                "accuracy": _mean(LABELS[g] == p.answer for g, p in zip(guesses, problems, strict=True)),
                "cue_share": _mean(g == p.meta["cue"] for g, p in zip(guesses, problems, strict=True)),
            }
        )

        def sample(inputs, salt, n=n):
            params = [
                SamplingParams(
                    max_new_tokens=max_new,
                    temperature=args.temperature,
                    stop=strings,
                    stop_token_ids=ids,
                    n=args.samples,
                    seed=derive_seed(cfg.run.seed, salt, n, i),
                )
                for i in range(len(inputs))
            ]
            return engine.generate([GenerateRequest(x, sp) for x, sp in zip(inputs, params, strict=True)])

        opening = f"{THINK_OPEN} "
        forced = sample([p + tokenizer.encode(opening) for p in prompts], "trace")
        texts = [[opening + tokenizer.decode(c.output_ids) for c in cs] for cs in forced]
        rows.append({"route": "trace", "rows": n, **trace_route(task, problems, texts)})
        own = sample(prompts, "own")
        rows.append({"route": "policy", "rows": n, **policy_route(task, tokenizer, problems, own)})
        for row in rows[-3:]:
            print(
                json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}),
                flush=True,
            )
    if args.markdown:
        print(markdown(rows))
    return 0


def markdown(rows: list[dict]) -> str:
    counts = sorted({r["rows"] for r in rows})
    lines = ["| route | measure | " + " | ".join(f"{n} rows" for n in counts) + " |"]
    lines.append("| --- | --- |" + " --- |" * len(counts))
    for route, keys in ROUTE_KEYS.items():
        for key in keys:
            vals = {r["rows"]: r.get(key) for r in rows if r["route"] == route}
            cells = ["-" if vals.get(n) is None else f"{vals[n]:.2f}" for n in counts]
            lines.append(f"| {route} | {key} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
