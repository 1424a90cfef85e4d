"""``ringzero cluster plan``: each stage's objects as the launcher renders them, their requests, and whether
they fit a cluster; the shipped profiles fit the clusters they name, and the settings it reads from values
files are the ones the chart installs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml
from cluster_kit import CHART, COMBINATIONS, NAMESPACE, RELEASE, render

from ringzero.cluster.capacity import Node, PodGroup, pack, quantity
from ringzero.cluster.plan import plan_run
from ringzero.cluster.values import load_values, pipeline_overrides, settings_dict, settings_from_values
from ringzero.config import load_config
from ringzero.errors import RingzeroError

REPO = CHART.parents[1]
CONFIG = REPO / "configs" / "cluster-h200.yaml"
# (values files, nodes, GPUs per node): each shipped GPU profile and the cluster its header names
PROFILES = [
    (["values-gpu.yaml"], 1, 8),
    (["values-gpu.yaml", "values-gpu-2node.yaml"], 2, 8),
]


def plan(files: list[str], *extra: str) -> subprocess.CompletedProcess:
    args = [sys.executable, "-m", "ringzero.cli.main", "cluster", "plan", str(CONFIG)]
    for f in files:
        args += ["--values", str(CHART / f)]
    return subprocess.run([*args, *extra], capture_output=True, text=True, cwd=REPO, timeout=120)


def profile_plan(files: list[str], nodes: int, gpus: int):
    values = load_values([CHART / f for f in files])
    cfg = load_config(CONFIG, pipeline_overrides(values))
    settings = settings_from_values([], values=values)
    return plan_run(cfg, settings, [Node(gpus)] * nodes)


@pytest.mark.parametrize(("files", "nodes", "gpus"), PROFILES, ids=["+".join(p[0]) for p in PROFILES])
def test_each_shipped_profile_fits_the_cluster_it_names(files, nodes, gpus):
    plans = profile_plan(files, nodes, gpus)
    assert [p.stage for p in plans] == ["base", "stage1", "distill", "stage2", "tier", "eval"]
    assert all(p.fits for p in plans), [(p.stage, p.short or p.problem) for p in plans if not p.fits]
    sampling = [p for p in plans if p.kind in ("rl", "distill", "eval")]
    # a sampling stage runs its servers and its job at once, and together they use the whole cluster
    assert all(p.totals()["gpus"] == nodes * gpus for p in sampling)
    assert all({g.role for g in p.pods} == {"trainer", "rollout"} for p in sampling)


def test_the_two_node_profile_on_one_node_is_refused_naming_what_is_short():
    done = plan(["values-gpu.yaml", "values-gpu-2node.yaml"], "--nodes", "1", "--gpus-per-node", "8")
    assert done.returncode == 2
    assert "stage1 (rl): DOES NOT FIT" in done.stdout and "stage base (pretrain): fits" in done.stdout
    assert (
        "needs 16 GPUs at once (rollout 2 x 4 + trainer 1 x 8) on 1 node x 8 GPUs; 8 GPUs short"
        in done.stderr
    )
    assert "no node has room for 2 rollout pods (4 GPUs" in done.stderr


def test_the_one_node_profile_prints_every_object_and_fits():
    done = plan(["values-gpu.yaml"], "--nodes", "1", "--gpus-per-node", "8", "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["fits"] is True
    stage1 = next(s for s in out["stages"] if s["stage"] == "stage1")
    assert [o["kind"] for o in stage1["objects"]] == [
        "ConfigMap",
        "Deployment",
        "Service",
        "Service",
        "TrainJob",
    ]
    assert stage1["objects"][-1]["torchrun"] == "1 node x 4 processes (dp 2 x cp 2)"
    assert {(g["role"], g["count"], g["gpus"]) for g in stage1["pods"]} == {
        ("trainer", 1, 4),
        ("rollout", 1, 4),
    }
    base = next(s for s in out["stages"] if s["stage"] == "base")
    assert [o["kind"] for o in base["objects"]] == ["ConfigMap", "TrainJob"]  # pretraining samples nothing


def test_ranks_that_are_not_the_run_s_dp_x_cp_are_a_problem_of_the_plan():
    done = plan(["values-gpu.yaml"], "--nodes", "1", "--gpus-per-node", "8", "--set", "parallel.cp=4")
    assert done.returncode == 2
    assert "the cluster settings run 1 node x 4 GPUs per node = 4 ranks" in done.stderr
    assert "parallel.dp x parallel.cp = 2 x 4 = 8" in done.stderr


def test_cpu_and_memory_are_checked_when_given():
    done = plan(["values-gpu.yaml"], "--nodes", "1", "--gpus-per-node", "8", "--memory-per-node", "1500Gi")
    assert done.returncode == 2
    assert "no node has room for a rollout pod (4 GPUs, 32 CPU, 640Gi)" in done.stderr
    assert (
        plan(
            ["values-gpu.yaml"],
            "--nodes",
            "1",
            "--gpus-per-node",
            "8",
            "--cpu-per-node",
            "112",
            "--memory-per-node",
            "1900Gi",
        ).returncode
        == 0
    )


def test_pods_must_fit_one_node_not_just_the_sum():
    trainer = PodGroup("TrainJob", "t", "trainer", 1, 8, 1, 1)
    assert pack([trainer], [Node(8)]) == (True, "")
    fits, short = pack([trainer], [Node(4), Node(4)])  # 8 GPUs in all, but no node holds the 8-GPU pod
    assert not fits and "GPUs short" not in short and "no node has room for a trainer pod (8 GPUs" in short
    rollouts = PodGroup("Deployment", "r", "rollout", 3, 4, 1, 1)
    assert pack([rollouts, PodGroup("TrainJob", "t", "trainer", 1, 4, 1, 1)], [Node(8), Node(8)])[0]
    assert not pack([rollouts, PodGroup("TrainJob", "t", "trainer", 1, 8, 1, 1)], [Node(8), Node(8)])[0]


def test_quantities():
    assert quantity("500m") == 0.5 and quantity("96") == 96 and quantity(2) == 2
    assert quantity("64Gi") == 64 * 2**30 and quantity("1G") == 1e9
    with pytest.raises(RingzeroError, match="not a Kubernetes quantity: 'lots'"):
        quantity("lots")


@pytest.mark.parametrize("combo", sorted(COMBINATIONS))
def test_the_settings_read_from_values_are_the_ones_the_chart_installs(helm_bin, combo):
    files = COMBINATIONS[combo]
    objects = render(helm_bin, files)
    [cm] = [o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-cluster")]
    installed = yaml.safe_load(cm["data"]["cluster.yaml"])
    assert (
        settings_dict(load_values([CHART / f for f in files]), release=RELEASE, namespace=NAMESPACE)
        == installed
    )


def test_the_release_carries_the_profile_s_overrides_to_its_pipeline(helm_bin):
    from ringzero.kfp.install import Install

    for combo, expected in (("gpu-2node", ["parallel.cp=4"]), ("gpu", [])):
        [cm] = [
            o
            for o in render(helm_bin, COMBINATIONS[combo])
            if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-cluster")
        ]
        assert (yaml.safe_load(cm["data"]["pipeline-overrides.yaml"]) or []) == expected
        overrides = Install(cm["data"], "test").overrides("cluster-h200.yaml")
        assert (
            overrides[-len(expected) :] == expected
            if expected
            else not any("parallel" in o for o in overrides)
        )
    assert pipeline_overrides(load_values([CHART / "values-gpu-2node.yaml"])) == ["parallel.cp=4"]


def test_pipeline_stages_count_in_the_ranks_the_plan_lays_out():
    """pp multiplies the ranks like dp, cp and tp: a layout of the same 4 ranks fits, one of 8 is refused."""
    done = plan(
        ["values-gpu.yaml"],
        "--nodes",
        "1",
        "--gpus-per-node",
        "8",
        "--set",
        "parallel.dp=1",
        "--set",
        "engines.training.pp=2",
        "--json",
    )
    assert done.returncode == 0, done.stderr
    stage1 = next(s for s in json.loads(done.stdout)["stages"] if s["stage"] == "stage1")
    assert stage1["objects"][-1]["torchrun"] == "1 node x 4 processes (dp 1 x cp 2 x pp 2)"
    done = plan(["values-gpu.yaml"], "--nodes", "1", "--gpus-per-node", "8", "--set", "engines.training.pp=2")
    assert done.returncode == 2
    assert "parallel.dp x parallel.cp x engines.training.pp = 2 x 2 x 2 = 8" in done.stderr
