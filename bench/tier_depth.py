"""Did tier RL earn adaptive depth? The targets, read from a finished run's eval stage.

For every checkpoint the eval stage measured (its ``compare`` list and its input), with the run's
fastest and deepest tiers (``--fast``, ``--deep``) and the task's difficulty thirds (``task.min_digits``):

- the fast tier's within-budget share (target after tier RL: >= 0.9);
- on the hardest third, deep minus fast accuracy (>= 0.20) and deep over fast length (>= 1.5);
- on the easiest third, deep over fast length (<= 1.3): no long thinking where it does not pay;
- the stage-2 checkpoint's gaps smaller than the tier checkpoint's: the stage earned them.

    python bench/tier_depth.py runs/tiny-cpu/manifest.json [--tier tier --before stage2] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

TARGETS = (  # (key under eval/, label, test)
    ("{fast}/within_budget", "fast within budget", lambda v: v >= 0.9, ">= 0.90"),
    ("contrast/hard/accuracy_gap", "hard: deep - fast accuracy", lambda v: v >= 0.2, ">= 0.20"),
    ("contrast/hard/len_ratio", "hard: deep / fast length", lambda v: v >= 1.5, ">= 1.5"),
    ("contrast/easy/len_ratio", "easy: deep / fast length", lambda v: v <= 1.3, "<= 1.3"),
)
SHOWN = ("{fast}/accuracy", "{deep}/accuracy", "{fast}/hard/accuracy", "{deep}/hard/accuracy",
         "{fast}/hard/len_mean", "{deep}/hard/len_mean", "{fast}/easy/len_mean", "{deep}/easy/len_mean")


def eval_rows(manifest: dict) -> dict[str, dict[str, float]]:
    """``{checkpoint: {key under eval/: value}}`` from the manifest's eval stage summary, the input last."""
    stages = [s for s in manifest["stages"] if s["kind"] == "eval"]
    if not stages:
        raise SystemExit("the manifest has no eval stage")
    summary, stage = stages[-1]["summary"], stages[-1]
    rows: dict[str, dict[str, float]] = {}
    for key, v in summary.items():
        if key.startswith("compare/"):
            _, name, rest = key.split("/", 2)
            rows.setdefault(name, {})[rest] = v
    input_name = next((n for n, uri in stage["inputs"]["compare"].items() if uri == stage["inputs"]["init_uri"]),
                      "input")
    rows[input_name] = {k.removeprefix("eval/"): v for k, v in summary.items() if k.startswith("eval/")}
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("manifest", type=Path)
    p.add_argument("--tier", default="tier", help="the tier-RL stage's checkpoint name")
    p.add_argument("--before", default="stage2", help="the checkpoint tier RL started from")
    p.add_argument("--fast", default="fast", help="the tier with the smallest budget")
    p.add_argument("--deep", default="deep", help="the tier with the largest budget")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    rows, fast, deep = eval_rows(json.loads(args.manifest.read_text())), args.fast, args.deep
    fmt = {"fast": fast, "deep": deep}
    names = list(rows)
    if args.json:
        print(json.dumps({"fast": fast, "deep": deep, "rows": rows}, indent=1, sort_keys=True))
        return 0
    print(f"| eval ({fast} vs {deep}) | " + " | ".join(names) + " | target |")
    print("| --- " * (len(names) + 2) + "|")
    for key, label, test, target in TARGETS:
        k = key.format(**fmt)
        cells = [f"{rows[n][k]:.2f}" if k in rows[n] else "-" for n in names]
        verdict = target
        if args.tier in rows and k in rows[args.tier]:
            verdict += ": met" if test(rows[args.tier][k]) else ": **missed**"
        print(f"| {label} | " + " | ".join(cells) + f" | {verdict} |")
    for key in SHOWN:
        k = key.format(**fmt)
        print(f"| {k} | " + " | ".join(f"{rows[n][k]:.3g}" if k in rows[n] else "-" for n in names) + " | |")
    if args.tier in rows and args.before in rows:
        t, b = rows[args.tier], rows[args.before]
        for key in ("contrast/hard/accuracy_gap", "contrast/hard/len_ratio"):
            if key in t and key in b:
                ok = b[key] < t[key]
                print(f"\n{key}: {args.before} {b[key]:.3f} vs {args.tier} {t[key]:.3f}: "
                      f"{'smaller before tier RL: met' if ok else 'not smaller: **missed**'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
