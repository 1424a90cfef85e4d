"""Run one stage with caching by identity: the unit both the local runner and the Kubeflow component call.

A finished stage commits ``stages/<hash>/outcome.json`` (output URI, summary, stop reason) and its
metrics; a later call with the same identity returns that outcome without running anything. An
interrupted stage has no outcome yet, so it runs again and resumes from its last checkpoint.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import structlog

from ringzero.config.run import RunConfig, stage_view
from ringzero.errors import RingzeroError
from ringzero.metrics import MemoryMetricWriter, MetricWriter, merge_by_step
from ringzero.parallel.one_writer import OneWriterStore, one_writer
from ringzero.parallel.runtime import Runtime, single
from ringzero.pipeline.gates import GateResult, evaluate_gate
from ringzero.pipeline.identity import stage_hash
from ringzero.stages.base import StageContext, StageInputs, StageOutcome, get_runner
from ringzero.store.lease import LeaseHeld, StageLease

log = structlog.get_logger(__name__)


@dataclass
class ExecutedStage:
    name: str
    kind: str
    stage_hash: str
    inputs: StageInputs
    outcome: StageOutcome
    gate: GateResult
    skipped: bool
    metrics: list[dict]


def outcome_key(h: str) -> str:
    return f"stages/{h[:16]}/outcome.json"


def metrics_key(h: str) -> str:
    return f"stages/{h[:16]}/metrics.jsonl"


def lease_key(h: str) -> str:
    return f"stages/{h[:16]}/lease.json"


@contextmanager
def stage_lease(store, h: str, runtime: Runtime):
    """Rank 0 holds the stage's lease while the job runs it; a second job on the same identity is
    refused on every rank before it writes anything (yields the lease on rank 0, None elsewhere)."""
    lease, refused = None, None
    if runtime.is_main:
        lease = StageLease(store.inner if isinstance(store, OneWriterStore) else store, lease_key(h))
        try:
            lease.acquire()
        except LeaseHeld as exc:
            refused = str(exc)
    refused = runtime.broadcast(refused)
    if refused is not None:
        raise RingzeroError(f"stage {h[:16]} is being run by another job: {refused}")
    try:
        yield lease
    finally:
        if lease is not None:
            lease.release()


def execute_stage(
    cfg: RunConfig,
    store,
    stage,
    inputs: StageInputs,
    run_dir: Path,
    force: bool = False,
    runtime: Runtime | None = None,
) -> ExecutedStage:
    """Every rank of a job calls this with the same arguments; rank 0 alone writes (store and run folder)."""
    runtime = runtime or single()
    store = one_writer(store, runtime)
    main = runtime.is_main
    cfg = stage_view(cfg, stage)  # the stage's own seed and precision, where it sets them
    h = stage_hash(cfg, stage, inputs)
    stage_dir = Path(run_dir) / stage.name
    stage_dir.mkdir(parents=True, exist_ok=True)
    # Rank 0 answers the read for the job (``one_writer``), so no rank can see an outcome the others missed.
    cached = None if force else store.get_json(outcome_key(h))
    if cached is not None:
        outcome = StageOutcome(**cached)
        metrics = merge_by_step(_parse_jsonl(store.get_bytes(metrics_key(h)) or b""))
        log.info("stage.cached", stage=stage.name, hash=h[:16], output=outcome.output_uri)
        skipped = True
    else:
        metrics_path = stage_dir / "metrics.jsonl"
        identity_path = stage_dir / "identity"
        if main and (force or not identity_path.exists() or identity_path.read_text() != h):
            # Another configuration ran here before: its curves are not this stage's. The same identity
            # keeps its records, so a resumed stage's curves start at step 1, not at the resume point.
            metrics_path.unlink(missing_ok=True)
            identity_path.write_text(h)
        log.info("stage.start", stage=stage.name, kind=stage.kind, hash=h[:16], init=inputs.init_uri)
        started = time.time()
        with stage_lease(store, h, runtime) as lease:
            with MetricWriter(metrics_path) if main else MemoryMetricWriter() as writer:
                ctx = StageContext(
                    cfg=cfg,
                    store=store,
                    stage_hash=h,
                    stage_dir=stage_dir,
                    metrics=writer,
                    fresh=force,
                    runtime=runtime,
                )
                try:
                    outcome = get_runner(stage.kind)(ctx, stage, inputs)
                except Exception as exc:
                    _log_failure(stage, exc)
                    raise
            outcome.wall_s = runtime.broadcast(time.time() - started)
            if lease is not None:
                lease.check()  # never publish an outcome under a lease another job has taken
            store.put_bytes(metrics_key(h), metrics_path.read_bytes() if main else b"")
            store.put_json(outcome_key(h), asdict(outcome))  # last: its presence means the stage finished
        # Every rank reads the committed records back (a store read is answered by rank 0 for all).
        metrics = merge_by_step(_parse_jsonl(store.get_bytes(metrics_key(h)) or b""))
        skipped = False
        log.info("stage.done", stage=stage.name, stop=outcome.stop_reason, wall_s=round(outcome.wall_s, 1))
    gate = evaluate_gate(stage.gate, outcome.summary)
    return ExecutedStage(stage.name, stage.kind, h, inputs, outcome, gate, skipped, metrics)


def _log_failure(stage, exc: Exception) -> None:
    """Put a failed stage in the run log: a refusal (``RingzeroError``) by its message, as the CLI prints it;
    anything else with its traceback's frames too (``ringzero/logs.py`` renders no local variables)."""
    if isinstance(exc, RingzeroError):
        log.error("stage.failed", stage=stage.name, error=str(exc))
    else:
        log.error("stage.failed", stage=stage.name, error=f"{type(exc).__name__}: {exc}", exc_info=exc)


def _parse_jsonl(data: bytes) -> list[dict]:
    import json

    return [json.loads(line) for line in data.decode().splitlines() if line.strip()]
