"""The training-job CRD the cluster serves must have every field the launcher sets.

A field the API server does not know is pruned silently (structural CRDs drop unknown fields), so on
Kubeflow Trainer v2.1 a TrainJob's ``runtimePatches`` would vanish and its pods start without their
volumes, and ``activeDeadlineSeconds`` would never end a job the launcher could not. So before creating
anything the launcher reads the CRD and refuses, naming the version needed. Skipped (with a log line)
when the account may not read CRDs (the chart's ``rbac.readCluster`` grants it).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from ringzero.errors import RingzeroError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class JobCrd:
    name: str  # the CRD's metadata.name
    version: str  # the API version the launcher writes
    fields: tuple[str, ...]  # dotted paths under the object's schema that the launcher sets
    needs: str  # what to install when a field is missing


CRDS = {
    "trainjob": JobCrd(
        "trainjobs.trainer.kubeflow.org",
        "v1alpha1",
        (
            "spec.runtimeRef.name",
            "spec.trainer.image",
            "spec.trainer.command",
            "spec.trainer.numNodes",
            "spec.trainer.numProcPerNode",
            "spec.trainer.resourcesPerNode",
            "spec.runtimePatches",
            "spec.activeDeadlineSeconds",
        ),
        "Kubeflow Trainer v2.2 or newer (v2.1 has podTemplateOverrides instead of runtimePatches and no "
        "activeDeadlineSeconds)",
    ),
    "pytorchjob": JobCrd(
        "pytorchjobs.kubeflow.org",
        "v1",
        (
            "spec.pytorchReplicaSpecs",
            "spec.nprocPerNode",
            "spec.runPolicy.activeDeadlineSeconds",
            "spec.runPolicy.backoffLimit",
            "spec.runPolicy.cleanPodPolicy",
        ),
        "the Kubeflow Training Operator v1.8 or newer",
    ),
}


class CrdUnreadable(Exception):
    """The account may not read CustomResourceDefinitions: the check is skipped, not failed."""


def missing_fields(crd: dict, want: JobCrd) -> list[str]:
    """The launcher's fields that the CRD's schema for ``want.version`` lacks ([] when all are there)."""
    versions = {v.get("name"): v for v in (crd.get("spec") or {}).get("versions") or []}
    served = versions.get(want.version)
    if served is None or not served.get("served", True):
        return [
            f"version {want.version} (served: "
            f"{sorted(v for v in versions if versions[v].get('served', True))})"
        ]
    schema = (served.get("schema") or {}).get("openAPIV3Schema") or {}
    out = []
    for path in want.fields:
        node = schema
        for part in path.split("."):
            node = (node.get("properties") or {}).get(part)
            if node is None:
                break
        if node is None:
            out.append(path)
    return out


def check_job_crd(api, backend: str) -> None:
    """Refuse, before anything is created, a cluster whose job CRD lacks a field the launcher sets."""
    want = CRDS[backend]
    try:
        crd = api.get_crd(want.name)
    except CrdUnreadable:
        log.info(
            "job CRD not checked: the launcher may not read CRDs (the chart's rbac.readCluster grants it)"
        )
        return
    if crd is None:
        raise RingzeroError(
            f"the cluster has no {want.name} CRD (backend {backend!r}): install {want.needs}; "
            "nothing was created"
        )
    missing = missing_fields(crd, want)
    if missing:
        raise RingzeroError(
            f"the cluster's {want.name} CRD lacks {', '.join(missing)}, which the launcher sets: it needs "
            f"{want.needs}; nothing was created"
        )
