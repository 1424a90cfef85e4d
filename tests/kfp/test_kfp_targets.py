"""The final-status step evaluates the run's targets over the stages the manifest recorded: into the
manifest, its Markdown summary and the run report; the run's status is the gates' alone."""

import json
from dataclasses import asdict

import pytest
import yaml
from kfp_kit import micro_config

from ringzero.kfp import tasks
from ringzero.kfp.manifest import open_run_manifest
from ringzero.kfp.settings import load_kfp_config
from ringzero.pipeline.execute import ExecutedStage, metrics_key, outcome_key
from ringzero.pipeline.gates import GateResult
from ringzero.stages.base import StageInputs, StageOutcome
from ringzero.store import open_store

pytestmark = pytest.mark.xdist_group("kfp")
TARGETS = [
    "stage1.len/mean >= 1.5 * stage1.len/mean@step1",
    {"name": "long", "expr": "stage1.len/mean >= 100"},
    "eval.compare/stage1/accuracy >= 0.9",
    "run.wall_minutes <= 12",
]


class Artifact:
    def __init__(self, path):
        self.path = str(path)


def test_the_final_status_step_reports_the_targets_of_the_stages_recorded(tmp_path):
    path = micro_config(tmp_path, gate=[])
    data = yaml.safe_load(path.read_text())
    data["targets"] = TARGETS
    path.write_text(yaml.safe_dump(data))
    cfg = load_kfp_config(path)[0]
    store = open_store(cfg.storage.root, cfg.storage.s3)
    # stage1 committed by its step (length 20 at step 1, 60 at the end); the run then failed
    outcome = StageOutcome(
        output_uri="file:///s/ckpt", summary={"len/mean": 60.0}, stop_reason="max_steps", steps=2, wall_s=30.0
    )
    ex = ExecutedStage(
        "stage1",
        "rl",
        "cd" * 32,
        StageInputs(),
        outcome,
        GateResult(True, ["no gate configured"]),
        False,
        [{"step": 1, "len/mean": 20.0}, {"step": 2, "len/mean": 60.0}],
    )
    store.put_json(outcome_key(ex.stage_hash), asdict(outcome))
    store.put_bytes(metrics_key(ex.stage_hash), "".join(json.dumps(r) + "\n" for r in ex.metrics).encode())
    open_run_manifest(cfg, store, tmp_path / "run", "run-1").record(ex)

    summary, page = Artifact(tmp_path / "summary.md"), Artifact(tmp_path / "report.html")
    status = tasks.record_final_status(
        tasks.config_text(cfg), "run-1", "FAILED", "eval crashed", summary, page
    )
    assert status == "failed"
    doc = store.get_json(f"runs/{cfg.run.name}/manifest.json")
    assert doc["status"] == "failed"
    assert [(t["name"], t["status"], t["left"], t["right"]) for t in doc["targets"]] == [
        (TARGETS[0], "met", 60.0, 30.0),
        ("long", "missed", 60.0, 100.0),
        (TARGETS[2], "missing", None, 0.9),
        (TARGETS[3], "missing", None, 12.0),
    ]
    text = (tmp_path / "summary.md").read_text()
    assert "| long: stage1.len/mean >= 100 | 60 | 100 | missed |" in text
    assert "| run.wall_minutes <= 12 | - | 12 | missing (run.wall_minutes) |" in text
    html = (tmp_path / "report.html").read_text()
    assert "<h2>Targets</h2>" in html and "<span class='target missed'>missed</span>" in html
