"""The run configuration: one YAML file, validated into these typed models at load."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from ringzero.config.base import RunName, StrictModel
from ringzero.config.cluster import ClusterSettings
from ringzero.config.kfp import KfpSettings
from ringzero.model.config import ModelConfig, PrecisionPolicy
from ringzero.parallel.config import ParallelConfig
from ringzero.stages.config import StageConfig
from ringzero.store.config import StorageConfig
from ringzero.tasks.config import ArithmeticTask, TaskConfig


class RunSettings(StrictModel):
    name: RunName = Field(..., description="run name (lowercase, digits, '-')")
    seed: int = Field(0, ge=0)
    run_dir: str = Field("runs", description="local folder for logs, metrics JSONL and reports")
    threads: int | None = Field(None, ge=1, description="torch CPU threads; null = torch's default")
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="where a stage's model, optimizer, batches and rollout engine live; auto: CUDA when "
        "present (each rank its LOCAL_RANK's GPU), else CPU"
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
    kind: Literal["torch", "megatron"] = Field("torch", description="torch: embedded default; megatron: production")

    @model_validator(mode="after")
    def _implemented(self) -> TrainingEngine:
        if self.kind == "megatron":
            raise ValueError(
                "kind 'megatron' is not implemented yet: stages would silently train with the embedded torch "
                "engine; use kind: torch (it runs dp x cp under torchrun on GPUs as well)"
            )
        return self


class RolloutEngine(StrictModel):
    kind: Literal["embedded", "sglang"] = Field("embedded", description="embedded: in-process; sglang: HTTP server")
    endpoint: str | None = Field(None, description="http(s)://host:port of an SGLang-compatible server")
    timeout_s: float = Field(600.0, gt=0)

    @model_validator(mode="after")
    def _endpoint(self) -> RolloutEngine:
        if self.kind == "sglang" and not self.endpoint:
            raise ValueError("endpoint is required when kind is sglang")
        if self.endpoint and not self.endpoint.startswith(("http://", "https://")):
            raise ValueError(f"endpoint must start with http:// or https:// (got {self.endpoint!r})")
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
    kfp: KfpSettings = Field(KfpSettings(), description="Kubeflow Pipelines: step image, resources, secrets, mode")
    cluster: ClusterSettings | None = Field(
        None, description="cluster mode: where stage jobs and rollout servers run (not part of stage identity)"
    )

    @model_validator(mode="after")
    def _stage_graph(self) -> RunConfig:
        problems = stage_graph_problems([s.model_dump() for s in self.stages])
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @model_validator(mode="after")
    def _layout_fits(self) -> RunConfig:
        if self.precision.deterministic and self.parallel.cp > 1:
            raise ValueError(
                "precision.deterministic needs parallel.cp = 1: a context-parallel forward sums attention in "
                f"another order than the rollout engine's, so their log-probs cannot be bitwise equal (cp={self.parallel.cp})"
            )
        return self

    def stage(self, name: str):
        for s in self.stages:
            if s.name == name:
                return s
        raise KeyError(name)


def stage_graph_problems(stages: list) -> list[str]:
    """Names unique; every ``init``/``reference``/``compare`` names an earlier stage or is a URI.

    Works on plain dicts so the loader can report these alongside field errors in one pass.
    """
    seen: list[str] = []
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
                problems.append(f"stages[{i}].{field}: {ref!r} is neither a URI nor an earlier stage (earlier: {seen})")
        if isinstance(name, str) and name not in seen:
            seen.append(name)
    return problems
