"""What the steps run, called in-process: config transport, gate verdicts, metrics and reports."""

import json
import math
from dataclasses import asdict

import pytest
from kfp_kit import micro_config

from ringzero.errors import ConfigError, RingzeroError
from ringzero.kfp import report, tasks
from ringzero.kfp.settings import load_kfp_config
from ringzero.pipeline.execute import ExecutedStage, metrics_key, outcome_key
from ringzero.pipeline.gates import GateResult
from ringzero.pipeline.manifest import RunManifest
from ringzero.stages.base import StageInputs, StageOutcome
from ringzero.store import open_store

pytestmark = pytest.mark.xdist_group("kfp")


@pytest.fixture
def cfg(tmp_path):
    return load_kfp_config(micro_config(tmp_path, gate=["reward/mean >= 0.3", "ratio/p99 <= 0.05"]))[0]


class Recorder:
    """Stands in for an output artifact: a path to write, and the Metrics call."""

    def __init__(self, path):
        self.path = str(path)
        self.logged = {}

    def log_metric(self, key, value):
        self.logged[key] = value


def test_config_travels_as_one_json_line_and_comes_back_equal(cfg):
    text = tasks.config_text(cfg)
    assert "\n" not in text
    assert tasks.parse_config_text(text) == cfg


def test_a_config_parameter_that_is_not_json_is_a_config_error():
    with pytest.raises(ConfigError, match="run_config: 1 problem"):
        tasks.parse_config_text("run: {name: x}")


@pytest.mark.parametrize(("reward", "passed"), [(0.5, True), (0.1, False)])
def test_gate_returns_a_plain_bool_and_writes_the_reasons(cfg, tmp_path, reward, passed):
    out = Recorder(tmp_path / "reasons.md")
    summary = json.dumps({"reward/mean": reward, "ratio/p99": 0.01})
    verdict = tasks.check_gate(tasks.config_text(cfg), "stage1", summary, out)
    assert verdict is passed
    text = (tmp_path / "reasons.md").read_text()
    assert ("PASS" if passed else "FAIL") in text.splitlines()[0]
    assert f"reward/mean = {reward:g}" in text


def test_a_missing_metric_fails_the_gate(cfg):
    assert tasks.check_gate(tasks.config_text(cfg), "stage1", json.dumps({"reward/mean": 0.9})) is False


def test_a_step_refuses_a_stage_of_another_kind(cfg):
    with pytest.raises(RingzeroError, match="stage 'base' is a pretrain stage; this step runs rl stages"):
        tasks.run_stage(tasks.config_text(cfg), "base", "rl", "in-process", "run-1", init_uri="", base_uri="")


def test_metrics_artifact_gets_finite_scalars_only(tmp_path):
    out = Recorder(tmp_path / "m")
    tasks._log_metrics(out, {"a/x": 1, "a/nan": math.nan, "a/inf": math.inf, "a/y": 0.5, "a/flag": True})
    assert out.logged == {"a/x": 1.0, "a/y": 0.5, "a/flag": 1.0}


def _executed(metrics, name="stage1"):
    outcome = StageOutcome(output_uri="file:///s/ckpt", summary={"len/mean": 3.0, "x/<b>": 1.0},
                           stop_reason="max_steps", steps=len(metrics), wall_s=2.0)
    gate = GateResult(passed=False, reasons=["FAIL: len/mean = 3 violates len/mean <= 2"])
    return ExecutedStage(name, "rl", "ab" * 32, StageInputs(), outcome, gate, False, metrics)


def _committed(store, ex):
    """What execute_stage leaves in the store for a finished stage."""
    store.put_json(outcome_key(ex.stage_hash), asdict(ex.outcome))
    store.put_bytes(metrics_key(ex.stage_hash), "".join(json.dumps(r) + "\n" for r in ex.metrics).encode())


def test_run_report_shows_the_run_as_far_as_the_manifest_goes(cfg, tmp_path):
    store = open_store(f"file://{tmp_path}/store")
    ex = _executed([{"step": 0, "len/mean": 1.0}, {"step": 1, "len/mean": 3.0}])
    _committed(store, ex)
    manifest = RunManifest(cfg, store, tmp_path / "run")
    manifest.record(ex)
    page = report.run_report_html(cfg, store, manifest.doc)
    assert "<span class='status running'>running</span>" in page
    assert page.count("<polyline") == 1 and "data-stage='stage1'" in page  # len/mean, the one curve logged
    assert page.count("not run") == 3  # base, distill and eval have not reached the manifest
    assert "x/&lt;b&gt;" in page and "x/<b>" not in page
    assert "The gate after stage <code>stage1</code> failed" in page


def test_run_report_refuses_a_stage_whose_outcome_is_not_in_the_store(cfg, tmp_path):
    store = open_store(f"file://{tmp_path}/store")
    manifest = RunManifest(cfg, store, tmp_path / "run")
    manifest.record(_executed([]))
    with pytest.raises(RingzeroError, match="stage 'stage1': stages/abababababababab/outcome.json is missing"):
        report.run_report_html(cfg, store, manifest.doc)


def test_stage_markdown_lists_the_summary_and_output():
    text = report.stage_markdown(_executed([]))
    assert "| len/mean | 3 |" in text and "output: `file:///s/ckpt`" in text



def test_an_unknown_mode_is_refused(cfg):
    with pytest.raises(RingzeroError, match="mode 'elsewhere': expected one of"):
        tasks.run_stage(tasks.config_text(cfg), "base", "pretrain", "elsewhere", "run-1", init_uri="", base_uri="")


def test_cluster_mode_hands_the_stage_to_the_cluster_launcher(cfg, tmp_path, monkeypatch):
    import ringzero.cluster

    calls = []

    def launched(cfg_, store, stage, inputs, run_dir):
        calls.append((stage.name, inputs))
        outcome = StageOutcome("file:///s/stage1", {"reward/mean": 0.5}, "max_steps", 3, 1.0)
        ex = ExecutedStage(stage.name, stage.kind, "cd" * 32, inputs, outcome, GateResult(True, ["ok"]), False, [])
        _committed(store, ex)  # as the stage's job does
        return ex

    monkeypatch.setattr(ringzero.cluster, "execute_stage_on_cluster", launched)
    summary = Recorder(tmp_path / "summary.md")
    uri, summary_json = tasks.run_stage(
        tasks.config_text(cfg), "stage1", "rl", "cluster", "run-1", init_uri="file:///s/base", base_uri="file:///s/base",
        reference_uri="file:///s/ref", summary=summary,
    )
    assert calls == [("stage1", StageInputs("file:///s/base", "file:///s/ref", "file:///s/base", {}))]
    assert (uri, json.loads(summary_json)) == ("file:///s/stage1", {"reward/mean": 0.5})
    assert "## stage `stage1` (rl): ran" in (tmp_path / "summary.md").read_text()
