"""Gates and caching through the local runner: a failing gate stops the run, a re-run reuses what is
committed."""

from pathlib import Path

import pytest
import yaml
from pipeline_kit import fake_calls, load, manifest, staged_config

from ringzero.cli.main import main
from ringzero.pipeline.local import run_pipeline
from ringzero.store import open_store

pytestmark = pytest.mark.usefixtures("fake_runners")
ALL = ["base", "stage1", "distill", "stage2", "eval"]


def run(config: Path):
    cfg = load(config)
    return run_pipeline(cfg, open_store(cfg.storage.root, cfg.storage.s3), Path(cfg.run.run_dir)), Path(
        cfg.run.run_dir
    )


def committed_outcomes(root: Path) -> int:
    return len(list((root / "store" / "stages").glob("*/outcome.json")))


def test_a_passing_gate_lets_every_stage_run_in_order(tmp_path):
    result, run_dir = run(staged_config(tmp_path, stage1_gate=["reward/mean >= 0.2", "gap/ratio/p99 <= 0.5"]))
    assert result.status == "succeeded" and result.failed_gate is None
    assert [c["stage"] for c in fake_calls(run_dir)] == ALL
    doc = manifest(run_dir)
    assert doc["status"] == "succeeded" and [s["name"] for s in doc["stages"]] == ALL
    stage1 = doc["stages"][1]
    assert stage1["gate"] == {
        "passed": True,
        "reasons": [
            "pass: reward/mean = 0.45 satisfies reward/mean >= 0.2",
            "pass: gap/ratio/p99 = 0.008 satisfies gap/ratio/p99 <= 0.5",
        ],
    }


def test_a_failing_gate_stops_the_run_with_its_reasons_and_nothing_downstream_runs(tmp_path, capsys):
    config = staged_config(tmp_path, stage1_gate=["reward/mean >= 0.2", "gap/ratio/p99 <= 0.005"])
    assert main(["run", str(config)]) == 3
    run_dir = tmp_path / "run"
    assert [c["stage"] for c in fake_calls(run_dir)] == ["base", "stage1"]
    assert committed_outcomes(tmp_path) == 2  # nothing downstream was even started
    doc = manifest(run_dir)
    assert doc["status"] == "gate_failed" and [s["name"] for s in doc["stages"]] == ["base", "stage1"]
    assert doc["stages"][1]["gate"] == {
        "passed": False,
        "reasons": [
            "pass: reward/mean = 0.45 satisfies reward/mean >= 0.2",
            "FAIL: gap/ratio/p99 = 0.008 violates gap/ratio/p99 <= 0.005",
        ],
    }
    out = capsys.readouterr().out
    assert "gate failed after stage 'stage1'; nothing promoted" in out
    assert "FAIL: gap/ratio/p99 = 0.008 violates gap/ratio/p99 <= 0.005" in out
    assert (run_dir / "report.html").exists()


def test_a_rerun_skips_every_committed_stage(tmp_path):
    config = staged_config(tmp_path)
    first, run_dir = run(config)
    second, _ = run(config)
    assert [c["stage"] for c in fake_calls(run_dir)] == ALL  # the second run called no runner
    assert [ex.skipped for ex in first.stages] == [False] * 5 and [ex.skipped for ex in second.stages] == [
        True
    ] * 5
    assert [ex.outcome.output_uri for ex in second.stages] == [ex.outcome.output_uri for ex in first.stages]
    assert (
        second.stages[-1].outcome.extra == first.stages[-1].outcome.extra
    )  # the eval table survives caching
    assert [s["skipped"] for s in manifest(run_dir)["stages"]] == [True] * 5


def test_changing_a_stage_reruns_it_and_everything_downstream_only(tmp_path):
    config = staged_config(tmp_path)
    run(config)
    data = yaml.safe_load(config.read_text())
    data["stages"][3]["steps"] = 5  # stage2
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    result, run_dir = run(config)
    assert [ex.skipped for ex in result.stages] == [True, True, True, False, False]
    assert [c["stage"] for c in fake_calls(run_dir)] == [*ALL, "stage2", "eval"]


def test_tightening_a_gate_on_a_rerun_stops_the_run_without_rerunning_the_stage(tmp_path):
    config = staged_config(tmp_path)
    run(config)
    result, run_dir = run(staged_config(tmp_path, stage1_gate=["len/mean <= 50"]))
    assert result.status == "gate_failed" and result.failed_gate.name == "stage1"
    assert result.failed_gate.skipped and result.failed_gate.gate.reasons == [
        "FAIL: len/mean = 70 violates len/mean <= 50"
    ]
    assert [c["stage"] for c in fake_calls(run_dir)] == ALL
    assert manifest(run_dir)["status"] == "gate_failed"
