"""What a finished run's stages did, read from its manifest: the tables the README and docs/bench/tiers.md
print.

From the manifest's eval stage (every checkpoint it measured: its ``compare`` list and its input) and the
stage records, in markdown:

- ``stages``: per stage, how it stopped, its steps, wall minutes, and the RL ratio tail (``ratio/p99``,
  the median of the per-step p99 over the stage, ``ratio/max``);
- ``checkpoints``: per checkpoint, pass@1, trace rate, mean and p95 length, and with tiers the fast
  tier's within-budget share and the deep-against-fast contrasts;
- ``buckets``: per checkpoint and difficulty third, accuracy and length untagged and per tier, and the
  fast tier's correct-within-budget share;
- ``gap``: per checkpoint and rollout policy, the token ratio tail and the sequence drift
  (``eval/gap/<policy>/...``), overall and per length third;
- ``targets``: the run's targets as the run reported them (met / missed / missing).

    python bench/run_story.py runs/tiny-cpu/manifest.json [--tables stages,checkpoints,gap] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

BUCKETS = ("easy", "medium", "hard")
THIRDS = ("short", "mid", "long")
TABLES = ("stages", "checkpoints", "buckets", "gap", "targets")


def eval_rows(manifest: dict) -> dict[str, dict[str, float]]:
    """``{checkpoint: {key under eval/: value}}`` from the manifest's last eval stage, the input last."""
    stages = [s for s in manifest["stages"] if s["kind"] == "eval"]
    if not stages:
        raise SystemExit("the manifest has no eval stage")
    stage = stages[-1]
    summary = stage["summary"]
    rows: dict[str, dict[str, float]] = {}
    for key, v in summary.items():
        if key.startswith("compare/"):
            _, name, rest = key.split("/", 2)
            rows.setdefault(name, {})[rest] = v
    compare = stage["inputs"].get("compare") or {}
    input_name = next((n for n, uri in compare.items() if uri == stage["inputs"]["init_uri"]), "input")
    rows[input_name] = {k.removeprefix("eval/"): v for k, v in summary.items() if k.startswith("eval/")}
    stage_order = [s["name"] for s in manifest["stages"]]  # the run's order (the manifest sorts its keys)
    order = [*(n for n in stage_order if n in rows), *(n for n in rows if n not in stage_order)]
    return {n: rows[n] for n in order if n in rows}


def cell(v, digits: int = 3) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return (
            f"{v:.{digits}g}" if abs(v) < 1e-2 or abs(v) >= 1e3 else f"{v:.{digits}f}".rstrip("0").rstrip(".")
        )
    return str(v)


def table(head: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    lines += ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def stages_table(manifest: dict) -> str:
    rows = []
    for s in manifest["stages"]:
        m = s["summary"]
        rows.append(
            [
                s["name"],
                s["kind"],
                s["stop_reason"],
                s["steps"],
                round(s["wall_s"] / 60, 1),
                m.get("ratio/p99"),
                m.get("ratio/p99_median"),
                m.get("ratio/max"),
            ]
        )
    return table(
        ["stage", "kind", "stop", "steps", "wall min", "ratio p99", "ratio p99 median", "ratio max"], rows
    )


def tiers_of(rows: dict) -> list[str]:
    """The tagged tiers the eval measured: the heads of ``<tier>/accuracy`` and ``<tier>/<bucket>/accuracy``
    keys that are not difficulty buckets themselves."""
    heads = set()
    for r in rows.values():
        for key in r:
            parts = key.split("/")
            if parts[-1] == "accuracy" and (len(parts) == 2 or (len(parts) == 3 and parts[1] in BUCKETS)):
                heads.add(parts[0])
    return sorted(heads - set(BUCKETS))


def checkpoints_table(rows: dict) -> str:
    keys = [
        ("accuracy", "pass@1"),
        ("trace_rate", "trace rate"),
        ("len_mean", "mean length"),
        ("len_p95", "length p95"),
    ]
    tiers = tiers_of(rows)
    keys += [
        (f"{t}/within_budget", f"{t} within budget")
        for t in tiers
        if any(f"{t}/within_budget" in r for r in rows.values())
    ]
    keys += [
        ("contrast/hard/accuracy_gap", "hard: deep - fast pass@1"),
        ("contrast/hard/len_ratio", "hard: deep / fast length"),
        ("contrast/easy/len_ratio", "easy: deep / fast length"),
    ]
    keys = [(k, label) for k, label in keys if any(k in r for r in rows.values())]
    return table(
        ["checkpoint", *(label for _, label in keys)],
        [[n, *(r.get(k) for k, _ in keys)] for n, r in rows.items()],
    )


def buckets_table(rows: dict) -> str:
    heads = [("", "untagged"), *((f"{t}/", t) for t in tiers_of(rows))]
    out = []
    for n, r in rows.items():
        for prefix, label in heads:
            acc = [r.get(f"{prefix}{b}/accuracy") for b in BUCKETS]
            length = [r.get(f"{prefix}{b}/len_mean") for b in BUCKETS]
            cwb = [r.get(f"{prefix}{b}/correct_within_budget") for b in BUCKETS]
            if all(v is None for v in acc):
                continue
            out.append(
                [
                    n,
                    label,
                    *(f"{cell(a)} / {cell(length_)}" for a, length_ in zip(acc, length, strict=True)),
                    " / ".join(cell(c) for c in cwb) if any(c is not None for c in cwb) else "-",
                ]
            )
    return table(
        [
            "checkpoint",
            "prompts",
            *(f"{b}: pass@1 / length" for b in BUCKETS),
            "correct within budget (easy / medium / hard)",
        ],
        out,
    )


def gap_table(rows: dict) -> str:
    policies = sorted({k.split("/")[1] for r in rows.values() for k in r if k.startswith("gap/")})
    out = []
    for n, r in rows.items():
        for p in policies:
            g = f"gap/{p}/"
            if f"{g}ratio/p99" not in r:
                continue
            out.append(
                [
                    n,
                    p,
                    r.get(f"{g}ratio/p99"),
                    r.get(f"{g}ratio/max"),
                    r.get(f"{g}seq_abs_log_ratio"),
                    *(r.get(f"{g}{t}/seq_abs_log_ratio") for t in THIRDS),
                    *(r.get(f"{g}{t}/ratio/p99") for t in THIRDS),
                ]
            )
    return table(
        [
            "checkpoint",
            "policy",
            "token p99",
            "token max",
            "seq drift",
            *(f"drift {t}" for t in THIRDS),
            *(f"p99 {t}" for t in THIRDS),
        ],
        out,
    )


def targets_table(manifest: dict) -> str:
    return table(
        ["target", "expression", "value", "against", "status"],
        [
            [t["name"], f"`{t['expr']}`", t["left"], t["right"], t["status"]]
            for t in manifest.get("targets", [])
        ],
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("manifest", type=Path)
    p.add_argument("--tables", default=",".join(TABLES), help=f"comma-separated, of {', '.join(TABLES)}")
    p.add_argument("--json", action="store_true", help="the eval rows per checkpoint as JSON")
    args = p.parse_args()
    manifest = json.loads(args.manifest.read_text())
    rows = eval_rows(manifest)
    if args.json:
        print(json.dumps(rows, indent=1, sort_keys=True))
        return 0
    wanted = [t.strip() for t in args.tables.split(",") if t.strip()]
    if unknown := [t for t in wanted if t not in TABLES]:
        raise SystemExit(f"--tables: unknown {unknown}; choose from {', '.join(TABLES)}")
    render = {
        "stages": lambda: stages_table(manifest),
        "checkpoints": lambda: checkpoints_table(rows),
        "buckets": lambda: buckets_table(rows),
        "gap": lambda: gap_table(rows),
        "targets": lambda: targets_table(manifest),
    }
    print("\n\n".join(f"### {name}\n\n{render[name]()}" for name in wanted))
    return 0


if __name__ == "__main__":
    sys.exit(main())
