"""The pipeline step in cluster mode: launch once, then take the stage's outcome from the store.

The launch goes to ``RunningCluster``, which runs the rendered job from its manifest alone (torchrun,
the mounted run config, the Secret's credentials, the operator's rank variables), so the outcome the
step returns was committed by ``ringzero stage run`` inside the job, not by the test.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict

import pytest
import yaml
from cluster_fakes import COMPLETE, FakeApi, FakeClock, RunningCluster
from cluster_helm_cli import REPO

from ringzero.cluster import execute_stage_on_cluster
from ringzero.cluster.pods import RUN_CONFIG_DIR, RUN_CONFIG_FILE
from ringzero.config import load_config
from ringzero.config.cluster import ClusterSettings
from ringzero.config.run import RunConfig
from ringzero.engines.builders import fresh_model
from ringzero.errors import RingzeroError
from ringzero.metrics import read_metrics
from ringzero.model.checkpoint import load_model, save_state
from ringzero.model.config import PrecisionPolicy
from ringzero.pipeline.execute import outcome_key
from ringzero.pipeline.identity import stage_hash
from ringzero.stages.base import StageInputs, StageOutcome
from ringzero.store import open_store
from ringzero.tokenizer import CharTokenizer

SECRETS = {"s3": {"access-key": "test-access-key", "secret-key": "test-secret-key"}}


def settings(backend="trainjob", **extra) -> ClusterSettings:
    return ClusterSettings.model_validate(
        {
            "namespace": "ml",
            "images": {k: {"repository": f"r/{k}", "tag": "1"} for k in ("trainer", "rollout", "cpu")},
            "s3_secret": {"name": "s3"},
            "device": "cpu",
            "gpus_per_node": 0,
            "backend": backend,
            **extra,
        }
    )


SETTINGS = settings()
INPUTS = StageInputs(
    init_uri="file:///ckpt/base", reference_uri="file:///ckpt/base", base_uri="file:///ckpt/base"
)
MICRO_MODEL = {
    "vocab_size": 64,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "layout": "LM",
    "intermediate_size": 64,
    "max_position_embeddings": 64,
    "kv_lora_rank": 8,
    "qk_nope_head_dim": 8,
    "qk_rope_head_dim": 4,
    "v_head_dim": 8,
    "head_dim": 8,
    "lightning_block_size": 16,
}
STAGE_STEPS = 2


@pytest.fixture
def run(tmp_path):
    cfg = load_config(
        REPO / "configs" / "tiny-cpu.yaml",
        [f"storage.root=file://{tmp_path}/store", f"run.run_dir={tmp_path}/run"],
    )
    return cfg, open_store(cfg.storage.root), cfg.stage("stage1")


@pytest.fixture
def micro(tmp_path):
    """A micro run whose stage1 continues pretraining from a committed checkpoint, and its inputs."""
    cfg = RunConfig.model_validate(
        {
            "run": {"name": "micro-cluster", "seed": 0, "run_dir": str(tmp_path / "run"), "threads": 1},
            "model": MICRO_MODEL,
            "precision": {"train": "fp32", "rollout": "fp32"},
            "task": {"kind": "arithmetic", "operation": "digitsum", "digits": 2, "eval_prompts": 2},
            "storage": {"root": f"file://{tmp_path / 'store'}"},
            "stages": [
                {
                    "name": "stage1",
                    "kind": "pretrain",
                    "steps": STAGE_STEPS,
                    "batch_size": 2,
                    "seq_len": 16,
                    "checkpoint_every": 2,
                    "optim": {"lr": 3e-3, "warmup_steps": 1},
                }
            ],
        }
    )
    store = open_store(cfg.storage.root)
    init = save_state(
        store,
        "ckpt/base",
        cfg.model,
        fresh_model(cfg, PrecisionPolicy.preset("fp32")).state_dict(),
        {"stage": "base"},
        CharTokenizer(),
    )
    return cfg, store, cfg.stage("stage1"), StageInputs(init_uri=init)


def cluster(tmp_path) -> RunningCluster:
    host = {k: v for k, v in os.environ.items() if k in ("PATH", "PYTHONPATH", "LANG", "SYSTEMROOT")}
    host.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(sys.path))
    return RunningCluster(tmp_path / "pods", secrets=SECRETS, host_env=host)


def commit_outcome(cfg, store, stage):
    """What `ringzero stage run` would commit; for the tests where no job runs."""
    outcome = StageOutcome(
        output_uri="file:///ckpt/stage1",
        summary={"reward/mean": 0.5},
        stop_reason="steps",
        steps=60,
        wall_s=1.0,
    )
    store.put_json(outcome_key(stage_hash(cfg, stage, INPUTS)), asdict(outcome))


@pytest.mark.parametrize("backend", ["trainjob", "pytorchjob"])
def test_the_launched_job_runs_the_stage_and_the_step_returns_its_outcome(micro, tmp_path, backend):
    cfg, store, stage, inputs = micro
    api = cluster(tmp_path)
    ex = execute_stage_on_cluster(
        cfg,
        store,
        stage,
        inputs,
        tmp_path / "run",
        settings=settings(backend),
        api=api,
        environ={"RINGZERO_POD_NAME": "step-1", "RINGZERO_POD_UID": "u-1"},
        clock=FakeClock(),
    )
    kind = {"trainjob": "TrainJob", "pytorchjob": "PyTorchJob"}[backend]
    assert api.created == ["ConfigMap", kind] and api.deleted == [kind, "ConfigMap"]
    (node,) = api.runs
    assert node["rc"] == 0, node["output"][-3000:]
    # The job ran the stage: torchrun started `ringzero stage run` on the mounted config with the inputs.
    argv = node["argv"]
    assert argv[argv.index("-m", 3) + 1 : argv.index("-m", 3) + 4] == ["ringzero.cli.main", "stage", "run"]
    config_path = argv[argv.index("run", 3) + 1]
    assert config_path == str(node["mounts"][RUN_CONFIG_DIR] / RUN_CONFIG_FILE)
    assert yaml.safe_load(open(config_path)) == cfg.model_dump(mode="json")
    assert (
        argv[argv.index("--init") + 1] == inputs.init_uri
        and "--nnodes=1" in argv
        and "--nproc-per-node=1" in argv
    )
    # The credentials reach the job (as values from the Secret or as files mounted from it).
    for name, key in (("RINGZERO_S3_ACCESS_KEY", "access-key"), ("RINGZERO_S3_SECRET_KEY", "secret-key")):
        env = node["env"]
        value = env.get(name) or open(env[f"{name}_FILE"]).read().strip()
        assert value == SECRETS["s3"][key], name
    # The outcome the step returns is the one the job's stage code committed: a real checkpoint, trained.
    assert ex.skipped and ex.outcome.steps == STAGE_STEPS and ex.outcome.stop_reason == "steps"
    assert ex.stage_hash == stage_hash(cfg, stage, inputs)
    assert store.get_json(outcome_key(ex.stage_hash))["output_uri"] == ex.outcome.output_uri
    assert load_model(ex.outcome.output_uri).config == cfg.model
    assert {"train/loss", "eval/accuracy"} <= set(ex.outcome.summary)
    assert [r["step"] for r in read_metrics(tmp_path / "run" / "stage1" / "metrics.jsonl")][-1] == STAGE_STEPS
    events = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert ("stage.done", "stage1") in [(e["event"], e.get("stage")) for e in events]  # the job's own run log


def test_a_world_other_than_the_runs_is_refused_before_launch(micro, tmp_path):
    cfg, store, stage, inputs = micro
    api = cluster(tmp_path)
    with pytest.raises(RingzeroError, match="parallel.dp x parallel.cp"):
        execute_stage_on_cluster(
            cfg,
            store,
            stage,
            inputs,
            tmp_path / "run",
            settings=settings(num_nodes=2),
            api=api,
            environ={},
            clock=FakeClock(),
        )
    assert api.runs == [] and api.created == []


def test_the_manifest_carries_the_run_config_stage_and_owner(run, tmp_path):
    cfg, store, stage = run
    api = FakeApi({"TrainJob": [[lambda: commit_outcome(cfg, store, stage), COMPLETE]]})
    execute_stage_on_cluster(
        cfg,
        store,
        stage,
        INPUTS,
        tmp_path / "run",
        settings=SETTINGS,
        api=api,
        environ={"RINGZERO_POD_NAME": "step-1", "RINGZERO_POD_UID": "u-1"},
        clock=FakeClock(),
    )
    configmap, trainjob = api.objects
    assert yaml.safe_load(configmap["data"]["config.yaml"]) == cfg.model_dump(mode="json")
    args = trainjob["spec"]["trainer"]["args"]
    assert (
        args[args.index("--stage") + 1] == "stage1" and args[args.index("--init") + 1] == "file:///ckpt/base"
    )
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
        execute_stage_on_cluster(
            cfg,
            store,
            stage,
            INPUTS,
            tmp_path / "run",
            settings=SETTINGS,
            api=api,
            environ={},
            clock=FakeClock(),
        )


def test_without_cluster_settings_the_step_says_what_is_missing(run, tmp_path):
    cfg, store, stage = run
    with pytest.raises(RingzeroError, match="needs cluster settings"):
        execute_stage_on_cluster(cfg, store, stage, INPUTS, tmp_path / "run", api=FakeApi({}))
