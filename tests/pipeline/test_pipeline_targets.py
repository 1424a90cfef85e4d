"""Run targets: evaluated over what the run left, printed, written to the manifest and the report, and never
stopping a run or changing a stage's identity."""

from pathlib import Path

import pytest
import yaml
from html_kit import parse, table_with_header
from pipeline_kit import load, manifest, staged_config

from ringzero.cli.main import main
from ringzero.config import load_config
from ringzero.config.targets import parse_expr
from ringzero.pipeline.identity import stage_hash
from ringzero.pipeline.local import resolve_inputs, run_pipeline
from ringzero.pipeline.summary import print_summary
from ringzero.pipeline.targets import RunValues, evaluate_targets
from ringzero.store import open_store

TINY = Path(__file__).resolve().parents[2] / "configs" / "tiny-cpu.yaml"
SUMMARIES = {
    "stage1": {"len/mean": 90.0, "reward/mean": 0.5},
    "distill": {"len/mean": 60.0},
    "eval": {
        "eval/accuracy": 0.9,
        "compare/stage2/accuracy": 0.92,
        "compare/stage1/len_mean": 100.0,
        "eval/nan": float("nan"),
    },
}
STEPS = {"stage1": {5: {"step": 5, "len/mean": 50.0}}}


def judge(expr: str, wall_minutes: float | None = 10.0):
    (result,) = evaluate_targets([parse_expr(expr)], RunValues(SUMMARIES, STEPS, wall_minutes))
    return result.status, result.left, result.right, result.missing


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("eval.eval/accuracy >= 0.90", ("met", 0.9, 0.9, [])),
        ("eval.eval/accuracy > 0.90", ("missed", 0.9, 0.9, [])),
        # scale and offset apply to their side: 0.92 - 0.03 = 0.89
        ("eval.eval/accuracy >= eval.compare/stage2/accuracy - 0.03", ("met", 0.9, pytest.approx(0.89), [])),
        (
            "eval.eval/accuracy >= eval.compare/stage2/accuracy + 0.03",
            ("missed", 0.9, pytest.approx(0.95), []),
        ),
        ("distill.len/mean <= 0.70 * eval.compare/stage1/len_mean", ("met", 60.0, pytest.approx(70.0), [])),
        (
            "distill.len/mean <= 0.5 * eval.compare/stage1/len_mean + 5",
            ("missed", 60.0, pytest.approx(55.0), []),
        ),
        ("2 * stage1.len/mean - 1 == 179", ("met", 179.0, 179.0, [])),
        # a metric at a step, from the stage's records
        ("stage1.len/mean >= 1.5 * stage1.len/mean@step5", ("met", 90.0, 75.0, [])),
        ("stage1.len/mean >= 2 * stage1.len/mean@step5", ("missed", 90.0, 100.0, [])),
        ("run.wall_minutes <= 12", ("met", 10.0, 12.0, [])),
        # whatever cannot be read is missing, never met, even where the comparison would hold
        (
            "stage1.len/mean >= 1.5 * stage1.len/mean@step6",
            ("missing", 90.0, None, ["stage1.len/mean@step6"]),
        ),
        ("eval.compare/tier/accuracy >= 0", ("missing", None, 0.0, ["eval.compare/tier/accuracy"])),
        (
            "stage2.len/mean >= stage9.len/mean",
            ("missing", None, None, ["stage2.len/mean", "stage9.len/mean"]),
        ),
        ("eval.eval/nan <= 1", ("missing", None, 1.0, ["eval.eval/nan"])),
    ],
)
def test_a_target_is_met_missed_or_missing(expr, expected):
    assert judge(expr) == expected


def test_the_wall_time_is_missing_until_every_stage_is_there():
    assert judge("run.wall_minutes <= 12", wall_minutes=None) == ("missing", None, 12.0, ["run.wall_minutes"])


# -- through the local runner, with the fake stage runners ---------------------------------------------------

# The fake RL stage's length is 40 + 10 x step (steps 0 to 3), its summary the last step's; the fake eval's
# input row has accuracy 0.9 and its summary no compare/ keys.
TARGETS = [
    "stage1.len/mean >= 1.5 * stage1.len/mean@step0",
    "stage1.len/mean >= 1.5 * stage1.len/mean@step1",
    {"name": "eval accurate", "expr": "eval.eval/accuracy >= 0.85"},
    "eval.compare/stage1/accuracy >= 0.9",
    "run.wall_minutes <= 12",
]
VERDICTS = ["met", "missed", "met", "missing", "met"]


@pytest.mark.usefixtures("fake_runners")
def test_the_console_manifest_and_report_show_every_target_and_the_exit_status_stays(tmp_path, capsys):
    config = staged_config(tmp_path, targets=TARGETS)
    assert main(["run", str(config)]) == 0  # a missed and a missing target: the run still succeeds
    out = capsys.readouterr().out
    assert out.index("stages") < out.index("targets (3 met, 1 missed, 1 missing)")
    rows = {
        line.split("│")[1].strip(): [c.strip() for c in line.strip("│").split("│")]
        for line in out.splitlines()
        if line.startswith("│ ")
    }
    assert rows["stage1.len/mean >= 1.5 * stage1.len/mean@step0"] == [
        "stage1.len/mean >= 1.5 * stage1.len/mean@step0",
        "70",
        "60",
        "met",
    ]
    assert rows["stage1.len/mean >= 1.5 * stage1.len/mean@step1"][1:] == ["70", "75", "missed"]
    assert rows["eval accurate: eval.eval/accuracy >= 0.85"][1:] == ["0.9", "0.85", "met"]
    assert rows["eval.compare/stage1/accuracy >= 0.9"][1:] == [
        "-",
        "0.9",
        "missing (eval.compare/stage1/accuracy)",
    ]

    doc = manifest(tmp_path / "run")
    assert doc["status"] == "succeeded"
    assert [(t["name"], t["status"]) for t in doc["targets"]] == [
        (t if isinstance(t, str) else t["name"], v) for t, v in zip(TARGETS, VERDICTS, strict=True)
    ]
    assert doc["targets"][2] == {
        "name": "eval accurate",
        "expr": "eval.eval/accuracy >= 0.85",
        "left": 0.9,
        "right": 0.85,
        "status": "met",
        "missing": [],
    }

    page = parse((tmp_path / "run" / "report.html").read_text())
    shown = table_with_header(page, "target")
    assert [r["result"].split()[0] for r in shown] == VERDICTS
    assert shown[1]["left"] == "70" and shown[1]["right"] == "75"


@pytest.mark.usefixtures("fake_runners")
def test_a_gate_stopped_run_leaves_the_targets_it_never_reached_missing(tmp_path):
    cfg = load(staged_config(tmp_path, stage1_gate=["reward/mean >= 0.9"], targets=TARGETS))
    result = run_pipeline(cfg, open_store(cfg.storage.root, cfg.storage.s3), Path(cfg.run.run_dir))
    assert result.status == "gate_failed"
    # stage1 ran, eval did not, and the run's wall time is not the whole run's
    assert [t.status for t in result.targets] == ["met", "missed", "missing", "missing", "missing"]
    assert [t["status"] for t in manifest(tmp_path / "run")["targets"]] == [t.status for t in result.targets]


@pytest.mark.usefixtures("fake_runners")
def test_adding_targets_reruns_nothing_and_cached_stages_still_answer_them(tmp_path, capsys):
    first = run_pipeline(*_run_args(staged_config(tmp_path)))
    assert first.targets == []
    capsys.readouterr()
    second = run_pipeline(*_run_args(staged_config(tmp_path, targets=TARGETS)))
    assert [ex.skipped for ex in second.stages] == [True] * 5
    assert [ex.stage_hash for ex in second.stages] == [ex.stage_hash for ex in first.stages]
    assert [t.status for t in second.targets] == VERDICTS  # summaries, records and wall time from the store
    assert second.targets[4].left == pytest.approx(sum(ex.outcome.wall_s for ex in first.stages) / 60)
    print_summary(second)
    assert "targets (3 met, 1 missed, 1 missing)" in capsys.readouterr().out


def test_targets_change_no_stage_identity_of_the_tiny_config(tmp_path):
    plain = load_config(TINY)
    path = tmp_path / "tiny-targets.yaml"
    data = yaml.safe_load(TINY.read_text())
    data["targets"] = [
        "eval.compare/stage1/accuracy >= 0.90",
        "stage1.len/mean >= 1.5 * stage1.len/mean@step5",
        {"name": "fast", "expr": "run.wall_minutes <= 12"},
    ]
    path.write_text(yaml.safe_dump(data))
    targeted = load_config(path)
    assert len(targeted.targets) == 3
    assert _hashes(targeted) == _hashes(plain)


def _hashes(cfg) -> list[str]:
    """Every stage's identity, its inputs named by the producers' identities as the runner would give them."""
    out, done = [], {}
    for stage in cfg.stages:
        inputs = resolve_inputs(stage, done)
        h = stage_hash(cfg, stage, inputs)
        out.append(h)
        done[stage.name] = _Done(
            stage.kind, f"file://store/stages/{h[:16]}/final" if stage.kind != "eval" else None
        )
    return out


class _Done:
    """What resolve_inputs reads of an executed stage."""

    def __init__(self, kind, uri):
        self.kind = kind
        self.outcome = type("Outcome", (), {"output_uri": uri})()


def _run_args(config: Path):
    cfg = load(config)
    return cfg, open_store(cfg.storage.root, cfg.storage.s3), Path(cfg.run.run_dir)
