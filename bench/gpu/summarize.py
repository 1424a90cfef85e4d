"""One JSON and one Markdown table of a GPU check: every phase's JSON in OUT folded into ``gpu.json`` and
its scalar figures listed in ``gpu.md`` (phase, figure, value), with the hardware the run saw.

    python bench/gpu/summarize.py OUT
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

PHASES = ("stage_steps", "gap_checks", "megatron_check", "decode_graphs")


def scalars(node, prefix=""):
    """(dotted path, value) of every number, string or bool in a JSON document."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from scalars(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from scalars(value, f"{prefix}[{i}]")
    elif isinstance(node, (int, float, str, bool)) or node is None:
        yield prefix, node


def hardware() -> dict:
    try:
        import torch
    except ImportError:
        return {}
    out = {"torch": torch.__version__, "cuda": torch.version.cuda}
    if torch.cuda.is_available():
        out["device"] = torch.cuda.get_device_name(0)
    return out


def main(argv: list[str]) -> int:
    out = Path(argv[0])
    doc = {"hardware": hardware(), "phases": {}}
    for phase in PHASES:
        path = out / f"{phase}.json"
        doc["phases"][phase] = json.loads(path.read_text()) if path.exists() else {"missing": True}
    (out / "gpu.json").write_text(json.dumps(doc, indent=1, default=str))
    rows = ["| phase | figure | value |", "| --- | --- | --- |"]
    rows += [f"| hardware | {k} | {v} |" for k, v in doc["hardware"].items()]
    for phase, body in doc["phases"].items():
        for key, value in scalars(body):
            rows.append(f"| {phase} | {key} | {value} |")
    (out / "gpu.md").write_text("\n".join(rows) + "\n")
    print(f"wrote {out / 'gpu.json'} and {out / 'gpu.md'} ({len(rows) - 2} figures)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
