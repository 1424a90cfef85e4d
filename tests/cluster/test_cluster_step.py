"""The pipeline step in cluster mode: launch once, then take the stage's outcome from the store."""

from __future__ import annotations

from dataclasses import asdict

import pytest
import yaml
from cluster_fakes import COMPLETE, RUNNING, FakeApi, FakeClock
from cluster_helm_cli import REPO

from ringzero.cluster import execute_stage_on_cluster
from ringzero.config import load_config
from ringzero.config.cluster import ClusterSettings
from ringzero.errors import RingzeroError
from ringzero.pipeline.execute import outcome_key
from ringzero.pipeline.identity import stage_hash
from ringzero.stages.base import StageInputs, StageOutcome
from ringzero.store import open_store

SETTINGS = ClusterSettings.model_validate({
    "namespace": "ml", "images": {k: {"repository": f"r/{k}", "tag": "1"} for k in ("trainer", "rollout", "cpu")},
    "s3_secret": {"name": "s3"}, "device": "cpu", "gpus_per_node": 0,
})
INPUTS = StageInputs(init_uri="file:///ckpt/base", reference_uri="file:///ckpt/base", base_uri="file:///ckpt/base")


@pytest.fixture
def run(tmp_path):
    cfg = load_config(REPO / "configs" / "tiny-cpu.yaml", [f"storage.root=file://{tmp_path}/store",
                                                          f"run.run_dir={tmp_path}/run"])
    return cfg, open_store(cfg.storage.root), cfg.stage("stage1")


def commit_outcome(cfg, store, stage):
    """What `ringzero stage run` in the job does at the end: commit the outcome under the stage identity."""
    outcome = StageOutcome(output_uri="file:///ckpt/stage1", summary={"reward/mean": 0.5}, stop_reason="steps",
                           steps=60, wall_s=1.0)
    store.put_json(outcome_key(stage_hash(cfg, stage, INPUTS)), asdict(outcome))


def test_launches_the_stage_then_returns_the_committed_outcome(run, tmp_path):
    cfg, store, stage = run
    api = FakeApi({"TrainJob": [[RUNNING, lambda: commit_outcome(cfg, store, stage), COMPLETE]]})
    ex = execute_stage_on_cluster(cfg, store, stage, INPUTS, tmp_path / "run", settings=SETTINGS, api=api,
                                  environ={"RINGZERO_POD_NAME": "step-1", "RINGZERO_POD_UID": "u-1"},
                                  clock=FakeClock())
    assert (ex.outcome.output_uri, ex.skipped) == ("file:///ckpt/stage1", True)
    assert api.created == ["ConfigMap", "TrainJob"] and api.deleted == ["TrainJob", "ConfigMap"]
    configmap, trainjob = api.objects
    assert yaml.safe_load(configmap["data"]["config.yaml"])["run"]["name"] == "tiny-cpu"
    args = trainjob["spec"]["trainer"]["args"]
    assert args[args.index("--stage") + 1] == "stage1" and args[args.index("--init") + 1] == "file:///ckpt/base"
    assert trainjob["metadata"]["ownerReferences"][0]["uid"] == "u-1"


def test_a_committed_stage_is_not_launched(run, tmp_path):
    cfg, store, stage = run
    commit_outcome(cfg, store, stage)
    api = FakeApi({})
    ex = execute_stage_on_cluster(cfg, store, stage, INPUTS, tmp_path / "run", settings=SETTINGS, api=api)
    assert ex.skipped and api.created == []


def test_a_job_that_commits_nothing_is_an_error_not_a_local_run(run, tmp_path):
    cfg, store, stage = run
    api = FakeApi({"TrainJob": [[COMPLETE]]})
    with pytest.raises(RingzeroError, match="committed no outcome"):
        execute_stage_on_cluster(cfg, store, stage, INPUTS, tmp_path / "run", settings=SETTINGS, api=api,
                                 environ={}, clock=FakeClock())


def test_without_cluster_settings_the_step_says_what_is_missing(run, tmp_path):
    cfg, store, stage = run
    with pytest.raises(RingzeroError, match="needs cluster settings"):
        execute_stage_on_cluster(cfg, store, stage, INPUTS, tmp_path / "run", api=FakeApi({}))
