"""``ringzero kfp run-local`` on a micro config with fake stage runners: both gate paths and a failing step.

The pass path is the guard against the local runner's silent skip: were the gate condition not
evaluable, distill and eval would not run and the manifest would miss them.
"""

import json

import pytest
from kfp_kit import micro_config

from ringzero.cli.main import main

pytestmark = [pytest.mark.xdist_group("kfp"), pytest.mark.slow, pytest.mark.usefixtures("fake_runners")]


def run_local(tmp_path, **config) -> tuple[int, dict]:
    code = main(
        ["kfp", "run-local", str(micro_config(tmp_path, **config)), "--pipeline-root", str(tmp_path / "kfp")]
    )
    return code, json.loads((tmp_path / "run" / "manifest.json").read_text())


def outputs_of(tmp_path, name: str) -> list:
    """Files a task wrote under the local pipeline root (one folder per task, named by its task key)."""
    return sorted(p for p in (tmp_path / "kfp").rglob("*") if p.is_file() and f"/{name}/" in str(p))


def executor_output(tmp_path, name: str) -> dict:
    (path,) = [p for p in outputs_of(tmp_path, name) if p.name == "executor_output.json"]
    return json.loads(path.read_text())


def test_a_passing_gate_runs_every_stage_with_checkpoints_wired_through(tmp_path):
    code, manifest = run_local(tmp_path, gate=["reward/mean >= 0.2", "gap/ratio/p99 <= 0.05"])
    assert code == 0 and manifest["status"] == "succeeded"
    stages = {s["name"]: s for s in manifest["stages"]}
    assert list(stages) == ["base", "stage1", "distill", "eval"]
    base, stage1, distill, ev = (stages[n] for n in ("base", "stage1", "distill", "eval"))
    assert base["output_uri"] and stage1["output_uri"] and distill["output_uri"] and ev["output_uri"] is None
    assert stage1["inputs"]["init_uri"] == stage1["inputs"]["reference_uri"] == base["output_uri"]
    assert stage1["inputs"]["base_uri"] == distill["inputs"]["base_uri"] == base["output_uri"]
    assert distill["inputs"]["init_uri"] == stage1["output_uri"]
    assert ev["inputs"]["init_uri"] == distill["output_uri"]
    assert ev["inputs"]["compare"] == {
        "base": base["output_uri"],
        "stage1": stage1["output_uri"],
        "distill": distill["output_uri"],
    }
    assert ev["summary"]["eval/compared"] == 3.0
    assert stage1["gate"]["passed"] is True and all(r.startswith("pass: ") for r in stage1["gate"]["reasons"])
    # What the UI renders: each stage's Markdown and the run report so far, the gate's reasons, the final
    # status.
    files = {p.name: p.read_text() for p in outputs_of(tmp_path, "rl-stage")}
    assert "## stage `stage1` (rl): ran" in files["summary"]
    assert (
        files["report"].count("<polyline") == 6
    )  # reward, len, gap p99, gap max, ratio p99, ratio max were logged
    assert (
        "<span class='status running'>running</span>" in files["report"]
        and files["report"].count("not run") == 2
    )
    (metrics,) = executor_output(tmp_path, "rl-stage")["artifacts"]["metrics"]["artifacts"]
    assert metrics["metadata"] == stage1["summary"]
    assert "PASS" in "".join(p.read_text() for p in outputs_of(tmp_path, "gate"))
    final = {p.name: p.read_text() for p in outputs_of(tmp_path, "record-status")}
    assert "## run `micro`: succeeded" in final["summary"]
    assert (
        "<span class='status succeeded'>succeeded</span>" in final["report"]
        and "not run" not in final["report"]
    )


def test_a_failing_gate_stops_the_run_with_nothing_downstream(tmp_path):
    code, manifest = run_local(tmp_path, gate=["reward/mean >= 0.9"])
    assert code == 3 and manifest["status"] == "gate_failed"
    assert [s["name"] for s in manifest["stages"]] == ["base", "stage1"]
    gate = manifest["stages"][1]["gate"]
    assert gate["passed"] is False
    assert gate["reasons"] == ["FAIL: reward/mean = 0.5 violates reward/mean >= 0.9"]
    assert outputs_of(tmp_path, "lm-stage-2") == [] and outputs_of(tmp_path, "eval-stage") == []
    assert "FAIL" in "".join(p.read_text() for p in outputs_of(tmp_path, "gate"))
    (final,) = [p.read_text() for p in outputs_of(tmp_path, "record-status") if p.name == "report"]
    assert "The gate after stage <code>stage1</code> failed" in final and final.count("not run") == 2


def test_a_failing_step_is_recorded_by_the_exit_handler(tmp_path, capsys):
    code, manifest = run_local(tmp_path, gate=[], rl_steps=13)  # the fake RL runner raises
    assert code == 2 and manifest["status"] == "failed"
    assert [s["name"] for s in manifest["stages"]] == ["base"]
    assert manifest["error"]
    assert "run 'micro' ended failed" in capsys.readouterr().err
