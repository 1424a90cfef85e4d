"""The page around the report's content: styles, the one small script, and table markup.

Everything is inline (no CDN, no web fonts): the report is opened from disk, from an artifact store or
inside the Kubeflow UI's sandboxed frame, none of which may reach the network. The script only toggles
a stage's lines when its legend entry is clicked, and marks the page ready for the render test.
"""

from __future__ import annotations

import html

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 1.5em auto; max-width: 1400px;
       padding: 0 1em; color: #222; }
h1 { margin-bottom: 0.2em; } h2 { margin-top: 1.6em; border-bottom: 1px solid #ddd; padding-bottom: 0.2em; }
.muted { color: #777; } code { font-size: 0.9em; }
.status { display: inline-block; padding: 0.1em 0.6em; border-radius: 0.3em; font-weight: 600; color: #fff; }
.status.succeeded, .gate.pass { background: #2e7d32; }
.status.gate_failed, .gate.fail { background: #c62828; }
.status.running, .status.failed { background: #ef6c00; }
.gate { display: inline-block; padding: 0 0.5em; border-radius: 0.3em; color: #fff; font-size: 0.85em; }
.target { display: inline-block; padding: 0 0.5em; border-radius: 0.3em; color: #fff; font-size: 0.85em; }
.target.met { background: #2e7d32; } .target.missed { background: #c62828; }
.target.missing { background: #9e9e9e; }
.banner { background: #fdecea; border: 1px solid #c62828; padding: 0.6em 1em; border-radius: 0.3em; }
table { border-collapse: collapse; font-size: 0.9em; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: right; white-space: nowrap; }
th { background: #f5f5f5; } td.text, th.text { text-align: left; }
tr.not-run td { color: #999; font-style: italic; }
.legend { margin: 0.5em 0; } .legend button { border: 1px solid #ccc; background: #fff; margin-right: 0.4em;
  padding: 0.15em 0.6em; border-radius: 1em; cursor: pointer; }
.legend button.off { opacity: 0.35; } .swatch { display: inline-block; width: 0.8em; height: 0.8em;
  border-radius: 50%; margin-right: 0.3em; vertical-align: middle; }
.plots { display: flex; flex-wrap: wrap; gap: 0.5em 1.5em; }
figure.plot { margin: 0; } figcaption { font-weight: 600; font-size: 0.9em; }
svg .frame { fill: #fcfcfc; stroke: #bbb; } svg .grid { stroke: #eee; } svg .boundary { stroke: #999;
  stroke-dasharray: 3 3; } svg polyline { fill: none; stroke-width: 1.6; }
svg text { font-size: 10px; fill: #555; } svg .stage-label { font-size: 10px; font-weight: 600; }
svg .axis { fill: #777; } .series.hidden { display: none; }
ul.reasons { margin: 0.2em 0 0.8em 0; } li.fail { color: #c62828; font-weight: 600; }
details { margin: 0.3em 0; } .scroll { overflow-x: auto; } summary { cursor: pointer; }
"""

# Legend entries toggle every element carrying their stage in data-stage; a stage hidden on one plot
# is hidden on all, so two stages can be compared without the others' scales in the way.
SCRIPT = """
(function () {
  var buttons = document.querySelectorAll('.legend button[data-stage]');
  buttons.forEach(function (b) {
    b.addEventListener('click', function () {
      var off = b.classList.toggle('off');
      document.querySelectorAll('.series[data-stage="' + b.dataset.stage + '"]').forEach(function (g) {
        g.classList.toggle('hidden', off);
      });
    });
  });
  document.body.dataset.plots = String(document.querySelectorAll('figure.plot svg').length);
  document.body.dataset.ready = '1';
})();
"""


def page(title: str, body: str) -> str:
    return (
        "<!doctype html>\n<html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head>\n<body>\n{body}\n"
        f"<script>{SCRIPT}</script>\n</body></html>\n"
    )


def table(
    headers: list[str],
    rows: list[list[str]],
    text_columns: int = 1,
    row_classes: list[str] | None = None,
    caption: str | None = None,
) -> str:
    """An HTML table of already-escaped cells; the first ``text_columns`` columns are left-aligned."""

    def cell(tag: str, i: int, v: str) -> str:
        return f"<{tag} class='text'>{v}</{tag}>" if i < text_columns else f"<{tag}>{v}</{tag}>"

    head = "".join(cell("th", i, html.escape(h)) for i, h in enumerate(headers))
    classes = row_classes or [""] * len(rows)
    body = "".join(
        f"<tr class='{c}'>" + "".join(cell("td", i, v) for i, v in enumerate(r)) + "</tr>"
        for r, c in zip(rows, classes, strict=True)
    )
    cap = f"<caption>{html.escape(caption)}</caption>" if caption else ""
    return f"<table>{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def legend(stages: list[tuple[str, str]]) -> str:
    """Clickable stage legend: ``(name, colour)`` pairs."""
    items = "".join(
        f"<button type='button' data-stage='{html.escape(n)}'><span class='swatch' "
        f"style='background:{c}'></span>"
        f"{html.escape(n)}</button>"
        for n, c in stages
    )
    return f"<div class='legend'>{items} <span class='muted'>(click a stage to hide or show it)</span></div>"
