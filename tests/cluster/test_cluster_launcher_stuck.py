"""A stage whose pods cannot run fails in minutes with the reason, not at the job's multi-day deadline:
unschedulable pods, images that cannot be pulled, missing config, crash loops. The clock is fake."""

from __future__ import annotations

import pytest
from cluster_fakes import READY, RUNNING, FakeApi, FakeClock

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
        "rollout": {"ready_timeout_s": 3600},
        "pending_timeout_s": 600,
        "image_pull_timeout_s": 300,
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
UNSCHEDULABLE = {
    "type": "PodScheduled",
    "status": "False",
    "reason": "Unschedulable",
    "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
}
SCHEDULER_EVENT = {
    "type": "Warning",
    "reason": "FailedScheduling",
    "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
}


def pending_pod(name="r-node-0", **status):
    return {
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "node"}]},
        "status": {"phase": "Pending", **status},
    }


def waiting(reason, message="", restarts=0, image="r/trainer:1"):
    return {
        "containerStatuses": [
            {
                "name": "node",
                "image": image,
                "restartCount": restarts,
                "state": {"waiting": {"reason": reason, "message": message}},
            }
        ]
    }


def launch(api, clock, rollout=None):
    return launch_stage(api, SETTINGS, JOB, rollout, clock=clock)


def test_an_unschedulable_pod_fails_the_stage_after_the_pending_timeout_with_the_scheduler_s_reason():
    api = FakeApi(
        {"TrainJob": [[RUNNING]]},
        pods=[pending_pod(conditions=[UNSCHEDULABLE])],
        events={"r-node-0": [SCHEDULER_EVENT]},
    )
    clock = FakeClock()
    with pytest.raises(StageFailed) as err:
        launch(api, clock)
    message = str(err.value)
    assert not isinstance(err.value, StageTimeout)
    assert (
        "pod r-node-0 cannot be scheduled (0/3 nodes are available: 3 Insufficient nvidia.com/gpu.)"
        in message
    )
    assert "Warning FailedScheduling: 0/3 nodes are available" in message
    assert 600 <= clock.now < 1200  # minutes, not the job's 2-day deadline
    assert api.deleted == ["TrainJob", "ConfigMap"]


def test_a_pod_that_waits_for_a_gpu_briefly_is_left_alone():
    api = FakeApi(
        {
            "TrainJob": [[RUNNING]] * 5
            + [
                [
                    lambda: api.pods.clear(),
                    {"status": {"conditions": [{"type": "Complete", "status": "True"}]}},
                ]
            ]
        },
        pods=[pending_pod(conditions=[UNSCHEDULABLE])],
    )
    launch(api, FakeClock())  # scheduled before the pending timeout: the stage completes


def test_an_image_that_cannot_be_pulled_fails_after_the_pull_timeout():
    api = FakeApi(
        {"TrainJob": [[RUNNING]]},
        pods=[pending_pod(**waiting("ImagePullBackOff", 'Back-off pulling image "r/trainer:1"'))],
    )
    clock = FakeClock()
    with pytest.raises(
        StageFailed, match=r"container node \(image r/trainer:1\) has not pulled its image for 300 s"
    ):
        launch(api, clock)
    assert clock.now < 600


def test_a_malformed_image_name_fails_at_once():
    api = FakeApi({"TrainJob": [[RUNNING]]}, pods=[pending_pod(**waiting("InvalidImageName"))])
    clock = FakeClock()
    with pytest.raises(StageFailed, match="can never pull its image: InvalidImageName"):
        launch(api, clock)
    assert clock.now < 100


def test_a_missing_secret_key_fails_the_stage():
    api = FakeApi(
        {"TrainJob": [[RUNNING]]},
        pods=[
            pending_pod(
                **waiting("CreateContainerConfigError", "couldn't find key secret-key in Secret ml/s3")
            )
        ],
    )
    with pytest.raises(
        StageFailed, match="cannot start: CreateContainerConfigError couldn't find key secret-key"
    ):
        launch(api, FakeClock())


def test_a_crash_loop_fails_the_stage_with_the_container_s_last_lines():
    crashing = {
        "metadata": {"name": "r-node-0"},
        "spec": {"containers": [{"name": "node"}]},
        "status": {"phase": "Running", **waiting("CrashLoopBackOff", restarts=3)},
    }
    api = FakeApi(
        {"TrainJob": [[RUNNING]]}, pods=[crashing], logs={("r-node-0", "node"): "ImportError: no einops"}
    )
    with pytest.raises(StageFailed) as err:
        launch(api, FakeClock())
    assert "crashed 3 times (CrashLoopBackOff)" in str(err.value) and "ImportError: no einops" in str(
        err.value
    )


def test_rollout_servers_that_cannot_be_scheduled_fail_long_before_their_ready_timeout():
    server = pending_pod("r-stage1-rollout-abc", conditions=[UNSCHEDULABLE])
    api = FakeApi({"Deployment": [[{"status": {}}]]}, pods=[server])
    clock = FakeClock()
    with pytest.raises(StageFailed, match="pod r-stage1-rollout-abc cannot be scheduled"):
        launch(api, clock, ROLLOUT)
    assert clock.now < 1200 and "TrainJob" not in api.created


def test_the_settings_default_to_minutes_and_the_job_deadline_to_days():
    s = ClusterSettings.model_validate({"images": IMAGES, "s3_secret": {"name": "s3"}})
    assert (s.pending_timeout_s, s.image_pull_timeout_s, s.crash_loop_restarts) == (600, 300, 3)
    assert s.job_timeout_s == 2 * 24 * 3600


def test_a_ready_deployment_is_not_held_back_by_the_pod_check():
    api = FakeApi(
        {
            "Deployment": [[READY]],
            "TrainJob": [[{"status": {"conditions": [{"type": "Complete", "status": "True"}]}}]],
        }
    )
    launch(api, FakeClock(), ROLLOUT)
