"""Shared helpers of the cluster tests: chart rendering, pod extraction, and offline schema validation."""

from __future__ import annotations

import functools
import json
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
    "external-s3": ["values-external-s3.yaml"],
    "cpu-external-s3": ["values-cpu.yaml", "values-external-s3.yaml"],
    "pytorchjob": ["values-pytorchjob.yaml"],
    "gpu-pytorchjob": ["values-gpu.yaml", "values-pytorchjob.yaml"],
    "multiuser": ["values-multiuser.yaml"],
}
CRD_KINDS = {"TrainJob": "trainjobs.yaml", "PyTorchJob": "pytorchjobs.yaml"}


def helm(helm_bin: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(helm_bin), *args], capture_output=True, text=True, timeout=120)


def render(helm_bin: Path, files: list[str], sets: tuple[str, ...] = ()) -> list[dict]:
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE]
    for f in files:
        args += ["-f", str(CHART / f)]
    for s in sets:
        args += ["--set", s]
    done = helm(helm_bin, *args)
    if done.returncode != 0:
        raise AssertionError(f"helm template {files} {sets} failed:\n{done.stderr}")
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def pod_specs(obj: dict) -> list[tuple[str, dict]]:
    """(where, pod spec) of every pod an object creates; for a TrainJob, its runtime patch's pod spec."""
    kind, spec = obj["kind"], obj.get("spec") or {}
    if kind in ("Deployment", "Job", "StatefulSet", "DaemonSet"):
        return [(kind, spec["template"]["spec"])]
    if kind == "PyTorchJob":
        return [(f"PyTorchJob/{role}", r["template"]["spec"]) for role, r in spec["pytorchReplicaSpecs"].items()]
    if kind == "TrainJob":
        found = []
        for patch in spec.get("runtimePatches", []):
            for job in patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]:
                found.append((f"TrainJob/{job['name']}", job["template"]["spec"]["template"]["spec"]))
        return found
    return []


def _strict(node):
    """Close every object schema that lists its properties: the API server would silently prune a typo."""
    if isinstance(node, dict):
        if ("properties" in node and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")):
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
            raise AssertionError("; ".join(f"{'.'.join(map(str, e.path))}: {e.message[:200]}" for e in errors))
        return
    try:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        raise AssertionError(f"{obj['kind']} {obj['metadata']['name']}: {'.'.join(map(str, e.path))}: {e.message}") from None


def dumps(objs: list[dict]) -> str:
    return json.dumps(objs, sort_keys=True)
