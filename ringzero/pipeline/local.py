"""The local runner: every configured stage in order, in this process, checkpoints passed as store URIs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import structlog

from ringzero.config.run import RunConfig, stage_input_refs
from ringzero.parallel.one_writer import one_writer
from ringzero.parallel.runtime import Runtime, single
from ringzero.pipeline.execute import ExecutedStage, execute_stage
from ringzero.pipeline.manifest import RunManifest
from ringzero.pipeline.targets import TargetResult, run_targets
from ringzero.stages.base import StageInputs

log = structlog.get_logger(__name__)


@dataclass
class PipelineResult:
    status: str  # succeeded | gate_failed
    stages: list[ExecutedStage] = field(default_factory=list)
    failed_gate: ExecutedStage | None = None
    targets: list[TargetResult] = field(default_factory=list)  # reported only: they never change the status


def resolve_inputs(stage, done: dict[str, ExecutedStage]) -> StageInputs:
    """A stage's inputs as URIs, by the one rule (``config.run.stage_input_refs``) over the stages done."""
    made = [(name, ex.kind, ex.outcome.output_uri) for name, ex in done.items() if ex.outcome.output_uri]
    refs = stage_input_refs(stage, made)
    return StageInputs(
        init_uri=refs.init, reference_uri=refs.reference, base_uri=refs.base, compare=refs.compare
    )


def run_pipeline(
    cfg: RunConfig, store, run_dir: Path, force: set[str] = frozenset(), runtime: Runtime | None = None
) -> PipelineResult:
    """Every rank of a job runs this; rank 0 alone writes the manifest, the others follow its decisions."""
    runtime = runtime or single()
    store = one_writer(store, runtime)
    manifest = RunManifest(cfg, store, run_dir, local=runtime.is_main)
    done: dict[str, ExecutedStage] = {}
    result = PipelineResult(status="succeeded")
    for stage in cfg.stages:
        inputs = resolve_inputs(stage, done)
        ex = execute_stage(cfg, store, stage, inputs, run_dir, force=stage.name in force, runtime=runtime)
        done[stage.name] = ex
        result.stages.append(ex)
        manifest.record(ex)
        if not ex.gate.passed:
            log.error("gate.failed", stage=stage.name, reasons=ex.gate.reasons)
            result.status, result.failed_gate = "gate_failed", ex
            break
    result.targets = run_targets(cfg, result.stages)
    manifest.record_targets(result.targets)
    manifest.finish(result.status)
    return result
