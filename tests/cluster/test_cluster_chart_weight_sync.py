"""Weight sync in the chart: the values reach the launcher's settings, and bad ones are refused."""

from __future__ import annotations

import pytest
import yaml
from cluster_kit import CHART, NAMESPACE, RELEASE, helm, render
from pydantic import ValidationError

from ringzero.config.cluster import ClusterSettings, RolloutSettings

DISK = ("cluster.rollout.weightSync=disk", "cluster.rollout.sharedWeightsPvc=rz-weights")


def the(objs, kind, suffix):
    (obj,) = [o for o in objs if o["kind"] == kind and o["metadata"]["name"].endswith(suffix)]
    return obj


def cluster_settings(objs) -> ClusterSettings:
    return ClusterSettings.model_validate(yaml.safe_load(the(objs, "ConfigMap", "-cluster")["data"]["cluster.yaml"]))


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
        defaults.weight_sync, defaults.shared_weights_pvc, defaults.shared_weights_mount)


def test_disk_sync_carries_the_claim_and_mount(helm_bin):
    objs = render(helm_bin, ["values-gpu.yaml"], (*DISK, "cluster.rollout.sharedWeightsMount=/weights"))
    raw = rollout_yaml(objs)
    assert (raw["weight_sync"], raw["shared_weights_pvc"], raw["shared_weights_mount"]) == (
        "disk", "rz-weights", "/weights")
    settings = cluster_settings(objs)
    assert settings.namespace == NAMESPACE
    assert (settings.rollout.weight_sync, settings.rollout.shared_weights_pvc,
            settings.rollout.shared_weights_mount) == ("disk", "rz-weights", "/weights")
    assert (settings.rollout.replicas, settings.rollout.tp_size) == (2, 4)  # the profile's values are kept


def test_a_claim_with_distributed_sync_is_carried(helm_bin):
    settings = cluster_settings(render(helm_bin, [], ("cluster.rollout.sharedWeightsPvc=rz-weights",)))
    assert (settings.rollout.weight_sync, settings.rollout.shared_weights_pvc) == ("distributed", "rz-weights")


# (--set, fragments of helm's error, the same setting as the launcher's ClusterSettings rollout fields)
REFUSED = [
    ("cluster.rollout.weightSync=nccl", ["/cluster/rollout/weightSync", "distributed", "disk"],
     {"weight_sync": "nccl"}),
    ("cluster.rollout.weightSync=disk", ["/cluster/rollout/sharedWeightsPvc", "minLength"],
     {"weight_sync": "disk"}),
    ("cluster.rollout.sharedWeightsPvc=Weights_PVC", ["/cluster/rollout/sharedWeightsPvc", "pattern"],
     {"shared_weights_pvc": "Weights_PVC"}),
    ("cluster.rollout.sharedWeightsMount=weights", ["/cluster/rollout/sharedWeightsMount", "pattern"],
     {"shared_weights_mount": "weights"}),
    ("cluster.rollout.sharedWeightsMount=/", ["/cluster/rollout/sharedWeightsMount"],
     {"shared_weights_mount": "/"}),
    ("cluster.rollout.sharedWeightsMount=/tmp", ["/cluster/rollout/sharedWeightsMount"],
     {"shared_weights_mount": "/tmp"}),
    ("cluster.rollout.sharedWeightsMount=/models/", ["/cluster/rollout/sharedWeightsMount"],
     {"shared_weights_mount": "/models/"}),
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
    done = helm(helm_bin, "template", RELEASE, str(CHART), "--skip-schema-validation",
                "--set", "cluster.rollout.weightSync=disk")
    assert done.returncode != 0
    assert "cluster.rollout.weightSync disk needs cluster.rollout.sharedWeightsPvc" in done.stderr, done.stderr


def test_mount_paths_the_launcher_accepts_pass_the_schema(helm_bin):
    for mount in ("/shared-weights", "/mnt/weights", "/models-shared", "/tmp2"):
        RolloutSettings.model_validate({"shared_weights_mount": mount})
        render(helm_bin, [], (f"cluster.rollout.sharedWeightsMount={mount}",))
