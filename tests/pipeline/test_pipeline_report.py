"""The run report: what it shows for a finished and a gate-stopped run, and that Chromium renders it."""

import html
from pathlib import Path

import pytest
from chromium_kit import render, screenshot
from html_kit import elements, parse, table_with_header
from pipeline_kit import load, staged_config

from ringzero.pipeline import report_plots as plots
from ringzero.pipeline.local import run_pipeline
from ringzero.pipeline.summary import print_summary, write_outputs
from ringzero.store import open_store

pytestmark = pytest.mark.usefixtures("fake_runners")
RL_STEPS = 6
CURVE_KEYS = [
    "reward/mean",
    "trace/rate",
    "len/mean",
    "gap/ratio/p99",
    "gap/ratio/max",
    "ratio/p99",
    "ratio/max",
]


def finished_run(tmp_path: Path, gate: list[str] | None = None) -> tuple[Path, str]:
    cfg = load(staged_config(tmp_path, stage1_gate=gate, rl_steps=RL_STEPS))
    run_dir = Path(cfg.run.run_dir)
    result = run_pipeline(cfg, open_store(cfg.storage.root, cfg.storage.s3), run_dir)
    path = write_outputs(cfg, result, run_dir)
    assert path == run_dir / "report.html"
    return path, path.read_text()


def stage_lines(doc, metric: str) -> dict[str, int]:
    """Stage -> number of points of its line in the plot of ``metric``."""
    (figure_index,) = [
        i for i, (t, a) in enumerate(doc.elements) if t == "figure" and a.get("data-metric") == metric
    ]
    lines, stage = {}, None
    for tag, attrs in doc.elements[figure_index + 1 :]:
        if tag == "figure":
            break
        if tag == "g" and "data-stage" in attrs:
            stage = attrs["data-stage"]
        if tag == "polyline":
            lines[stage] = len(attrs["points"].split())
    return lines


def test_a_finished_run_reports_every_stage_gate_curve_and_the_checkpoint_comparison(tmp_path):
    _, text = finished_run(tmp_path, gate=["reward/mean >= 0.2", "gap/ratio/p99 <= 0.5"])
    doc = parse(text)
    rows = table_with_header(doc, "stage")
    assert [r["stage"] for r in rows] == ["base", "stage1", "distill", "stage2", "eval"]
    assert all(r["status"] == "ran" and r["gate"] == "pass" for r in rows)
    stage1 = rows[1]
    # The fake RL stage's last step: reward 0.3 + 0.05*5, length 40 + 10*5.
    assert (stage1["steps"], stage1["reward"], stage1["length"], stage1["stop"]) == (
        "6",
        "0.55",
        "90",
        "max_steps",
    )
    assert "pass: reward/mean = 0.55 satisfies reward/mean >= 0.2" in html.unescape(text)
    # One plot per curve; each stage that logged a metric draws one line with a point per step.
    assert [a["data-metric"] for a in elements(doc, "figure") if "data-metric" in a] == CURVE_KEYS
    assert stage_lines(doc, "reward/mean") == {"stage1": RL_STEPS, "stage2": RL_STEPS}
    assert stage_lines(doc, "len/mean") == {"stage1": RL_STEPS, "distill": 2, "stage2": RL_STEPS}
    comparison = {r["metric"]: r for r in table_with_header(doc, "metric")}
    assert list(comparison) == ["greedy accuracy", "pass@4"]
    assert list(comparison["pass@4"]) == ["metric", "base", "stage1", "distill", "stage2", "input"]
    assert comparison["greedy accuracy"]["base"] == "0.5" and comparison["pass@4"]["input"] == "1"


def test_the_report_needs_nothing_from_the_network(tmp_path):
    _, text = finished_run(tmp_path)
    doc = parse(text)
    fetching = [(t, a) for t, a in doc.elements if {"src", "href"} & set(a) or t in ("link", "iframe", "img")]
    assert fetching == []
    assert "url(" not in text and "@import" not in text


def test_a_failed_gate_is_shown_with_its_reasons_and_the_stages_it_kept_from_running(tmp_path):
    _, text = finished_run(tmp_path, gate=["gap/ratio/p99 <= 0.005"])
    doc = parse(text)
    assert "gate_failed" in text
    assert "The gate after stage <code>stage1</code> failed" in text
    assert "FAIL: gap/ratio/p99 = 0.01 violates gap/ratio/p99 <= 0.005" in html.unescape(text)
    rows = {r["stage"]: r for r in table_with_header(doc, "stage")}
    assert rows["stage1"]["gate"] == "FAIL"
    assert [rows[n]["status"] for n in ("distill", "stage2", "eval")] == ["not run"] * 3
    assert set(stage_lines(doc, "ratio/p99")) == set(stage_lines(doc, "gap/ratio/p99")) == {"stage1"}


def test_chromium_renders_the_report_with_its_plots_and_no_console_errors(tmp_path):
    path, text = finished_run(tmp_path, gate=["reward/mean >= 0.2"])
    page = render(path, tmp_path / "profile")
    assert page.console == []
    dom = parse(page.dom)
    (body,) = elements(dom, "body")
    # Set by the page's script after it wired the legend: the script ran to its end and saw every plot.
    assert body.get("data-ready") == "1" and body.get("data-plots") == str(len(CURVE_KEYS))
    assert len(elements(dom, "polyline")) == len(elements(parse(text), "polyline")) == 15
    assert len(elements(dom, "button")) == 3  # legend: stage1, distill, stage2
    shot = screenshot(path, tmp_path / "profile-shot", tmp_path / "report.png")
    assert shot.stat().st_size > 10_000  # a blank page compresses to a few hundred bytes


def test_the_render_check_sees_script_errors(tmp_path):
    """The console check above is only meaningful if a broken page fails it."""
    broken = tmp_path / "broken.html"
    broken.write_text(
        "<!doctype html><body><script>document.body.dataset.ready = missing.value;</script></body>"
    )
    page = render(broken, tmp_path / "profile")
    assert len(page.console) == 1 and "missing is not defined" in page.console[0]
    assert elements(parse(page.dom), "body")[0].get("data-ready") is None


# --- plots ------------------------------------------------------------------------------------------------


def test_series_keeps_the_last_value_per_step_and_drops_values_it_cannot_plot():
    records = [
        {"step": 0, "len/mean": 1.0},
        {"step": 1, "len/mean": 1e308},
        {"step": 2, "len/mean": None},
        {"step": 3},
        {"step": 0, "len/mean": 5.0},
        {"step": 4, "len/mean": 2},
    ]
    assert plots.series(records, "len/mean") == [(0, 5.0), (4, 2.0)]


@pytest.mark.parametrize(
    ("lo", "hi", "ticks"),
    [
        (0.0, 1.0, [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]),
        (0.03, 0.97, [0.2, 0.4, 0.6, 0.8]),
        (-3.0, 7.0, [-2.0, 0.0, 2.0, 4.0, 6.0]),
        (120.0, 480.0, [200.0, 300.0, 400.0]),
    ],
)
def test_axis_ticks_are_round_numbers_inside_the_range(lo, hi, ticks):
    assert plots.nice_ticks(lo, hi) == pytest.approx(ticks)


def test_a_plot_puts_the_extremes_on_the_edges_and_lays_stages_side_by_side():
    svg = plots.line_plot(
        "len",
        "len/mean",
        [
            plots.Segment("a", "#000", [(0, 10.0), (4, 20.0)]),
            plots.Segment("b", "#111", []),
            plots.Segment("c", "#222", [(10, 15.0), (11, 15.0)]),
        ],
    )
    doc = parse(svg)
    a_line, c_line = (a["points"].split() for a in elements(doc, "polyline"))
    xs = [float(p.split(",")[0]) for p in a_line + c_line]
    ys = [float(p.split(",")[1]) for p in a_line + c_line]
    assert xs == sorted(xs) and len(set(xs)) == 4  # c starts right of a, whatever its own step numbers
    plot_h = plots.HEIGHT - plots.MARGIN_TOP - plots.MARGIN_BOTTOM
    pad = plot_h * 0.05 / 1.1  # the y range is padded by 5% of the data range on each side
    assert ys[0] == pytest.approx(plots.HEIGHT - plots.MARGIN_BOTTOM - pad, abs=0.1)  # 10: the minimum
    assert ys[1] == pytest.approx(plots.MARGIN_TOP + pad, abs=0.1)  # 20: the maximum
    assert [g["data-stage"] for g in elements(doc, "g")] == ["a", "c"]  # b logged nothing: no room taken


def test_the_console_summary_shows_every_stage_and_the_comparison(tmp_path, capsys):
    cfg = load(staged_config(tmp_path, rl_steps=RL_STEPS))
    result = run_pipeline(cfg, open_store(cfg.storage.root, cfg.storage.s3), Path(cfg.run.run_dir))
    capsys.readouterr()
    print_summary(result)
    lines = capsys.readouterr().out.splitlines()
    stage1 = [
        c.strip() for c in next(line for line in lines if line.startswith("│ stage1")).strip("│").split("│")
    ]
    del stage1[5]  # wall seconds: measured, not asserted
    assert stage1 == [
        "stage1",
        "rl",
        "ran",
        "max_steps",
        "6",
        "0.55",
        "-",
        "-",
        "1",
        "90",
        "0.01",
        "0.75",
        "0.03",
        "-",
        "3.5",
        "pass",
    ]  # the fake RL runner keeps no per-step p99s, so no ratio p99 median
    pass_at_4 = next(line for line in lines if line.startswith("│ pass@4"))
    assert [c.strip() for c in pass_at_4.strip("│").split("│")] == ["pass@4", "0.6", "0.7", "0.8", "0.9", "1"]
