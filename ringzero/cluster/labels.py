"""Object names and labels that tie every launched object to its run, stage and launch."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

PART_OF = "ringzero"
MANAGED_BY = "ringzero-launcher"
RUN_LABEL = "ringzero.dev/run"
STAGE_LABEL = "ringzero.dev/stage"
LAUNCH_LABEL = "ringzero.dev/launch"
COMPONENT_LABEL = "app.kubernetes.io/component"


@dataclass(frozen=True)
class OwnerRef:
    """The object whose deletion garbage-collects everything a launch created (the pipeline step's pod)."""

    api_version: str
    kind: str
    name: str
    uid: str

    def to_k8s(self) -> dict:
        # Not a controller reference: the owner (a pod) does not reconcile these objects.
        return {
            "apiVersion": self.api_version,
            "kind": self.kind,
            "name": self.name,
            "uid": self.uid,
            "blockOwnerDeletion": False,
        }


def launch_name(run: str, stage: str, attempt: str) -> str:
    """A DNS-label name unique per launch: readable prefix, hash suffix so long names stay distinct.

    ``attempt`` distinguishes relaunches of one stage (the pipeline step's pod name works well).
    """
    digest = hashlib.sha256(f"{run}/{stage}/{attempt}".encode()).hexdigest()[:8]
    # 63 minus the hash, its dash and the longest suffix added later ("-rollout").
    prefix = re.sub(r"[^a-z0-9-]", "-", f"{run}-{stage}".lower())[: 63 - 9 - 8].strip("-")
    return f"{prefix}-{digest}"


def launch_labels(run: str, stage: str, name: str, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/part-of": PART_OF,
        "app.kubernetes.io/managed-by": MANAGED_BY,
        COMPONENT_LABEL: component,
        RUN_LABEL: run,
        STAGE_LABEL: stage,
        LAUNCH_LABEL: name,
    }


def selector(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def metadata(name: str, namespace: str, labels: dict[str, str], owner: OwnerRef | None) -> dict:
    meta: dict = {"name": name, "namespace": namespace, "labels": dict(labels)}
    if owner is not None:
        meta["ownerReferences"] = [owner.to_k8s()]
    return meta
