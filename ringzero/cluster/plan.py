"""What a run would create on the cluster, stage by stage, and whether it fits: before anything exists.

``plan_run`` renders every stage exactly as the launcher would (``launch.render_stage``: the run-config
ConfigMap, for a sampling stage the SGLang Deployment and its two Services, then the TrainJob or
PyTorchJob), reads each pod group's requests from the rendered objects, and packs one stage's pods
(they run at the same time: the servers stay up while the job trains) onto the given nodes, largest GPU
request first. ``fits`` is false when some pod finds no node with room; ``short`` then says what is
missing. The launcher runs the same packing against the cluster's allocatable resources before it
creates anything (``check_capacity``).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

import yaml

from ringzero.cluster.job import StageJob, check_world
from ringzero.cluster.labels import launch_name
from ringzero.cluster.launch import render_stage
from ringzero.cluster.pods import GPU_RESOURCE
from ringzero.cluster.rollout import RolloutSpec
from ringzero.cluster.step import SAMPLING_KINDS
from ringzero.config.cluster import ClusterSettings
from ringzero.errors import RingzeroError

_QUANTITY = re.compile(r"^([0-9.]+)([a-zA-Z]*)$")
_SUFFIX = {"": 1, "m": 1e-3, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15,
           "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50}


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


@dataclass
class StagePlan:
    stage: str
    kind: str
    objects: list[dict] = field(default_factory=list)  # kind, name, and for jobs the torchrun shape
    pods: list[PodGroup] = field(default_factory=list)
    fits: bool = True
    short: str = ""
    problem: str = ""  # the stage cannot be rendered at all (e.g. ranks that are not dp x cp x tp)

    def totals(self) -> dict:
        return {"gpus": sum(p.count * p.gpus for p in self.pods), "cpu": sum(p.count * p.cpu for p in self.pods),
                "memory": sum(p.count * p.memory for p in self.pods)}


def pod_requests(pod_spec: dict) -> tuple[int, float, float]:
    """(GPUs, CPU cores, memory bytes) one pod asks for: its containers' sum, or its largest init container."""
    def of(containers):
        rows = [c.get("resources", {}).get("requests", {}) for c in containers]
        return [(int(quantity(r.get(GPU_RESOURCE, 0))), quantity(r.get("cpu", 0)), quantity(r.get("memory", 0)))
                for r in rows]
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
            out.append(PodGroup(kind, f"{name}/{role.lower()}", "trainer", spec["replicas"], gpus, cpu, memory))
        return out
    return []


def pack(pods: list[PodGroup], nodes: list[Node]) -> tuple[bool, str]:
    """First fit, largest GPU request first; ``(fits, what is short)``."""
    free = [[n.gpus, n.cpu, n.memory] for n in nodes]
    unplaced: list[tuple[str, str]] = []
    for group in sorted(pods, key=lambda p: (p.gpus, p.memory, p.cpu), reverse=True):
        for _ in range(group.count):
            for room in free:
                if room[0] >= group.gpus and (room[1] is None or room[1] >= group.cpu) and (
                        room[2] is None or room[2] >= group.memory):
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
    parts = [f"needs {need} GPUs at once ({_breakdown(pods)}) on {_describe(nodes)}"]
    if need > have:
        parts.append(f"{need - have} GPUs short")
    parts.append("no node has room for " + ", ".join(_dedupe(unplaced)))
    return False, "; ".join(parts)


def _breakdown(pods: list[PodGroup]) -> str:
    return " + ".join(f"{p.role} {p.count} x {p.gpus}" for p in pods if p.gpus) or "no GPUs"


def _describe(nodes: list[Node]) -> str:
    gpus = {n.gpus for n in nodes}
    if len(gpus) == 1:
        return f"{len(nodes)} node{'s' if len(nodes) != 1 else ''} x {gpus.pop()} GPUs"
    return f"{len(nodes)} nodes with {', '.join(str(n.gpus) for n in nodes)} GPUs"


def _dedupe(items: list[tuple[str, str]]) -> list[str]:
    """``[(role, requests), ...]`` as "a rollout pod (...)" or "2 rollout pods (... each)"."""
    seen: dict[tuple[str, str], int] = {}
    for item in items:
        seen[item] = seen.get(item, 0) + 1
    return [f"a {role} pod ({req})" if n == 1 else f"{n} {role} pods ({req} each)" for (role, req), n in seen.items()]


def plan_stage(cfg, settings: ClusterSettings, stage, nodes: list[Node], release: str = "plan") -> StagePlan:
    plan = StagePlan(stage.name, stage.kind)
    job = StageJob(
        run=cfg.run.name, stage=stage.name, name=launch_name(cfg.run.name, stage.name, release),
        namespace=settings.namespace or "default",
        config_yaml=yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False),
        dp=cfg.parallel.dp, cp=cfg.parallel.cp, tp=cfg.engines.training.tp,
    )
    rollout = None
    if cfg.engines.rollout.kind == "sglang" and stage.kind in SAMPLING_KINDS:
        rollout = RolloutSpec.from_run_config(cfg, f"<the checkpoint {stage.name} starts from>")
    try:
        check_world(settings, job)
        objects = render_stage(settings, job, rollout)
    except RingzeroError as exc:
        plan.fits, plan.problem = False, str(exc)
        return plan
    for obj in objects:
        row = {"kind": obj["kind"], "name": obj["metadata"]["name"]}
        if obj["kind"] in ("TrainJob", "PyTorchJob"):
            row["torchrun"] = (f"{settings.num_nodes} node{'s' if settings.num_nodes != 1 else ''} x "
                               f"{settings.procs_per_node()} processes (dp {job.dp} x cp {job.cp}"
                               + (f" x tp {job.tp}" if job.tp > 1 else "") + ")")
        plan.objects.append(row)
        plan.pods += pod_groups(obj)
    plan.fits, plan.short = pack(plan.pods, nodes)
    return plan


def plan_run(cfg, settings: ClusterSettings, nodes: list[Node]) -> list[StagePlan]:
    return [plan_stage(cfg, settings, stage, nodes) for stage in cfg.stages]


def as_json(plans: list[StagePlan], nodes: list[Node]) -> dict:
    return {
        "nodes": [asdict(n) for n in nodes],
        "fits": all(p.fits for p in plans),
        "stages": [{**{k: v for k, v in asdict(p).items() if k != "pods"},
                    "pods": [asdict(g) for g in p.pods], "totals": p.totals()} for p in plans],
    }


def as_text(plans: list[StagePlan], nodes: list[Node]) -> str:
    lines = [f"capacity: {_describe(nodes)}" + (
        "" if nodes[0].cpu is None else f", {nodes[0].cpu:g} CPU" ) + (
        "" if nodes[0].memory is None else f", {gib(nodes[0].memory)} each")]
    for p in plans:
        verdict = "fits" if p.fits else "DOES NOT FIT"
        lines.append(f"\nstage {p.stage} ({p.kind}): {verdict}")
        if p.problem:
            lines.append(f"  {p.problem}")
            continue
        for row in p.objects:
            text = f"  {row['kind']:<11} {row['name']}"
            for group in [g for g in p.pods if g.kind == row["kind"] and g.name.split("/")[0] == row["name"]]:
                text += (f"  {group.count} pod{'s' if group.count != 1 else ''} x ({group.gpus} GPUs, "
                         f"{group.cpu:g} CPU, {gib(group.memory)})")
            if "torchrun" in row:
                text += f"  torchrun {row['torchrun']}"
            lines.append(text)
        t = p.totals()
        lines.append(f"  at once: {t['gpus']} GPUs, {t['cpu']:g} CPU, {gib(t['memory'])}")
        if p.short:
            lines.append(f"  short: {p.short}")
    return "\n".join(lines)
