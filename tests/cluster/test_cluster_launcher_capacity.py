"""The launcher checks, before it creates anything, that a stage's pods fit the cluster's schedulable
nodes: refused with what is short when they do not, skipped when the account may not read nodes."""

from __future__ import annotations

import pytest
from cluster_fakes import COMPLETE, READY, FakeApi, FakeClock, node

from ringzero.cluster.capacity import schedulable_nodes
from ringzero.cluster.job import StageJob
from ringzero.cluster.launch import launch_stage
from ringzero.cluster.rollout import RolloutSpec
from ringzero.config.cluster import ClusterSettings
from ringzero.errors import RingzeroError
from ringzero.store.config import S3Settings

IMAGES = {k: {"repository": f"r/{k}", "tag": "1"} for k in ("trainer", "rollout", "cpu")}
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
SETTINGS = ClusterSettings.model_validate(
    {
        "namespace": "ml",
        "images": IMAGES,
        "s3_secret": {"name": "s3"},
        "gpus_per_node": 4,
        "node_selector": {"nvidia.com/gpu.product": "NVIDIA-H200"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "node_resources": {"cpu": "56", "memory": "1000Gi"},
        "rollout": {"replicas": 1, "tp_size": 4, "resources": {"cpu": "32", "memory": "640Gi"}},
    }
)
JOB = StageJob(
    run="r",
    stage="stage1",
    name="r-stage1-0a1b2c3d",
    namespace="ml",
    config_yaml="run: {name: r}\n",
    dp=2,
    cp=2,
)
ROLLOUT = RolloutSpec("s3://b/ckpt", S3Settings(), lm_head_fp32=True, deterministic=False, seed=0)


def launch(api):
    return launch_stage(api, SETTINGS, JOB, ROLLOUT, clock=FakeClock())


def streams():
    return {"Deployment": [[READY]], "TrainJob": [[COMPLETE]]}


def test_a_stage_that_fits_one_node_is_launched_and_the_nodes_were_read_with_the_selector():
    api = FakeApi(streams(), nodes=[node("gpu-0", 8, taints=[GPU_TAINT])])
    launch(api)
    assert api.created == ["ConfigMap", "Deployment", "Service", "Service", "TrainJob"]
    assert api.node_selectors == ["nvidia.com/gpu.product=NVIDIA-H200"]


def test_a_stage_that_cannot_fit_is_refused_before_anything_is_created():
    api = FakeApi(streams(), nodes=[node("gpu-0", 4), node("gpu-1", 2)])
    with pytest.raises(RingzeroError) as err:
        launch(api)
    message = str(err.value)
    assert "stage 'stage1' does not fit the cluster, so nothing was created" in message
    assert (
        "needs 8 GPUs at once (rollout 1 x 4 + trainer 1 x 4) on 2 nodes with 4, 2 GPUs; 2 GPUs short"
        in message
    )
    assert api.created == [] and api.deleted == []


def test_memory_counts_too():
    api = FakeApi(streams(), nodes=[node("gpu-0", 8, memory="1200Gi")])
    with pytest.raises(RingzeroError, match="no node has room for a rollout pod"):
        launch(api)
    assert api.created == []


def test_cordoned_and_untolerated_nodes_are_not_counted():
    nodes = [
        node("cordoned", 8, unschedulable=True),
        node("reserved", 8, taints=[{"key": "team", "value": "vision", "effect": "NoSchedule"}]),
        node("ok", 8, taints=[GPU_TAINT, {"key": "soft", "effect": "PreferNoSchedule"}]),
    ]
    assert [n.name for n in schedulable_nodes(nodes, SETTINGS)] == ["ok"]
    with pytest.raises(RingzeroError, match="no schedulable node matches the node selector"):
        launch(FakeApi(streams(), nodes=nodes[:2]))


def test_without_permission_to_read_nodes_the_check_is_skipped():
    api = FakeApi(streams(), nodes=None)
    launch(api)
    assert api.created[-1] == "TrainJob"
