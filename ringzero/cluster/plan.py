"""What a run would create on the cluster, stage by stage, and whether it fits: before anything exists.

``plan_run`` renders every stage exactly as the launcher would (``launch.render_stage``: the run-config
ConfigMap, for a sampling stage the SGLang Deployment and its two Services, then the TrainJob or
PyTorchJob), reads each pod group's requests from the rendered objects, and packs one stage's pods
(they run at the same time: the servers stay up while the job trains) onto the given nodes, largest GPU
request first (``capacity``). ``fits`` is false when some pod finds no node with room; ``short`` then
says what is missing. The launcher runs the same packing against the cluster's nodes before it creates
anything (``capacity.check_capacity``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import yaml

from ringzero.cluster.capacity import Node, PodGroup, describe, gib, pack, pod_groups
from ringzero.cluster.job import StageJob, check_world
from ringzero.cluster.labels import launch_name
from ringzero.cluster.launch import render_stage
from ringzero.cluster.rollout import RolloutSpec
from ringzero.cluster.step import SAMPLING_KINDS
from ringzero.config.cluster import ClusterSettings
from ringzero.errors import RingzeroError


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
        return {
            "gpus": sum(p.count * p.gpus for p in self.pods),
            "cpu": sum(p.count * p.cpu for p in self.pods),
            "memory": sum(p.count * p.memory for p in self.pods),
        }


def plan_stage(cfg, settings: ClusterSettings, stage, nodes: list[Node], release: str = "plan") -> StagePlan:
    plan = StagePlan(stage.name, stage.kind)
    job = StageJob(
        run=cfg.run.name,
        stage=stage.name,
        name=launch_name(cfg.run.name, stage.name, release),
        namespace=settings.namespace or "default",
        config_yaml=yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False),
        dp=cfg.parallel.dp,
        cp=cfg.parallel.cp,
        tp=cfg.engines.training.tp,
        pp=cfg.engines.training.pp,
    )
    rollout = None
    if cfg.engines.rollout.kind == "sglang" and stage.kind in SAMPLING_KINDS:
        rollout = RolloutSpec.from_run_config(cfg, f"<the checkpoint {stage.name} starts from>", stage)
    try:
        check_world(settings, job)
        objects = render_stage(settings, job, rollout)
    except RingzeroError as exc:
        plan.fits, plan.problem = False, str(exc)
        return plan
    for obj in objects:
        row = {"kind": obj["kind"], "name": obj["metadata"]["name"]}
        if obj["kind"] in ("TrainJob", "PyTorchJob"):
            row["torchrun"] = (
                f"{settings.num_nodes} node{'s' if settings.num_nodes != 1 else ''} x "
                f"{settings.procs_per_node()} processes (dp {job.dp} x cp {job.cp}"
                + (f" x tp {job.tp}" if job.tp > 1 else "")
                + (f" x pp {job.pp}" if job.pp > 1 else "")
                + ")"
            )
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
        "stages": [
            {
                **{k: v for k, v in asdict(p).items() if k != "pods"},
                "pods": [asdict(g) for g in p.pods],
                "totals": p.totals(),
            }
            for p in plans
        ],
    }


def as_text(plans: list[StagePlan], nodes: list[Node]) -> str:
    lines = [
        f"capacity: {describe(nodes)}"
        + ("" if nodes[0].cpu is None else f", {nodes[0].cpu:g} CPU")
        + ("" if nodes[0].memory is None else f", {gib(nodes[0].memory)} each")
    ]
    for p in plans:
        verdict = "fits" if p.fits else "DOES NOT FIT"
        lines.append(f"\nstage {p.stage} ({p.kind}): {verdict}")
        if p.problem:
            lines.append(f"  {p.problem}")
            continue
        for row in p.objects:
            text = f"  {row['kind']:<11} {row['name']}"
            for group in [g for g in p.pods if g.kind == row["kind"] and g.name.split("/")[0] == row["name"]]:
                text += (
                    f"  {group.count} pod{'s' if group.count != 1 else ''} x ({group.gpus} GPUs, "
                    f"{group.cpu:g} CPU, {gib(group.memory)})"
                )
            if "torchrun" in row:
                text += f"  torchrun {row['torchrun']}"
            lines.append(text)
        t = p.totals()
        lines.append(f"  at once: {t['gpus']} GPUs, {t['cpu']:g} CPU, {gib(t['memory'])}")
        if p.short:
            lines.append(f"  short: {p.short}")
    return "\n".join(lines)
