"""What the launcher submits: valid TrainJob/PyTorchJob/rollout objects that carry the run's settings."""

from __future__ import annotations

import pytest
import yaml
from cluster_helm_cli import REPO
from cluster_kit import plain_secret_env, pod_specs, restricted_violations, validate
from pydantic import ValidationError

from ringzero.cluster.job import StageJob
from ringzero.cluster.labels import OwnerRef, launch_name
from ringzero.cluster.launch import render_stage
from ringzero.cluster.rollout import RolloutSpec
from ringzero.config import load_config
from ringzero.config.cluster import ClusterSettings
from ringzero.errors import RingzeroError
from ringzero.store.config import S3Settings

IMAGES = {
    k: {"repository": f"registry.example/ringzero/{k}", "tag": "0.1.0"} for k in ("trainer", "rollout", "cpu")
}


def settings(**over) -> ClusterSettings:
    base = {
        "namespace": "ml",
        "images": IMAGES,
        "s3_secret": {"name": "ringzero-s3"},
        "num_nodes": 2,
        "gpus_per_node": 8,
        "node_selector": {"nvidia.com/gpu.product": "NVIDIA-H200"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "rollout": {"tp_size": 4, "replicas": 2},
    }
    return ClusterSettings.model_validate({**base, **over})


def job(**over) -> StageJob:
    base = dict(
        run="h200",
        stage="stage1",
        name=launch_name("h200", "stage1", "pod-abc"),
        namespace="ml",
        config_yaml="run: {name: h200}\n",
        dp=4,
        cp=4,
        stage_args=("--init", "s3://ringzero/runs/h200/base"),
        owner=OwnerRef("v1", "Pod", "step-pod", "1234-uid"),
    )
    return StageJob(**{**base, **over})


def rollout(lm_head_fp32=True, deterministic=False, body="bfloat16") -> RolloutSpec:
    return RolloutSpec(
        "s3://ringzero/runs/h200/base",
        S3Settings(endpoint="minio.ml.svc:9000"),
        lm_head_fp32,
        deterministic,
        seed=7,
        body=body,
    )


def kinds(objs):
    return [o["kind"] for o in objs]


@pytest.mark.parametrize("backend,kind", [("trainjob", "TrainJob"), ("pytorchjob", "PyTorchJob")])
def test_every_launched_object_validates(backend, kind):
    objs = render_stage(settings(backend=backend), job(), rollout())
    assert kinds(objs) == ["ConfigMap", "Deployment", "Service", "Service", kind]
    for obj in objs:
        validate(obj)
    shared = settings(
        backend=backend,
        rollout={
            "replicas": 2,
            "tp_size": 4,
            "weight_sync": "disk",
            "shared_weights_pvc": "ringzero-weights",
        },
    )
    for obj in render_stage(shared, job(), rollout()):
        validate(obj)


@pytest.mark.parametrize("backend", ["trainjob", "pytorchjob"])
def test_launched_pods_are_restricted(backend):
    objs = render_stage(settings(backend=backend), job(), rollout())
    pods = [p for o in objs for p in pod_specs(o)]
    assert len(pods) >= 2
    assert not [v for where, pod in pods for v in restricted_violations(where, pod)]


@pytest.mark.parametrize("backend", ["trainjob", "pytorchjob"])
def test_ipc_lock_is_added_to_the_nccl_containers_only_and_is_the_one_relaxation(backend):
    """cluster.ipc_lock gives IPC_LOCK back to the trainer and SGLang containers (NCCL over InfiniBand
    registers memory), not to the fetch-model init container; the restricted-profile check names it."""
    objs = render_stage(settings(backend=backend, ipc_lock=True), job(), rollout())
    added = {}
    for where, pod in (p for o in objs for p in pod_specs(o)):
        for c in [*pod.get("containers", []), *pod.get("initContainers", [])]:
            caps = (c.get("securityContext") or {}).get("capabilities") or {}
            if pod.get("containers") == [] and not caps:
                continue  # a TrainJob patch names the container, its context is in the patch
            added[c["name"]] = caps.get("add", [])
            assert caps.get("drop") == ["ALL"], (where, c["name"])
    assert added == {
        "node" if backend == "trainjob" else "pytorch": ["IPC_LOCK"],
        "sglang": ["IPC_LOCK"],
        "fetch-model": [],
    }
    violations = [
        v for where, pod in (p for o in objs for p in pod_specs(o)) for v in restricted_violations(where, pod)
    ]
    assert violations and all(v.endswith("adds capabilities") for v in violations)
    with pytest.raises(ValidationError, match="ipc_lock is for NCCL over InfiniBand"):
        settings(device="cpu", gpus_per_node=0, ipc_lock=True)


@pytest.mark.parametrize("backend", ["trainjob", "pytorchjob"])
def test_trainer_and_sglang_containers_have_a_memory_backed_dev_shm(backend):
    """NCCL (cross-pod weight sync, the trainer's collectives) and SGLang's TP workers exchange through
    /dev/shm, which is 64Mi unless the pod mounts its own."""
    objs = render_stage(settings(backend=backend), job(), rollout())
    seen = set()
    for _, pod in (p for o in objs for p in pod_specs(o)):
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        for c in pod.get("containers", []):
            shm = [m for m in c.get("volumeMounts", []) if m["mountPath"] == "/dev/shm"]
            assert len(shm) == 1, c["name"]
            empty = volumes[shm[0]["name"]]["emptyDir"]
            assert empty["medium"] == "Memory" and empty["sizeLimit"]
            seen.add(c["name"])
    assert seen >= {"sglang", "node" if backend == "trainjob" else "pytorch"}


STAGE = [
    "-m",
    "ringzero.cli.main",
    "stage",
    "run",
    "/etc/ringzero/run/config.yaml",
    "--stage",
    "stage1",
    "--init",
    "s3://ringzero/runs/h200/base",
]


def torchrun_flags(args: list[str]) -> dict[str, str]:
    """torchrun's own --name=value flags: everything before the -m that starts the stage."""
    return dict(a.removeprefix("--").split("=", 1) for a in args[: args.index("-m")])


def test_trainjob_runs_the_stage_on_torch_distributed():
    tj = render_stage(settings(), job())[-1]
    spec, trainer = tj["spec"], tj["spec"]["trainer"]
    assert spec["runtimeRef"] == {
        "apiGroup": "trainer.kubeflow.org",
        "kind": "ClusterTrainingRuntime",
        "name": "torch-distributed",
    }
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (2, 8)
    assert trainer["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == "8"
    assert trainer["image"] == "registry.example/ringzero/trainer:0.1.0"
    assert trainer["command"] == ["torchrun"]
    assert trainer["args"][trainer["args"].index("-m") :] == STAGE
    pod = pod_specs(tj)[0][1]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H200"}
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert {"name": "run-config", "configMap": {"name": f"{tj['metadata']['name']}-config"}} in pod["volumes"]


@pytest.mark.parametrize("nodes,gpus,dp,cp", [(1, 8, 2, 4), (2, 8, 4, 4), (4, 2, 8, 1), (3, 1, 1, 3)])
def test_trainjob_torchrun_matches_the_nodes_and_the_rendezvous_of_the_torch_plugin(nodes, gpus, dp, cp):
    j = job(dp=dp, cp=cp)
    trainer = render_stage(settings(num_nodes=nodes, gpus_per_node=gpus), j)[-1]["spec"]["trainer"]
    flags = torchrun_flags(trainer["args"])
    assert flags == {
        "nnodes": str(nodes),
        "nproc-per-node": str(gpus),
        "rdzv-backend": "c10d",
        "rdzv-endpoint": "$(PET_MASTER_ADDR):$(PET_MASTER_PORT)",
        "rdzv-id": j.name,
        "max-restarts": "0",
    }
    # The same counts in the fields the torch plugin turns into PET_NNODES / PET_NPROC_PER_NODE and the pods.
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (nodes, gpus)
    assert trainer["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == str(gpus)
    assert nodes * gpus == dp * cp
    # The plugin sets the PET_* variables; a job that set them itself would contradict it.
    assert not [
        e for e in trainer["env"] if e["name"].startswith("PET_") or e["name"] in ("RANK", "WORLD_SIZE")
    ]


@pytest.mark.parametrize("nodes,gpus,dp,cp", [(1, 8, 2, 4), (3, 8, 6, 4), (2, 4, 2, 4)])
def test_pytorchjob_torchrun_meets_at_the_master_the_operator_names(nodes, gpus, dp, cp):
    j = job(dp=dp, cp=cp)
    pj = render_stage(settings(backend="pytorchjob", num_nodes=nodes, gpus_per_node=gpus), j)[-1]
    assert pj["spec"]["nprocPerNode"] == str(gpus)
    assert "elasticPolicy" not in pj["spec"]
    replicas = pj["spec"]["pytorchReplicaSpecs"]
    assert sum(r["replicas"] for r in replicas.values()) == nodes
    for role in replicas.values():
        (container,) = role["template"]["spec"]["containers"]
        assert container["command"] == ["torchrun"]
        assert torchrun_flags(container["args"]) == {
            "nnodes": str(nodes),
            "nproc-per-node": str(gpus),
            "rdzv-backend": "c10d",
            "rdzv-endpoint": "$(MASTER_ADDR):$(MASTER_PORT)",
            "rdzv-id": j.name,
            "max-restarts": "0",
        }
        assert container["args"][container["args"].index("-m") :] == STAGE
        # MASTER_PORT is this port's number; the operator creates the Master's Service for it.
        assert {"name": "pytorchjob-port", "containerPort": 23456, "protocol": "TCP"} in container["ports"]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == str(gpus)


@pytest.mark.parametrize("backend", ["trainjob", "pytorchjob"])
@pytest.mark.parametrize("nodes,gpus,dp,cp", [(2, 8, 2, 4), (1, 8, 1, 4), (1, 4, 2, 4)])
def test_a_cluster_world_other_than_dp_times_cp_is_refused(backend, nodes, gpus, dp, cp):
    with pytest.raises(RingzeroError) as err:
        render_stage(settings(backend=backend, num_nodes=nodes, gpus_per_node=gpus), job(dp=dp, cp=cp))
    text = str(err.value)
    node_s = f"{nodes} node" + ("s" if nodes > 1 else "")
    assert f"cluster settings run {node_s} x {gpus} GPUs per node = {nodes * gpus} ranks" in text
    assert f"parallel.dp x parallel.cp = {dp} x {cp} = {dp * cp}" in text


def test_the_world_is_checked_before_anything_is_created():
    from cluster_fakes import FakeApi

    from ringzero.cluster.launch import launch_stage

    api = FakeApi({})
    with pytest.raises(RingzeroError, match="16 ranks"):
        launch_stage(api, settings(), job(dp=2, cp=4), rollout())
    assert api.created == []


def test_objects_are_tied_to_the_run_and_owned_by_the_step_pod():
    j = job()
    for obj in render_stage(settings(), j, rollout()):
        labels = obj["metadata"]["labels"]
        assert (labels["ringzero.dev/run"], labels["ringzero.dev/stage"], labels["ringzero.dev/launch"]) == (
            "h200",
            "stage1",
            j.name,
        )
        assert obj["metadata"]["ownerReferences"] == [
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": "step-pod",
                "uid": "1234-uid",
                "blockOwnerDeletion": False,
            }
        ]
    tj = render_stage(settings(), j)[-1]
    patch = tj["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    assert patch["template"]["spec"]["template"]["metadata"]["labels"]["ringzero.dev/launch"] == j.name


def test_pytorchjob_fallback_has_master_and_workers():
    pj = render_stage(settings(backend="pytorchjob", num_nodes=3), job(dp=6, cp=4))[-1]
    replicas = pj["spec"]["pytorchReplicaSpecs"]
    assert (replicas["Master"]["replicas"], replicas["Worker"]["replicas"]) == (1, 2)
    assert pj["spec"]["nprocPerNode"] == "8"
    container = replicas["Master"]["template"]["spec"]["containers"][0]
    assert container["name"] == "pytorch" and container["command"] == ["torchrun"]
    single = render_stage(settings(backend="pytorchjob", num_nodes=1), job(dp=2, cp=4))[-1]
    assert "Worker" not in single["spec"]["pytorchReplicaSpecs"]


def test_rollout_servers_follow_the_precision_policy():
    deployment, service = render_stage(settings(), job(), rollout(lm_head_fp32=True))[1:3]
    pod = deployment["spec"]["template"]["spec"]
    server = pod["containers"][0]
    args = server["args"]
    assert args[args.index("--tp-size") + 1] == "4"
    assert args[args.index("--random-seed") + 1] == "7"
    assert args[args.index("--model-path") + 1] == "/models/policy"
    assert args[args.index("--dtype") + 1] == "bfloat16"
    assert "--enable-fp32-lm-head" in args and "--enable-deterministic-inference" not in args
    assert server["resources"]["limits"]["nvidia.com/gpu"] == "4"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert server[probe]["httpGet"] == {"path": "/health", "port": "http"}
    assert server["ports"] == [{"name": "http", "containerPort": 30000, "protocol": "TCP"}]
    assert service["spec"]["ports"][0]["port"] == 30000
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    fetch = pod["initContainers"][0]
    assert fetch["args"][:2] == ["s3://ringzero/runs/h200/base", "/models/policy"]
    assert deployment["spec"]["replicas"] == 2
    plain = render_stage(settings(), job(), rollout(lm_head_fp32=False, deterministic=True, body="float32"))[
        1
    ]
    plain_args = plain["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--enable-fp32-lm-head" not in plain_args and "--enable-deterministic-inference" in plain_args
    assert plain_args[plain_args.index("--dtype") + 1] == "float32"
    assert plain_args[plain_args.index("--random-seed") + 1] == "7"
    # SGLang has no flag for the attention softmax precision: none is invented.
    assert not [a for a in args + plain_args if "softmax" in a]


def test_a_float64_rollout_body_is_refused_for_sglang():
    with pytest.raises(RingzeroError, match="SGLang serves bfloat16 or float32.*float64"):
        render_stage(settings(), job(), rollout(body="float64"))


def test_every_replica_is_resolvable_through_a_headless_service():
    j = job()
    deployment, service, headless = render_stage(settings(), j, rollout())[1:4]
    assert headless["metadata"]["name"] == f"{j.name}-pods" and len(headless["metadata"]["name"]) <= 63
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is False
    assert (
        headless["spec"]["selector"]
        == deployment["spec"]["selector"]["matchLabels"]
        == service["spec"]["selector"]
    )
    assert headless["spec"]["ports"] == service["spec"]["ports"]
    assert "clusterIP" not in service["spec"]  # the load-balanced Service stays as it was


def overrides(args: list[str]) -> dict[str, str]:
    pairs = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
    return dict(
        p.removeprefix("engines.rollout.").split("=", 1) for p in pairs if p.startswith("engines.rollout.")
    )


def test_the_trainer_is_pointed_at_every_replica_and_the_served_checkpoint():
    j = job()
    args = render_stage(settings(), j, rollout())[-1]["spec"]["trainer"]["args"]
    assert overrides(args) == {
        "kind": "sglang",
        "endpoint": f"http://{j.name}-rollout.ml.svc:30000",
        "replica_dns": f"{j.name}-pods.ml.svc:30000",
        "replicas": "2",
        "tp_size": "4",
        "weight_sync": "distributed",
        "served_uri": "s3://ringzero/runs/h200/base",
    }
    # The overrides load into the run config the job reads.
    cfg = load_config(
        REPO / "configs" / "tiny-cpu.yaml", [f"engines.rollout.{k}={v}" for k, v in overrides(args).items()]
    )
    engine = cfg.engines.rollout
    assert (engine.replica_dns, engine.replicas, engine.tp_size, engine.weight_sync) == (
        f"{j.name}-pods.ml.svc:30000",
        2,
        4,
        "distributed",
    )


@pytest.mark.parametrize("backend", ["trainjob", "pytorchjob"])
def test_disk_sync_mounts_one_claim_in_trainer_and_server_pods(backend):
    j = job()
    shared = settings(
        backend=backend,
        rollout={
            "replicas": 2,
            "tp_size": 4,
            "weight_sync": "disk",
            "shared_weights_pvc": "ringzero-weights",
        },
    )
    objs = render_stage(shared, j, rollout())
    claim = {"name": "shared-weights", "persistentVolumeClaim": {"claimName": "ringzero-weights"}}
    for where, pod in [p for o in objs for p in pod_specs(o)]:
        assert claim in pod["volumes"], where
        for container in pod["containers"]:
            (mount,) = [m for m in container["volumeMounts"] if m["name"] == "shared-weights"]
            assert mount["mountPath"] == "/shared-weights"
            assert mount.get("readOnly", False) == (container["name"] == "sglang"), where
    trainer = objs[-1]
    args = (
        trainer["spec"]["trainer"]["args"]
        if backend == "trainjob"
        else (trainer["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["args"])
    )
    assert overrides(args)["weight_sync"] == "disk"
    assert overrides(args)["weights_dir"] == f"/shared-weights/{j.name}"
    # Without a rollout nothing is mounted.
    assert "shared-weights" not in str(render_stage(shared, j)[-1])


def test_disk_sync_without_a_shared_volume_is_refused():
    with pytest.raises(ValidationError, match="weight_sync disk needs shared_weights_pvc"):
        settings(rollout={"weight_sync": "disk"})
    with pytest.raises(ValidationError, match="shared_weights_mount"):
        settings(rollout={"weight_sync": "disk", "shared_weights_pvc": "w", "shared_weights_mount": "/tmp"})


@pytest.mark.parametrize("preset,flag", [("fp32-islands", True), ("bf16", False)])
def test_rollout_spec_comes_from_the_run_config(preset, flag):
    cfg = load_config(REPO / "configs" / "tiny-cpu.yaml", [f"precision.rollout={preset}", "run.seed=3"])
    spec = RolloutSpec.from_run_config(cfg, "s3://b/p/ckpt")
    assert (spec.lm_head_fp32, spec.seed, spec.body) == (flag, 3, "bfloat16")


def test_trainer_reaches_the_rollout_service_it_waits_for():
    j = job()
    objs = render_stage(settings(), j, rollout())
    args = objs[-1]["spec"]["trainer"]["args"]
    assert f"engines.rollout.endpoint=http://{j.name}-rollout.ml.svc:30000" in args
    assert objs[2]["metadata"]["name"] == f"{j.name}-rollout"
    assert f"engines.rollout.replica_dns={j.name}-pods.ml.svc:30000" in args
    assert "engines.rollout.endpoint" not in str(render_stage(settings(), j)[-1])


def test_credentials_are_mounted_files_never_values(monkeypatch):
    monkeypatch.setenv("RINGZERO_S3_ACCESS_KEY", "CANARY-ACCESS-9f3a")
    monkeypatch.setenv("RINGZERO_S3_SECRET_KEY", "CANARY-SECRET-77b1")
    for backend in ("trainjob", "pytorchjob"):
        objs = render_stage(settings(backend=backend), job(), rollout())
        text = yaml.safe_dump_all(objs)
        assert "CANARY" not in text
        assert not [n for o in objs for n in plain_secret_env(o)]
        assert "secretKeyRef" not in text, "credentials must not reach the environment"
        readers = 0
        for where, pod in [p for o in objs for p in pod_specs(o)]:
            (volume,) = [v for v in pod["volumes"] if "secret" in v]
            assert volume["secret"] == {
                "secretName": "ringzero-s3",
                "defaultMode": 0o440,
                "items": [
                    {"key": "access-key", "path": "access-key"},
                    {"key": "secret-key", "path": "secret-key"},
                ],
            }
            for c in pod.get("initContainers", []) + pod["containers"]:
                mounts = [m for m in c.get("volumeMounts", []) if m["name"] == volume["name"]]
                env = {e["name"]: e.get("value") for e in c.get("env", [])}
                if mounts:
                    assert mounts == [
                        {"name": volume["name"], "mountPath": "/etc/ringzero/s3", "readOnly": True}
                    ]
                    readers += 1
                if "RINGZERO_S3_ACCESS_KEY_FILE" in env:
                    assert mounts, f"{where}/{c['name']} names key files it does not mount"
                    assert env["RINGZERO_S3_SECRET_KEY_FILE"] == "/etc/ringzero/s3/secret-key"
        trainer = objs[-1]
        trainer_env = (
            trainer["spec"]["trainer"]["env"]
            if backend == "trainjob"
            else trainer["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["env"]
        )
        assert {"name": "RINGZERO_S3_ACCESS_KEY_FILE", "value": "/etc/ringzero/s3/access-key"} in trainer_env
        assert readers >= 2, f"{backend}: the trainer and the fetch-model container mount the keys"


def test_credential_files_follow_the_secret_key_names():
    s = settings(s3_secret={"name": "store-keys", "access_key_key": "id", "secret_key_key": "key"})
    objs = render_stage(s, job(), rollout())
    volumes = [v["secret"] for o in objs for _, pod in pod_specs(o) for v in pod["volumes"] if "secret" in v]
    assert volumes and all(
        v["secretName"] == "store-keys"
        and v["items"] == [{"key": "id", "path": "access-key"}, {"key": "key", "path": "secret-key"}]
        for v in volumes
    )


def test_secret_looking_plain_env_is_refused():
    with pytest.raises(RingzeroError, match="HF_TOKEN"):
        job(env={"HF_TOKEN": "hf_abc"})
    assert job(env={"RINGZERO_S3_ACCESS_KEY_FILE": "/var/run/s3/key"}).env


def test_cpu_device_uses_the_cpu_image_and_refuses_sglang():
    cpu = settings(device="cpu", gpus_per_node=0, num_nodes=1, node_selector={}, tolerations=[])
    tj = render_stage(cpu, job(dp=1, cp=1))[-1]
    assert tj["spec"]["trainer"]["image"].startswith("registry.example/ringzero/cpu:")
    assert tj["spec"]["trainer"]["numProcPerNode"] == 1
    assert torchrun_flags(tj["spec"]["trainer"]["args"])["nproc-per-node"] == "1"
    with pytest.raises(RingzeroError, match="1 node x 1 process per CPU node = 1 rank,"):
        render_stage(cpu, job(dp=2, cp=1))
    assert "nvidia.com/gpu" not in str(tj)
    with pytest.raises(RingzeroError, match="need GPUs"):
        render_stage(cpu, job(dp=1, cp=1), rollout())


@pytest.mark.parametrize(
    "change,field",
    [
        ({"images": {**IMAGES, "trainer": {"repository": "r/t", "tag": "latest"}}}, "images.trainer.tag"),
        ({"images": {**IMAGES, "cpu": {"repository": "r/c:1.0", "tag": "1.0"}}}, "images.cpu.repository"),
        ({"device": "cpu"}, "gpus_per_node must be 0"),
        ({"gpus_per_node": 0}, "gpus_per_node must be at least 1"),
        ({"namespace": "Not_A_Label"}, "namespace"),
        ({"tolerations": [{"key": "k", "operator": "Exists", "value": "v"}]}, "tolerations.0"),
        ({"s3_secret": {"name": "ringzero-s3", "access_key": "AKIA"}}, "s3_secret.access_key"),
    ],
)
def test_bad_cluster_settings_name_the_field(change, field):
    with pytest.raises(ValidationError) as err:
        settings(**change)
    text = str(err.value).replace("\n", " ")
    assert field.split(".")[0] in text and field.split(".")[-1] in text, text


def test_launch_names_are_dns_labels_and_distinct():
    long_run = "a-very-long-run-name-that-goes-on-and-on-for-quite-a-while"
    names = {launch_name(long_run, "stage1", f"pod-{i}") for i in range(50)}
    assert len(names) == 50
    for name in names:
        assert len(f"{name}-rollout") <= 63 and name[0].isalnum() and name[-1].isalnum()
        assert len(f"{name}-pods") <= 63
