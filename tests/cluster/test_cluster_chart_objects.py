"""Object-level rules of every rendered combination: explicit namespaces, images pinned by digest on request,
and S3 credentials mounted as files (never environment values)."""

from __future__ import annotations

import pytest
import yaml
from cluster_kit import COMBINATIONS, NAMESPACE, pod_specs, render

from ringzero.config.cluster import ClusterSettings

# Kinds that live outside any namespace; everything else the chart renders must name its namespace.
CLUSTER_SCOPED = {
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "CustomResourceDefinition",
    "PersistentVolume",
    "StorageClass",
    "PriorityClass",
    "ClusterTrainingRuntime",
    "ValidatingWebhookConfiguration",
    "MutatingWebhookConfiguration",
}
DIGEST = "sha256:" + "0123456789abcdef" * 4
# values path of each image -> its repository in values.yaml
IMAGES = {
    "images.trainer": "ringzero/trainer",
    "images.rollout": "ringzero/rollout",
    "images.cpu": "ringzero/cpu",
    "minio.image": "quay.io/minio/minio",
    "minio.clientImage": "quay.io/minio/mc",
}
KEY_DIR = "/etc/ringzero/s3"


def namespace_problems(objs: list[dict]) -> list[str]:
    return [
        f"{o['kind']}/{o['metadata']['name']}: metadata.namespace is {o['metadata'].get('namespace')!r}"
        for o in objs
        if o["kind"] not in CLUSTER_SCOPED and o["metadata"].get("namespace") != NAMESPACE
    ]


def containers(obj: dict) -> list[dict]:
    """Every container of the object; a TrainJob's trainer counts as one (its image and env run there)."""
    found = [
        c for _, pod in pod_specs(obj) for c in pod.get("initContainers", []) + pod.get("containers", [])
    ]
    if obj["kind"] == "TrainJob":
        found.append({"name": "trainer", **obj["spec"]["trainer"]})
    return found


def images(objs: list[dict]) -> list[str]:
    return [c["image"] for o in objs for c in containers(o) if "image" in c]


def settings(objs: list[dict]) -> ClusterSettings:
    (cm,) = [o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-cluster")]
    return ClusterSettings.model_validate(yaml.safe_load(cm["data"]["cluster.yaml"]))


@pytest.mark.parametrize("name", sorted(COMBINATIONS))
def test_every_namespaced_object_names_the_release_namespace(rendered, name):
    objs = rendered[name]
    hooks = [o for o in objs if "helm.sh/hook" in (o["metadata"].get("annotations") or {})]
    assert hooks, "hooks and test pods are rendered too"
    problems = namespace_problems(objs)
    assert not problems, "\n".join(problems)


def test_the_namespace_check_flags_a_missing_namespace(rendered):
    objs = [dict(o, metadata=dict(o["metadata"])) for o in rendered["defaults"]]
    del objs[0]["metadata"]["namespace"]
    assert namespace_problems(objs) == [
        f"{objs[0]['kind']}/{objs[0]['metadata']['name']}: metadata.namespace is None"
    ]
    assert not namespace_problems([{"kind": "ClusterRole", "metadata": {"name": "x"}}])


@pytest.mark.parametrize("path", sorted(IMAGES))
@pytest.mark.parametrize("files", [[], ["values-cpu.yaml"], ["values-gpu.yaml", "values-pytorchjob.yaml"]])
def test_a_digest_pins_every_container_of_that_image(helm_bin, path, files):
    repo = IMAGES[path]
    plain = render(helm_bin, files)
    pinned = render(helm_bin, files, (f"{path}.digest={DIGEST}",))
    ours = [i for i in images(pinned) if i.split("@")[0].rsplit(":", 1)[0] == repo]
    before = [i for i in images(plain) if i.rsplit(":", 1)[0] == repo]
    assert len(ours) == len(before)
    assert all(i == f"{repo}@{DIGEST}" for i in ours), ours
    assert all(i.startswith(f"{repo}:") and "@" not in i for i in before), before
    # Every other image is untouched.
    assert sorted(i for i in images(pinned) if i not in ours) == sorted(
        i for i in images(plain) if i not in before
    )
    if path.startswith("images."):
        kind = path.split(".")[1]
        # The launcher starts this image for stages and rollout servers: the digest reaches it too.
        assert getattr(settings(pinned).images, kind).ref() == f"{repo}@{DIGEST}"
        assert getattr(settings(plain).images, kind).ref() == f"{repo}:0.1.0"
    else:
        assert ours, f"no chart container runs {path}"


def test_chart_images_are_found(rendered):
    """The digest test would pass vacuously if no container ran the image: each chart image is used."""
    used = {i.rsplit(":", 1)[0] for i in images(rendered["defaults"]) + images(rendered["cpu"])}
    assert {"ringzero/trainer", "ringzero/cpu", "quay.io/minio/minio", "quay.io/minio/mc"} <= used


@pytest.mark.parametrize("bad", ["sha256:abc", "sha512:" + "0" * 128, "0" * 64, DIGEST.upper()])
def test_the_schema_refuses_a_malformed_digest(helm_bin, bad):
    from cluster_kit import CHART, RELEASE, helm

    done = helm(helm_bin, "template", RELEASE, str(CHART), "--set", f"images.trainer.digest={bad}")
    assert done.returncode != 0 and "digest" in done.stderr, done.stderr


@pytest.mark.parametrize("name", sorted(COMBINATIONS))
def test_s3_keys_reach_pods_as_mounted_files(rendered, name):
    objs = rendered[name]
    assert "secretKeyRef" not in yaml.safe_dump_all(objs), "credentials must not be environment variables"
    readers = 0
    for obj in objs:
        pods = pod_specs(obj)
        env_of = {c["name"]: {e["name"]: e.get("value") for e in c.get("env", [])} for c in containers(obj)}
        for where, pod in pods:
            volumes = {v["name"]: v["secret"] for v in pod.get("volumes", []) if "secret" in v}
            for secret in volumes.values():
                assert secret["secretName"] == "ringzero-s3"
                assert secret["defaultMode"] in (0o400, 0o440)
                assert secret["items"] == [
                    {"key": "access-key", "path": "access-key"},
                    {"key": "secret-key", "path": "secret-key"},
                ]
            for c in pod.get("initContainers", []) + pod.get("containers", []):
                mounts = [m for m in c.get("volumeMounts", []) if m["name"] in volumes]
                for m in mounts:
                    assert m["readOnly"] is True and m["mountPath"] == KEY_DIR, (where, m)
                env = env_of.get(c["name"], {}) | (
                    env_of.get("trainer", {}) if obj["kind"] == "TrainJob" else {}
                )
                files = {k: v for k, v in env.items() if k.endswith("_FILE") and v and v.startswith(KEY_DIR)}
                if files:
                    assert mounts, f"{where}/{c['name']} names key files it does not mount"
                    readers += 1
                    assert sorted(files.values()) == [f"{KEY_DIR}/access-key", f"{KEY_DIR}/secret-key"]
    # The smoke job's node, and with the bundled MinIO its server and the bucket job.
    minio = [o for o in objs if o["kind"] == "Deployment"]
    assert readers == 1 + 2 * len(minio), f"{readers} containers read the keys"
