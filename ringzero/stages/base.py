"""What every stage runner receives and returns, and the registry from stage kind to runner.

A runner is ``run(ctx, stage, inputs) -> StageOutcome``. It reads its input checkpoints from
``inputs``, writes intermediate checkpoints under ``ctx.checkpoint_prefix`` (so an interrupted stage
resumes from ``ctx.resume_uri()``), logs metrics through ``ctx.metrics`` and returns its output URI
and a flat summary of namespaced metrics that gates are evaluated on.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ringzero.config.run import RunConfig
from ringzero.errors import RingzeroError
from ringzero.metrics import MetricWriter
from ringzero.parallel.runtime import Runtime, single


@dataclass(frozen=True)
class StageInputs:
    init_uri: str | None = None  # the checkpoint this stage starts from (None: fresh init)
    reference_uri: str | None = None  # frozen KL reference for RL stages
    base_uri: str | None = None  # the pretrained base of the run (distillation may restart from it)
    compare: dict[str, str] = field(default_factory=dict)  # stage name -> checkpoint URI, for eval


@dataclass
class StageOutcome:
    output_uri: str | None
    summary: dict[str, float]
    stop_reason: str
    steps: int
    wall_s: float
    extra: dict[str, Any] = field(default_factory=dict)  # stage-specific tables (eval's comparison)


@dataclass
class StageContext:
    cfg: RunConfig
    store: Any  # ringzero.store.CheckpointStore
    stage_hash: str
    stage_dir: Path  # local folder for this stage's metrics and artifacts
    metrics: MetricWriter
    fresh: bool = False  # --force: start over, ignoring this identity's resume points and partial results
    runtime: Runtime = field(default_factory=single)  # device, rank and dp x cp groups of the job

    @property
    def checkpoint_prefix(self) -> str:
        return f"stages/{self.stage_hash[:16]}"

    @property
    def final_name(self) -> str:
        """Where the stage commits its output checkpoint: under its own identity, so the output URI
        names everything upstream of it (the identity hash of a downstream stage relies on that)."""
        return f"{self.checkpoint_prefix}/final"

    def resume_uri(self) -> str | None:
        """Latest committed intermediate checkpoint of this exact stage configuration, if any."""
        return None if self.fresh else self.store.latest(f"{self.checkpoint_prefix}/step-")


class StageRunner(Protocol):
    def __call__(self, ctx: StageContext, stage: Any, inputs: StageInputs) -> StageOutcome: ...


_RUNNERS = {
    "pretrain": "ringzero.stages.pretrain:run",
    "rl": "ringzero.stages.rl:run",
    "distill": "ringzero.stages.distill:run",
    "eval": "ringzero.stages.evaluate:run",
}


# Test-only: tests replace runners with fast fakes, also inside the subprocesses they start (the KFP
# local runner runs each pipeline step in its own process). "kind=module:func,..."; never set elsewhere.
TEST_RUNNERS_ENV = "RINGZERO_TEST_STAGE_RUNNERS"


def _runner_specs() -> dict[str, str]:
    specs = dict(_RUNNERS)
    for item in filter(None, os.environ.get(TEST_RUNNERS_ENV, "").split(",")):
        kind, _, spec = item.partition("=")
        specs[kind.strip()] = spec.strip()
    return specs


def get_runner(kind: str) -> StageRunner:
    specs = _runner_specs()
    if kind not in specs:
        raise RingzeroError(f"unknown stage kind {kind!r}; known: {sorted(specs)}")
    module, func = specs[kind].split(":")
    try:
        return getattr(importlib.import_module(module), func)
    except ModuleNotFoundError as exc:
        if exc.name == module:
            raise RingzeroError(f"stage kind {kind!r} has no runner installed ({module})") from None
        raise
