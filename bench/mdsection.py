"""Write one benchmark's results into a markdown file between ``<!-- bench:NAME -->`` markers.

Each benchmark owns its block; rerunning it replaces the block and leaves the rest of the file alone.
"""

from __future__ import annotations

from pathlib import Path


def write_section(path: Path, name: str, body: str, title: str = "# Benchmarks") -> None:
    """Replace (or append) the block between ``<!-- bench:name -->`` markers in ``path``."""
    path = Path(path)
    start, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    text = path.read_text() if path.exists() else f"{title}\n"
    block = f"{start}\n{body.rstrip()}\n{end}"
    if start in text and end in text:
        text = text[: text.index(start)] + block + text[text.index(end) + len(end):]
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
