"""Shared helpers of the cluster tests: chart rendering, pod extraction, and offline schema validation."""

from __future__ import annotations

import functools
import json
import re
import subprocess
from pathlib import Path

import jsonschema
import kubernetes_validate
import yaml
from cluster_helm_cli import REPO

CHART = REPO / "helm" / "ringzero"
SCHEMAS = Path(__file__).parent / "schemas"
KUBERNETES_VERSION = "1.32"  # the oldest minor the chart documents support for, with Trainer v2
NAMESPACE = "ml"
RELEASE = "rz"

# Each documented combination of values files (docs/cluster.md and the files' own headers).
COMBINATIONS: dict[str, list[str]] = {
    "defaults": [],
    "cpu": ["values-cpu.yaml"],
    "gpu": ["values-gpu.yaml"],
    "gpu-2node": ["values-gpu.yaml", "values-gpu-2node.yaml"],
    "external-s3": ["values-external-s3.yaml"],
    "cpu-external-s3": ["values-cpu.yaml", "values-external-s3.yaml"],
    "pytorchjob": ["values-pytorchjob.yaml"],
    "gpu-pytorchjob": ["values-gpu.yaml", "values-pytorchjob.yaml"],
    "multiuser": ["values-multiuser.yaml"],
}
SECRET_LOOKING = re.compile(r"(SECRET|PASSWORD|TOKEN|ACCESS_KEY|PRIVATE|CREDENTIAL)", re.IGNORECASE)
CRD_KINDS = {"TrainJob": "trainjobs.yaml", "PyTorchJob": "pytorchjobs.yaml"}


def helm(helm_bin: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(helm_bin), *args], capture_output=True, text=True, timeout=120)


def render_text(helm_bin: Path, files: list[str], sets: tuple[str, ...] = ()) -> str:
    """``helm template`` of the chart with these values files and ``--set``s, as YAML text."""
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE]
    for f in files:
        args += ["-f", str(CHART / f)]
    for s in sets:
        args += ["--set", s]
    done = helm(helm_bin, *args)
    if done.returncode != 0:
        raise AssertionError(f"helm template {files} {sets} failed:\n{done.stderr}")
    return done.stdout


def render(helm_bin: Path, files: list[str], sets: tuple[str, ...] = ()) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(render_text(helm_bin, files, sets)) if doc]


def pod_specs(obj: dict) -> list[tuple[str, dict]]:
    """(where, pod spec) of every pod an object creates; for a TrainJob, its runtime patch's pod spec."""
    kind, spec = obj["kind"], obj.get("spec") or {}
    if kind in ("Deployment", "Job", "StatefulSet", "DaemonSet"):
        return [(kind, spec["template"]["spec"])]
    if kind == "PyTorchJob":
        return [
            (f"PyTorchJob/{role}", r["template"]["spec"]) for role, r in spec["pytorchReplicaSpecs"].items()
        ]
    if kind == "TrainJob":
        found = []
        for patch in spec.get("runtimePatches", []):
            for job in patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]:
                found.append((f"TrainJob/{job['name']}", job["template"]["spec"]["template"]["spec"]))
        return found
    return []


def restricted_violations(where: str, pod: dict) -> list[str]:
    """What in a pod spec breaks the "restricted" Pod Security Standard (plus our read-only root rule)."""
    found = []
    psc = pod.get("securityContext") or {}
    if psc.get("runAsUser") == 0:
        found.append(f"{where}: pod runAsUser 0")
    if (psc.get("seccompProfile") or {}).get("type") != "RuntimeDefault":
        found.append(f"{where}: pod seccompProfile is not RuntimeDefault")
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(field):
            found.append(f"{where}: {field}")
    for vol in pod.get("volumes") or []:
        if "hostPath" in vol:
            found.append(f"{where}: hostPath volume {vol['name']}")
    mounts_tmp = False
    for c in (pod.get("initContainers") or []) + (pod.get("containers") or []):
        csc = c.get("securityContext") or {}
        name = f"{where}/{c['name']}"
        if not (csc.get("runAsNonRoot") or psc.get("runAsNonRoot")):
            found.append(f"{name}: runAsNonRoot not set")
        if csc.get("runAsUser") == 0:
            found.append(f"{name}: runAsUser 0")
        if csc.get("allowPrivilegeEscalation") is not False:
            found.append(f"{name}: allowPrivilegeEscalation not false")
        if csc.get("privileged"):
            found.append(f"{name}: privileged")
        if (csc.get("capabilities") or {}).get("drop") != ["ALL"]:
            found.append(f"{name}: capabilities not dropped ALL")
        if (csc.get("capabilities") or {}).get("add"):
            found.append(f"{name}: adds capabilities")
        if csc.get("readOnlyRootFilesystem") is not True:
            found.append(f"{name}: root filesystem writable")
        if (csc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type") != "RuntimeDefault":
            found.append(f"{name}: seccomp not RuntimeDefault")
        mounts_tmp |= any(m["mountPath"] == "/tmp" for m in c.get("volumeMounts") or [])
    if not mounts_tmp:
        found.append(f"{where}: no writable /tmp for a read-only root")
    return found


def plain_secret_env(obj: dict) -> list[str]:
    """Credential-looking env vars given as plain values anywhere in the object."""
    bad = []

    def walk(node):
        if isinstance(node, dict):
            if "name" in node and "value" in node and isinstance(node.get("name"), str):
                # *_FILE names carry the path of a mounted secret, not the secret.
                if SECRET_LOOKING.search(node["name"]) and not node["name"].endswith("_FILE"):
                    bad.append(node["name"])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(obj)
    return bad


def _strict(node):
    """Close every object schema that lists its properties: the API server would silently prune a typo."""
    if isinstance(node, dict):
        if (
            "properties" in node
            and "additionalProperties" not in node
            and not node.get("x-kubernetes-preserve-unknown-fields")
        ):
            node["additionalProperties"] = False
        for value in node.values():
            _strict(value)
    elif isinstance(node, list):
        for value in node:
            _strict(value)
    return node


@functools.cache
def crd_validator(kind: str) -> jsonschema.Draft7Validator:
    crd = yaml.safe_load((SCHEMAS / "crds" / CRD_KINDS[kind]).read_text())
    version = next(v for v in crd["spec"]["versions"] if v.get("storage"))
    return jsonschema.Draft7Validator(_strict(version["schema"]["openAPIV3Schema"]))


def validate(obj: dict) -> None:
    """Raise with the field path if the object is invalid for its kind (CRD schema or built-in schema)."""
    if obj["kind"] in CRD_KINDS:
        errors = sorted(crd_validator(obj["kind"]).iter_errors(obj), key=lambda e: list(e.path))
        if errors:
            raise AssertionError(
                "; ".join(f"{'.'.join(map(str, e.path))}: {e.message[:200]}" for e in errors)
            )
        return
    try:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        raise AssertionError(
            f"{obj['kind']} {obj['metadata']['name']}: {'.'.join(map(str, e.path))}: {e.message}"
        ) from None


def dumps(objs: list[dict]) -> str:
    return json.dumps(objs, sort_keys=True)
