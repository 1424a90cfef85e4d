"""Weight sync in the chart: the values reach the launcher's settings, bad ones are refused, and the
NetworkPolicies open exactly the traffic distributed sync needs between the pods the launcher renders."""

from __future__ import annotations

import itertools

import pytest
import yaml
from cluster_kit import CHART, NAMESPACE, RELEASE, helm, render, validate
from pydantic import ValidationError

from ringzero.cluster.job import StageJob
from ringzero.cluster.launch import render_stage
from ringzero.cluster.rollout import PORT, RolloutSpec
from ringzero.config.cluster import ClusterSettings, RolloutSettings
from ringzero.store.config import S3Settings

DISK = ("cluster.rollout.weightSync=disk", "cluster.rollout.sharedWeightsPvc=rz-weights")
NCCL_PORT = 43117  # any port: NCCL and the group's TCP store listen on ports chosen at run time
PORTS = (PORT, 9000, 23456, 29500, NCCL_PORT)


def the(objs, kind, suffix):
    (obj,) = [o for o in objs if o["kind"] == kind and o["metadata"]["name"].endswith(suffix)]
    return obj


def cluster_settings(objs) -> ClusterSettings:
    return ClusterSettings.model_validate(
        yaml.safe_load(the(objs, "ConfigMap", "-cluster")["data"]["cluster.yaml"])
    )


def rollout_yaml(objs) -> dict:
    return yaml.safe_load(the(objs, "ConfigMap", "-cluster")["data"]["cluster.yaml"])["rollout"]


# --- the cluster settings ---------------------------------------------------------------------------------


def test_defaults_carry_distributed_sync_without_a_claim(rendered):
    raw = rollout_yaml(rendered["defaults"])
    assert set(raw) <= set(RolloutSettings.model_fields), set(raw) - set(RolloutSettings.model_fields)
    assert raw["weight_sync"] == "distributed" and raw["shared_weights_mount"] == "/shared-weights"
    assert "shared_weights_pvc" not in raw  # no claim: ClusterSettings' null, never an empty name
    settings = cluster_settings(rendered["defaults"]).rollout
    defaults = RolloutSettings()
    assert (settings.weight_sync, settings.shared_weights_pvc, settings.shared_weights_mount) == (
        defaults.weight_sync,
        defaults.shared_weights_pvc,
        defaults.shared_weights_mount,
    )


def test_disk_sync_carries_the_claim_and_mount(helm_bin):
    objs = render(helm_bin, ["values-gpu.yaml"], (*DISK, "cluster.rollout.sharedWeightsMount=/weights"))
    raw = rollout_yaml(objs)
    assert (raw["weight_sync"], raw["shared_weights_pvc"], raw["shared_weights_mount"]) == (
        "disk",
        "rz-weights",
        "/weights",
    )
    settings = cluster_settings(objs)
    assert settings.namespace == NAMESPACE
    assert (
        settings.rollout.weight_sync,
        settings.rollout.shared_weights_pvc,
        settings.rollout.shared_weights_mount,
    ) == ("disk", "rz-weights", "/weights")
    assert (settings.rollout.replicas, settings.rollout.tp_size) == (1, 4)  # the profile's values are kept


def test_a_claim_with_distributed_sync_is_carried(helm_bin):
    settings = cluster_settings(render(helm_bin, [], ("cluster.rollout.sharedWeightsPvc=rz-weights",)))
    assert (settings.rollout.weight_sync, settings.rollout.shared_weights_pvc) == (
        "distributed",
        "rz-weights",
    )


# (--set, fragments of helm's error, the same setting as the launcher's ClusterSettings rollout fields)
REFUSED = [
    (
        "cluster.rollout.weightSync=nccl",
        ["/cluster/rollout/weightSync", "distributed", "disk"],
        {"weight_sync": "nccl"},
    ),
    (
        "cluster.rollout.weightSync=disk",
        ["/cluster/rollout/sharedWeightsPvc", "minLength"],
        {"weight_sync": "disk"},
    ),
    (
        "cluster.rollout.sharedWeightsPvc=Weights_PVC",
        ["/cluster/rollout/sharedWeightsPvc", "pattern"],
        {"shared_weights_pvc": "Weights_PVC"},
    ),
    (
        "cluster.rollout.sharedWeightsMount=weights",
        ["/cluster/rollout/sharedWeightsMount", "pattern"],
        {"shared_weights_mount": "weights"},
    ),
    (
        "cluster.rollout.sharedWeightsMount=/",
        ["/cluster/rollout/sharedWeightsMount"],
        {"shared_weights_mount": "/"},
    ),
    (
        "cluster.rollout.sharedWeightsMount=/tmp",
        ["/cluster/rollout/sharedWeightsMount"],
        {"shared_weights_mount": "/tmp"},
    ),
    (
        "cluster.rollout.sharedWeightsMount=/models/",
        ["/cluster/rollout/sharedWeightsMount"],
        {"shared_weights_mount": "/models/"},
    ),
]


@pytest.mark.parametrize("setting,fragments,fields", REFUSED, ids=[r[0] for r in REFUSED])
def test_the_schema_refuses_what_the_launcher_refuses(helm_bin, setting, fragments, fields):
    done = helm(helm_bin, "template", RELEASE, str(CHART), "--set", setting)
    assert done.returncode != 0, f"{setting} was accepted"
    for fragment in fragments:
        assert fragment in done.stderr, done.stderr
    with pytest.raises(ValidationError):
        RolloutSettings.model_validate(fields)


def test_disk_without_a_claim_is_refused_even_without_the_schema(helm_bin):
    done = helm(
        helm_bin,
        "template",
        RELEASE,
        str(CHART),
        "--skip-schema-validation",
        "--set",
        "cluster.rollout.weightSync=disk",
    )
    assert done.returncode != 0
    assert "cluster.rollout.weightSync disk needs cluster.rollout.sharedWeightsPvc" in done.stderr, (
        done.stderr
    )


def test_mount_paths_the_launcher_accepts_pass_the_schema(helm_bin):
    for mount in ("/shared-weights", "/mnt/weights", "/models-shared", "/tmp2"):
        assert RolloutSettings.model_validate({"shared_weights_mount": mount}).shared_weights_mount == mount
        # the schema let it through and the chart carried it to the launcher's settings unchanged
        assert (
            rollout_yaml(render(helm_bin, [], (f"cluster.rollout.sharedWeightsMount={mount}",)))[
                "shared_weights_mount"
            ]
            == mount
        )


# --- the network policies against the pods the launcher renders ------------------------------------------


def template_labels(obj: dict) -> list[dict]:
    """Labels of every pod an object creates (for a TrainJob, its runtime patch's pod template)."""
    kind, spec = obj["kind"], obj.get("spec") or {}
    if kind in ("Deployment", "Job"):
        return [spec["template"]["metadata"]["labels"]]
    if kind == "PyTorchJob":
        return [r["template"]["metadata"]["labels"] for r in spec["pytorchReplicaSpecs"].values()]
    if kind == "TrainJob":
        return [
            job["template"]["spec"]["template"]["metadata"]["labels"]
            for patch in spec.get("runtimePatches", [])
            for job in patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
        ]
    return []


def launched_pods(settings: ClusterSettings) -> dict[str, dict]:
    """{trainer, rollout}: the pod labels of a sampling stage's job and servers, as the launcher renders
    them."""
    job = StageJob(
        run="cluster-h200",
        stage="rl",
        name="cluster-h200-rl-0a1b2c3d",
        namespace=NAMESPACE,
        config_yaml="",
        dp=settings.world_size() // 2,
        cp=2,
    )
    spec = RolloutSpec(
        "s3://ringzero/runs/cluster-h200/base",
        S3Settings(endpoint="minio.ml.svc:9000"),
        lm_head_fp32=True,
        deterministic=False,
        seed=7,
    )
    objs = render_stage(settings, job, spec)
    for obj in objs:
        validate(obj)
    (training,) = [o for o in objs if o["kind"] in ("TrainJob", "PyTorchJob")]
    (deployment,) = [o for o in objs if o["kind"] == "Deployment"]
    trainer_labels, rollout_labels = template_labels(training), template_labels(deployment)
    assert trainer_labels and all(labels == trainer_labels[0] for labels in trainer_labels)
    # The Services reach exactly these pods.
    for service in (o for o in objs if o["kind"] == "Service"):
        assert all(rollout_labels[0].get(k) == v for k, v in service["spec"]["selector"].items())
    return {"trainer": trainer_labels[0], "rollout": rollout_labels[0]}


def namespace_pods(objs: list[dict]) -> dict[str, dict]:
    """Every kind of pod in the release namespace: launched ones, the chart's own, and strangers."""
    pods = launched_pods(cluster_settings(objs))
    for suffix, name in (
        ("-minio", "minio"),
        ("-create-bucket", "bucket-job"),
        ("-pipeline-upload", "upload-job"),
    ):
        found = [
            o for o in objs if o["kind"] in ("Deployment", "Job") and o["metadata"]["name"].endswith(suffix)
        ]
        if found:
            pods[name] = template_labels(found[0])[0]
    (smoke,) = [
        o
        for o in objs
        if o["kind"] in ("TrainJob", "PyTorchJob") and o["metadata"]["name"].endswith("-smoke")
    ]
    pods["helm-test"] = template_labels(smoke)[0]  # component trainer, but managed by Helm
    pods["kfp-step"] = {"pipelines.kubeflow.org/v2_component": "true"}
    pods["stranger"] = {"app": "something-else"}
    pods["other-ringzero"] = {
        "app.kubernetes.io/part-of": "ringzero",
        "app.kubernetes.io/component": "rollout",
    }
    return pods


def selects(selector: dict, labels: dict) -> bool:
    ok = all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items())
    for e in selector.get("matchExpressions") or []:
        op, key, values = e["operator"], e["key"], e.get("values") or []
        ok &= {
            "In": labels.get(key) in values,
            "NotIn": labels.get(key) not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
    return ok


def allowed(policies: list[dict], src: dict, dst: dict, port: int) -> bool:
    """Kubernetes ingress semantics within one namespace: a pod no policy selects takes everything; a selected
    pod takes what one of its policies' rules lets in (no ``from``: any source; no ``ports``: any port)."""
    mine = [
        p
        for p in policies
        if "Ingress" in p["spec"]["policyTypes"] and selects(p["spec"]["podSelector"], dst)
    ]
    if not mine:
        return True
    for policy in mine:
        for rule in policy["spec"].get("ingress") or []:
            peers = rule.get("from") or []
            assert all(set(peer) == {"podSelector"} for peer in peers), (
                f"{policy['metadata']['name']}: {peers}"
            )
            if peers and not any(selects(peer["podSelector"], src) for peer in peers):
                continue
            ports = rule.get("ports") or []
            if ports and not any(p["port"] == port and p.get("protocol", "TCP") == "TCP" for p in ports):
                continue
            return True
    return False


def reachable(objs: list[dict], pods: dict[str, dict]) -> set[tuple[str, str, int]]:
    policies = [o for o in objs if o["kind"] == "NetworkPolicy"]
    return {
        (src, dst, port)
        for (src, s), (dst, d) in itertools.product(pods.items(), repeat=2)
        for port in PORTS
        if allowed(policies, s, d, port)
    }


def every_port(src: str, dst: str) -> set[tuple[str, str, int]]:
    return {(src, dst, port) for port in PORTS}


def weight_sync_policies(objs):
    return [
        o for o in objs if o["kind"] == "NetworkPolicy" and o["metadata"]["name"].endswith("-weight-sync")
    ]


TWO_SERVERS = ["values-gpu.yaml", "values-gpu-2node.yaml"]


@pytest.mark.parametrize(
    "files", [TWO_SERVERS, [*TWO_SERVERS, "values-pytorchjob.yaml"]], ids=["trainjob", "pytorchjob"]
)
def test_distributed_sync_opens_trainer_and_servers_to_each_other_and_nothing_else(helm_bin, files):
    """Two-node GPU profile (2 servers): trainer <-> server and server <-> server on every port, between
    launched pods."""
    distributed = render(helm_bin, files)
    disk = render(helm_bin, files, DISK)
    for obj in weight_sync_policies(distributed):
        validate(obj)
    pods = namespace_pods(distributed)
    assert pods == namespace_pods(disk)  # same pods, only the policies differ
    opened = reachable(distributed, pods) - reachable(disk, pods)
    assert not reachable(disk, pods) - reachable(distributed, pods)
    assert opened == (every_port("trainer", "rollout") - {("trainer", "rollout", PORT)}) | every_port(
        "rollout", "trainer"
    ) | every_port("rollout", "rollout")
    # Port 30000 from trainers was open already; nothing new reaches the chart's pods or the helm test job.
    assert ("trainer", "rollout", PORT) in reachable(disk, pods)
    assert {dst for _, dst, _ in opened} == {"rollout", "trainer"}


def test_one_server_needs_no_server_to_server_rule(rendered):
    """Default values: one server pod, whose TP ranks talk inside the pod; trainer <-> server stays open."""
    objs = rendered["defaults"]
    pods = namespace_pods(objs)
    now = reachable(objs, pods)
    assert every_port("trainer", "rollout") | every_port("rollout", "trainer") <= now
    assert not every_port("rollout", "rollout") & now
    (rollout_policy,) = [
        p for p in weight_sync_policies(objs) if p["metadata"]["name"].endswith("-rollout-weight-sync")
    ]
    assert len(rollout_policy["spec"]["ingress"][0]["from"]) == 1


def test_disk_sync_adds_no_policy(helm_bin, rendered):
    """Disk sync: the servers read the shared volume; the only traffic into them stays HTTP from trainers."""
    objs = render(helm_bin, ["values-gpu.yaml"], DISK)
    policies = sorted(o["metadata"]["name"] for o in objs if o["kind"] == "NetworkPolicy")
    assert policies == sorted(f"{RELEASE}-ringzero-{n}" for n in ("minio", "rollout", "trainer", "jobs"))
    pods = namespace_pods(objs)
    into_rollout = {(s, p) for s, d, p in reachable(objs, pods) if d == "rollout"}
    assert ("trainer", PORT) in into_rollout and {p for _, p in into_rollout} == {PORT}
    assert not {(s, d, p) for s, d, p in reachable(objs, pods) if s == "rollout" and d == "trainer"}


def test_cpu_clusters_have_no_servers_to_open(rendered):
    assert not weight_sync_policies(rendered["cpu"])


def test_the_policy_selectors_are_the_launcher_labels(rendered):
    """Spelled out: the new selectors are the launcher's part-of, managed-by and component labels."""
    from ringzero.cluster.labels import COMPONENT_LABEL, MANAGED_BY, PART_OF

    def launched(component):
        return {
            "app.kubernetes.io/part-of": PART_OF,
            "app.kubernetes.io/managed-by": MANAGED_BY,
            COMPONENT_LABEL: component,
        }

    policies = {
        p["metadata"]["name"].removeprefix(f"{RELEASE}-ringzero-"): p["spec"]
        for p in weight_sync_policies(rendered["gpu-2node"])
    }
    assert set(policies) == {"rollout-weight-sync", "trainer-weight-sync"}
    rollout, trainer = policies["rollout-weight-sync"], policies["trainer-weight-sync"]
    assert rollout["podSelector"] == {"matchLabels": launched("rollout")}
    assert [peer["podSelector"]["matchLabels"] for peer in rollout["ingress"][0]["from"]] == [
        launched("trainer"),
        launched("rollout"),
    ]
    assert trainer["podSelector"] == {"matchLabels": launched("trainer")}
    assert [peer["podSelector"]["matchLabels"] for peer in trainer["ingress"][0]["from"]] == [
        launched("rollout")
    ]
    for spec in policies.values():
        assert (
            spec["policyTypes"] == ["Ingress"]
            and len(spec["ingress"]) == 1
            and "ports" not in spec["ingress"][0]
        )
