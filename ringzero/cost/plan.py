"""What a run costs on ``nodes x gpus_per_node`` GPUs of one kind, at a layout or at the best of them.

``plan_layout`` prices one layout for every training stage of the run: bytes per GPU of the heaviest rank
of each pipeline role (first stage: the embedding; last: the head; one stage: both), communication by
group, the step-time bounds, and the rollout replicas' memory and speed bounds. A layout is refused with
every reason at once: the megatron engine's own rule set (``config.run.megatron_problems``, what config
validation and the engine's build refuse) plus memory: a rank over the GPU's memory (``HBM x
mem_fraction``). ``search`` prices every layout the GPUs allow (tp within a node, pp dividing the layers,
cp and ep of the data-parallel ranks, the distributed optimizer on) and ranks those that fit by predicted
step time.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ringzero.config.run import RunConfig, megatron_problems
from ringzero.cost.gpus import Gpu
from ringzero.cost.memory import Layout, RankBytes, state_bytes
from ringzero.cost.params import count
from ringzero.cost.rollout import RolloutPlan, plan_rollout
from ringzero.cost.training import StepShape, activation_bytes, comm_bytes, step_time
from ringzero.errors import RingzeroError

RECOMPUTE = ("none", "selective", "full")
PROMPT_TOKENS = 512
"""Prompt length the plan assumes for RL stages (the config bounds responses, not prompts)."""


@dataclass(frozen=True)
class Assumptions:
    mfu: float = 0.25
    recompute: str = "selective"
    mem_fraction: float = 0.9
    rollout_gpus: int | None = None  # GPUs a replica (tp within a node x pp); None: the fewest that fit
    rollout_mem_fraction: float = 0.95  # what the SGLang cookbook serves Ring-2.5-1T at

    def __post_init__(self):
        if not 0 < self.mfu <= 1:
            raise RingzeroError(f"--mfu {self.mfu}: a share of the peak, in (0, 1]")
        if self.recompute not in RECOMPUTE:
            raise RingzeroError(f"--recompute {self.recompute!r}: none, selective or full")
        if not 0 < self.mem_fraction <= 1:
            raise RingzeroError(f"--mem-fraction {self.mem_fraction}: a share of the GPU's memory, in (0, 1]")


@dataclass
class StagePlan:
    stage: str
    shape: StepShape
    roles: dict[str, RankBytes]
    comm: dict[str, float]
    step_time_s: dict[str, float]


@dataclass
class LayoutPlan:
    layout: Layout
    stages: list[StagePlan] = field(default_factory=list)
    rollout: RolloutPlan | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return not self.problems

    @property
    def step_s(self) -> float:
        return max((s.step_time_s["overlapped"] for s in self.stages), default=0.0)

    def as_dict(self) -> dict:
        return {
            "layout": self.layout.label(),
            "recompute": self.stages[0].shape.recompute if self.stages else None,
            "fits": self.fits,
            "problems": self.problems,
            "stages": {
                s.stage: {
                    "shape": vars(s.shape),
                    "per_gpu_bytes": {role: b.as_dict() for role, b in s.roles.items()},
                    "comm_bytes_per_step": s.comm,
                    "step_time_s": s.step_time_s,
                }
                for s in self.stages
            },
            "rollout": None if self.rollout is None else self.rollout.as_dict(),
            "rollout_tokens_per_s": None
            if self.rollout is None
            else {
                "decode_bound": self.rollout.decode_tokens_per_s * self.replicas,
                "prefill_bound": self.rollout.prefill_tokens_per_s * self.replicas,
            },
        }

    @property
    def replicas(self) -> int:
        return 0 if self.rollout is None else self.layout.gpus // (self.rollout.tp * self.rollout.pp)


def stage_shape(stage, recompute: str) -> StepShape | None:
    """The optimizer step a training stage takes (None for a stage that does not train)."""
    if stage.kind == "rl":
        passes = int(stage.loss.kl_coef > 0) + int(bool(stage.loss.corrections))
        sequences = stage.prompts_per_step * stage.samples_per_prompt // stage.minibatches
        seq = PROMPT_TOKENS + stage.sampling.max_new_tokens
        return StepShape(seq, stage.micro_batch, sequences, passes, recompute)
    if stage.kind == "pretrain":
        return StepShape(stage.seq_len, stage.micro_batch, stage.batch_size, 0, recompute)
    if stage.kind == "distill":
        return StepShape(stage.max_seq_len, stage.micro_batch, stage.batch_size, 0, recompute)
    return None


def with_layout(cfg: RunConfig, layout: Layout) -> RunConfig:
    training = cfg.engines.training.model_copy(
        update={
            "kind": "megatron",
            "tp": layout.tp,
            "pp": layout.pp,
            "ep": layout.ep,
            "distributed_optimizer": layout.distributed_optimizer,
        }
    )
    return cfg.model_copy(
        update={
            "engines": cfg.engines.model_copy(update={"training": training}),
            "parallel": cfg.parallel.model_copy(update={"dp": layout.dp, "cp": layout.cp}),
        }
    )


def plan_layout(
    cfg: RunConfig, layout: Layout, gpu: Gpu, gpus_per_node: int, assume: Assumptions = Assumptions()
) -> LayoutPlan:
    out = LayoutPlan(layout, problems=list(megatron_problems(with_layout(cfg, layout))))
    if out.problems:
        return out
    model, policy = cfg.model, cfg.precision.train
    budget = gpu.hbm_bytes * assume.mem_fraction
    roles = {"only": [0]} if layout.pp == 1 else {"first": [0], "last": [layout.pp - 1]}
    for stage in cfg.stages:
        shape = stage_shape(stage, assume.recompute)
        if shape is None:
            continue
        per_role = {}
        for role, (index,) in roles.items():
            b = state_bytes(model, policy, layout, index)
            acts = activation_bytes(model, policy, layout, shape, index)
            per_role[role] = RankBytes(b.weights, b.grads, b.optimizer, acts)
        heavy = max(per_role.values(), key=lambda b: b.total)
        if heavy.total > budget:
            out.problems.append(
                f"stage {stage.name!r}: a rank needs {heavy.total / 2**30:.1f} GiB (weights "
                f"{heavy.weights / 2**30:.1f}, grads {heavy.grads / 2**30:.1f}, optimizer "
                f"{heavy.optimizer / 2**30:.1f}, activations {heavy.activations / 2**30:.1f}) of the "
                f"{budget / 2**30:.1f} GiB a {gpu.key} offers at mem_fraction {assume.mem_fraction}"
            )
        comm = comm_bytes(model, policy, layout, shape, heavy.grads)
        times = step_time(model, layout, shape, comm, gpu, gpus_per_node, assume.mfu)
        out.stages.append(StagePlan(stage.name, shape, per_role, comm.as_dict(), times))
    out.rollout = rollout_replica(cfg, gpu, layout.gpus, gpus_per_node, assume)
    if out.rollout is not None and out.rollout.max_sequences < 1:
        r = out.rollout
        out.problems.append(
            f"rollout: a replica of {r.tp * r.pp} {gpu.key} cannot hold the weights "
            f"({r.weights_per_gpu / 2**30:.1f} GiB a GPU) and one sequence of {r.context} tokens"
        )
    if out.rollout is not None and layout.gpus % (out.rollout.tp * out.rollout.pp):
        out.problems.append(
            f"rollout: replicas of {out.rollout.tp * out.rollout.pp} GPUs do not divide {layout.gpus}"
        )
    return out


def rollout_replica(
    cfg: RunConfig, gpu: Gpu, gpus: int, gpus_per_node: int, assume: Assumptions
) -> RolloutPlan | None:
    """The run's rollout replicas (on the same GPUs as training, between its steps): ``rollout_gpus`` GPUs
    each, or the fewest (within a node, then whole nodes) that hold the weights and a long sequence."""
    rl = [s for s in cfg.stages if s.kind == "rl"]
    if not rl:
        return None
    context = PROMPT_TOKENS + max(s.sampling.max_new_tokens for s in rl)
    sizes = (
        [assume.rollout_gpus]
        if assume.rollout_gpus
        else [*_divisors(gpus_per_node), *(gpus_per_node * n for n in range(2, 9))]
    )
    for size in sizes:
        tp = min(size, gpus_per_node)
        plan = plan_rollout(
            cfg.model,
            cfg.precision.rollout,
            gpu,
            tp,
            context,
            pp=size // tp,
            mem_fraction=assume.rollout_mem_fraction,
        )
        if plan.max_sequences >= 1 or size == sizes[-1]:
            return plan
    return None


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def search(
    cfg: RunConfig, gpu: Gpu, nodes: int, gpus_per_node: int, assume: Assumptions = Assumptions()
) -> tuple[list[LayoutPlan], list[LayoutPlan]]:
    """``(fits ranked by step time, refused)`` over every layout of ``nodes x gpus_per_node`` GPUs."""
    gpus = nodes * gpus_per_node
    experts = cfg.model.num_experts or 1
    fits, refused = [], []
    for tp in _divisors(gpus_per_node):
        for pp in _divisors(cfg.model.num_hidden_layers):
            for cp in (1, 2, 4, 8):
                if gpus % (tp * pp * cp):
                    continue
                dp = gpus // (tp * pp * cp)
                for ep in [e for e in _divisors(dp * cp) if experts % e == 0]:
                    layout = Layout(tp, pp, ep, cp, dp, distributed_optimizer=True)
                    # the lightest recomputation that fits: each step further costs compute
                    for recompute in RECOMPUTE[RECOMPUTE.index(assume.recompute) :]:
                        plan = plan_layout(
                            cfg, layout, gpu, gpus_per_node, replace(assume, recompute=recompute)
                        )
                        if plan.fits:
                            break
                    (fits if plan.fits else refused).append(plan)
    fits.sort(key=lambda p: (p.step_s, max(s.step_time_s["serial"] for s in p.stages)))
    return fits, refused


def parse_layout(text: str, gpus: int) -> Layout:
    """``tp=1,pp=10,ep=32,cp=1`` (dp: the GPUs left; ``dist-opt=0`` for ringzero's own optimizer)."""
    values = {"tp": 1, "pp": 1, "ep": 1, "cp": 1, "dist-opt": 1}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep or key not in values or not value.isdigit() or (int(value) < 1 and key != "dist-opt"):
            raise RingzeroError(
                f"--layout {text!r}: expected comma-separated tp=N, pp=N, ep=N, cp=N (and dist-opt=0|1), "
                f"got {part!r}"
            )
        values[key] = int(value)
    inner = values["tp"] * values["pp"] * values["cp"]
    if gpus % inner:
        raise RingzeroError(
            f"--layout {text!r}: tp x pp x cp = {inner} does not divide the {gpus} GPUs (--nodes x "
            "--gpus-per-node); the data-parallel degree is what is left"
        )
    return Layout(
        values["tp"], values["pp"], values["ep"], values["cp"], gpus // inner, bool(values["dist-opt"])
    )


def summary(cfg: RunConfig, gpu: Gpu, nodes: int, gpus_per_node: int) -> dict:
    pc = count(cfg.model)
    return {
        "params": {"total": pc.total, "active": pc.active, "routed": pc.routed},
        "gpu": {"key": gpu.key, "name": gpu.name, "source": gpu.source, "hbm_bytes": gpu.hbm_bytes},
        "gpus": nodes * gpus_per_node,
        "nodes": nodes,
        "gpus_per_node": gpus_per_node,
    }


def as_text(head: dict, plans: list[LayoutPlan], refused: list[LayoutPlan], gpu: Gpu, show: int = 10) -> str:
    gib = 2**30
    p = head["params"]
    where = f"{head['gpus']} x {gpu.name} ({head['nodes']} nodes x {head['gpus_per_node']})"
    params = f"{p['total'] / 1e9:.1f}B parameters ({p['active'] / 1e9:.1f}B active"
    lines = [
        f"{params}, {p['routed'] / 1e9:.1f}B in routed experts) on {where}",
        "bounds from stated assumptions (docs/cluster.md), not measurements",
    ]
    for plan in plans[:show]:
        verdict = "fits" if plan.fits else "refused: " + "; ".join(plan.problems)
        lines += ["", f"layout {plan.layout.label()}: {verdict}"]
        for s in plan.stages:
            t, shape = s.step_time_s, s.shape
            step = f"step {t['overlapped']:.1f}-{t['serial']:.1f} s"
            split = f"compute {t['compute']:.1f}, comm {t['comm']:.1f}"
            lines.append(f"  {s.stage} ({shape.sequences} x {shape.seq} tokens a step): {step} ({split})")
            lines.append(f"    recompute {shape.recompute}")
            for role, b in s.roles.items():
                parts = ", ".join(f"{k} {v / gib:.1f}" for k, v in b.as_dict().items() if k != "total")
                total = f"total {b.total / gib:.1f} of {gpu.hbm_bytes / gib:.0f}"
                lines.append(f"    {role} stage, GiB a GPU: {parts}; {total}")
            lines.append(
                "    comm per step, GB a rank: " + ", ".join(f"{k} {v / 1e9:.1f}" for k, v in s.comm.items())
            )
        if plan.rollout is not None:
            r, n = plan.rollout, plan.replicas
            weights = f"{r.weights_per_gpu / gib:.1f} GiB weights a GPU"
            lines.append(f"  rollout: {n} replicas of tp {r.tp} x pp {r.pp}, {weights}")
            lines.append(f"    {r.max_sequences} sequences of {r.context} tokens a replica")
            speeds = f"{r.decode_tokens_per_s * n:,.0f} decode and {r.prefill_tokens_per_s * n:,.0f} prefill"
            lines.append(f"    at most {speeds} tokens/s")
    if refused:
        lines += ["", f"{len(refused)} layouts refused, for example:"]
        lines += [f"  {plan.layout.label()}: " + "; ".join(plan.problems) for plan in refused[:show]]
    return "\n".join(lines)
