"""The chart lints, renders for each documented combination, and every object validates offline."""

from __future__ import annotations

import pytest
import yaml
from cluster_helm_cli import REPO
from cluster_kit import CHART, COMBINATIONS, NAMESPACE, RELEASE, helm, validate

from ringzero.config import parse_config
from ringzero.config.cluster import ClusterSettings


def by_kind(objs, kind):
    return [o for o in objs if o["kind"] == kind]


def the(objs, kind, suffix):
    (obj,) = [o for o in objs if o["kind"] == kind and o["metadata"]["name"].endswith(suffix)]
    return obj


@pytest.mark.parametrize("name", sorted(COMBINATIONS))
def test_lint_strict(helm_bin, name):
    args = ["lint", "--strict", str(CHART)]
    for f in COMBINATIONS[name]:
        args += ["-f", str(CHART / f)]
    done = helm(helm_bin, *args)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("name", sorted(COMBINATIONS))
def test_every_object_validates(rendered, name):
    objs = rendered[name]
    assert objs, "nothing rendered"
    for obj in objs:
        validate(obj)


def test_default_install_has_the_documented_objects(rendered):
    kinds = sorted(o["kind"] for o in rendered["defaults"])
    for kind in (
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "ConfigMap",
        "Deployment",
        "PersistentVolumeClaim",
        "Service",
        "Job",
        "NetworkPolicy",
        "TrainJob",
    ):
        assert kind in kinds, f"{kind} missing from {kinds}"
    jobs = {o["metadata"]["name"] for o in by_kind(rendered["defaults"], "Job")}
    assert jobs == {f"{RELEASE}-ringzero-create-bucket", f"{RELEASE}-ringzero-pipeline-upload"}


def test_external_s3_drops_minio_and_points_at_the_endpoint(rendered):
    objs = rendered["external-s3"]
    assert not [o for o in objs if "minio" in o["metadata"]["name"]]
    data = the(objs, "ConfigMap", "-cluster")["data"]
    assert data["s3-endpoint"] == "s3.us-east-1.amazonaws.com"
    assert data["s3-secure"] == "true"
    assert data["s3-region"] == "us-east-1"
    assert data["s3-root"] == "s3://my-ringzero-runs/runs"


def test_bundled_minio_is_the_endpoint(rendered):
    data = the(rendered["defaults"], "ConfigMap", "-cluster")["data"]
    service = the(rendered["defaults"], "Service", "-minio")
    assert data["s3-endpoint"] == f"{service['metadata']['name']}.{NAMESPACE}.svc:9000"
    assert data["s3-secure"] == "false"


@pytest.mark.parametrize("name", sorted(COMBINATIONS))
def test_cluster_settings_load_into_the_launcher_model(rendered, name):
    """The chart's rendering of ClusterSettings is what the launcher validates: they cannot drift apart."""
    text = the(rendered[name], "ConfigMap", "-cluster")["data"]["cluster.yaml"]
    settings = ClusterSettings.model_validate(yaml.safe_load(text))
    assert settings.namespace == NAMESPACE
    assert settings.s3_secret.name == "ringzero-s3"


def test_gpu_profile_settings(rendered):
    text = the(rendered["gpu"], "ConfigMap", "-cluster")["data"]["cluster.yaml"]
    settings = ClusterSettings.model_validate(yaml.safe_load(text))
    assert (settings.device, settings.num_nodes, settings.gpus_per_node) == ("gpu", 1, 4)
    assert settings.node_selector == {"nvidia.com/gpu.product": "NVIDIA-H200"}
    assert settings.tolerations[0].key == "nvidia.com/gpu"
    assert (settings.rollout.replicas, settings.rollout.tp_size) == (1, 4)  # 4 + 4 on one 8-GPU node


def test_cpu_profile_runs_the_cpu_image_without_gpus(rendered):
    smoke = the(rendered["cpu"], "TrainJob", "-smoke")
    assert smoke["spec"]["trainer"]["image"].startswith("ringzero/cpu:")
    assert "nvidia.com/gpu" not in str(smoke["spec"]["trainer"]["resourcesPerNode"])


def test_smoke_job_follows_the_backend(rendered, helm_bin):
    from cluster_kit import render

    assert by_kind(rendered["defaults"], "TrainJob") and not by_kind(rendered["defaults"], "PyTorchJob")
    job = the(rendered["gpu-pytorchjob"], "PyTorchJob", "-smoke")
    assert job["spec"]["pytorchReplicaSpecs"]["Master"]["replicas"] == 1
    assert "Worker" not in job["spec"]["pytorchReplicaSpecs"]  # 1 node in the GPU profile
    two = render(helm_bin, ["values-gpu.yaml", "values-pytorchjob.yaml"], ("cluster.numNodes=2",))
    assert the(two, "PyTorchJob", "-smoke")["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 1
    trainjob = the(rendered["defaults"], "TrainJob", "-smoke")
    assert trainjob["spec"]["runtimeRef"]["name"] == "torch-distributed"
    assert trainjob["metadata"]["annotations"]["helm.sh/hook"] == "test"


def shipped_run_config(objs):
    """The run config the release's pipeline runs: pipeline.runConfig, read from the run-config ConfigMap,
    with the profile's pipeline overrides (from the cluster ConfigMap, as the upload Job reads them)."""
    from ringzero.config.loader import apply_overrides

    upload = the(objs, "Job", "-pipeline-upload")["spec"]["template"]["spec"]["containers"][0]
    name = next(e["value"] for e in upload["env"] if e["name"] == "RUN_CONFIG")
    data = yaml.safe_load(the(objs, "ConfigMap", "-runs")["data"][name])
    apply_overrides(
        data, yaml.safe_load(the(objs, "ConfigMap", "-cluster")["data"]["pipeline-overrides.yaml"]) or []
    )
    return parse_config(data, name)


GPU_COMBINATIONS = sorted(n for n, files in COMBINATIONS.items() if "values-cpu.yaml" not in files)


@pytest.mark.parametrize("name", GPU_COMBINATIONS)
def test_gpu_values_run_the_world_of_the_shipped_run_config(rendered, name):
    """nodes x GPUs per node of the chart's values = dp x cp of the run config it ships and runs.

    (The CPU profile runs a user-supplied, one-process config; the launcher refuses cluster-h200 there.)
    """
    objs = rendered[name]
    settings = ClusterSettings.model_validate(
        yaml.safe_load(the(objs, "ConfigMap", "-cluster")["data"]["cluster.yaml"])
    )
    cfg = shipped_run_config(objs)
    assert settings.device == "gpu"
    world = settings.num_nodes * settings.gpus_per_node
    assert world == settings.world_size() == cfg.parallel.dp * cfg.parallel.cp, (
        f"{name}: {settings.num_nodes} nodes x {settings.gpus_per_node} GPUs = {world}, but {cfg.run.name} "
        f"needs dp {cfg.parallel.dp} x cp {cfg.parallel.cp}"
    )
    # The smoke job the release tests with requests the same nodes and GPUs.
    (smoke,) = [
        o
        for o in objs
        if o["kind"] in ("TrainJob", "PyTorchJob") and o["metadata"]["name"].endswith("-smoke")
    ]
    if smoke["kind"] == "TrainJob":
        nodes, limits = (
            smoke["spec"]["trainer"]["numNodes"],
            smoke["spec"]["trainer"]["resourcesPerNode"]["limits"],
        )
    else:
        replicas = smoke["spec"]["pytorchReplicaSpecs"]
        nodes = sum(r["replicas"] for r in replicas.values())
        limits = replicas["Master"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert nodes * int(limits["nvidia.com/gpu"]) == world


def test_gpu_values_launch_the_shipped_run_config(rendered):
    """The launcher renders the GPU profile's stage job for the shipped config, one torchrun rank per GPU."""
    from ringzero.cluster.job import StageJob
    from ringzero.cluster.launch import render_stage

    settings = ClusterSettings.model_validate(
        yaml.safe_load(the(rendered["gpu"], "ConfigMap", "-cluster")["data"]["cluster.yaml"])
    )
    cfg = shipped_run_config(rendered["gpu"])
    job = StageJob(
        run=cfg.run.name,
        stage="base",
        name="cluster-h200-base-0a1b2c3d",
        namespace=NAMESPACE,
        config_yaml="",
        dp=cfg.parallel.dp,
        cp=cfg.parallel.cp,
    )
    trainer = render_stage(settings, job)[-1]["spec"]["trainer"]
    assert trainer["command"] == ["torchrun"]
    assert trainer["args"][:2] == ["--nnodes=1", "--nproc-per-node=4"]


def test_run_config_map_ships_the_cluster_config(rendered):
    shipped = the(rendered["defaults"], "ConfigMap", "-runs")["data"]
    source = (REPO / "configs" / "cluster-h200.yaml").read_text()
    assert shipped["cluster-h200.yaml"].rstrip("\n") == source.rstrip("\n")
    cfg = parse_config(yaml.safe_load(shipped["cluster-h200.yaml"]), "cluster-h200.yaml")
    assert cfg.run.name == "cluster-h200"


def test_chart_copy_of_the_run_config_matches_configs():
    chart_copy = CHART / "files" / "runs" / "cluster-h200.yaml"
    assert chart_copy.read_text() == (REPO / "configs" / "cluster-h200.yaml").read_text(), (
        "copy configs/cluster-h200.yaml to helm/ringzero/files/runs/ after changing it"
    )


def test_extra_run_configs_are_shipped_and_selectable(helm_bin, tmp_path):
    from cluster_kit import render

    objs = render(
        helm_bin,
        [],
        (
            "runConfigs.bundled=false",
            "runConfigs.extra.mine\\.yaml=run: {name: mine}",
            "pipeline.runConfig=mine.yaml",
        ),
    )
    data = the(objs, "ConfigMap", "-runs")["data"]
    assert list(data) == ["mine.yaml"]
    upload = the(objs, "Job", "-pipeline-upload")
    env = {e["name"]: e.get("value") for e in upload["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["RUN_CONFIG"] == "mine.yaml"


def test_upload_job_compiles_with_this_release_settings(rendered):
    container = the(rendered["multiuser"], "Job", "-pipeline-upload")["spec"]["template"]["spec"][
        "containers"
    ][0]
    script = container["args"][0]
    assert "ringzero kfp compile" in script and "python -m ringzero.cluster.kfp_upload" in script
    # the release's settings come from its cluster ConfigMap, mounted where --install reads it
    assert "--install /etc/ringzero/cluster" in script
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["cluster"] == "/etc/ringzero/cluster"
    volumes = the(rendered["multiuser"], "Job", "-pipeline-upload")["spec"]["template"]["spec"]["volumes"]
    (token,) = [v for v in volumes if v["name"] == "kfp-token"]
    assert token["projected"]["sources"][0]["serviceAccountToken"]["audience"] == "pipelines.kubeflow.org"
    default = the(rendered["defaults"], "Job", "-pipeline-upload")["spec"]["template"]["spec"]
    assert "kfp-token" not in str(default["volumes"])


def test_upload_script_overrides_load_with_the_real_config_loader(rendered, tmp_path):
    """Run the upload Job's shell script with stand-ins for ringzero and python that record their argv,
    then feed the recorded compile overrides to the loader `ringzero kfp compile` uses."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from ringzero.kfp.install import from_dir
    from ringzero.kfp.settings import load_kfp_config

    objs = rendered["external-s3"]
    job = the(objs, "Job", "-pipeline-upload")["spec"]["template"]["spec"]
    container = job["containers"][0]
    maps = {o["metadata"]["name"]: o["data"] for o in objs if o["kind"] == "ConfigMap"}
    etc = tmp_path / "etc"
    for volume in job["volumes"]:
        if "configMap" in volume:
            folder = etc / volume["name"]
            folder.mkdir(parents=True)
            for key, text in maps[volume["configMap"]["name"]].items():
                (folder / key).write_text(text)
    env = {"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "ARGV_DIR": str(tmp_path)}
    for e in container["env"]:
        ref = (e.get("valueFrom") or {}).get("configMapKeyRef")
        env[e["name"]] = maps[ref["name"]][ref["key"]] if ref else e["value"]
    (tmp_path / "bin").mkdir()
    for tool in ("ringzero", "python"):
        stand_in = tmp_path / "bin" / tool
        stand_in.write_text(
            f'#!/bin/sh\n"{sys.executable}" -c \'import json,sys; '
            f'json.dump(sys.argv[1:], open("{tmp_path}/{tool}.json", "w"))\' "$@"\n'
        )
        stand_in.chmod(0o755)
    script = (
        container["args"][0]
        .replace("/etc/ringzero/runs", str(etc / "runs"))
        .replace("/etc/ringzero/cluster", str(etc / "cluster"))
    )
    done = subprocess.run(["/bin/sh", "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr

    argv = json.loads((tmp_path / "ringzero.json").read_text())
    assert argv[:2] == ["kfp", "compile"] and argv[argv.index("--output") + 1] == "/tmp/pipeline.yaml"
    # What `ringzero kfp compile --install DIR` makes of the mounted ConfigMap, through the real loader.
    installed = from_dir(argv[argv.index("--install") + 1])
    cfg, kfp = load_kfp_config(argv[2], installed.overrides(Path(argv[2]).name))
    assert cfg.storage.root == "s3://my-ringzero-runs/runs/cluster-h200"
    assert (cfg.storage.s3.endpoint, cfg.storage.s3.secure, cfg.storage.s3.region) == (
        "s3.us-east-1.amazonaws.com",
        True,
        "us-east-1",
    )
    assert (kfp.mode, kfp.base_image, kfp.s3_secret.name) == ("cluster", "ringzero/cpu:0.1.0", "ringzero-s3")
    assert kfp.service_account == "rz-ringzero" and cfg.cluster.service_account == "rz-ringzero"
    assert cfg.cluster.images.trainer.repository == "ringzero/trainer"
    upload = json.loads((tmp_path / "python.json").read_text())
    assert upload[:3] == ["-m", "ringzero.cluster.kfp_upload", "/tmp/pipeline.yaml"]
    assert upload[upload.index("--name") + 1] == "ringzero" and "--token-file" not in upload
