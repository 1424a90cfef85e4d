"""launch_stage against a scripted fake of the client boundary: success, failure with log tails, timeouts,
interrupts and SIGTERM, and cleanup on every path. The clock is fake: nothing here depends on real time."""

from __future__ import annotations

import os
import signal

import pytest
from cluster_fakes import COMPLETE, FAILED, READY, RUNNING, FakeApi, FakeClock, pod

from ringzero.cluster.job import StageJob
from ringzero.cluster.launch import launch_stage
from ringzero.cluster.rollout import RolloutSpec
from ringzero.cluster.wait import StageFailed, StageTimeout
from ringzero.config.cluster import ClusterSettings
from ringzero.store.config import S3Settings

IMAGES = {k: {"repository": f"r/{k}", "tag": "1"} for k in ("trainer", "rollout", "cpu")}
SETTINGS = ClusterSettings.model_validate(
    {
        "namespace": "ml",
        "images": IMAGES,
        "s3_secret": {"name": "s3"},
        "gpus_per_node": 8,
        "log_lines": 3,
        "job_timeout_s": 100,
        "rollout": {"ready_timeout_s": 50},
    }
)
JOB = StageJob(
    run="r",
    stage="stage1",
    name="r-stage1-0a1b2c3d",
    namespace="ml",
    config_yaml="run: {name: r}\n",
    dp=2,
    cp=4,
)
ROLLOUT = RolloutSpec("s3://b/ckpt", S3Settings(), lm_head_fp32=True, deterministic=False, seed=0)


def test_success_returns_the_finished_job_and_cleans_up():
    api = FakeApi({"TrainJob": [[RUNNING, RUNNING, COMPLETE]]})
    done = launch_stage(api, SETTINGS, JOB, clock=FakeClock())
    assert done["status"] == COMPLETE["status"]
    assert api.created == ["ConfigMap", "TrainJob"]
    assert api.deleted == ["TrainJob", "ConfigMap"]


def test_rollout_servers_become_ready_before_the_job_starts():
    order = []
    api = FakeApi(
        {
            "Deployment": [[{"status": {}}, READY]],
            "TrainJob": [[lambda: order.append(list(api.deleted)), COMPLETE]],
        }
    )
    launch_stage(api, SETTINGS, JOB, ROLLOUT, clock=FakeClock())
    assert api.created == ["ConfigMap", "Deployment", "Service", "Service", "TrainJob"]
    assert order == [[]]  # the servers were still up while the job ran
    assert api.deleted == ["TrainJob", "Service", "Service", "Deployment", "ConfigMap"]


def test_failure_surfaces_the_reason_and_the_failed_pod_logs_first():
    logs = {
        ("r-node-0", "node"): "step 1\nstep 2\nTraceback\nValueError: loss is nan",
        ("r-node-1", "node"): "waiting for peers",
    }
    api = FakeApi(
        {"TrainJob": [[RUNNING, FAILED]]},
        pods=[pod("r-node-1", "Running"), pod("r-node-0", "Failed")],
        logs=logs,
    )
    with pytest.raises(StageFailed) as err:
        launch_stage(api, SETTINGS, JOB, clock=FakeClock())
    text = str(err.value)
    assert "PodFailed: node-0 exited with code 1" in text and "'stage1'" in text
    assert "ValueError: loss is nan" in text and "step 1" not in text  # only the last 3 lines
    assert text.index("r-node-0") < text.index("r-node-1")
    assert not isinstance(err.value, StageTimeout)
    assert api.deleted == ["TrainJob", "ConfigMap"]


def test_a_job_that_never_ends_times_out_and_is_deleted():
    api = FakeApi(
        {"TrainJob": [[RUNNING]]},
        pods=[pod("r-node-0", "Running")],
        logs={("r-node-0", "node"): "step 99999"},
    )
    with pytest.raises(StageTimeout, match="did not finish within 100 s") as err:
        launch_stage(api, SETTINGS, JOB, clock=FakeClock())
    assert "step 99999" in str(err.value)
    assert api.deleted == ["TrainJob", "ConfigMap"]


def test_servers_that_never_get_ready_time_out_before_any_job():
    api = FakeApi(
        {"Deployment": [[{"status": {"availableReplicas": 0}}]]},
        pods=[pod("r-rollout-x", "Pending", containers=("sglang",))],
    )
    with pytest.raises(StageTimeout, match="Deployment ml/r-stage1-0a1b2c3d-rollout"):
        launch_stage(api, SETTINGS, JOB, ROLLOUT, clock=FakeClock())
    assert "TrainJob" not in api.created
    assert api.deleted == ["Service", "Service", "Deployment", "ConfigMap"]


def test_ctrl_c_while_waiting_deletes_everything_and_propagates():
    def interrupt():
        raise KeyboardInterrupt

    api = FakeApi({"Deployment": [[READY]], "TrainJob": [[RUNNING, interrupt]]})
    with pytest.raises(KeyboardInterrupt):
        launch_stage(api, SETTINGS, JOB, ROLLOUT, clock=FakeClock())
    assert api.deleted == ["TrainJob", "Service", "Service", "Deployment", "ConfigMap"]


def test_sigterm_while_waiting_deletes_everything():
    """A cancelled pipeline step gets SIGTERM: the launcher must unwind and clean up, not die silently."""
    before = signal.getsignal(signal.SIGTERM)
    api = FakeApi({"TrainJob": [[RUNNING, lambda: os.kill(os.getpid(), signal.SIGTERM), RUNNING]]})
    with pytest.raises(KeyboardInterrupt):
        launch_stage(api, SETTINGS, JOB, clock=FakeClock())
    assert api.deleted == ["TrainJob", "ConfigMap"]
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_watch_that_ends_early_is_followed_by_a_fresh_read():
    api = FakeApi({"TrainJob": [[], [], [COMPLETE]]})
    assert launch_stage(api, SETTINGS, JOB, clock=FakeClock())["status"] == COMPLETE["status"]


def test_a_job_deleted_by_someone_else_fails_the_stage():
    api = FakeApi({"TrainJob": [[RUNNING, "DELETED"]]})
    with pytest.raises(StageFailed, match="was deleted while the launcher waited"):
        launch_stage(api, SETTINGS, JOB, clock=FakeClock())


def test_a_refused_create_still_cleans_up_what_exists():
    api = FakeApi({}, fail_create={"TrainJob"})
    with pytest.raises(RuntimeError, match="no resource for TrainJob"):
        launch_stage(api, SETTINGS, JOB, clock=FakeClock())
    assert api.deleted == ["TrainJob", "ConfigMap"]  # deleting what was never made is harmless


def test_one_failed_delete_does_not_stop_the_others():
    api = FakeApi({"TrainJob": [[COMPLETE]]}, fail_delete={"TrainJob"})
    launch_stage(api, SETTINGS, JOB, clock=FakeClock())
    assert api.deleted == ["ConfigMap"]


def test_pytorchjob_backend_reads_its_own_conditions():
    settings = SETTINGS.model_copy(update={"backend": "pytorchjob"})
    done = {
        "status": {
            "conditions": [{"type": "Running", "status": "False"}, {"type": "Succeeded", "status": "True"}]
        }
    }
    api = FakeApi({"PyTorchJob": [[RUNNING, done]]})
    launch_stage(api, settings, JOB, clock=FakeClock())
    assert api.created == ["ConfigMap", "PyTorchJob"]
    failed = FakeApi(
        {"PyTorchJob": [[FAILED]]},
        pods=[pod("r-master-0", "Failed", ("pytorch",))],
        logs={("r-master-0", "pytorch"): "CUDA out of memory"},
    )
    with pytest.raises(StageFailed, match="CUDA out of memory"):
        launch_stage(failed, settings, JOB, clock=FakeClock())


def test_no_pods_is_explained():
    api = FakeApi({"TrainJob": [[FAILED]]})
    with pytest.raises(StageFailed, match="no pods were created"):
        launch_stage(api, SETTINGS, JOB, clock=FakeClock())
