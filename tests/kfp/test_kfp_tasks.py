"""What the steps run, called in-process: config transport, gate verdicts, metrics and reports."""

import json
import math
from dataclasses import asdict

import pytest
import yaml
from kfp_kit import micro_config

from ringzero.errors import ConfigError, RingzeroError
from ringzero.kfp import report, tasks
from ringzero.kfp.settings import load_kfp_config
from ringzero.pipeline.execute import ExecutedStage, execute_stage, metrics_key, outcome_key
from ringzero.pipeline.gates import GateResult
from ringzero.pipeline.identity import stage_hash
from ringzero.pipeline.manifest import RunManifest
from ringzero.stages.base import StageInputs, StageOutcome
from ringzero.store import open_store

pytestmark = pytest.mark.xdist_group("kfp")


@pytest.fixture
def cfg(tmp_path):
    return load_kfp_config(micro_config(tmp_path, gate=["reward/mean >= 0.3", "gap/ratio/p99 <= 0.05"]))[0]


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
    summary = json.dumps({"reward/mean": reward, "gap/ratio/p99": 0.01})
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
    outcome = StageOutcome(
        output_uri="file:///s/ckpt",
        summary={"len/mean": 3.0, "x/<b>": 1.0},
        stop_reason="max_steps",
        steps=len(metrics),
        wall_s=2.0,
    )
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
    with pytest.raises(
        RingzeroError, match="stage 'stage1': stages/abababababababab/outcome.json is missing"
    ):
        report.run_report_html(cfg, store, manifest.doc)


def test_stage_markdown_lists_the_summary_and_output():
    text = report.stage_markdown(_executed([]))
    assert "| len/mean | 3 |" in text and "output: `file:///s/ckpt`" in text


def test_an_unknown_mode_is_refused(cfg):
    with pytest.raises(RingzeroError, match="mode 'elsewhere': expected one of"):
        tasks.run_stage(
            tasks.config_text(cfg), "base", "pretrain", "elsewhere", "run-1", init_uri="", base_uri=""
        )


def test_cluster_mode_hands_the_stage_to_the_cluster_launcher(cfg, tmp_path, monkeypatch):
    import ringzero.cluster

    calls = []

    def launched(cfg_, store, stage, inputs, run_dir):
        calls.append((stage.name, inputs))
        outcome = StageOutcome("file:///s/stage1", {"reward/mean": 0.5}, "max_steps", 3, 1.0)
        ex = ExecutedStage(
            stage.name, stage.kind, "cd" * 32, inputs, outcome, GateResult(True, ["ok"]), False, []
        )
        _committed(store, ex)  # as the stage's job does
        return ex

    monkeypatch.setattr(ringzero.cluster, "execute_stage_on_cluster", launched)
    summary = Recorder(tmp_path / "summary.md")
    uri, summary_json = tasks.run_stage(
        tasks.config_text(cfg),
        "stage1",
        "rl",
        "cluster",
        "run-1",
        init_uri="file:///s/base",
        base_uri="file:///s/base",
        reference_uri="file:///s/ref",
        summary=summary,
    )
    assert calls == [("stage1", StageInputs("file:///s/base", "file:///s/ref", "file:///s/base", {}))]
    assert (uri, json.loads(summary_json)) == ("file:///s/stage1", {"reward/mean": 0.5})
    assert "## stage `stage1` (rl): ran" in (tmp_path / "summary.md").read_text()


def _gpu_cfg(tmp_path, gpus, parallel):
    from ringzero.config import load_config

    return load_config(micro_config(tmp_path, gate=[], kfp={"stage_pod": {"gpus": gpus}}, parallel=parallel))


class Ranks:
    """Stands in for `ringzero stage run ... --nproc N`: records the command, then runs the stage as it
    would."""

    def __init__(self, code=0, commit=True):
        self.argv, self.code, self.commit = [], code, commit

    def __call__(self, argv):
        from ringzero.config import load_config

        self.argv.append(list(argv))
        path = argv[argv.index("run") + 1]
        self.config = yaml.safe_load(open(path))
        if self.commit:
            # The ranks' work, done by one process: what they commit is keyed by the stage identity.
            cfg = load_config(path)
            flag = {a: argv[i + 1] for i, a in enumerate(argv) if a.startswith("--")}
            inputs = StageInputs(flag.get("--init"), flag.get("--reference"), flag.get("--base"), {})
            execute_stage(cfg, open_store(cfg.storage.root), cfg.stage(flag["--stage"]), inputs, tmp_run(cfg))
        return self.code


def tmp_run(cfg):
    from pathlib import Path

    return Path(cfg.run.run_dir) / "ranks"


@pytest.mark.usefixtures("fake_runners")
@pytest.mark.parametrize(("gpus", "parallel"), [(4, {"dp": 4}), (8, {"dp": 2, "cp": 4})])
def test_a_step_with_gpus_runs_its_stage_with_one_local_rank_per_gpu(tmp_path, monkeypatch, gpus, parallel):
    cfg = _gpu_cfg(tmp_path, gpus, parallel)
    ranks = Ranks()
    monkeypatch.setattr(tasks, "_run_command", ranks)
    uri, _ = tasks.run_stage(
        tasks.config_text(cfg), "base", "pretrain", "in-process", "run-1", init_uri="", base_uri=""
    )
    (argv,) = ranks.argv
    assert argv[1:6] == ["-m", "ringzero.cli.main", "stage", "run", argv[5]]
    assert argv[6:] == ["--stage", "base", "--nproc", str(gpus)]
    assert (
        ranks.config["kfp"]["stage_pod"]["gpus"] == gpus and ranks.config["parallel"]["dp"] == parallel["dp"]
    )
    assert uri.startswith(f"file://{tmp_path}/store/")  # the ranks' committed outcome, read back by the step


def test_a_step_with_gpus_reuses_a_committed_stage(tmp_path, monkeypatch):
    cfg = _gpu_cfg(tmp_path, 2, {"dp": 2})
    store = open_store(cfg.storage.root)
    stage = cfg.stage("base")
    outcome = StageOutcome("file:///s/base", {"loss/final": 1.0}, "max_steps", 1, 1.0)
    store.put_json(outcome_key(stage_hash(cfg, stage, StageInputs())), asdict(outcome))
    ranks = Ranks(commit=False)
    monkeypatch.setattr(tasks, "_run_command", ranks)
    uri, _ = tasks.run_stage(
        tasks.config_text(cfg), "base", "pretrain", "in-process", "run-1", init_uri="", base_uri=""
    )
    assert uri == "file:///s/base" and ranks.argv == []


@pytest.mark.parametrize(("code", "match"), [(1, "exited with 1"), (0, "committed no outcome")])
def test_a_step_whose_ranks_fail_or_commit_nothing_fails(tmp_path, monkeypatch, code, match):
    cfg = _gpu_cfg(tmp_path, 2, {"dp": 2})
    ranks = Ranks(code=code, commit=False)
    monkeypatch.setattr(tasks, "_run_command", ranks)
    with pytest.raises(RingzeroError, match=match):
        tasks.run_stage(
            tasks.config_text(cfg),
            "stage1",
            "rl",
            "in-process",
            "run-1",
            init_uri="file:///s/base",
            base_uri="file:///s/base",
            reference_uri="file:///s/ref",
        )
    # The ranks get the step's inputs exactly, so they commit under the identity the step looks up.
    (argv,) = ranks.argv
    assert argv[6:] == [
        "--stage",
        "stage1",
        "--init",
        "file:///s/base",
        "--reference",
        "file:///s/ref",
        "--base",
        "file:///s/base",
        "--nproc",
        "2",
    ]


@pytest.mark.usefixtures("fake_runners")
def test_a_step_without_gpus_runs_its_one_rank_in_process(tmp_path, monkeypatch):
    cfg = _gpu_cfg(tmp_path, 1, None)
    monkeypatch.setattr(tasks, "_run_command", lambda argv: pytest.fail(f"started {argv}"))
    uri, _ = tasks.run_stage(
        tasks.config_text(cfg), "base", "pretrain", "in-process", "run-1", init_uri="", base_uri=""
    )
    assert uri


@pytest.mark.parametrize(
    ("gpus", "parallel", "ranks"), [(4, {"dp": 2}, "4 local ranks"), (0, {"cp": 2}, "1 process")]
)
def test_a_step_refuses_a_config_whose_pod_cannot_run_dp_times_cp(
    tmp_path, monkeypatch, gpus, parallel, ranks
):
    # A config that never went through load_kfp_config (a hand-edited run parameter) is refused by the step.
    cfg = _gpu_cfg(tmp_path, gpus, parallel)
    monkeypatch.setattr(tasks, "_run_command", lambda argv: pytest.fail(f"started {argv}"))
    with pytest.raises(ConfigError) as info:
        tasks.run_stage(
            tasks.config_text(cfg), "base", "pretrain", "in-process", "run-1", init_uri="", base_uri=""
        )
    (problem,) = info.value.problems
    assert (
        problem.startswith("kfp.stage_pod.gpus: ")
        and ranks in problem
        and "parallel.dp x parallel.cp" in problem
    )
