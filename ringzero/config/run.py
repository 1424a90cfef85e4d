"""The run configuration: one YAML file, validated into these typed models at load."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Generic, Literal, TypeVar

from pydantic import Field, model_validator

from ringzero.config.cluster import ClusterSettings
from ringzero.config.kfp import KfpSettings
from ringzero.config.megatron_split import split_problems
from ringzero.config.stages import StageConfig
from ringzero.config.targets import TargetExpr, target_problems
from ringzero.model.config import ModelConfig, PrecisionPolicy
from ringzero.parallel.config import ParallelConfig
from ringzero.store.config import StorageConfig
from ringzero.strict_model import RunName, StrictModel
from ringzero.tasks.config import ArithmeticTask, TaskConfig

T = TypeVar("T")


class RunSettings(StrictModel):
    name: RunName = Field(..., description="run name (lowercase, digits, '-')")
    seed: int = Field(0, ge=0)
    run_dir: str = Field("runs", description="local folder for logs, metrics JSONL and reports")
    threads: int | None = Field(None, ge=1, description="torch CPU threads; null = torch's default")
    sigterm_grace_s: float = Field(
        25.0,
        gt=0,
        le=3600,
        description="on SIGTERM a step loop saves a resume point at the next step and "
        "exits; after this many seconds the process exits whatever it is doing (keep it under the pod's "
        "terminationGracePeriodSeconds)",
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto",
        description="where a stage's model, optimizer, batches and rollout engine live; auto: CUDA when "
        "present (each rank its LOCAL_RANK's GPU), else CPU",
    )


class PrecisionSettings(StrictModel):
    train: PrecisionPolicy = Field(PrecisionPolicy.preset("fp32-islands"), description="training engine")
    rollout: PrecisionPolicy = Field(PrecisionPolicy.preset("fp32-islands"), description="rollout engine")
    deterministic: bool = Field(
        False, description="batch-invariant, same-op-order rollout: train/rollout log-probs bitwise equal"
    )


class CharTokenizer(StrictModel):
    kind: Literal["char"] = "char"


class HFTokenizer(StrictModel):
    kind: Literal["hf"] = "hf"
    path: str = Field(..., description="a tokenizer.json file")


TokenizerConfig = Annotated[CharTokenizer | HFTokenizer, Field(discriminator="kind")]


class TrainingEngine(StrictModel):
    kind: Literal["torch", "megatron"] = Field(
        "torch", description="torch: embedded default; megatron: megatron-core"
    )
    tp: int = Field(
        1, ge=1, description="megatron: tensor-parallel degree (heads and MLP columns split over tp ranks)"
    )
    pp: int = Field(1, ge=1, description="megatron: pipeline-parallel degree")
    ep: int = Field(
        1,
        ge=1,
        description="megatron: expert-parallel degree (each MoE layer's routed experts split "
        "over ep of the parallel.dp x parallel.cp ranks; must divide dp x cp and model.num_experts)",
    )
    distributed_optimizer: bool = Field(
        False, description="megatron: shard optimizer state over the data-parallel ranks (megatron-core's)"
    )

    @model_validator(mode="after")
    def _engine_dims(self) -> TrainingEngine:
        problems = []
        if self.kind == "torch":
            problems += [
                f"{name}: {getattr(self, name)} is a megatron degree; the torch engine splits work over "
                "parallel.dp x parallel.cp only (use kind: megatron)"
                for name in ("tp", "pp", "ep")
                if getattr(self, name) > 1
            ]
            if self.distributed_optimizer:
                problems.append(
                    "distributed_optimizer: megatron-core's; the torch engine keeps a full AdamW per rank "
                    "(use kind: megatron)"
                )
        if problems:
            raise ValueError("; ".join(problems))
        return self


class DistributedSync(StrictModel):
    """Weight pushes over a torch.distributed group the trainer opens with every server (``weight_sync:
    distributed``).

    The trainer is rank 0; replica ``r`` holds ranks ``1 + r * tp_size`` to ``(r + 1) * tp_size``.
    """

    backend: Literal["nccl", "gloo"] = Field("nccl", description="nccl on GPUs; gloo for CPU tests")
    master_address: str | None = Field(
        None, description="address the servers reach the trainer at; null = the trainer host's own address"
    )
    master_port: int = Field(
        0, ge=0, le=65535, description="port of the group's store on the trainer; 0 = a free one"
    )
    group_name: str = Field("ringzero-weights", min_length=1, description="the group's name on every server")
    timeout_s: float = Field(600.0, gt=0, description="to form the group and for each collective")


class RolloutEngine(StrictModel):
    kind: Literal["embedded", "sglang"] = Field(
        "embedded", description="embedded: in-process; sglang: HTTP servers"
    )
    endpoint: str | None = Field(
        None,
        description="http(s)://host:port of one SGLang-compatible server (a load-balanced Service reaches "
        "one pod per call, so weight pushes would miss the others: give endpoints or replica_dns for "
        "several)",
    )
    endpoints: list[str] = Field(default_factory=list, description="http(s)://host:port of every replica")
    replica_dns: str | None = Field(
        None, description="host:port of a headless Service: each of its DNS A records is one replica"
    )
    replicas: int | None = Field(
        None, ge=1, description="replicas replica_dns must resolve to before sampling"
    )
    tp_size: int = Field(
        1, ge=1, description="tensor-parallel ranks of each replica (distributed weight sync)"
    )
    timeout_s: float = Field(600.0, gt=0)
    stale: Literal["refuse", "count"] = Field(
        "refuse",
        description="a completion whose weight_version is not the last one pushed: refuse the batch, or "
        "keep it and count it (metric rollout/stale_samples)",
    )
    weight_sync: Literal["disk", "distributed", "store"] = Field(
        "disk",
        description="disk: each server loads a model folder at a local path it can read (weights_dir); "
        "distributed: tensors broadcast from the trainer over a torch.distributed group; store: the "
        "committed "
        "checkpoint's store URI (only `ringzero serve` reads those)",
    )
    weights_dir: str | None = Field(
        None,
        description="absolute path of the folder trainer and servers share (a volume mounted in both); "
        "disk pushes must name a model folder under it",
    )
    served_uri: str | None = Field(
        None,
        description="checkpoint the servers were started with (the launcher sets it): a stage that samples "
        "from that checkpoint pushes nothing",
    )
    distributed: DistributedSync = DistributedSync()

    @model_validator(mode="after")
    def _endpoint(self) -> RolloutEngine:
        if self.kind == "sglang" and not (self.endpoint or self.endpoints or self.replica_dns):
            raise ValueError("endpoint is required when kind is sglang (or endpoints, or replica_dns)")
        for url in [self.endpoint, *self.endpoints]:
            if url and not url.startswith(("http://", "https://")):
                raise ValueError(f"endpoint must start with http:// or https:// (got {url!r})")
        if self.replica_dns is not None:
            host, _, port = self.replica_dns.rpartition(":")
            if "://" in self.replica_dns or not host or not port.isdigit():
                raise ValueError(f"replica_dns must be host:port without a scheme (got {self.replica_dns!r})")
        if self.weights_dir is not None and not self.weights_dir.startswith("/"):
            raise ValueError(f"weights_dir must be an absolute path (got {self.weights_dir!r})")
        return self


class EngineSettings(StrictModel):
    training: TrainingEngine = TrainingEngine()
    rollout: RolloutEngine = RolloutEngine()


class RunConfig(StrictModel):
    run: RunSettings
    model: ModelConfig = ModelConfig()
    tokenizer: TokenizerConfig = CharTokenizer()
    precision: PrecisionSettings = PrecisionSettings()
    parallel: ParallelConfig = ParallelConfig()
    engines: EngineSettings = EngineSettings()
    task: TaskConfig = ArithmeticTask()
    storage: StorageConfig = StorageConfig()
    stages: list[StageConfig] = Field(default_factory=list)
    kfp: KfpSettings = Field(
        KfpSettings(), description="Kubeflow Pipelines: step image, resources, secrets, mode"
    )
    cluster: ClusterSettings | None = Field(
        None,
        description="cluster mode: where stage jobs and rollout servers run (not part of stage identity)",
    )
    targets: list[TargetExpr] = Field(
        default_factory=list,
        description="what the run should reach, reported as met / missed / missing once it "
        "ends (never stopping it, not part of stage identity); see ringzero.config.targets for the grammar",
    )

    @model_validator(mode="after")
    def _stage_graph(self) -> RunConfig:
        problems = stage_graph_problems([s.model_dump() for s in self.stages])
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @model_validator(mode="after")
    def _targets_name_stages(self) -> RunConfig:
        problems = target_problems(list(self.targets), [s.name for s in self.stages])
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @model_validator(mode="after")
    def _layout_fits(self) -> RunConfig:
        if self.precision.deterministic and self.parallel.cp > 1:
            raise ValueError(
                "precision.deterministic needs parallel.cp = 1: a context-parallel forward sums attention in "
                "another order than the rollout engine's, so their log-probs cannot be bitwise equal "
                f"(cp={self.parallel.cp})"
            )
        problems = megatron_problems(self) if self.engines.training.kind == "megatron" else []
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @model_validator(mode="after")
    def _model_serves(self) -> RunConfig:
        problems = []
        for i, st in enumerate(self.stages):
            if not getattr(getattr(st, "loss", None), "routing_replay", False):
                continue
            if self.model.num_experts is None:
                problems.append(
                    f"stages[{i}].loss.routing_replay: the model has no MoE layers (model.num_experts "
                    "is null), so there is no routing to replay"
                )
            if self.precision.deterministic:
                problems.append(
                    f"stages[{i}].loss.routing_replay: precision.deterministic already makes the "
                    "rollout engine route every token as the trainer does"
                )
        if self.engines.rollout.kind == "sglang" and self.cluster is not None:
            # The launcher starts real SGLang servers (an SGLang-compatible `ringzero serve` takes any
            # layout).
            from ringzero.model.sglang_loader import sglang_problems

            problems += [
                f"model: the cluster's SGLang servers cannot serve it: {p}"
                for p in sglang_problems(self.model)
            ]
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def stage(self, name: str):
        for s in self.stages:
            if s.name == name:
                return s
        raise KeyError(name)


def _routing_replay_problems(cfg: RunConfig) -> list[str]:
    return [
        f"stages[{i}].loss.routing_replay: the megatron engine's MoE layers do not replay the rollout's "
        "routing yet; use kind: torch for routing replay"
        for i, st in enumerate(cfg.stages)
        if getattr(getattr(st, "loss", None), "routing_replay", False)
    ]


def _megatron_cp_problems(cfg: RunConfig) -> list[str]:
    """Context parallelism in megatron layers: MLA all-to-all over heads, Lightning all-gather of states,
    on the zigzag shards megatron's MLA ropes."""
    p, problems = cfg.parallel, []
    if p.sharding != "zigzag":
        problems.append(
            f"engines.training.kind megatron: parallel.cp = {p.cp} needs parallel.sharding: zigzag "
            f"(got {p.sharding}): megatron's MLA ropes each CP rank's chunks r and 2 cp - 1 - r"
        )
    if p.cp_plan.mla != "a2a" or p.cp_plan.lightning != "allgather":
        problems.append(
            f"engines.training.kind megatron: parallel.cp_plan must be mla: a2a, lightning: allgather "
            f"(got mla: {p.cp_plan.mla}, lightning: {p.cp_plan.lightning}): those are the strategies "
            "the megatron layers implement"
        )
    return problems


def _megatron_ep_share_problems(cfg: RunConfig) -> list[str]:
    """Expert parallelism spans data-parallel ranks, whose MoE layers exchange tokens in every forward: the
    RL trainer's minibatches must split evenly over dp so that every rank runs as many micro-batches
    (``lm_step`` evens out the micro-batch counts itself: pretraining and distillation batches may not)."""
    dp, ep, problems = cfg.parallel.dp, cfg.engines.training.ep, []
    for i, st in enumerate(cfg.stages):
        rows = st.prompts_per_step * st.samples_per_prompt // st.minibatches if st.kind == "rl" else 0
        if rows % dp:
            problems.append(
                f"stages[{i}]: a minibatch of prompts_per_step x samples_per_prompt / minibatches = {rows} "
                f"responses does not split evenly over parallel.dp ({dp}), which engines.training.ep {ep} "
                "needs: the data-parallel ranks' MoE layers exchange tokens in every forward"
            )
    return problems


def megatron_problems(cfg: RunConfig) -> list[str]:
    """What the megatron engine cannot train yet, or cannot split as asked (the split: one rule set,
    ``config.megatron_split``)."""
    t, p = cfg.engines.training, cfg.parallel
    problems = _megatron_cp_problems(cfg) if p.cp > 1 else []
    if cfg.precision.deterministic:
        problems.append(
            "engines.training.kind megatron: precision.deterministic decodes with the torch engine's "
            "batch-invariant forward, which megatron's kernels do not reproduce bit for bit"
        )
    problems += split_problems(cfg.model, tp=t.tp, pp=t.pp, ep=t.ep, cp=p.cp, dp=p.dp)
    if cfg.model.num_experts is not None:
        problems += _routing_replay_problems(cfg)
    if t.ep > 1 and p.dp > 1:
        problems += _megatron_ep_share_problems(cfg)
    return problems


MAKES_CHECKPOINT = frozenset({"pretrain", "rl", "distill"})
"""The stage kinds whose output is a checkpoint a later stage can start from."""


def stage_graph_problems(stages: list) -> list[str]:
    """Names unique; every ``init``/``reference``/``compare`` is a URI or names an earlier stage that makes a
    checkpoint (``MAKES_CHECKPOINT``).

    Works on plain dicts so the loader can report these alongside field errors in one pass.
    """
    seen: list[str] = []
    made: list[str] = []
    problems = []
    for i, stage in enumerate(stages):
        if not isinstance(stage, dict):
            continue
        name = stage.get("name")
        if name in seen:
            problems.append(f"stages[{i}].name: {name!r} is used by an earlier stage")
        refs = {"init": stage.get("init"), "reference": stage.get("reference")}
        compare = stage.get("compare") or []
        if isinstance(compare, list):
            refs.update({f"compare[{j}]": c for j, c in enumerate(compare)})
        for field, ref in refs.items():
            if not isinstance(ref, str) or "://" in ref:
                continue
            if ref not in seen:
                problems.append(
                    f"stages[{i}].{field}: {ref!r} is neither a URI nor an earlier stage (earlier: {seen})"
                )
            elif ref not in made:
                problems.append(
                    f"stages[{i}].{field}: stage {ref!r} makes no checkpoint (stages that do: {made})"
                )
        if isinstance(name, str) and name not in seen:
            seen.append(name)
            if stage.get("kind") in MAKES_CHECKPOINT:
                made.append(name)
    return problems


@dataclass(frozen=True)
class InputRefs(Generic[T]):
    """A stage's inputs as whatever stands for a checkpoint where it runs: a URI (the local runner) or an
    earlier step's output (a Kubeflow pipeline)."""

    init: T | None
    reference: T | None  # RL stages only
    base: T | None
    compare: dict[str, T]


def stage_input_refs(stage, made: list[tuple[str, str, T]]) -> InputRefs[T]:
    """The one rule for a stage's inputs, from ``made``: (name, kind, checkpoint) of the earlier stages that
    made one, in order. ``init`` is the named stage (or URI) or else the latest checkpoint; an RL stage's
    ``reference`` the named one or else its init; ``base`` the first pretrain stage's; ``compare`` by name.
    The names are valid: the config was checked at load (``stage_graph_problems``)."""
    by_name = {name: out for name, _, out in made}

    def ref(value):
        return None if value is None else (value if "://" in value else by_name[value])

    init = ref(stage.init) if stage.init else (made[-1][2] if made else None)
    return InputRefs(
        init=init,
        reference=(ref(stage.reference) or init) if stage.kind == "rl" else None,
        base=next((out for _, kind, out in made if kind == "pretrain"), None),
        compare={name: ref(name) for name in getattr(stage, "compare", [])},
    )


def stage_view(cfg: RunConfig, stage) -> RunConfig:
    """The run as ``stage`` sees it: its own ``seed`` and ``precision`` in place of the run's, when set. A
    stage runs, and is identified (ringzero.pipeline.identity), under this view, so a stage that sets its
    seed to the run's is the very stage that does not set it."""
    seed, precision = getattr(stage, "seed", None), getattr(stage, "precision", None)
    update = {}
    if seed is not None and seed != cfg.run.seed:
        update["run"] = cfg.run.model_copy(update={"seed": seed})
    if precision is not None:
        fields = {k: v for k, v in (("train", precision.train), ("rollout", precision.rollout)) if v}
        if fields:
            update["precision"] = cfg.precision.model_copy(update=fields)
    return cfg.model_copy(update=update) if update else cfg
