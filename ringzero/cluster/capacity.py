"""Whether a stage's pods fit a set of nodes: the packing behind ``cluster plan`` and the launcher's check.

A stage's pods run at the same time (the rollout servers stay up while the job trains), so they are packed
together, largest GPU request first, onto the nodes (first fit). Each pod's requests are read from the
rendered objects themselves (a Deployment's pod template, a TrainJob's resources per node, a
PyTorchJob's replica templates), so what is checked is what would be created.

``check_capacity`` is the launcher's check before it creates anything: the nodes it may schedule on
(those matching the node selector, not cordoned, with no taint the settings do not tolerate), each with
its allocatable resources. That is the cluster's size, not what other workloads leave free at the moment.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

from ringzero.cluster.labels import selector
from ringzero.cluster.pods import GPU_RESOURCE
from ringzero.config.cluster import ClusterSettings
from ringzero.errors import RingzeroError

log = logging.getLogger(__name__)
_QUANTITY = re.compile(r"^([0-9.]+)([a-zA-Z]*)$")
_SUFFIX = {
    "": 1,
    "m": 1e-3,
    "k": 1e3,
    "K": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
}


def quantity(value: str | int | float) -> float:
    """A Kubernetes quantity as a number (``"500m"`` -> 0.5, ``"64Gi"`` -> 68719476736)."""
    m = _QUANTITY.match(str(value).strip())
    if not m or m[2] not in _SUFFIX:
        raise RingzeroError(f"not a Kubernetes quantity: {value!r}")
    return float(m[1]) * _SUFFIX[m[2]]


def gib(n: float) -> str:
    return f"{n / 2**30:g}Gi"


@dataclass(frozen=True)
class Node:
    """What one node offers the run's pods."""

    gpus: int
    cpu: float | None = None  # cores; None = not checked
    memory: float | None = None  # bytes; None = not checked
    name: str = ""


@dataclass
class PodGroup:
    """``count`` identical pods of one object."""

    kind: str  # the object: TrainJob, PyTorchJob, Deployment
    name: str
    role: str  # trainer or rollout
    count: int
    gpus: int
    cpu: float
    memory: float


def pod_requests(pod_spec: dict) -> tuple[int, float, float]:
    """(GPUs, CPU cores, memory bytes) one pod asks for: its containers' sum, or its largest init
    container."""

    def of(containers):
        rows = [c.get("resources", {}).get("requests", {}) for c in containers]
        return [
            (int(quantity(r.get(GPU_RESOURCE, 0))), quantity(r.get("cpu", 0)), quantity(r.get("memory", 0)))
            for r in rows
        ]

    main, init = of(pod_spec.get("containers", [])), of(pod_spec.get("initContainers", []))
    total = tuple(sum(x[i] for x in main) for i in range(3))
    return tuple(max([total[i], *(x[i] for x in init)]) for i in range(3))  # type: ignore[return-value]


def pod_groups(obj: dict) -> list[PodGroup]:
    kind, name = obj["kind"], obj["metadata"]["name"]
    if kind == "Deployment":
        gpus, cpu, memory = pod_requests(obj["spec"]["template"]["spec"])
        return [PodGroup(kind, name, "rollout", obj["spec"]["replicas"], gpus, cpu, memory)]
    if kind == "TrainJob":
        trainer = obj["spec"]["trainer"]
        gpus, cpu, memory = pod_requests({"containers": [{"resources": trainer["resourcesPerNode"]}]})
        return [PodGroup(kind, name, "trainer", trainer["numNodes"], gpus, cpu, memory)]
    if kind == "PyTorchJob":
        out = []
        for role, spec in obj["spec"]["pytorchReplicaSpecs"].items():
            gpus, cpu, memory = pod_requests(spec["template"]["spec"])
            out.append(
                PodGroup(kind, f"{name}/{role.lower()}", "trainer", spec["replicas"], gpus, cpu, memory)
            )
        return out
    return []


def pack(pods: list[PodGroup], nodes: list[Node]) -> tuple[bool, str]:
    """First fit, largest GPU request first; ``(fits, what is short)``."""
    free = [[n.gpus, n.cpu, n.memory] for n in nodes]
    unplaced: list[tuple[str, str]] = []
    for group in sorted(pods, key=lambda p: (p.gpus, p.memory, p.cpu), reverse=True):
        for _ in range(group.count):
            for room in free:
                if (
                    room[0] >= group.gpus
                    and (room[1] is None or room[1] >= group.cpu)
                    and (room[2] is None or room[2] >= group.memory)
                ):
                    room[0] -= group.gpus
                    if room[1] is not None:
                        room[1] -= group.cpu
                    if room[2] is not None:
                        room[2] -= group.memory
                    break
            else:
                unplaced.append((group.role, f"{group.gpus} GPUs, {group.cpu:g} CPU, {gib(group.memory)}"))
    if not unplaced:
        return True, ""
    need = sum(p.count * p.gpus for p in pods)
    have = sum(n.gpus for n in nodes)
    parts = [f"needs {need} GPUs at once ({_breakdown(pods)}) on {describe(nodes)}"]
    if need > have:
        parts.append(f"{need - have} GPUs short")
    parts.append("no node has room for " + ", ".join(_dedupe(unplaced)))
    return False, "; ".join(parts)


def _breakdown(pods: list[PodGroup]) -> str:
    return " + ".join(f"{p.role} {p.count} x {p.gpus}" for p in pods if p.gpus) or "no GPUs"


def describe(nodes: list[Node]) -> str:
    gpus = {n.gpus for n in nodes}
    if len(gpus) == 1:
        return f"{len(nodes)} node{'s' if len(nodes) != 1 else ''} x {gpus.pop()} GPUs"
    return f"{len(nodes)} nodes with {', '.join(str(n.gpus) for n in nodes)} GPUs"


def _dedupe(items: list[tuple[str, str]]) -> list[str]:
    """``[(role, requests), ...]`` as "a rollout pod (...)" or "2 rollout pods (... each)"."""
    seen: dict[tuple[str, str], int] = {}
    for item in items:
        seen[item] = seen.get(item, 0) + 1
    return [
        f"a {role} pod ({req})" if n == 1 else f"{n} {role} pods ({req} each)"
        for (role, req), n in seen.items()
    ]


# -- the launcher's check against the cluster ---------------------------------------------------------


def _tolerated(taint: dict, settings: ClusterSettings) -> bool:
    for t in settings.tolerations:
        if t.effect is not None and t.effect != taint.get("effect"):
            continue
        if t.operator == "Exists" and (t.key is None or t.key == taint.get("key")):
            return True
        if (
            t.operator == "Equal"
            and t.key == taint.get("key")
            and (t.value or "") == (taint.get("value") or "")
        ):
            return True
    return False


def schedulable_nodes(node_objects: list[dict], settings: ClusterSettings) -> list[Node]:
    """The nodes a stage's pods may land on, with their allocatable GPUs, CPU and memory."""
    out = []
    for obj in node_objects:
        spec, status = obj.get("spec") or {}, obj.get("status") or {}
        if spec.get("unschedulable"):
            continue
        if any(
            t.get("effect") in ("NoSchedule", "NoExecute") and not _tolerated(t, settings)
            for t in spec.get("taints") or []
        ):
            continue
        alloc = status.get("allocatable") or {}
        out.append(
            Node(
                int(quantity(alloc.get(GPU_RESOURCE, 0))),
                quantity(alloc.get("cpu", 0)),
                quantity(alloc.get("memory", 0)),
                (obj.get("metadata") or {}).get("name", ""),
            )
        )
    return out


def check_capacity(api, settings: ClusterSettings, objects: list[dict], stage: str) -> None:
    """Refuse, before anything is created, a stage whose pods cannot all run at once on the cluster's
    schedulable nodes. Skipped (with a log line) when the account may not read nodes."""
    found = api.list_nodes(selector(settings.node_selector))
    if found is None:
        log.info(
            "capacity not checked: the launcher may not list nodes (the chart's rbac.readCluster grants it)"
        )
        return
    pods = [g for obj in objects for g in pod_groups(obj)]
    nodes = schedulable_nodes(found, settings)
    if not nodes:
        raise RingzeroError(
            f"stage {stage!r}: no schedulable node matches the node selector "
            f"{settings.node_selector or '{}'} and "
            f"the tolerations; nothing was created"
        )
    fits, short = pack(pods, nodes)
    if not fits:
        raise RingzeroError(
            f"stage {stage!r} does not fit the cluster, so nothing was created: {short}. `ringzero cluster "
            "plan` "
            "shows each stage's pods; shrink the job or the rollout servers, or add nodes"
        )
